// Validation tab: opens a `distplan validate` result (distplan.validate/v1), or runs one on the CPU
// through the CLI as a subprocess with its log streaming; either way the document is read into
// the library's typed report (distplan/gpu_backend/validation_report.h), the one the CLI prints.
// Shows predicted against measured memory per stage and category (the memory chart's colours), the
// bytes handed to each collective per stage, the step time and losses, and the relative error of
// every figure.
#pragma once

#include <QByteArray>
#include <QString>
#include <QStringList>
#include <QWidget>
#include <vector>

class QChart;
class QChartView;
class QCheckBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QProcess;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QTemporaryFile;

namespace distplan::backend {
struct ValidationReport;
}

namespace distplan::gui {

class ValidationView : public QWidget {
  Q_OBJECT

 public:
  explicit ValidationView(QWidget* parent = nullptr);
  ~ValidationView() override;

  /// The scenario a run validates (a scenario JSON document).
  void setScenarioDocument(const QByteArray& json);
  /// Shows a validate result, read into the library's typed report
  /// (backend::validation_report_from_json); returns false (and the library's error, with its
  /// JSON path, in the log) when it cannot be read.
  bool loadResult(const QByteArray& json);
  bool openFile(const QString& path);
  /// Writes the result on screen (as the CLI wrote it) to `path`; false when there is none or the
  /// file cannot be written.
  bool saveResult(const QString& path);
  /// Starts `distplan validate --device cpu` on the scenario; false when it cannot start.
  bool startRun();
  /// Stops a run: the CLI, and mpirun with its ranks.
  void stopRun();
  [[nodiscard]] bool isRunning() const { return process_ != nullptr; }

  /// Predicted against measured memory per stage (the tab's main chart, what "Export" writes).
  [[nodiscard]] QChartView* chartView() const { return chartView_; }
  /// Bytes handed to each (group, op) per step: one category per (group, op), and the bar sets
  /// "S<stage> predicted", "S<stage> measured" for every measured stage.
  [[nodiscard]] QChartView* communicationChartView() const { return commView_; }
  /// The communication chart's categories as "<group> <op>" (the axis breaks them into lines).
  [[nodiscard]] QStringList communicationCategories() const { return commLabels_; }
  [[nodiscard]] QTableWidget* errorTable() const { return errors_; }
  [[nodiscard]] QString logText() const;
  /// Time, losses and run facts of the loaded result, as shown above the error table.
  [[nodiscard]] QString summaryText() const;
  /// Bytes per unit of the memory chart's axis: the report's unit (ValidationReport::in_gib, the
  /// unit of `distplan validate --format table`), 2^30 (GiB) or 2^20 (MiB) for small models.
  [[nodiscard]] double memoryUnitBytes() const { return memoryUnit_; }
  /// Draws the communication chart on a log axis (small DP bars beside TP ones).
  void setCommunicationLogScale(bool on);
  [[nodiscard]] bool communicationLogScale() const;

  void setCliPath(const QString& path);
  [[nodiscard]] QString cliPath() const;
  /// The CLI a run starts: `distplan` next to this program, in the build tree's cli/ beside it
  /// (build/gui and build/cli), or on PATH; empty when none is found.
  [[nodiscard]] static QString defaultCliPath();

 signals:
  void resultLoaded();
  /// A run ended; `loaded` is true when its output was a result the view now shows.
  void runFinished(int exitCode, bool loaded);

 private:
  void finishRun(int exitCode);
  void showMemory(const backend::ValidationReport& r);
  void showCommunication(const backend::ValidationReport& r);
  void showSummary(const backend::ValidationReport& r);
  void showErrors(const backend::ValidationReport& r);
  void rebuildCommunicationChart();

  QByteArray scenario_;
  // The communication chart: one category per "<group> <op>", one predicted and one measured
  // bar per measured stage, bytes per step ([stage index][category]).
  QStringList commLabels_;
  std::vector<int> commStages_;
  std::vector<std::vector<double>> commPredicted_, commMeasured_;
  double memoryUnit_ = 1024.0 * 1024.0 * 1024.0;
  QLineEdit* cliPath_ = nullptr;
  QSpinBox* steps_ = nullptr;
  QPushButton* run_ = nullptr;
  QPushButton* stop_ = nullptr;
  QCheckBox* logScale_ = nullptr;
  QLabel* summary_ = nullptr;
  QPlainTextEdit* log_ = nullptr;
  QChart* chart_ = nullptr;
  QChartView* chartView_ = nullptr;
  QChart* commChart_ = nullptr;
  QChartView* commView_ = nullptr;
  QTableWidget* errors_ = nullptr;
  QProcess* process_ = nullptr;
  QTemporaryFile* scenarioFile_ = nullptr;
  QByteArray stdout_;
  QByteArray result_;  // the document on screen, as read
  QPushButton* save_ = nullptr;
  QByteArray stderrTail_;
};

}  // namespace distplan::gui
