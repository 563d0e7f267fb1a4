#include "timelineview.h"

#include <algorithm>

#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QVBoxLayout>

#include "chartexport.h"
#include "timelinewidget.h"

namespace distplan::gui {

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
  timeline_ = new TimelineWidget(this);
  info_ = new QLabel(this);
  info_->setWordWrap(true);
  auto* zoomIn = new QPushButton(tr("Zoom in"), this);
  auto* zoomOut = new QPushButton(tr("Zoom out"), this);
  auto* fit = new QPushButton(tr("Fit step"), this);
  auto* exportButton = new QPushButton(tr("Export chart…"), this);
  auto centre = [this] { return timeline_->viewStart() + timeline_->viewSpan() / 2; };
  connect(zoomIn, &QPushButton::clicked, this, [this, centre] { timeline_->zoom(1.5, centre()); });
  connect(zoomOut, &QPushButton::clicked, this,
          [this, centre] { timeline_->zoom(1 / 1.5, centre()); });
  connect(fit, &QPushButton::clicked, timeline_, &TimelineWidget::fit);
  connect(exportButton, &QPushButton::clicked, this,
          [this] { exportWidgetWithDialog(this, timeline_, QStringLiteral("timeline")); });

  auto* controls = new QHBoxLayout;
  controls->addWidget(info_, 1);
  controls->addWidget(zoomIn);
  controls->addWidget(zoomOut);
  controls->addWidget(fit);
  controls->addWidget(exportButton);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addWidget(timeline_, 1);
  auto* hint = new QLabel(
      tr("Wheel: zoom around the cursor · drag: pan · double-click: whole step · hover: details"),
      this);
  hint->setStyleSheet(QStringLiteral("color: gray;"));
  layout->addWidget(hint);
}

void TimelineView::setTimeline(std::shared_ptr<const TimelineData> data, double bubbleFraction) {
  timeline_->setTimeline(std::move(data));
  const TimelineData& shown = timeline_->timeline();
  int passes = 0;
  for (BlockKind k : {BlockKind::forward, BlockKind::backward, BlockKind::backward_weight}) {
    passes += timeline_->blockCount(k);
  }
  info_->setText(tr("Simulated step: %1 ms · bubble %2 % · %3 stages · %4 passes, %5 transfers")
                     .arg(shown.step_seconds * 1e3, 0, 'f', 1)
                     .arg(bubbleFraction * 100, 0, 'f', 1)
                     .arg(shown.num_stages)
                     .arg(passes)
                     .arg(timeline_->blockCount(BlockKind::communication)));
  if (!shown.moe_all_to_all_seconds.empty()) {
    const double most =
        *std::max_element(shown.moe_all_to_all_seconds.begin(), shown.moe_all_to_all_seconds.end());
    info_->setText(info_->text() +
                   tr(" · MoE all-to-all %1 ms per micro-batch (forward + backward, busiest "
                      "stage, inside the passes)")
                       .arg(most * 1e3, 0, 'f', 3));
  }
}

QString TimelineView::infoText() const {
  return info_->text();
}

void TimelineView::setMessage(const QString& message) {
  timeline_->setTimeline(TimelineData{});
  info_->setText(message);
}

}  // namespace distplan::gui
