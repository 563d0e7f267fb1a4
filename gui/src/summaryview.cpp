#include "summaryview.h"

#include <QGridLayout>
#include <QGroupBox>
#include <QHeaderView>
#include <QLabel>
#include <QLocale>
#include <QTableWidget>
#include <QVBoxLayout>

#include "categories.h"
#include "plansession.h"

namespace distplan::gui {

SummaryView::SummaryView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  auto* grid = new QGridLayout;
  layout->addLayout(grid);
  auto place = [&](const QString& key, const QString& title, int row, int column) {
    auto* box = new QGroupBox(title, this);
    auto* v = new QVBoxLayout(box);
    auto* value = new QLabel(box);
    value->setObjectName(QStringLiteral("figure:") + key);
    value->setTextFormat(Qt::RichText);
    value->setWordWrap(true);
    QFont f = value->font();
    f.setPointSizeF(f.pointSizeF() * 1.5);
    value->setFont(f);
    v->addWidget(value);
    grid->addWidget(box, row, column);
    figures_.insert(key, value);
  };
  place(QStringLiteral("step"), tr("Step time"), 0, 0);
  place(QStringLiteral("tokens"), tr("Throughput"), 0, 1);
  place(QStringLiteral("mfu"), tr("Model FLOPs utilisation"), 0, 2);
  place(QStringLiteral("bubble"), tr("Pipeline bubble"), 1, 0);
  place(QStringLiteral("memory"), tr("Peak memory per GPU"), 1, 1);
  place(QStringLiteral("fits"), tr("Fits in memory"), 1, 2);

  details_ = new QLabel(this);
  details_->setWordWrap(true);
  layout->addWidget(details_);
  levers_ = new QLabel(this);
  levers_->setObjectName(QStringLiteral("levers"));
  levers_->setTextFormat(Qt::RichText);
  levers_->setWordWrap(true);
  layout->addWidget(levers_);

  auto* box = new QGroupBox(tr("What lowers the peak (double-click to apply)"), this);
  auto* v = new QVBoxLayout(box);
  suggestionTable_ = new QTableWidget(0, 4, box);
  suggestionTable_->setHorizontalHeaderLabels({tr("Change"), tr("Peak"), tr("Saves"), tr("Fits")});
  suggestionTable_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  suggestionTable_->horizontalHeader()->setStretchLastSection(true);
  suggestionTable_->verticalHeader()->hide();
  suggestionTable_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  suggestionTable_->setSelectionBehavior(QAbstractItemView::SelectRows);
  connect(suggestionTable_, &QTableWidget::cellDoubleClicked, this,
          [this](int row, int) { emit suggestionChosen(row); });
  v->addWidget(suggestionTable_);
  layout->addWidget(box, 1);
}

QString SummaryView::figureText(const QString& key) const {
  const QLabel* label = figures_.value(key);
  return label ? label->text() : QString();
}

void SummaryView::setPlan(const Scenario& s, const Estimate& e,
                          std::vector<FitSuggestion> suggestions) {
  scenario_ = s;
  estimate_ = e;
  suggestions_ = std::move(suggestions);
  suggestionTable_->setRowCount(static_cast<int>(suggestions_.size()));
  for (int i = 0; i < static_cast<int>(suggestions_.size()); ++i) {
    const FitSuggestion& f = suggestions_[static_cast<std::size_t>(i)];
    auto item = [](const QString& t) { return new QTableWidgetItem(t); };
    suggestionTable_->setItem(i, 0, item(QString::fromStdString(f.change)));
    suggestionTable_->setItem(i, 1, item(formatGiB(f.peak_bytes)));
    suggestionTable_->setItem(i, 2, item(formatGiB(f.saving_bytes)));
    suggestionTable_->setItem(i, 3, item(f.fits ? tr("yes") : tr("no")));
    suggestionTable_->item(i, 1)->setToolTip(formatBytesExact(f.peak_bytes));
  }
  refresh();
}

void SummaryView::refresh() {
  const TimeEstimate& t = estimate_.time;
  const QLocale locale(QLocale::English);
  // The plan's figures are the schedule walk's (docs/time.md, "One timing engine"); the
  // timeline's simulation walks the same program, so there is one figure to show.
  auto walked = [&](const QString& figure) {
    return tr("%1<br><small>schedule walk</small>").arg(figure);
  };
  figures_[QStringLiteral("step")]->setText(
      walked(tr("%1 ms").arg(t.step_seconds * 1e3, 0, 'f', 1)));
  figures_[QStringLiteral("tokens")]->setText(
      walked(tr("%1 tokens/s").arg(locale.toString(t.tokens_per_second, 'f', 0))));
  figures_[QStringLiteral("mfu")]->setText(walked(tr("%1 %").arg(t.mfu * 100, 0, 'f', 1)));
  figures_[QStringLiteral("bubble")]->setText(
      walked(tr("%1 %").arg(t.bubble_fraction * 100, 0, 'f', 1)));
  const MemoryEstimate& m = estimate_.memory;
  // Reserved bytes (allocator segments and runtime) are what fits compares; allocated beside them.
  figures_[QStringLiteral("memory")]->setText(
      tr("%1 reserved<br><small>%2 allocated, of %3, stage %4</small>")
          .arg(formatGiB(m.peak_reserved_bytes), formatGiB(m.peak_allocated_bytes),
               formatGiB(m.capacity_bytes))
          .arg(m.peak_stage));
  figures_[QStringLiteral("fits")]->setText(
      m.fits ? tr("<span style='color:#2e7d32'>yes</span><br><small>%1 free</small>")
                   .arg(formatGiB(m.capacity_bytes - m.peak_reserved_bytes))
             : tr("<span style='color:#b00020'>no</span><br><small>%1 over</small>")
                   .arg(formatGiB(m.peak_reserved_bytes - m.capacity_bytes)));
  const ParallelSpec& p = scenario_.parallel;
  details_->setText(
      tr("%1 on %2 × %3 · %4 parameters · tp %5 · pp %6 · dp %7 · ZeRO %8 · %9 "
         "micro-batches per step · %10 GFLOP per step (model)")
          .arg(QString::fromStdString(scenario_.model.name),
               QString::number(scenario_.cluster.num_gpus),
               QString::fromStdString(scenario_.cluster.gpu.name),
               locale.toString(static_cast<qlonglong>(estimate_.parameters)))
          .arg(p.tp)
          .arg(p.pp)
          .arg(p.dp)
          .arg(p.zero_stage)
          .arg(estimate_.num_microbatches)
          .arg(locale.toString(estimate_.compute.model_flops_per_step / 1e9, 'f', 0)));
  levers_->setText(leversText());
}

// The memory levers in use, each with what the plan says it costs or holds (display only).
QString SummaryView::leversText() const {
  const ParallelSpec& p = scenario_.parallel;
  const QLocale locale(QLocale::English);
  QStringList parts;
  if (p.cp > 1) {
    parts << tr("context parallel cp %1 (%2)")
                 .arg(p.cp)
                 .arg(QString::fromStdString(std::string(to_string(p.cp_comm))));
  }
  if (p.ep > 1 || p.etp > 1) parts << tr("expert parallel ep %1 · etp %2").arg(p.ep).arg(p.etp);
  if (scenario_.training.fp8 != Fp8Recipe::none) {
    parts << tr("FP8 GEMMs (%1 recipe)")
                 .arg(QString::fromStdString(std::string(to_string(scenario_.training.fp8))));
  }
  if (p.offload_optimizer != Offload::none || p.offload_params != Offload::none) {
    const MemoryEstimate& m = estimate_.memory;
    const OffloadEstimate& o = estimate_.offload;
    QString host = tr("offload: optimizer to %1, parameters to %2 · host memory %3 per node")
                       .arg(QString::fromStdString(std::string(to_string(p.offload_optimizer))),
                            QString::fromStdString(std::string(to_string(p.offload_params))),
                            formatGiB(m.host_bytes_per_node));
    if (m.host_capacity_bytes > 0) host += tr(" of %1").arg(formatGiB(m.host_capacity_bytes));
    if (!m.host_fits) host += tr(" <span style='color:#b00020'>(does not fit)</span>");
    if (m.nvme_bytes_per_node > 0)
      host += tr(" · NVMe %1 per node").arg(formatGiB(m.nvme_bytes_per_node));
    host += tr(" · PCIe %1 per GPU per step (%2 ms before overlap), CPU optimizer %3 ms")
                .arg(formatGiB(o.pcie_bytes_per_gpu_per_step))
                .arg(locale.toString(o.pcie_seconds * 1e3, 'f', 1))
                .arg(locale.toString(o.cpu_optimizer_seconds * 1e3, 'f', 1));
    parts << host;
  }
  return parts.join(QStringLiteral("<br>"));
}

}  // namespace distplan::gui
