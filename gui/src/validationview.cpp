#include "validationview.h"

#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QLogValueAxis>
#include <QPlainTextEdit>
#include <QProcess>
#include <QProcessEnvironment>
#include <QPushButton>
#include <QSaveFile>
#include <QSpinBox>
#include <QSplitter>
#include <QStackedBarSeries>
#include <QStandardPaths>
#include <QTableWidget>
#include <QTemporaryFile>
#include <QTimer>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#ifdef Q_OS_LINUX
#include <sys/types.h>
#include <csignal>
#endif
#include <cmath>
#include <map>

#include "categories.h"
#include "chartexport.h"
#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/error.h"
#include "distplan/planner/input_file.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::gui {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiBytes = 1024.0 * kMiB;

/// One stacked segment of the memory chart: the planner's categories less the runtime reserve
/// (a host run has no device runtime; validate compares the predicted total without it), plus the
/// measured `temporaries` the planner does not model.
struct Segment {
  QString key;
  QString label;
  QColor color;
};

std::vector<Segment> memorySegments() {
  std::vector<Segment> out;
  for (MemoryCategory c : kMemoryCategories) {
    if (c == MemoryCategory::runtime) continue;
    out.push_back({categoryKey(c), categoryLabel(c), categoryColor(c)});
  }
  out.push_back({QStringLiteral("temporaries"),
                 QCoreApplication::translate("ValidationView", "Temporaries"),
                 QColor(0xba, 0xb0, 0xac)});
  return out;
}

QString ms(double seconds) {
  return QStringLiteral("%1 ms").arg(seconds * 1e3, 0, 'f', 3);
}

QString percent(const backend::RelativeError& value) {
  if (!value) return QCoreApplication::translate("ValidationView", "n/a");
  return QStringLiteral("%1%2 %")
      .arg(*value >= 0 ? QStringLiteral("+") : QString())
      .arg(*value * 100, 0, 'f', 2);
}

/// The relative errors of a report as the rows of the error table: the figure's place in the
/// validate/v1 document's `relative_error` ("memory/stage 1/weights_bytes"; a per-stage entry
/// named by its stage), time first, then memory, then communication (the figures a person checks
/// first), each in the document's key order. Null: the figure has no prediction (n/a).
std::vector<std::pair<QString, backend::RelativeError>> errorRows(
    const backend::ValidationReport& r) {
  std::vector<std::pair<QString, backend::RelativeError>> rows;
  auto add = [&rows](const QString& path, const backend::RelativeError& e) {
    rows.emplace_back(path, e);
  };
  if (!r.fits) {
    add(QStringLiteral("memory/fits"), r.estimate.memory.fits ? 1.0 : 0.0);
    return rows;
  }
  if (r.bubble_error) add(QStringLiteral("time/bubble_fraction"), *r.bubble_error);
  add(QStringLiteral("time/simulated_step_seconds"), r.simulated_step_error);
  if (r.step_error) add(QStringLiteral("time/step_seconds"), *r.step_error);
  add(QStringLiteral("memory/peak_bytes"), r.peak_error);
  for (const backend::StageMemoryError& es : r.memory_error)
    for (const auto& [category, e] : es.by_category)  // by name, as the document's keys
      add(QStringLiteral("memory/stage %1/%2_bytes")
              .arg(es.stage)
              .arg(QString::fromStdString(category)),
          e);
  for (const backend::StageCollectivesError& ec : r.collectives_error) {
    for (const auto& [op, e] : ec.by_op)
      add(QStringLiteral("communication/stage %1/collectives/%2")
              .arg(ec.stage)
              .arg(QString::fromStdString(op)),
          e);
    add(QStringLiteral("communication/stage %1/wire_bytes_per_gpu_per_step").arg(ec.stage),
        ec.wire_bytes_per_gpu_per_step);
  }
  return rows;
}

/// Bytes per step of one stage's collectives by "group op" (the report's "group/op").
std::map<QString, double> bytesByOp(const backend::StageCollectives& stage) {
  std::map<QString, double> out;
  for (const auto& [key, totals] : stage.by_op)
    out[QString::fromStdString(key).replace(QLatin1Char('/'), QLatin1Char(' '))] =
        static_cast<double>(totals.bytes);
  return out;
}

/// The processes whose parent is `parent`, from /proc ("pid (comm) state ppid ...").
std::vector<pid_t> childrenOf(qint64 parent) {
  std::vector<pid_t> out;
#ifdef Q_OS_LINUX
  for (const QString& entry : QDir(QStringLiteral("/proc")).entryList(QDir::Dirs)) {
    bool numeric = false;
    const pid_t pid = static_cast<pid_t>(entry.toLongLong(&numeric));
    if (!numeric) continue;
    QFile stat(QStringLiteral("/proc/%1/stat").arg(entry));
    if (!stat.open(QIODevice::ReadOnly)) continue;
    const QByteArray line = stat.readAll();
    const QList<QByteArray> fields = line.mid(line.lastIndexOf(')') + 2).split(' ');
    if (fields.size() > 1 && fields[1].toLongLong() == parent) out.push_back(pid);
  }
#else
  Q_UNUSED(parent);
#endif
  return out;
}

/// Stops a `distplan validate` run. The CLI starts mpirun in a process group of its own
/// (cli/src/cmd_validate.cpp) and Open MPI gives each rank its own group: killing the CLI alone
/// leaves them running. mpirun's group gets SIGTERM (mpirun stops its ranks), the CLI SIGKILL,
/// and every group of mpirun and its ranks SIGKILL 3 s later.
void stopProcessTree(QProcess* process) {
#ifdef Q_OS_LINUX
  std::vector<pid_t> launchers, groups;
  if (process->processId() > 0) {
    for (pid_t launcher : childrenOf(process->processId())) {
      launchers.push_back(launcher);
      groups.push_back(launcher);
      for (pid_t rank : childrenOf(launcher)) groups.push_back(rank);
    }
  }
  for (pid_t group : launchers) ::kill(-group, SIGTERM);
  process->kill();
  if (!groups.empty()) {
    QTimer::singleShot(3000, [groups] {
      for (pid_t group : groups) ::kill(-group, SIGKILL);
    });
  }
#else
  process->kill();
#endif
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
  run_->setToolTip(
      tr("distplan validate --device cpu on the scenario being edited (mpirun starts "
         "one process per rank)"));
  stop_ = new QPushButton(tr("Stop"), this);
  stop_->setEnabled(false);
  auto* exportButton = new QPushButton(tr("Export chart…"), this);
  save_ = new QPushButton(tr("Save result…"), this);
  save_->setToolTip(tr("Save the result on screen as distplan.validate/v1 JSON"));
  save_->setEnabled(false);

  log_ = new QPlainTextEdit(this);
  log_->setReadOnly(true);
  log_->setMaximumBlockCount(5000);
  log_->setPlaceholderText(tr("Open a `distplan validate` result, or run one on the CPU."));
  QFont mono(QStringLiteral("DejaVu Sans Mono"));
  mono.setStyleHint(QFont::Monospace);
  log_->setFont(mono);

  chart_ = new QChart;
  chart_->setAnimationOptions(QChart::NoAnimation);
  chart_->legend()->setAlignment(Qt::AlignRight);
  chart_->setTitle(tr("Memory per GPU, predicted and measured"));
  chartView_ = new QChartView(chart_, this);
  chartView_->setRenderHint(QPainter::Antialiasing);
  chartView_->setMinimumHeight(260);

  commChart_ = new QChart;
  commChart_->setAnimationOptions(QChart::NoAnimation);
  commChart_->legend()->setAlignment(Qt::AlignBottom);
  commChart_->setTitle(tr("Bytes handed to collectives"));
  commView_ = new QChartView(commChart_, this);
  commView_->setRenderHint(QPainter::Antialiasing);
  commView_->setMinimumHeight(220);
  logScale_ = new QCheckBox(tr("Log scale"), this);
  logScale_->setToolTip(tr("Small data-parallel bars stay visible beside tensor-parallel ones"));

  summary_ = new QLabel(this);
  summary_->setTextFormat(Qt::RichText);
  summary_->setWordWrap(true);
  summary_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);

  errors_ = new QTableWidget(0, 2, this);
  errors_->setHorizontalHeaderLabels({tr("Figure"), tr("Relative error (%)")});
  errors_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  errors_->horizontalHeader()->setSectionResizeMode(1, QHeaderView::ResizeToContents);
  errors_->verticalHeader()->setDefaultSectionSize(errors_->fontMetrics().height() + 6);
  errors_->verticalHeader()->hide();
  errors_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  errors_->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  errors_->setSortingEnabled(true);

  connect(open, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Open validation result"), {},
                                                      tr("JSON (*.json);;All files (*)"));
    if (!path.isEmpty()) openFile(path);
  });
  connect(run_, &QPushButton::clicked, this, [this] { startRun(); });
  connect(stop_, &QPushButton::clicked, this, &ValidationView::stopRun);
  connect(logScale_, &QCheckBox::toggled, this, [this] { rebuildCommunicationChart(); });
  connect(save_, &QPushButton::clicked, this, [this] {
    const QString path =
        QFileDialog::getSaveFileName(this, tr("Save validation result"),
                                     QStringLiteral("validation.result.json"), tr("JSON (*.json)"));
    if (!path.isEmpty()) saveResult(path);
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

  auto* commBox = new QWidget(this);
  auto* commLayout = new QVBoxLayout(commBox);
  commLayout->setContentsMargins(0, 0, 0, 0);
  commLayout->addWidget(commView_, 1);
  commLayout->addWidget(logScale_, 0, Qt::AlignRight);
  // Charts side by side on top; the run's summary, the error table and the log below.
  auto* charts = new QSplitter(Qt::Horizontal, this);
  charts->addWidget(chartView_);
  charts->addWidget(commBox);
  charts->setSizes({440, 560});
  auto* figures = new QWidget(this);
  auto* figuresLayout = new QVBoxLayout(figures);
  figuresLayout->setContentsMargins(0, 0, 0, 0);
  figuresLayout->addWidget(summary_);
  figuresLayout->addWidget(errors_, 1);
  auto* details = new QSplitter(Qt::Horizontal, this);
  details->addWidget(figures);
  details->addWidget(log_);
  details->setSizes({600, 400});
  auto* splitter = new QSplitter(Qt::Vertical, this);
  splitter->addWidget(charts);
  splitter->addWidget(details);
  splitter->setSizes({550, 450});
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addWidget(splitter, 1);
  auto* bottom = new QHBoxLayout;
  bottom->addStretch(1);
  bottom->addWidget(save_);
  bottom->addWidget(exportButton);
  layout->addLayout(bottom);
}

ValidationView::~ValidationView() {
  if (process_) {
    process_->disconnect(this);
    stopProcessTree(process_);
    process_->waitForFinished(2000);
  }
}

void ValidationView::stopRun() {
  if (!process_) return;
  log_->appendPlainText(tr("stopping the run and its ranks"));
  stopProcessTree(process_);
}

QString ValidationView::defaultCliPath() {
  const QDir here(QCoreApplication::applicationDirPath());
  // build/gui/distplan-gui beside build/cli/distplan; tests run from build/tests/gui.
  for (const QString& candidate :
       {here.filePath(QStringLiteral("distplan")), here.filePath(QStringLiteral("../cli/distplan")),
        here.filePath(QStringLiteral("../../cli/distplan"))}) {
    const QFileInfo info(candidate);
    if (info.isFile() && info.isExecutable()) return info.canonicalFilePath();
  }
  return QStandardPaths::findExecutable(QStringLiteral("distplan"));
}

void ValidationView::setCliPath(const QString& path) {
  cliPath_->setText(path);
}

QString ValidationView::cliPath() const {
  return cliPath_->text();
}

void ValidationView::setScenarioDocument(const QByteArray& json) {
  scenario_ = json;
}

QString ValidationView::logText() const {
  return log_->toPlainText();
}

QString ValidationView::summaryText() const {
  return summary_->text();
}

bool ValidationView::communicationLogScale() const {
  return logScale_->isChecked();
}

void ValidationView::setCommunicationLogScale(bool on) {
  logScale_->setChecked(on);  // toggled() rebuilds when the state changes
}

bool ValidationView::openFile(const QString& path) {
  std::string text;
  try {
    // The scenario reader's bound: a result is a few kB, /dev/zero is not.
    text = read_input_file(QFile::encodeName(path).toStdString(), "validation result");
  } catch (const InputError& e) {
    log_->appendPlainText(QString::fromUtf8(e.what()));
    return false;
  }
  const bool ok = loadResult(QByteArray::fromStdString(text));
  if (ok) log_->appendPlainText(tr("opened %1").arg(QDir::toNativeSeparators(path)));
  return ok;
}

bool ValidationView::saveResult(const QString& path) {
  if (result_.isEmpty()) return false;
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly) || file.write(result_) != result_.size() || !file.commit()) {
    log_->appendPlainText(tr("cannot write %1: %2").arg(path, file.errorString()));
    return false;
  }
  log_->appendPlainText(tr("saved %1").arg(QDir::toNativeSeparators(path)));
  return true;
}

bool ValidationView::loadResult(const QByteArray& text) {
  // The library reads the document into the typed report `distplan validate` printed it from
  // (validation_report.h); a bad or stale document is refused there, at its JSON path.
  backend::ValidationReport r;
  try {
    r = backend::validation_report_from_json(parse_json_text(text.toStdString()));
  } catch (const InputError& e) {
    const QString what = QString::fromUtf8(e.what());
    log_->appendPlainText(
        e.path().empty()
            ? tr("not a validation result: %1").arg(what)
            : tr("not a validation result: %1: %2").arg(QString::fromStdString(e.path()), what));
    return false;
  } catch (const std::exception& e) {
    log_->appendPlainText(tr("not a validation result: %1").arg(QString::fromUtf8(e.what())));
    return false;
  }
  showMemory(r);
  showCommunication(r);
  showSummary(r);
  showErrors(r);
  result_ = text;
  save_->setEnabled(true);
  emit resultLoaded();
  return true;
}

void ValidationView::showMemory(const backend::ValidationReport& r) {
  // One stacked bar for each of predicted and measured per measured stage (an emulated rank
  // measures one stage only): the plan's categories less the runtime reserve, then the measured
  // temporaries the planner does not model.
  chart_->removeAllSeries();
  for (QAbstractAxis* axis : chart_->axes()) {
    chart_->removeAxis(axis);
    delete axis;
  }
  QStringList labels;
  for (const backend::StageMemoryMeasured& ms : r.memory)
    labels << tr("S%1<br>pred.").arg(ms.stage) << tr("S%1<br>meas.").arg(ms.stage);
  const std::vector<Segment> segments = memorySegments();
  // Bytes of one segment: the plan's stage memory (nothing planned for temporaries), or measured.
  auto predicted = [&r](const backend::StageMemoryMeasured& ms, const Segment& seg) {
    const StageMemory& ps = r.estimate.memory.stages[static_cast<std::size_t>(ms.stage)];
    for (MemoryCategory c : kMemoryCategories)
      if (categoryKey(c) == seg.key) return static_cast<double>(categoryBytes(ps, c));
    return 0.0;
  };
  auto measured = [](const backend::StageMemoryMeasured& ms, const Segment& seg) {
    return static_cast<double>(ms.bytes.at(seg.key.toStdString()));
  };
  double maxBytes = 0;
  for (const backend::StageMemoryMeasured& ms : r.memory) {
    double p = 0, m = 0;
    for (const Segment& seg : segments) {
      p += predicted(ms, seg);
      m += measured(ms, seg);
    }
    maxBytes = std::max({maxBytes, p, m});
  }
  // GiB for real models, MiB for the small ones a CPU runs: the unit `distplan validate` prints.
  memoryUnit_ = r.in_gib ? kGiBytes : kMiB;
  const QString unitName = r.in_gib ? tr("GiB") : tr("MiB");
  auto* series = new QStackedBarSeries;
  for (const Segment& seg : segments) {
    auto* set = new QBarSet(seg.label);
    set->setColor(seg.color);
    set->setBorderColor(seg.color.darker(130));
    for (const backend::StageMemoryMeasured& ms : r.memory)
      *set << predicted(ms, seg) / memoryUnit_ << measured(ms, seg) / memoryUnit_;
    series->append(set);
  }
  chart_->addSeries(series);
  auto* x = new QBarCategoryAxis;
  x->append(labels);
  x->setTitleText(tr("stage: predicted, measured"));
  auto* y = new QValueAxis;
  y->setTitleText(tr("%1 per GPU").arg(unitName));
  y->setLabelFormat(QStringLiteral("%.3g"));
  y->setRange(0, maxBytes > 0 ? maxBytes / memoryUnit_ * 1.1 : 1.0);
  y->applyNiceNumbers();
  chart_->addAxis(x, Qt::AlignBottom);
  chart_->addAxis(y, Qt::AlignLeft);
  series->attachAxis(x);
  series->attachAxis(y);
}

void ValidationView::showCommunication(const backend::ValidationReport& r) {
  // Bytes handed per (group, op) and step, predicted beside measured per measured stage (the
  // report lists the planned and the measured collectives of the same stages, entry by entry).
  commLabels_.clear();
  commStages_.clear();
  commPredicted_.clear();
  commMeasured_.clear();
  std::vector<std::pair<std::map<QString, double>, std::map<QString, double>>> perStage;
  std::map<QString, bool> keys;
  for (std::size_t i = 0; i < r.measured_collectives.size(); ++i) {
    perStage.emplace_back(bytesByOp(r.predicted_collectives[i]),
                          bytesByOp(r.measured_collectives[i]));
    commStages_.push_back(r.measured_collectives[i].stage);
    for (const auto& [k, unused] : perStage.back().first) keys[k] = true;
    for (const auto& [k, unused] : perStage.back().second) keys[k] = true;
  }
  for (const auto& [k, unused] : keys) commLabels_ << k;
  for (const auto& [pm, mm] : perStage) {
    commPredicted_.emplace_back();
    commMeasured_.emplace_back();
    for (const QString& k : commLabels_) {
      commPredicted_.back().push_back(pm.count(k) ? pm.at(k) : 0.0);
      commMeasured_.back().push_back(mm.count(k) ? mm.at(k) : 0.0);
    }
  }
  rebuildCommunicationChart();
}

void ValidationView::showSummary(const backend::ValidationReport& r) {
  // The run, the step time, the losses.
  const Scenario& s = r.scenario;
  QStringList lines;
  const QString modelName =
      s.model.name.empty() ? tr("model") : QString::fromStdString(s.model.name);
  lines << tr("<b>%1</b> on %2, %3 rank(s), tp %4 · pp %5 · dp %6, %7 step(s)")
               .arg(modelName.toHtmlEscaped(), QString::fromStdString(r.settings.device))
               .arg(r.ranks)
               .arg(s.parallel.tp)
               .arg(s.parallel.pp)
               .arg(s.parallel.dp)
               .arg(r.settings.steps);
  if (r.settings.emulate_rank >= 0)
    lines << tr("Emulated rank %1 (collectives move no data)").arg(r.settings.emulate_rank);
  if (!r.fits) {
    lines << tr("<b>Measured: does not fit</b> — %1")
                 .arg(QString::fromStdString(r.oom_message).toHtmlEscaped());
  }
  if (!r.memory.empty()) {
    const StageMemory& first =
        r.estimate.memory.stages[static_cast<std::size_t>(r.memory.front().stage)];
    lines << tr("Memory without the runtime reserve (%1 %2 predicted; a host run has none); "
                "temporaries are measured only: the planner does not model them.")
                 .arg(static_cast<double>(first.runtime_bytes) / memoryUnit_, 0, 'f', 0)
                 .arg(memoryUnit_ == kGiBytes ? tr("GiB") : tr("MiB"));
  }
  if (r.fits) {
    const double step = r.time.step_seconds;
    const double opt = r.time.optimizer_seconds;
    lines << tr("Step (simulated with measured pass times): predicted %1, measured %2 without "
                "the optimizer's %3 (%4)")
                 .arg(ms(r.simulated_step_seconds), ms(step - opt), ms(opt),
                      percent(r.simulated_step_error));
    lines << tr("Pipeline bubble: predicted %1 %, measured %2 %")
                 .arg(r.simulated_bubble_fraction * 100, 0, 'f', 1)
                 .arg(r.time.bubble_fraction * 100, 0, 'f', 1);
    lines << tr("Planner's analytic step on a %1: %2")
                 .arg(QString::fromStdString(s.cluster.gpu.name).toHtmlEscaped(),
                      ms(r.estimate.time.step_seconds));
  }
  if (!r.losses.empty()) {
    QStringList losses;
    for (double l : r.losses)
      if (!std::isnan(l)) losses << QString::number(l, 'f', 4);
    lines << tr("Loss per step: %1").arg(losses.join(QStringLiteral(" → ")));
  }
  // One flag per step (fp16 loss scaling skipped the update on overflow).
  const auto skipped = std::count(r.skipped.begin(), r.skipped.end(), true);
  if (skipped > 0) lines << tr("Skipped steps (fp16 overflow): %1").arg(skipped);
  summary_->setText(lines.join(QStringLiteral("<br>")));
}

void ValidationView::showErrors(const backend::ValidationReport& r) {
  const std::vector<std::pair<QString, backend::RelativeError>> rows = errorRows(r);
  errors_->setSortingEnabled(false);
  errors_->setRowCount(static_cast<int>(rows.size()));
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const auto& [path, value] = rows[static_cast<std::size_t>(i)];
    errors_->setItem(i, 0, new QTableWidgetItem(path));
    auto* item = new QTableWidgetItem;
    if (value) {
      item->setData(Qt::DisplayRole, std::round(*value * 1e5) / 1e3);  // percent, 3 decimals
      item->setData(Qt::ToolTipRole, percent(value));
      if (std::abs(*value) > 0.10) item->setForeground(QColor(0xb0, 0x00, 0x20));
    } else {
      item->setData(Qt::DisplayRole, tr("n/a"));
      item->setData(Qt::ToolTipRole, tr("no prediction to compare with"));
    }
    errors_->setItem(i, 1, item);
  }
  // Rows stay in that order until a person sorts by a column.
  errors_->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  errors_->setSortingEnabled(true);
}

void ValidationView::rebuildCommunicationChart() {
  commChart_->removeAllSeries();
  for (QAbstractAxis* axis : commChart_->axes()) {
    commChart_->removeAxis(axis);
    delete axis;
  }
  const bool log = logScale_->isChecked();
  double maxBytes = 0, minPositive = 0;
  for (const auto* side : {&commPredicted_, &commMeasured_}) {
    for (const std::vector<double>& values : *side) {
      for (double v : values) {
        maxBytes = std::max(maxBytes, v);
        if (v > 0 && (minPositive == 0 || v < minPositive)) minPositive = v;
      }
    }
  }
  const double unit = maxBytes >= kGiBytes ? kGiBytes : kMiB;
  const QString unitName = unit == kGiBytes ? tr("GiB") : tr("MiB");
  // A log axis cannot show zero: an absent collective is drawn at the axis floor.
  const double floor =
      log && minPositive > 0 ? std::pow(10.0, std::floor(std::log10(minPositive / unit))) : 0.0;
  // Stage s: a dark (predicted) and a light (measured) shade of its own hue.
  static const QColor kShades[][2] = {{QColor(0x4e, 0x79, 0xa7), QColor(0xa0, 0xcb, 0xe8)},
                                      {QColor(0xf2, 0x8e, 0x2b), QColor(0xff, 0xbe, 0x7d)},
                                      {QColor(0x59, 0xa1, 0x4f), QColor(0x8c, 0xd1, 0x7d)},
                                      {QColor(0xb0, 0x7a, 0xa1), QColor(0xd4, 0xa6, 0xc8)}};
  auto* series = new QBarSeries;
  for (std::size_t s = 0; s < commStages_.size(); ++s) {
    auto* predicted = new QBarSet(tr("S%1 predicted").arg(commStages_[s]));
    auto* measured = new QBarSet(tr("S%1 measured").arg(commStages_[s]));
    const auto& shade = kShades[s % std::size(kShades)];
    predicted->setColor(shade[0]);
    measured->setColor(shade[1]);
    predicted->setBorderColor(shade[0].darker(130));
    measured->setBorderColor(shade[0]);
    for (std::size_t k = 0; k < commPredicted_[s].size(); ++k) {
      *predicted << std::max(commPredicted_[s][k] / unit, floor);
      *measured << std::max(commMeasured_[s][k] / unit, floor);
    }
    series->append(predicted);
    series->append(measured);
  }
  commChart_->addSeries(series);
  auto* x = new QBarCategoryAxis;
  // The group over the op, the op broken at its word ("tp", "reduce-", "scatter"): a label is
  // cut to its category's width.
  QStringList twoLine;
  for (const QString& label : commLabels_) {
    twoLine << QString(label)
                   .replace(QLatin1Char(' '), QStringLiteral("<br>"))
                   .replace(QLatin1Char('_'), QStringLiteral("-<br>"));
  }
  x->append(twoLine);
  QFont small = x->labelsFont();
  small.setPointSizeF(small.pointSizeF() * 0.9);
  x->setLabelsFont(small);
  commChart_->addAxis(x, Qt::AlignBottom);
  series->attachAxis(x);
  const QString title = tr("%1 per GPU per step").arg(unitName);
  if (log && maxBytes > 0) {
    auto* y = new QLogValueAxis;
    y->setBase(10);
    y->setLabelFormat(QStringLiteral("%.3g"));
    y->setTitleText(title + tr(" (log)"));
    y->setRange(floor, std::pow(10.0, std::ceil(std::log10(maxBytes / unit * 1.5))));
    commChart_->addAxis(y, Qt::AlignLeft);
    series->attachAxis(y);
  } else {
    auto* y = new QValueAxis;
    y->setTitleText(title);
    y->setLabelFormat(QStringLiteral("%.3g"));
    y->setRange(0, maxBytes > 0 ? maxBytes / unit * 1.1 : 1.0);
    y->applyNiceNumbers();
    commChart_->addAxis(y, Qt::AlignLeft);
    series->attachAxis(y);
  }
}

bool ValidationView::startRun() {
  if (process_) return false;
  const QString cli = cliPath_->text();
  if (cli.isEmpty() || !QFileInfo(cli).isExecutable()) {
    log_->appendPlainText(tr("no distplan CLI at \"%1\"").arg(cli));
    return false;
  }
  if (scenario_.isEmpty()) {
    log_->appendPlainText(tr("no scenario to validate"));
    return false;
  }
  delete scenarioFile_;
  scenarioFile_ =
      new QTemporaryFile(QDir::tempPath() + QStringLiteral("/distplan-XXXXXX.json"), this);
  if (!scenarioFile_->open() || scenarioFile_->write(scenario_) != scenario_.size()) {
    log_->appendPlainText(tr("cannot write the scenario to a temporary file"));
    return false;
  }
  scenarioFile_->flush();
  stdout_.clear();
  stderrTail_.clear();
  process_ = new QProcess(this);
  // Local ranks talk through shared memory (TOOLCHAIN.md); the CLI sets the rest of Open MPI's
  // defaults itself.
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  if (!env.contains(QStringLiteral("OMPI_MCA_btl")))
    env.insert(QStringLiteral("OMPI_MCA_btl"), QStringLiteral("self,vader"));
  process_->setProcessEnvironment(env);
  connect(process_, &QProcess::readyReadStandardOutput, this,
          [this] { stdout_ += process_->readAllStandardOutput(); });
  connect(process_, &QProcess::readyReadStandardError, this, [this] {
    // Whole lines as they arrive; a partial line waits for its end.
    stderrTail_ += process_->readAllStandardError();
    const qsizetype end = stderrTail_.lastIndexOf('\n');
    if (end < 0) return;
    log_->appendPlainText(QString::fromUtf8(stderrTail_.left(end)));
    stderrTail_.remove(0, end + 1);
  });
  connect(process_, &QProcess::finished, this, [this](int exitCode, QProcess::ExitStatus status) {
    finishRun(status == QProcess::NormalExit ? exitCode : -1);
  });
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError error) {
    log_->appendPlainText(tr("process error: %1").arg(process_->errorString()));
    if (error == QProcess::FailedToStart) finishRun(-1);
  });
  const QStringList args{
      QStringLiteral("validate"), QStringLiteral("--device"),       QStringLiteral("cpu"),
      QStringLiteral("--steps"),  QString::number(steps_->value()), scenarioFile_->fileName()};
  log_->appendPlainText(QStringLiteral("$ %1 %2").arg(cli, args.join(QLatin1Char(' '))));
  run_->setEnabled(false);
  stop_->setEnabled(true);
  process_->start(cli, args);
  return true;
}

void ValidationView::finishRun(int exitCode) {
  if (!process_) return;
  if (!stderrTail_.isEmpty()) log_->appendPlainText(QString::fromUtf8(stderrTail_));
  stderrTail_.clear();
  log_->appendPlainText(exitCode >= 0 ? tr("exit code %1").arg(exitCode) : tr("stopped"));
  run_->setEnabled(true);
  stop_->setEnabled(false);
  process_->disconnect(this);
  process_->deleteLater();
  process_ = nullptr;
  const bool loaded = exitCode == 0 && loadResult(stdout_);
  emit runFinished(exitCode, loaded);
}

}  // namespace distplan::gui
