#include "memoryview.h"

#include <algorithm>

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCursor>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QPushButton>
#include <QSplitter>
#include <QStackedBarSeries>
#include <QTableView>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>

#include "chartexport.h"
#include "memorymodel.h"

namespace distplan::gui {

MemoryView::MemoryView(QWidget* parent) : QWidget(parent) {
  model_ = new MemoryModel(this);
  chart_ = new QChart;
  chart_->setAnimationOptions(QChart::NoAnimation);
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chartView_ = new QChartView(chart_, this);
  chartView_->setRenderHint(QPainter::Antialiasing);
  chartView_->setMinimumHeight(300);

  table_ = new QTableView(this);
  table_->setModel(model_);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->verticalHeader()->hide();
  table_->setAlternatingRowColors(true);

  auto* exportButton = new QPushButton(tr("Export chart…"), this);
  connect(exportButton, &QPushButton::clicked, this,
          [this] { exportWidgetWithDialog(this, chartView_, QStringLiteral("memory")); });

  auto* tableBox = new QWidget(this);
  auto* tableLayout = new QVBoxLayout(tableBox);
  tableLayout->setContentsMargins(0, 0, 0, 0);
  auto* caption = new QLabel(
      tr("Per GPU, in GiB (2^30 bytes); exact bytes on hover. Total: the categories plus the "
         "transient. Allocated: what the caching allocator hands out at the peak. Reserved: what "
         "the GPU holds, the allocator's segments plus the runtime outside it (what fits "
         "compares)."),
      tableBox);
  caption->setWordWrap(true);
  tableLayout->addWidget(caption);
  tableLayout->addWidget(table_, 1);
  auto* splitter = new QSplitter(Qt::Vertical, this);
  splitter->addWidget(chartView_);
  splitter->addWidget(tableBox);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(splitter);
  layout->addWidget(exportButton, 0, Qt::AlignRight);
}

void MemoryView::setMemory(const MemoryEstimate& memory) {
  model_->setMemory(memory);
  rebuildChart();
}

void MemoryView::rebuildChart() {
  const MemoryEstimate& memory = model_->memory();
  chart_->removeAllSeries();
  for (QAbstractAxis* axis : chart_->axes()) {
    chart_->removeAxis(axis);
    delete axis;
  }

  bars_ = new QStackedBarSeries;
  QStringList stages;
  for (const StageMemory& s : memory.stages) stages << tr("Stage %1").arg(s.stage);
  // Fine-tuning (docs/peft.md): the weights split into the frozen base (a lighter bar, first)
  // and what trains.
  frozen_ = std::any_of(memory.stages.begin(), memory.stages.end(),
                        [](const StageMemory& s) { return s.frozen_weights_bytes > 0; });
  if (frozen_) {
    const QColor light = categoryColor(MemoryCategory::weights).lighter(150);
    auto* set = new QBarSet(tr("Weights (frozen)"));
    set->setColor(light);
    set->setBorderColor(light.darker(130));
    for (const StageMemory& s : memory.stages) *set << to_gib(s.frozen_weights_bytes);
    connect(set, &QBarSet::hovered, this, [this](bool status, int index) {
      const auto& stages = model_->memory().stages;
      if (!status || index < 0 || index >= static_cast<int>(stages.size())) {
        QToolTip::hideText();
        return;
      }
      const StageMemory& s = stages[static_cast<std::size_t>(index)];
      QToolTip::showText(QCursor::pos(), tr("Stage %1 — frozen weights (no gradients, no "
                                            "optimizer states)\n%2\nstage total %3")
                                             .arg(s.stage)
                                             .arg(formatBytesExact(s.frozen_weights_bytes),
                                                  formatBytesExact(s.total_bytes)));
    });
    bars_->append(set);
  }
  for (MemoryCategory c : kMemoryCategories) {
    const bool trained = frozen_ && c == MemoryCategory::weights;
    auto* set = new QBarSet(trained ? tr("Weights (trained)") : categoryLabel(c));
    set->setColor(categoryColor(c));
    set->setBorderColor(categoryColor(c).darker(130));
    for (const StageMemory& s : memory.stages)
      *set << to_gib(categoryBytes(s, c) - (trained ? s.frozen_weights_bytes : 0));
    connect(set, &QBarSet::hovered, this, [this, c](bool status, int index) {
      const auto& stages = model_->memory().stages;
      if (!status || index < 0 || index >= static_cast<int>(stages.size())) {
        QToolTip::hideText();
        return;
      }
      const StageMemory& s = stages[static_cast<std::size_t>(index)];
      QToolTip::showText(QCursor::pos(),
                         tr("Stage %1 — %2\n%3\nstage total %4")
                             .arg(s.stage)
                             .arg(categoryLabel(c), formatBytesExact(categoryBytes(s, c)),
                                  formatBytesExact(s.total_bytes)));
    });
    bars_->append(set);
  }
  // Above the categories, what the CLI lists beside them: the transient of a layer's backward
  // (inside allocated) and the caching allocator's segments beyond it (reserved − total), so each
  // bar stands as high as the stage's reserved bytes, what fits compares.
  const auto addExtra = [this, &memory](const QString& name, const QColor& color,
                                        Bytes (*bytes)(const StageMemory&), const QString& what) {
    auto* set = new QBarSet(name);
    set->setColor(color);
    set->setBorderColor(color.darker(130));
    for (const StageMemory& s : memory.stages) *set << to_gib(bytes(s));
    connect(set, &QBarSet::hovered, this, [this, name, bytes, what](bool status, int index) {
      const auto& stages = model_->memory().stages;
      if (!status || index < 0 || index >= static_cast<int>(stages.size())) {
        QToolTip::hideText();
        return;
      }
      const StageMemory& s = stages[static_cast<std::size_t>(index)];
      QToolTip::showText(QCursor::pos(), tr("Stage %1 — %2\n%3\n%4\nreserved %5")
                                             .arg(s.stage)
                                             .arg(name, formatBytesExact(bytes(s)), what,
                                                  formatBytesExact(s.reserved_bytes)));
    });
    bars_->append(set);
  };
  addExtra(
      tr("Transient"), QColor(0xed, 0xc9, 0x48),
      [](const StageMemory& s) { return s.transient_bytes; },
      tr("inside a layer's backward: activation gradients, framework buckets"));
  addExtra(
      tr("Allocator cache"), QColor(0xd7, 0xd7, 0xd7),
      [](const StageMemory& s) { return std::max<Bytes>(0, s.reserved_bytes - s.total_bytes); },
      tr("the caching allocator's segments beyond what is allocated (reserved − total)"));
  chart_->addSeries(bars_);

  capacity_ = new QLineSeries;
  const double capGiB = to_gib(memory.capacity_bytes);
  capacity_->setName(tr("Capacity %1").arg(formatGiB(memory.capacity_bytes)));
  // The category axis places stage i at x = i, so -0.5 .. n-0.5 spans every bar.
  const double n = static_cast<double>(memory.stages.size());
  capacity_->append(-0.5, capGiB);
  capacity_->append(n - 0.5, capGiB);
  QPen pen(QColor(0xb0, 0x00, 0x20));
  pen.setWidth(2);
  pen.setStyle(Qt::DashLine);
  capacity_->setPen(pen);
  chart_->addSeries(capacity_);

  auto* x = new QBarCategoryAxis;
  x->append(stages);
  auto* y = new QValueAxis;
  y->setTitleText(tr("GiB per GPU"));
  y->setRange(
      0, std::max({capGiB, to_gib(memory.peak_bytes), to_gib(memory.peak_reserved_bytes)}) * 1.08);
  y->setLabelFormat(QStringLiteral("%.0f"));
  y->applyNiceNumbers();
  chart_->addAxis(x, Qt::AlignBottom);
  chart_->addAxis(y, Qt::AlignLeft);
  bars_->attachAxis(x);
  bars_->attachAxis(y);
  capacity_->attachAxis(x);
  capacity_->attachAxis(y);

  chart_->setTitle(
      tr("Memory per GPU by pipeline stage — peak %1 reserved (%2 allocated) of %3 (%4)")
          .arg(formatGiB(memory.peak_reserved_bytes), formatGiB(memory.peak_allocated_bytes),
               formatGiB(memory.capacity_bytes), memory.fits ? tr("fits") : tr("does not fit")));
}

double MemoryView::stackGiB(int stage) const {
  double sum = 0;
  if (!bars_) return sum;
  for (QBarSet* set : bars_->barSets()) sum += set->at(stage);
  return sum;
}

double MemoryView::barValueGiB(MemoryCategory category, int stage) const {
  const auto index =
      static_cast<int>(std::find(kMemoryCategories.begin(), kMemoryCategories.end(), category) -
                       kMemoryCategories.begin());
  const int first = frozen_ ? 1 : 0;  // the frozen weights' set comes first
  const double frozen =
      frozen_ && category == MemoryCategory::weights ? bars_->barSets().at(0)->at(stage) : 0.0;
  return bars_->barSets().at(first + index)->at(stage) + frozen;
}

double MemoryView::frozenWeightsGiB(int stage) const {
  return frozen_ ? bars_->barSets().at(0)->at(stage) : -1.0;
}

int MemoryView::barCount() const {
  return bars_ ? static_cast<int>(bars_->barSets().at(0)->count()) : 0;
}

double MemoryView::capacityLineGiB() const {
  return capacity_ && capacity_->count() > 0 ? capacity_->at(0).y() : 0.0;
}

}  // namespace distplan::gui
