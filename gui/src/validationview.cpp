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
#include <nlohmann/json.hpp>

#include "categories.h"
#include "chartexport.h"
#include "distplan/planner/error.h"
#include "distplan/planner/input_file.h"

namespace distplan::gui {

namespace {

using nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiBytes = 1024.0 * kMiB;

/// The stages of a memory object: `{"memory": {"stages": [...]}}` or `{"stages": [...]}`.
const json* stagesOf(const json& side) {
  if (side.contains("memory") && side["memory"].is_object() && side["memory"].contains("stages"))
    return &side["memory"]["stages"];
  if (side.contains("stages")) return &side["stages"];
  return nullptr;
}

double number(const json& obj, const char* key) {
  return obj.is_object() && obj.contains(key) && obj[key].is_number() ? obj[key].get<double>()
                                                                      : 0.0;
}

/// obj[key] as an integer, or `fallback` when obj is no object or the field no integer.
long long integer(const json& obj, const char* key, long long fallback) {
  return obj.is_object() && obj.contains(key) && obj[key].is_number_integer()
             ? obj[key].get<long long>()
             : fallback;
}

std::string str(const json& obj, const char* key, const std::string& fallback) {
  return obj.is_object() && obj.contains(key) && obj[key].is_string() ? obj[key].get<std::string>()
                                                                      : fallback;
}

const json& at(const json& obj, std::initializer_list<const char*> path) {
  static const json kNull;
  const json* node = &obj;
  for (const char* key : path) {
    if (!node->is_object() || !node->contains(key)) return kNull;
    node = &(*node)[key];
  }
  return *node;
}

/// Every numeric or null leaf under `node` (a null error: the figure has no predicted value),
/// with its path; a per-stage entry is named by its stage ("memory/stage 1/weights_bytes") and its
/// "stage" number is not a figure.
void flatten(const json& node, const std::string& path,
             std::vector<std::pair<std::string, json>>& out) {
  if (node.is_number() || node.is_null()) {
    out.emplace_back(path, node);
  } else if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it)
      flatten(it.value(), path + "/" + it.key(), out);
  } else if (node.is_array()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      const json& item = node[i];
      if (item.is_object() && item.contains("stage") && item["stage"].is_number_integer()) {
        json rest = item;
        rest.erase("stage");
        std::string base = path;
        if (base.size() >= 7 && base.compare(base.size() - 7, 7, "/stages") == 0)
          base.resize(base.size() - 7);
        flatten(rest, base + "/stage " + std::to_string(item["stage"].get<int>()), out);
      } else {
        flatten(item, path + "/" + std::to_string(i), out);
      }
    }
  }
}

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

/// Bytes per step of one stage's collectives, by "group op".
std::map<QString, double> bytesByOp(const json& stage) {
  std::map<QString, double> out;
  const json& list = at(stage, {"collectives"});
  if (!list.is_array()) return out;
  for (const json& c : list) {
    const QString key = QStringLiteral("%1 %2").arg(QString::fromStdString(str(c, "group", "?")),
                                                    QString::fromStdString(str(c, "op", "?")));
    out[key] += number(c, "bytes_per_step");
  }
  return out;
}

QString ms(double seconds) {
  return QStringLiteral("%1 ms").arg(seconds * 1e3, 0, 'f', 3);
}

QString percent(const json& value) {
  if (!value.is_number()) return QCoreApplication::translate("ValidationView", "n/a");
  return QStringLiteral("%1%2 %")
      .arg(value.get<double>() >= 0 ? QStringLiteral("+") : QString())
      .arg(value.get<double>() * 100, 0, 'f', 2);
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
  const json doc = json::parse(text.toStdString(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    log_->appendPlainText(tr("not a JSON document"));
    return false;
  }
  if (!doc.contains("predicted") || !doc.contains("measured") ||
      !at(doc, {"predicted", "memory"}).is_object() ||
      !at(doc, {"measured", "memory"}).is_object()) {
    log_->appendPlainText(tr("not a validation result: it needs predicted and measured memory"));
    return false;
  }
  const json& predictedSide = doc["predicted"];
  const json& measuredSide = doc["measured"];
  const json* predicted = stagesOf(predictedSide);
  const json* measured = stagesOf(measuredSide);
  const bool outOfMemory = at(measuredSide, {"memory", "fits"}) == json(false);

  // Memory: one stacked bar for each of predicted and measured per stage. Measured stages carry
  // their stage number (an emulated rank measures one stage only).
  chart_->removeAllSeries();
  for (QAbstractAxis* axis : chart_->axes()) {
    chart_->removeAxis(axis);
    delete axis;
  }
  std::vector<std::pair<const json*, const json*>> pairs;  // (predicted, measured) per stage
  QStringList labels;
  if (predicted && measured && predicted->is_array() && measured->is_array()) {
    for (std::size_t i = 0; i < measured->size(); ++i) {
      const json& m = (*measured)[i];
      const std::size_t stage =
          m.contains("stage") && m["stage"].is_number_integer() ? m["stage"].get<std::size_t>() : i;
      if (stage >= predicted->size()) continue;
      pairs.emplace_back(&(*predicted)[stage], &m);
      labels << tr("S%1<br>pred.").arg(stage) << tr("S%1<br>meas.").arg(stage);
    }
  }
  const std::vector<Segment> segments = memorySegments();
  double maxBytes = 0;
  std::vector<double> totals(2 * pairs.size(), 0.0);
  for (const Segment& seg : segments) {
    const std::string key = seg.key.toStdString() + "_bytes";
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      totals[2 * i] += number(*pairs[i].first, key.c_str());
      totals[2 * i + 1] += number(*pairs[i].second, key.c_str());
    }
  }
  for (double t : totals) maxBytes = std::max(maxBytes, t);
  // GiB for real models, MiB for the small ones a CPU runs (as `distplan validate` prints them).
  memoryUnit_ = maxBytes >= kGiBytes ? kGiBytes : kMiB;
  const QString unitName = memoryUnit_ == kGiBytes ? tr("GiB") : tr("MiB");
  auto* series = new QStackedBarSeries;
  for (const Segment& seg : segments) {
    auto* set = new QBarSet(seg.label);
    set->setColor(seg.color);
    set->setBorderColor(seg.color.darker(130));
    const std::string key = seg.key.toStdString() + "_bytes";
    for (const auto& [p, m] : pairs) {
      *set << number(*p, key.c_str()) / memoryUnit_ << number(*m, key.c_str()) / memoryUnit_;
    }
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

  // Communication: bytes handed per (group, op) and step, predicted beside measured per stage.
  commLabels_.clear();
  commStages_.clear();
  commPredicted_.clear();
  commMeasured_.clear();
  const json& pcs = at(predictedSide, {"communication", "stages"});
  const json& mcs = at(measuredSide, {"communication", "stages"});
  if (pcs.is_array() && mcs.is_array()) {
    std::vector<std::pair<std::map<QString, double>, std::map<QString, double>>> perStage;
    std::map<QString, bool> keys;
    for (const json& ms : mcs) {
      const long long stage = integer(ms, "stage", 0);
      const json* ps = nullptr;
      for (const json& p : pcs)
        if (integer(p, "stage", -1) == stage) ps = &p;
      perStage.emplace_back(ps ? bytesByOp(*ps) : std::map<QString, double>{}, bytesByOp(ms));
      commStages_.push_back(static_cast<int>(stage));
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
  }
  rebuildCommunicationChart();

  // Summary: the run, the step time, the losses.
  QStringList lines;
  const QString device = QString::fromStdString(str(doc, "device", "?"));
  const json& model = at(doc, {"scenario", "model"});
  QString modelName = tr("model");
  if (model.is_string()) modelName = QString::fromStdString(model.get<std::string>());
  if (model.is_object() && model.contains("name") && model["name"].is_string())
    modelName = QString::fromStdString(model["name"].get<std::string>());
  const json& par = at(doc, {"scenario", "parallel"});
  lines << tr("<b>%1</b> on %2, %3 rank(s), tp %4 · pp %5 · dp %6, %7 step(s)")
               .arg(modelName.toHtmlEscaped(), device)
               .arg(integer(doc, "ranks", 1))
               .arg(integer(par, "tp", 1))
               .arg(integer(par, "pp", 1))
               .arg(integer(par, "dp", 1))
               .arg(integer(doc, "steps", 0));
  if (doc.contains("emulate_rank") && doc["emulate_rank"].is_number_integer())
    lines << tr("Emulated rank %1 (collectives move no data)").arg(doc["emulate_rank"].get<int>());
  if (outOfMemory) {
    lines << tr("<b>Measured: does not fit</b> — %1")
                 .arg(QString::fromStdString(
                          at(measuredSide, {"memory", "message"}).is_string()
                              ? at(measuredSide, {"memory", "message"}).get<std::string>()
                              : std::string())
                          .toHtmlEscaped());
  }
  if (!pairs.empty()) {
    lines << tr("Memory without the runtime reserve (%1 %2 predicted; a host run has none); "
                "temporaries are measured only: the planner does not model them.")
                 .arg(number(*pairs.front().first, "runtime_bytes") / memoryUnit_, 0, 'f', 0)
                 .arg(unitName);
  }
  const json& ptime = at(predictedSide, {"time"});
  const json& mtime = at(measuredSide, {"time"});
  if (mtime.is_object()) {
    const double step = number(mtime, "step_seconds");
    const double opt = number(mtime, "optimizer_seconds");
    lines << tr("Step (simulated with measured pass times): predicted %1, measured %2 without "
                "the optimizer's %3 (%4)")
                 .arg(ms(number(ptime, "simulated_step_seconds")), ms(step - opt), ms(opt),
                      percent(at(doc, {"relative_error", "time", "simulated_step_seconds"})));
    lines << tr("Pipeline bubble: predicted %1 %, measured %2 %")
                 .arg(number(ptime, "simulated_bubble_fraction") * 100, 0, 'f', 1)
                 .arg(number(mtime, "bubble_fraction") * 100, 0, 'f', 1);
    const json& gpu = at(doc, {"scenario", "cluster", "gpu"});
    const std::string gpuName = gpu.is_string() ? gpu.get<std::string>() : str(gpu, "name", "?");
    lines << tr("Planner's analytic step on a %1: %2")
                 .arg(QString::fromStdString(gpuName).toHtmlEscaped(),
                      ms(number(ptime, "step_seconds")));
  }
  if (doc.contains("losses") && doc["losses"].is_array() && !doc["losses"].empty()) {
    QStringList losses;
    for (const json& l : doc["losses"])
      if (l.is_number()) losses << QString::number(l.get<double>(), 'f', 4);
    lines << tr("Loss per step: %1").arg(losses.join(QStringLiteral(" → ")));
  }
  // skipped_steps: one flag per step (fp16 loss scaling skipped the update on overflow).
  if (doc.contains("skipped_steps") && doc["skipped_steps"].is_array()) {
    int skipped = 0;
    for (const json& flag : doc["skipped_steps"]) skipped += flag == json(true) ? 1 : 0;
    if (skipped > 0) lines << tr("Skipped steps (fp16 overflow): %1").arg(skipped);
  }
  summary_->setText(lines.join(QStringLiteral("<br>")));

  // The relative errors the result reports (every number under its error object; null: n/a).
  // Time and memory first (the figures a person checks), then communication, then the rest.
  std::vector<std::pair<std::string, json>> rows;
  const json& err = at(doc, {"relative_error"});
  if (err.is_object()) {
    for (const char* key : {"time", "memory", "communication"})
      if (err.contains(key)) flatten(err[key], std::string("/") + key, rows);
    for (auto it = err.begin(); it != err.end(); ++it)
      if (it.key() != "time" && it.key() != "memory" && it.key() != "communication")
        flatten(it.value(), "/" + it.key(), rows);
  }
  errors_->setSortingEnabled(false);
  errors_->setRowCount(static_cast<int>(rows.size()));
  for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
    const auto& [path, value] = rows[static_cast<std::size_t>(i)];
    errors_->setItem(i, 0, new QTableWidgetItem(QString::fromStdString(path.substr(1))));
    auto* item = new QTableWidgetItem;
    if (value.is_number()) {
      const double v = value.get<double>();
      item->setData(Qt::DisplayRole, std::round(v * 1e5) / 1e3);  // percent, 3 decimals
      item->setData(Qt::ToolTipRole, percent(value));
      if (std::abs(v) > 0.10) item->setForeground(QColor(0xb0, 0x00, 0x20));
    } else {
      item->setData(Qt::DisplayRole, tr("n/a"));
      item->setData(Qt::ToolTipRole, tr("no prediction to compare with"));
    }
    errors_->setItem(i, 1, item);
  }
  // Rows stay in that order until a person sorts by a column.
  errors_->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  errors_->setSortingEnabled(true);
  result_ = text;
  save_->setEnabled(true);
  emit resultLoaded();
  return true;
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
