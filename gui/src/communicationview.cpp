#include "communicationview.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCursor>
#include <QHeaderView>
#include <QHorizontalStackedBarSeries>
#include <QLabel>
#include <QPushButton>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QTableView>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>

#include "categories.h"
#include "chartexport.h"
#include "communicationmodel.h"

namespace distplan::gui {

namespace {
QString qs(std::string_view v) {
  return QString::fromUtf8(v.data(), static_cast<int>(v.size()));
}
QColor linkColor(Link l) {
  return l == Link::intra_node ? QColor(0x4e, 0x79, 0xa7) : QColor(0xe1, 0x57, 0x59);
}
}  // namespace

CommunicationView::CommunicationView(QWidget* parent) : QWidget(parent) {
  model_ = new CommunicationModel(this);
  proxy_ = new QSortFilterProxyModel(this);
  proxy_->setSourceModel(model_);
  proxy_->setSortRole(Qt::UserRole);
  table_ = new QTableView(this);
  table_->setModel(proxy_);
  table_->setSortingEnabled(true);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->verticalHeader()->hide();
  table_->setAlternatingRowColors(true);

  chart_ = new QChart;
  chart_->setAnimationOptions(QChart::NoAnimation);
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chartView_ = new QChartView(chart_, this);
  chartView_->setRenderHint(QPainter::Antialiasing);
  chartView_->setMinimumHeight(360);

  total_ = new QLabel(this);
  auto* exportButton = new QPushButton(tr("Export chart…"), this);
  connect(exportButton, &QPushButton::clicked, this,
          [this] { exportWidgetWithDialog(this, chartView_, QStringLiteral("communication")); });

  auto* splitter = new QSplitter(Qt::Vertical, this);
  splitter->addWidget(chartView_);
  splitter->addWidget(table_);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 2);
  splitter->setSizes({560, 340});
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(total_);
  layout->addWidget(splitter);
  layout->addWidget(exportButton, 0, Qt::AlignRight);
}

void CommunicationView::setCommunication(const CommunicationEstimate& communication) {
  model_->setCommunication(communication);
  total_->setText(tr("Wire bytes one GPU sends per step: %1")
                      .arg(formatBytesExact(communication.wire_bytes_per_gpu_per_step)));
  rebuildChart();
}

void CommunicationView::rebuildChart() {
  const auto& collectives = model_->communication().collectives;
  chart_->removeAllSeries();
  for (QAbstractAxis* axis : chart_->axes()) {
    chart_->removeAxis(axis);
    delete axis;
  }
  auto* series = new QHorizontalStackedBarSeries;
  QStringList rows;
  for (const Collective& c : collectives) {
    rows << QStringLiteral("%1 %2 · %3")
                .arg(qs(to_string(c.group)), qs(to_string(c.op)), qs(c.what()));
  }
  double maxGiB = 0;
  for (Link link : {Link::intra_node, Link::inter_node}) {
    auto* set = new QBarSet(link == Link::intra_node ? tr("intra-node") : tr("inter-node"));
    set->setColor(linkColor(link));
    set->setBorderColor(linkColor(link).darker(130));
    for (const Collective& c : collectives) {
      const double gib = c.link == link ? to_gib(c.wire_bytes_per_gpu_per_step) : 0.0;
      *set << gib;
      maxGiB = std::max(maxGiB, gib);
    }
    connect(set, &QBarSet::hovered, this, [this](bool status, int index) {
      const auto& cs = model_->communication().collectives;
      if (!status || index < 0 || index >= static_cast<int>(cs.size())) {
        QToolTip::hideText();
        return;
      }
      const Collective& c = cs[static_cast<std::size_t>(index)];
      QToolTip::showText(QCursor::pos(),
                         tr("%1 %2 (%3) over %4 ranks, %5\n%6 calls × %7 buffer\nwire: %8 per step")
                             .arg(qs(to_string(c.group)), qs(to_string(c.op)), qs(c.what()))
                             .arg(c.group_size)
                             .arg(qs(to_string(c.link)))
                             .arg(c.calls_per_step)
                             .arg(formatBytesExact(c.bytes_per_call),
                                  formatBytesExact(c.wire_bytes_per_gpu_per_step)));
    });
    series->append(set);
  }
  chart_->addSeries(series);
  auto* y = new QBarCategoryAxis;
  y->append(rows);
  auto* x = new QValueAxis;
  x->setTitleText(tr("GiB sent per GPU per step"));
  x->setRange(0, maxGiB > 0 ? maxGiB * 1.08 : 1.0);
  x->applyNiceNumbers();
  chart_->addAxis(y, Qt::AlignLeft);
  chart_->addAxis(x, Qt::AlignBottom);
  series->attachAxis(x);
  series->attachAxis(y);
  chart_->setTitle(tr("Communication per step by group and op"));
}

}  // namespace distplan::gui
