// Timeline tab: the simulated step as a Gantt chart with zoom, pan and export controls, and the
// simulator's headline figures above it.
#pragma once

#include <memory>

#include <QWidget>

#include "timelinedata.h"

class QLabel;

namespace distplan::gui {

class TimelineWidget;

class TimelineView : public QWidget {
  Q_OBJECT

 public:
  explicit TimelineView(QWidget* parent = nullptr);

  void setTimeline(std::shared_ptr<const TimelineData> data, double bubbleFraction);
  /// Shown instead of a chart when there is nothing to simulate.
  void setMessage(const QString& message);
  [[nodiscard]] TimelineWidget* timeline() const { return timeline_; }
  /// The line above the chart (step, bubble, counts, the MoE all-to-all share); tests read it.
  [[nodiscard]] QString infoText() const;

 private:
  TimelineWidget* timeline_ = nullptr;
  QLabel* info_ = nullptr;
};

}  // namespace distplan::gui
