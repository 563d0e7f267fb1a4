// A text field bound to one value of the scenario document. It shows the value exactly as the
// document holds it (a number's JSON text, shifted by a power of ten or divided by 2^30 for the
// unit a person reads), never clamped or rounded, and it reports a new value only when the person
// typed a different one. What the value means and whether it is allowed is the planner's call.
#pragma once

#include <QLineEdit>
#include <nlohmann/json.hpp>

namespace distplan::gui {

/// How the document's number relates to the number shown.
enum class FieldUnit {
  plain,  // shown as stored (counts, fractions, strings)
  giB,    // bytes, shown in GiB (2^30); written back as whole bytes
  tera,   // FLOP/s, shown in TFLOP/s (10^12)
  giga,   // B/s, shown in GB/s (10^9)
};

class ValueField : public QLineEdit {
  Q_OBJECT

 public:
  explicit ValueField(FieldUnit unit, QWidget* parent = nullptr);

  /// Shows `value` (null: nothing). `inDocument` false marks a value the document does not hold
  /// (a preset's or a default), in italics.
  void showValue(const nlohmann::json& value, bool inDocument);
  [[nodiscard]] FieldUnit unit() const { return unit_; }
  [[nodiscard]] bool showsDocumentValue() const { return inDocument_; }

  /// The document value for `text` typed in this field's unit: a JSON number, true/false, or else
  /// the text itself as a string (so the validator names the field). Empty text: null.
  [[nodiscard]] nlohmann::json valueForText(const QString& text) const;
  /// The text shown for `value` in this field's unit.
  [[nodiscard]] QString textForValue(const nlohmann::json& value) const;

 signals:
  /// The person typed a different value (null: the field was cleared, the key is to be removed).
  void valueEdited(const nlohmann::json& value);

 private:
  void commit();

  FieldUnit unit_;
  QString shown_;
  bool inDocument_ = false;
};

/// `number` (a JSON number's text) times 10^-k, as exact decimal text.
[[nodiscard]] QString shiftDecimal(const QString& number, int k);

}  // namespace distplan::gui
