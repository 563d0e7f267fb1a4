// The main window: the scenario editor on the left, results in tabs on the right (Summary,
// Memory, Communication, Timeline, Search, Validation). Every edit goes to the PlanSession, which
// estimates at once and simulates right after; the tabs follow its signals.
#pragma once

#include <QMainWindow>
#include <QStringList>
#include <nlohmann/json_fwd.hpp>
#include <string>

class QLabel;
class QMenu;
class QSplitter;
class QTabWidget;

namespace distplan::gui {

class CommunicationView;
class MemoryView;
class PlanSession;
class ScenarioEditor;
class SearchView;
class SummaryView;
class TimelineView;
class ValidationView;

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  /// `persistent`: restore and save window state and recent files (QSettings); off for
  /// screenshots and tests.
  explicit MainWindow(bool persistent = true, QWidget* parent = nullptr);

  /// Loads the embedded default scenario (Llama-2-70B on 64 × H100).
  void loadDefaultScenario();
  /// Opens a scenario or search file (read with the CLI's size bound); on failure returns false
  /// and sets `error` ("path: message").
  bool openScenario(const QString& path, QString* error = nullptr);
  /// Makes the Hugging Face config.json at `path` the open scenario's model
  /// ({"hf_config": ...}, read by the library's importer as `distplan plan --hf-config`); on
  /// failure returns false, sets `error` ("path: /model/hf_config/...: message") and changes
  /// nothing. openScenario() does this for a file that is a config.json.
  bool importHfConfig(const QString& path, QString* error = nullptr);
  /// A document that is a Hugging Face config.json (model_type, no scenario sections).
  [[nodiscard]] static bool isHfConfig(const nlohmann::json& doc);
  /// Saves the document: the bytes read when nothing was edited, else the edited document.
  bool saveScenario(const QString& path, QString* error = nullptr);
  /// Shows the tab named `name` (summary, memory, communication, timeline, search, validation).
  bool showTab(const QString& name);
  [[nodiscard]] static QStringList tabNames();
  /// The chart or view of the current tab that "Export chart" writes.
  [[nodiscard]] QWidget* currentChart() const;

  [[nodiscard]] PlanSession* session() const { return session_; }
  [[nodiscard]] ScenarioEditor* editor() const { return editor_; }
  [[nodiscard]] MemoryView* memoryView() const { return memory_; }
  [[nodiscard]] CommunicationView* communicationView() const { return communication_; }
  [[nodiscard]] TimelineView* timelineView() const { return timeline_; }
  [[nodiscard]] SummaryView* summaryView() const { return summary_; }
  [[nodiscard]] SearchView* searchView() const { return search_; }
  [[nodiscard]] ValidationView* validationView() const { return validation_; }
  [[nodiscard]] QString bannerText() const;

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  void createMenus();
  void planChanged();
  void planInvalid(const QString& path, const QString& message);
  void simulationChanged();
  void editorEdited();
  void openDialog();
  void importHfConfigDialog();
  void saveDialog(bool saveAs);
  void copyPlanJson();
  void exportCurrentChart();
  void addRecentFile(const QString& path);
  void updateRecentMenu();
  void setCurrentFile(const QString& path);

  bool persistent_ = true;
  PlanSession* session_ = nullptr;
  ScenarioEditor* editor_ = nullptr;
  QSplitter* splitter_ = nullptr;
  QTabWidget* tabs_ = nullptr;
  QLabel* banner_ = nullptr;
  SummaryView* summary_ = nullptr;
  MemoryView* memory_ = nullptr;
  CommunicationView* communication_ = nullptr;
  TimelineView* timeline_ = nullptr;
  SearchView* search_ = nullptr;
  ValidationView* validation_ = nullptr;
  QMenu* recentMenu_ = nullptr;
  QStringList recentFiles_;
  QString currentFile_;
  std::string originalText_;     // the bytes the document was read from
  bool documentEdited_ = false;  // since it was read: Save writes originalText_ when false
};

}  // namespace distplan::gui
