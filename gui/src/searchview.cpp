#include "searchview.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QCursor>
#include <QDoubleSpinBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QProgressBar>
#include <QPushButton>
#include <QScatterSeries>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QSplitter>
#include <QStyle>
#include <QTableView>
#include <QThread>
#include <QTimer>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>

#include "categories.h"
#include "chartexport.h"

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"

#ifdef DISTPLAN_GUI_HAVE_SEARCH
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#endif

namespace distplan::gui {

bool isSearchDocument(const nlohmann::json& doc) {
  if (!doc.is_object()) return false;
  if (doc.contains("search")) return true;
  if (const auto p = doc.find("parallel"); p != doc.end() && p->is_object()) {
    for (const auto& [key, v] : p->items()) {
      // Candidate lists; a plan's explicit splits are lists too.
      if (v.is_array() && key != "layers_per_stage" && key != "layers_per_virtual_stage")
        return true;
    }
  }
  if (const auto t = doc.find("training"); t != doc.end() && t->is_object()) {
    if (const auto mb = t->find("micro_batch_size"); mb != t->end() && mb->is_array()) return true;
  }
  return false;
}

/// Shared between the view and one worker thread; the worker writes, the view reads.
struct SearchView::Job {
  std::atomic<double> fraction{0};
  std::atomic<std::uint64_t> evaluated{0};
  std::atomic<bool> abandoned{false};
  std::mutex mutex;  // guards the fields below
  std::vector<SearchRow> rows;
  QString summary;
  QString error;
};

namespace {

/// A header that keeps room for the sort arrow only in the section that shows it. QHeaderView
/// widens every section by the arrow (a header's height and a margin, about 30 px) whenever
/// sorting is on; over 17 columns that is more than the split column needs to fit beside the
/// others at the default window size.
class CompactSortHeader : public QHeaderView {
 public:
  explicit CompactSortHeader(QWidget* parent) : QHeaderView(Qt::Horizontal, parent) {
    connect(this, &QHeaderView::sortIndicatorChanged, this, [this] { resizeSections(); });
  }

 protected:
  [[nodiscard]] QSize sectionSizeFromContents(int logicalIndex) const override {
    QSize size = QHeaderView::sectionSizeFromContents(logicalIndex);
    if (isSortIndicatorShown() && logicalIndex != sortIndicatorSection()) {
      // What QHeaderView added for the arrow; the label has the section to itself without one.
      size.rwidth() -= size.height() + style()->pixelMetric(QStyle::PM_HeaderMargin, nullptr, this);
    }
    return size;
  }
};

}  // namespace

SearchView::SearchView(QWidget* parent) : QWidget(parent) {
  objective_ = new QComboBox(this);
  objective_->addItem(tr("highest tokens/s"), 0);
  objective_->addItem(tr("lowest peak memory"), 1);
  objective_->addItem(tr("fewest GPUs reaching the target"), 2);
  topK_ = new QSpinBox(this);
  topK_->setRange(1, 10000);  // the search request's own bound on top_k
  topK_->setValue(50);
  topK_->setPrefix(tr("top "));
  // What fraction of the GPU's memory a plan must leave free (search.memory_margin): a layout at
  // 79.9 of 80 GiB fits on paper and not after a fragmentation spike.
  margin_ = new QDoubleSpinBox(this);
  margin_->setObjectName(QStringLiteral("memoryMargin"));
  margin_->setRange(0, 99);
  margin_->setDecimals(0);
  margin_->setSingleStep(5);
  margin_->setValue(0);
  margin_->setPrefix(tr("keep "));
  margin_->setSuffix(tr(" % free"));
  margin_->setToolTip(
      tr("Memory margin: a plan fits when its peak is at most this much below the GPU's memory "
         "(search.memory_margin)"));
  start_ = new QPushButton(tr("Search"), this);
  cancel_ = new QPushButton(tr("Cancel"), this);
  cancel_->setEnabled(false);
  progress_ = new QProgressBar(this);
  progress_->setRange(0, 1000);
  progress_->setValue(0);
  status_ = new QLabel(this);
  status_->setObjectName(QStringLiteral("searchStatus"));
  connect(start_, &QPushButton::clicked, this, &SearchView::startSearch);
  connect(cancel_, &QPushButton::clicked, this, &SearchView::cancelSearch);

  model_ = new SearchModel(this);
  proxy_ = new QSortFilterProxyModel(this);
  proxy_->setSourceModel(model_);
  proxy_->setSortRole(SearchModel::SortRole);
  table_ = new QTableView(this);
  table_->setHorizontalHeader(new CompactSortHeader(table_));
  table_->setModel(proxy_);
  table_->setSortingEnabled(true);
  table_->sortByColumn(SearchModel::RankColumn, Qt::AscendingOrder);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->verticalHeader()->hide();
  table_->setAlternatingRowColors(true);
  table_->setToolTip(tr("Double-click a plan to load it into the editor"));
  connect(table_, &QTableView::doubleClicked, this,
          [this](const QModelIndex& index) { emit planChosen(proxy_->mapToSource(index).row()); });

  chart_ = new QChart;
  chart_->setAnimationOptions(QChart::NoAnimation);
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chart_->setTitle(tr("Plans: peak memory against throughput"));
  chartView_ = new QChartView(chart_, this);
  chartView_->setRenderHint(QPainter::Antialiasing);
  auto* exportButton = new QPushButton(tr("Export chart…"), this);
  connect(exportButton, &QPushButton::clicked, this,
          [this] { exportWidgetWithDialog(this, chartView_, QStringLiteral("search")); });

  pollTimer_ = new QTimer(this);
  pollTimer_->setInterval(50);
  connect(pollTimer_, &QTimer::timeout, this, &SearchView::pollProgress);

  auto* controls = new QHBoxLayout;
  controls->addWidget(new QLabel(tr("Objective:"), this));
  controls->addWidget(objective_);
  controls->addWidget(topK_);
  controls->addWidget(margin_);
  controls->addWidget(start_);
  controls->addWidget(cancel_);
  controls->addWidget(progress_, 1);
  auto* splitter = new QSplitter(Qt::Vertical, this);
  splitter->addWidget(table_);
  splitter->addWidget(chartView_);
  splitter->setStretchFactor(0, 1);
  splitter->setStretchFactor(1, 1);
  splitter->setSizes({400, 400});
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addWidget(status_);
  layout->addWidget(splitter, 1);
  layout->addWidget(exportButton, 0, Qt::AlignRight);

  if (!searchAvailable()) {
    start_->setEnabled(false);
    status_->setText(tr("This build has no search library."));
  } else {
    status_->setText(tr("Search every layout of the current model, cluster and batch."));
  }
  showUsedAxes();
  rebuildChart();
}

SearchView::~SearchView() {
  // A worker still running reads nothing of the view, but its QThread must not be destroyed early.
  if (job_) job_->abandoned = true;
  for (QThread* t : threads_) {
    t->wait();
    delete t;
  }
}

bool SearchView::searchAvailable() {
#ifdef DISTPLAN_GUI_HAVE_SEARCH
  return true;
#else
  return false;
#endif
}

void SearchView::setBaseScenario(const Scenario& s) {
  base_ = s;
}

const Scenario* SearchView::requestBase() const {
#ifdef DISTPLAN_GUI_HAVE_SEARCH
  return request_ ? &request_->space.base : nullptr;
#else
  return nullptr;
#endif
}

void SearchView::setDocument(const nlohmann::json& doc) {
  if (doc.is_null()) {
    if (request_)
      status_->setText(tr("Search every layout of the current model, cluster and batch."));
    request_.reset();
    return;
  }
#ifdef DISTPLAN_GUI_HAVE_SEARCH
  auto request = std::make_shared<search::Request>(search::request_from_json(doc));
  objective_->setCurrentIndex(request->options.objective == search::Objective::memory ? 1
                              : request->options.objective == search::Objective::gpus ? 2
                                                                                      : 0);
  topK_->setValue(request->options.top_k);
  setMemoryMargin(request->options.memory_margin);
  request_ = std::move(request);
  if (!job_) status_->setText(tr("Search the candidates and constraints of the opened file."));
#else
  throw InputError("/search", "this build has no search library");
#endif
}

double SearchView::memoryMargin() const {
  return margin_->value() / 100;
}

void SearchView::setMemoryMargin(double fraction) {
  margin_->setValue(fraction * 100);
}

bool SearchView::isRunning() const {
  return job_ != nullptr;
}

QString SearchView::statusText() const {
  return status_->text();
}

void SearchView::setRunning(bool running) {
  start_->setEnabled(!running && searchAvailable());
  cancel_->setEnabled(running);
  objective_->setEnabled(!running);
  topK_->setEnabled(!running);
  margin_->setEnabled(!running);
  if (running) {
    pollTimer_->start();
  } else {
    pollTimer_->stop();
  }
}

void SearchView::startSearch() {
#ifdef DISTPLAN_GUI_HAVE_SEARCH
  if (job_ || (!base_ && !request_)) return;
  search::Space space;
  search::Options options;
  if (request_) {  // the opened file's candidates, constraints and options
    space = request_->space;
    options = request_->options;
  } else {
    space.base = *base_;
  }
  const int objective = objective_->currentData().toInt();
  if (objective == 2 && !(request_ && request_->options.objective == search::Objective::gpus)) {
    status_->setText(
        tr("The fewest-GPUs objective needs a target_tokens_per_second in the "
           "file's search object."));
    return;
  }
  options.objective = objective == 1   ? search::Objective::memory
                      : objective == 2 ? search::Objective::gpus
                                       : search::Objective::throughput;
  options.top_k = topK_->value();
  options.memory_margin = memoryMargin();
  marginUsed_ = options.memory_margin;
  auto job = std::make_shared<Job>();
  job_ = job;
  options.progress = [job](double fraction, std::uint64_t evaluated) {
    job->fraction = fraction;
    job->evaluated = evaluated;
  };
  QThread* thread = QThread::create([job, space = std::move(space), options]() {
    try {
      const search::Result result = search::run(space, options);
      std::vector<SearchRow> rows;
      int rank = 0;
      for (const search::Plan& p : result.plans) {
        SearchRow r;
        r.rank = ++rank;
        // The layout over the request's scenario, so a light-ends split is resolved against the
        // model (parallel_of() knows no model and gives the even split) and double-clicking the
        // row plans what the search planned.
        r.parallel = search::make_scenario(space.base, p.layout).parallel;
        r.light_ends = p.layout.split == search::SplitChoice::light_ends;
        r.shard_group = p.layout.fsdp_shard_size;
        r.micro_batch_size = p.layout.micro_batch_size;
        r.peak_bytes = p.figures.peak_bytes;
        r.capacity_bytes = p.figures.capacity_bytes;
        r.step_seconds = p.figures.step_seconds;
        r.tokens_per_second = p.figures.tokens_per_second;
        r.mfu = p.figures.mfu;
        r.bubble_fraction = p.bubble_fraction;
        rows.push_back(r);
      }
      std::uint64_t outOfMemory =
          result.rejected[static_cast<std::size_t>(search::Reject::out_of_memory)];
      QString summary = QObject::tr(
                            "%1 layouts evaluated in %2 s, %3 fit, %4 out of memory; %5 "
                            "planned with the schedule walk.")
                            .arg(result.evaluated)
                            .arg(result.seconds, 0, 'f', 2)
                            .arg(result.feasible)
                            .arg(outOfMemory)
                            .arg(result.walked);
      if (result.plans.empty() && !result.suggestions.empty()) {
        summary += QObject::tr(" Nothing fits: %1")
                       .arg(QString::fromStdString(result.suggestions.front().detail));
      }
      std::lock_guard lock(job->mutex);
      job->rows = std::move(rows);
      job->summary = summary;
    } catch (const std::exception& e) {
      std::lock_guard lock(job->mutex);
      job->error = QString::fromUtf8(e.what());
    }
  });
  threads_.push_back(thread);
  connect(thread, &QThread::finished, this, [this, thread, job] {
    threads_.erase(std::remove(threads_.begin(), threads_.end(), thread), threads_.end());
    thread->deleteLater();
    if (!job->abandoned) finishJob(job);
  });
  progress_->setValue(0);
  status_->setText(tr("Searching…"));
  setRunning(true);
  thread->start();
#endif
}

void SearchView::cancelSearch() {
  if (!job_) return;
  // The search has no stop hook: the worker runs to its end and its answer is dropped.
  job_->abandoned = true;
  job_.reset();
  setRunning(false);
  progress_->setValue(0);
  status_->setText(tr("Search cancelled."));
}

void SearchView::pollProgress() {
  if (!job_) return;
  progress_->setValue(static_cast<int>(job_->fraction.load() * 1000));
  status_->setText(tr("Searching… %1 layouts evaluated").arg(job_->evaluated.load()));
}

void SearchView::finishJob(const std::shared_ptr<Job>& job) {
  job_.reset();
  setRunning(false);
  progress_->setValue(progress_->maximum());
  {
    std::lock_guard lock(job->mutex);
    if (!job->error.isEmpty()) {
      status_->setText(tr("Search failed: %1").arg(job->error));
    } else {
      model_->setRows(std::move(job->rows));
      status_->setText(job->summary);
      showUsedAxes();
    }
  }
  rebuildChart();
  emit searchFinished();
}

// cp, v and ep get their column when a plan splits them (every axis that is not 1 is shown), and
// the split its column when a plan has light ends (two rows that differ only there differ).
void SearchView::showUsedAxes() {
  for (SearchModel::Column c : {SearchModel::CpColumn, SearchModel::VirtualStagesColumn,
                                SearchModel::EpColumn, SearchModel::SplitColumn}) {
    table_->setColumnHidden(c, !model_->axisUsed(c));
  }
}

void SearchView::rebuildChart() {
  chart_->removeAllSeries();
  for (QAbstractAxis* axis : chart_->axes()) {
    chart_->removeAxis(axis);
    delete axis;
  }
  const auto& rows = model_->rows();
  auto* scatter = new QScatterSeries;
  scatter->setName(tr("plans"));
  scatter->setMarkerSize(9);
  scatter->setColor(QColor(0x4e, 0x79, 0xa7));
  auto* best = new QScatterSeries;
  best->setName(tr("best"));
  best->setMarkerSize(13);
  best->setColor(QColor(0xf2, 0x8e, 0x2b));
  // Both axes start at zero, so distances between plans read as proportions.
  double maxGiB = 1;
  double maxTokens = 1;
  Bytes capacity = 0;
  for (const SearchRow& r : rows) {
    (r.rank == 1 ? best : scatter)->append(to_gib(r.peak_bytes), r.tokens_per_second);
    maxGiB = std::max(maxGiB, to_gib(r.peak_bytes));
    maxTokens = std::max(maxTokens, r.tokens_per_second);
    capacity = std::max(capacity, r.capacity_bytes);
  }
  connect(scatter, &QScatterSeries::hovered, this, [](const QPointF& p, bool state) {
    if (state) {
      QToolTip::showText(
          QCursor::pos(),
          QObject::tr("%1 GiB, %2 tokens/s").arg(p.x(), 0, 'f', 2).arg(p.y(), 0, 'f', 0));
    }
  });
  chart_->addSeries(scatter);
  chart_->addSeries(best);
  auto* capLine = new QLineSeries;
  if (capacity > 0) {
    capLine->setName(tr("capacity %1").arg(formatGiB(capacity)));
    capLine->append(to_gib(capacity), 0);
    capLine->append(to_gib(capacity), maxTokens * 2);
    QPen pen(QColor(0xb0, 0x00, 0x20));
    pen.setWidth(2);
    pen.setStyle(Qt::DashLine);
    capLine->setPen(pen);
    maxGiB = std::max(maxGiB, to_gib(capacity));
  }
  chart_->addSeries(capLine);
  if (capacity > 0 && marginUsed_ > 0) {
    // What the margin leaves usable: the plans shown are those left of this line.
    auto* usable = new QLineSeries;
    const double usableGiB = to_gib(capacity) * (1 - marginUsed_);
    usable->setName(tr("usable with a %1 % margin").arg(marginUsed_ * 100, 0, 'f', 0));
    usable->append(usableGiB, 0);
    usable->append(usableGiB, maxTokens * 2);
    QPen pen(QColor(0x55, 0x55, 0x55));
    pen.setWidth(2);
    pen.setStyle(Qt::DotLine);
    usable->setPen(pen);
    chart_->addSeries(usable);
  }
  auto* x = new QValueAxis;
  x->setTitleText(tr("peak memory per GPU (GiB)"));
  x->setRange(0, maxGiB * 1.08);
  x->applyNiceNumbers();
  auto* y = new QValueAxis;
  y->setTitleText(tr("tokens/s"));
  y->setRange(0, maxTokens * 1.1);
  y->applyNiceNumbers();
  y->setLabelFormat(QStringLiteral("%.0f"));
  chart_->addAxis(x, Qt::AlignBottom);
  chart_->addAxis(y, Qt::AlignLeft);
  for (QAbstractSeries* s : chart_->series()) {
    s->attachAxis(x);
    s->attachAxis(y);
  }
}

}  // namespace distplan::gui
