// The scenario editor. The document is the scenario JSON as read from the file: each widget is
// bound to one JSON pointer and shows the document's value there exactly (or, in italics, the
// value the preset or a default gives when the document has none); a change by the person writes
// that one value into the document and nothing else, so every other field, and every value a
// widget could not represent, stays as it was. Fields without a widget are listed under "Other
// fields in the file". The editor never validates or computes: the planner reads the document.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include <QHash>
#include <QWidget>
#include <nlohmann/json.hpp>

#include "distplan/planner/spec.h"

class QCheckBox;
class QComboBox;
class QFormLayout;
class QLabel;

namespace distplan::gui {

class ValueField;
enum class FieldUnit;

class ScenarioEditor : public QWidget {
  Q_OBJECT

 public:
  explicit ScenarioEditor(QWidget* parent = nullptr);

  /// Shows `doc` (a scenario or search document); the editor edits this document from now on.
  void setDocument(const nlohmann::json& doc);
  /// The document: what was read, plus the person's edits.
  [[nodiscard]] const nlohmann::json& document() const { return doc_; }
  /// The scenario the planner resolved from the document (presets and defaults filled in): the
  /// values shown for fields the document leaves out, and the choices tp, pp, dp offer.
  /// `withLayout` false: the layout is a placeholder (a search request's base), not shown.
  void setResolved(const Scenario& s, bool withLayout = true);
  /// Changes the document so that it describes `to` where `to` differs from `from` (a layout
  /// chosen from the search or a suggestion), field by field; everything else stays.
  void applyScenario(const Scenario& from, const Scenario& to);
  /// Writes `value` at JSON pointer `path` (null removes the key), as an edit by the person.
  void editValue(const QString& path, const nlohmann::json& value);
  /// Several values as one edit.
  void editValues(const std::vector<std::pair<QString, nlohmann::json>>& values);

  /// Marks the field whose JSON path is the longest prefix of `path` and shows `message` beside it.
  void showError(const QString& path, const QString& message);
  void clearError();
  /// The message currently shown for `path`'s field (empty when none); tests read it.
  [[nodiscard]] QString errorText() const;
  /// The "Other fields in the file" text: document values no widget shows.
  [[nodiscard]] QString otherFieldsText() const;

 signals:
  /// The person changed the document; read document().
  void edited();

 private:
  enum class Kind { value, choice, intChoice, check, preset };
  struct Field {
    Kind kind = Kind::value;
    QWidget* editor = nullptr;
    QLabel* error = nullptr;
  };

  QWidget* addRow(QFormLayout* form, const QString& label, QWidget* editor, const QString& path,
                  Kind kind);
  ValueField* addValue(QFormLayout* form, const QString& label, const QString& path, FieldUnit unit,
                       const QString& unitText = {}, bool connectEdit = true);
  QComboBox* addChoice(QFormLayout* form, const QString& label, const QString& path,
                       const QStringList& values);
  QComboBox* addIntChoice(QFormLayout* form, const QString& label, const QString& path);
  QCheckBox* addCheck(QFormLayout* form, const QString& label, const QString& path);
  QComboBox* addPreset(QFormLayout* form, const QString& label, const QString& path, bool model);

  void buildPresetsGroup(QFormLayout* form);
  void buildModelGroup(QFormLayout* form);
  void buildMoeGroup(QFormLayout* form);
  void buildClusterGroup(QFormLayout* form);
  void buildTrainingGroup(QFormLayout* form);
  void buildPeftGroup(QFormLayout* form);
  void buildParallelGroup(QFormLayout* form);
  void buildAssumptionsGroup(QFormLayout* form);

  /// The value shown at `path`: the document's, else the resolved scenario's (null if neither).
  [[nodiscard]] nlohmann::json shownValue(const QString& path, bool* inDocument) const;
  /// Refreshes every widget from the document and the resolved scenario.
  void refresh();
  void refreshField(const QString& path, const Field& f);
  void refreshOtherFields();
  void presetChosen(const QString& path, const QString& name, bool model);

  bool updating_ = false;  // true while the editor itself sets widgets
  nlohmann::json doc_ = nlohmann::json::object();
  nlohmann::json resolved_;  // to_json of the last resolved scenario (null before one)
  std::optional<Scenario> resolvedScenario_;
  QHash<QString, Field> fields_;
  QLabel* generalError_ = nullptr;
  QLabel* otherFields_ = nullptr;
  QWidget* otherBox_ = nullptr;
  QString errorPath_;
};

/// Sets `value` at JSON pointer `path` in `doc`, creating objects on the way; a preset name on the
/// way (`"model": "llama2-7b"`) becomes `{"preset": "llama2-7b"}` so the preset stays. Null
/// removes the key, unless `keepNull` (then null is written: a JSON null the planner reads).
void setDocumentValue(nlohmann::json& doc, const std::string& path, const nlohmann::json& value,
                      bool keepNull = false);

}  // namespace distplan::gui
