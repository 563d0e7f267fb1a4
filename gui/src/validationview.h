// Validation tab: opens a `distplan validate` result (distplan.validate/v1), or runs one on the CPU
// through the CLI as a subprocess with its log streaming; shows predicted against measured memory
// per stage and category (the memory chart's colours) and the relative error of every figure.
#pragma once

#include <QByteArray>
#include <QWidget>

class QChart;
class QChartView;
class QLineEdit;
class QPlainTextEdit;
class QProcess;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QTemporaryFile;

namespace distplan::gui {

class ValidationView : public QWidget {
  Q_OBJECT

 public:
  explicit ValidationView(QWidget* parent = nullptr);
  ~ValidationView() override;

  /// The scenario a run validates (a scenario JSON document).
  void setScenarioDocument(const QByteArray& json);
  /// Shows a validate result; returns false (and says why in the log) when it cannot be read.
  bool loadResult(const QByteArray& json);
  bool openFile(const QString& path);
  void startRun();

  [[nodiscard]] QChartView* chartView() const { return chartView_; }
  [[nodiscard]] QTableWidget* errorTable() const { return errors_; }
  [[nodiscard]] QString logText() const;
  /// The CLI the run starts: next to this program, in the build tree, or on PATH.
  [[nodiscard]] static QString defaultCliPath();

 signals:
  void resultLoaded();

 private:
  void runFinished(int exitCode);

  QByteArray scenario_;
  QLineEdit* cliPath_ = nullptr;
  QSpinBox* steps_ = nullptr;
  QPushButton* run_ = nullptr;
  QPushButton* stop_ = nullptr;
  QPlainTextEdit* log_ = nullptr;
  QChart* chart_ = nullptr;
  QChartView* chartView_ = nullptr;
  QTableWidget* errors_ = nullptr;
  QProcess* process_ = nullptr;
  QTemporaryFile* scenarioFile_ = nullptr;
  QByteArray stdout_;
};

}  // namespace distplan::gui
