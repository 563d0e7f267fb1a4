#include "validationview.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QProcess>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QStackedBarSeries>
#include <QStandardPaths>
#include <QTableWidget>
#include <QTemporaryFile>
#include <QVBoxLayout>
#include <QValueAxis>
#include <nlohmann/json.hpp>

#include "categories.h"
#include "chartexport.h"

namespace distplan::gui {

namespace {

using nlohmann::json;

/// The stages of a memory object: `{"memory": {"stages": [...]}}` or `{"stages": [...]}`.
const json* stagesOf(const json& side) {
  if (side.contains("memory") && side["memory"].contains("stages"))
    return &side["memory"]["stages"];
  if (side.contains("stages")) return &side["stages"];
  return nullptr;
}

double number(const json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_number() ? obj[key].get<double>() : 0.0;
}

/// Every numeric leaf under `node`, with its JSON pointer.
void flatten(const json& node, const std::string& path,
             std::vector<std::pair<std::string, double>>& out) {
  if (node.is_number()) {
    out.emplace_back(path, node.get<double>());
  } else if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it)
      flatten(it.value(), path + "/" + it.key(), out);
  } else if (node.is_array()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      flatten(node[i], path + "/" + std::to_string(i), out);
  }
}

}  // namespace

ValidationView::ValidationView(QWidget* parent) : QWidget(parent) {
  auto* open = new QPushButton(tr("Open result…"), this);
  cliPath_ = new QLineEdit(defaultCliPath(), this);
  cliPath_->setPlaceholderText(tr("path to the distplan CLI"));
  steps_ = new QSpinBox(this);
  steps_->setRange(1, 1000);
  steps_->setValue(3);
  steps_->setPrefix(tr("steps "));
  run_ = new QPushButton(tr("Run on CPU"), this);
  stop_ = new QPushButton(tr("Stop"), this);
  stop_->setEnabled(false);
  auto* exportButton = new QPushButton(tr("Export chart…"), this);

  log_ = new QPlainTextEdit(this);
  log_->setReadOnly(true);
  log_->setMaximumBlockCount(5000);
  log_->setPlaceholderText(tr("Open a `distplan validate` result, or run one on the CPU."));
  QFont mono(QStringLiteral("DejaVu Sans Mono"));
  mono.setStyleHint(QFont::Monospace);
  log_->setFont(mono);

  chart_ = new QChart;
  chart_->setAnimationOptions(QChart::NoAnimation);
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chart_->setTitle(tr("Predicted against measured memory per GPU"));
  chartView_ = new QChartView(chart_, this);
  chartView_->setRenderHint(QPainter::Antialiasing);

  errors_ = new QTableWidget(0, 2, this);
  errors_->setHorizontalHeaderLabels({tr("Figure"), tr("Relative error")});
  errors_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  errors_->verticalHeader()->hide();
  errors_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  errors_->setSortingEnabled(true);

  connect(open, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Open validation result"), {},
                                                      tr("JSON (*.json);;All files (*)"));
    if (!path.isEmpty()) openFile(path);
  });
  connect(run_, &QPushButton::clicked, this, &ValidationView::startRun);
  connect(stop_, &QPushButton::clicked, this, [this] {
    if (process_) process_->kill();
  });
  connect(exportButton, &QPushButton::clicked, this,
          [this] { exportWidgetWithDialog(this, chartView_, QStringLiteral("validation")); });

  auto* controls = new QHBoxLayout;
  controls->addWidget(open);
  controls->addSpacing(16);
  controls->addWidget(new QLabel(tr("CLI:"), this));
  controls->addWidget(cliPath_, 1);
  controls->addWidget(steps_);
  controls->addWidget(run_);
  controls->addWidget(stop_);
  auto* right = new QSplitter(Qt::Vertical, this);
  right->addWidget(errors_);
  right->addWidget(log_);
  auto* splitter = new QSplitter(Qt::Horizontal, this);
  splitter->addWidget(chartView_);
  splitter->addWidget(right);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addWidget(splitter, 1);
  layout->addWidget(exportButton, 0, Qt::AlignRight);
}

ValidationView::~ValidationView() {
  if (process_) {
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(2000);
  }
}

QString ValidationView::defaultCliPath() {
  const QDir here(QCoreApplication::applicationDirPath());
  for (const QString& candidate :
       {here.filePath(QStringLiteral("distplan")), here.filePath(QStringLiteral("../cli/distplan")),
        here.filePath(QStringLiteral("../../cli/distplan"))}) {
    if (QFileInfo(candidate).isExecutable()) return QFileInfo(candidate).canonicalFilePath();
  }
  return QStandardPaths::findExecutable(QStringLiteral("distplan"));
}

void ValidationView::setScenarioDocument(const QByteArray& json) {
  scenario_ = json;
}

QString ValidationView::logText() const {
  return log_->toPlainText();
}

bool ValidationView::openFile(const QString& path) {
  QFile file(path);
  if (!file.open(QIODevice::ReadOnly)) {
    log_->appendPlainText(tr("cannot open %1: %2").arg(path, file.errorString()));
    return false;
  }
  return loadResult(file.readAll());
}

bool ValidationView::loadResult(const QByteArray& text) {
  const json doc = json::parse(text.toStdString(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    log_->appendPlainText(tr("not a JSON document"));
    return false;
  }
  const json* predicted = doc.contains("predicted") ? stagesOf(doc["predicted"]) : nullptr;
  const json* measured = doc.contains("measured") ? stagesOf(doc["measured"]) : nullptr;
  if (!predicted || !measured) {
    log_->appendPlainText(tr("not a validation result: it needs predicted and measured memory"));
    return false;
  }

  // One stacked bar for each of predicted and measured per stage, stacked by category.
  chart_->removeAllSeries();
  for (QAbstractAxis* axis : chart_->axes()) {
    chart_->removeAxis(axis);
    delete axis;
  }
  auto* series = new QStackedBarSeries;
  QStringList labels;
  const std::size_t stages = std::min(predicted->size(), measured->size());
  for (std::size_t i = 0; i < stages; ++i) {
    labels << tr("S%1 predicted").arg(i) << tr("S%1 measured").arg(i);
  }
  double maxGiB = 0;
  std::vector<double> totals(2 * stages, 0.0);
  for (MemoryCategory c : kMemoryCategories) {
    auto* set = new QBarSet(categoryLabel(c));
    set->setColor(categoryColor(c));
    set->setBorderColor(categoryColor(c).darker(130));
    const std::string key = categoryKey(c).toStdString() + "_bytes";
    for (std::size_t i = 0; i < stages; ++i) {
      const double p = number((*predicted)[i], key.c_str()) / kGiB;
      const double m = number((*measured)[i], key.c_str()) / kGiB;
      *set << p << m;
      totals[2 * i] += p;
      totals[2 * i + 1] += m;
    }
    series->append(set);
  }
  for (double t : totals) maxGiB = std::max(maxGiB, t);
  chart_->addSeries(series);
  auto* x = new QBarCategoryAxis;
  x->append(labels);
  auto* y = new QValueAxis;
  y->setTitleText(tr("GiB per GPU"));
  y->setRange(0, maxGiB > 0 ? maxGiB * 1.1 : 1.0);
  y->applyNiceNumbers();
  chart_->addAxis(x, Qt::AlignBottom);
  chart_->addAxis(y, Qt::AlignLeft);
  series->attachAxis(x);
  series->attachAxis(y);

  // The relative errors the result reports (every number under its error object).
  std::vector<std::pair<std::string, double>> rows;
  for (const char* key : {"relative_error", "relative_errors", "errors", "error"}) {
    if (doc.contains(key)) flatten(doc[key], std::string("/") + key, rows);
  }
  errors_->setSortingEnabled(false);
  errors_->setRowCount(static_cast<int>(rows.size()));
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const auto& [path, value] = rows[static_cast<std::size_t>(i)];
    errors_->setItem(i, 0, new QTableWidgetItem(QString::fromStdString(path)));
    auto* item = new QTableWidgetItem;
    item->setData(Qt::DisplayRole, value * 100);
    item->setData(Qt::ToolTipRole, tr("%1 %").arg(value * 100, 0, 'f', 3));
    if (std::abs(value) > 0.10) item->setForeground(QColor(0xb0, 0x00, 0x20));
    errors_->setItem(i, 1, item);
  }
  errors_->setHorizontalHeaderLabels({tr("Figure"), tr("Relative error (%)")});
  errors_->setSortingEnabled(true);
  emit resultLoaded();
  return true;
}

void ValidationView::startRun() {
  if (process_) return;
  const QString cli = cliPath_->text();
  if (cli.isEmpty() || !QFileInfo(cli).isExecutable()) {
    log_->appendPlainText(tr("no distplan CLI at \"%1\"").arg(cli));
    return;
  }
  delete scenarioFile_;
  scenarioFile_ =
      new QTemporaryFile(QDir::tempPath() + QStringLiteral("/distplan-XXXXXX.json"), this);
  if (!scenarioFile_->open() || scenarioFile_->write(scenario_) != scenario_.size()) {
    log_->appendPlainText(tr("cannot write the scenario to a temporary file"));
    return;
  }
  scenarioFile_->flush();
  stdout_.clear();
  process_ = new QProcess(this);
  connect(process_, &QProcess::readyReadStandardOutput, this, [this] {
    const QByteArray chunk = process_->readAllStandardOutput();
    stdout_ += chunk;
  });
  connect(process_, &QProcess::readyReadStandardError, this, [this] {
    log_->appendPlainText(QString::fromUtf8(process_->readAllStandardError()).trimmed());
  });
  connect(process_, &QProcess::finished, this,
          [this](int exitCode, QProcess::ExitStatus) { runFinished(exitCode); });
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError) {
    log_->appendPlainText(tr("process error: %1").arg(process_->errorString()));
  });
  const QStringList args{
      QStringLiteral("validate"), QStringLiteral("--device"),       QStringLiteral("cpu"),
      QStringLiteral("--steps"),  QString::number(steps_->value()), scenarioFile_->fileName()};
  log_->appendPlainText(QStringLiteral("$ %1 %2").arg(cli, args.join(QLatin1Char(' '))));
  run_->setEnabled(false);
  stop_->setEnabled(true);
  process_->start(cli, args);
}

void ValidationView::runFinished(int exitCode) {
  log_->appendPlainText(tr("exit code %1").arg(exitCode));
  run_->setEnabled(true);
  stop_->setEnabled(false);
  process_->deleteLater();
  process_ = nullptr;
  if (exitCode == 0) loadResult(stdout_);
}

}  // namespace distplan::gui
