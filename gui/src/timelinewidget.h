// A Gantt chart of one simulated training step: one row per pipeline stage, forward, backward and
// weight-gradient blocks coloured by kind and labelled by micro-batch, communication on a thin lane
// under each row, idle time (bubbles) hatched, each stage's idle share beside its name. Wheel
// zooms around the cursor, dragging pans, double-click fits the whole step; hovering a block names
// it and gives its start and end. Painting is bounded by pixels, not by passes: each lane's blocks
// are indexed by start time, only the visible window is visited, and blocks narrower than a few
// pixels are drawn as pixel columns shaded by the share of each column the lane is busy, so 2^20
// passes paint as fast as a few hundred and thousands of micro-batches read as bands and bubbles.
#pragma once

#include <memory>

#include <QWidget>

#include "timelinedata.h"

namespace distplan::gui {

class TimelineWidget : public QWidget {
  Q_OBJECT

 public:
  explicit TimelineWidget(QWidget* parent = nullptr);

  /// Shows `data` (indexed here if it was not already).
  void setTimeline(TimelineData data);
  /// Shows shared, already indexed data without copying it (the simulation's).
  void setTimeline(std::shared_ptr<const TimelineData> data);
  [[nodiscard]] const TimelineData& timeline() const { return *data_; }

  [[nodiscard]] int rowCount() const { return data_->num_stages; }
  [[nodiscard]] int blockCount(BlockKind kind) const;
  /// Rectangles the last paint drew for blocks (single blocks plus merged pixel columns).
  [[nodiscard]] long long lastPaintedBlocks() const { return lastPainted_; }
  /// The visible time window, in seconds.
  [[nodiscard]] double viewStart() const { return viewStart_; }
  [[nodiscard]] double viewSpan() const { return viewSpan_; }

  void zoom(double factor, double anchorSeconds);
  void fit();
  /// Shows [startSeconds, startSeconds + spanSeconds) (the --timeline-window of a screenshot).
  void showWindow(double startSeconds, double spanSeconds);
  /// The share of the step stage `stage`'s compute lane is idle (its bubble), 0..1.
  [[nodiscard]] double idleFraction(int stage) const;
  /// Whether the last paint shaded compute passes narrower than a few pixels instead of drawing
  /// them (the legend then says so; short sends shaded in the communication lane do not count).
  [[nodiscard]] bool lastPaintAggregated() const { return aggregated_; }

  /// The tooltip text of `b`: stage, pass, times and, for a pass of a MoE model, the planner's
  /// all-to-all seconds inside it.
  [[nodiscard]] QString blockDescription(const TimelineBlock& b) const;

  [[nodiscard]] static QColor kindColor(BlockKind kind);
  /// A pixel column of passes too narrow to draw: the kinds' colours mixed by their busy seconds
  /// in it, as opaque as the lane is busy (a quarter at least, so a little traffic still shows).
  [[nodiscard]] static QColor densityColor(bool communication, double columnSeconds,
                                           const LaneBusy& busy);
  [[nodiscard]] static QString kindName(BlockKind kind);

  [[nodiscard]] QSize sizeHint() const override { return {900, 360}; }
  [[nodiscard]] QSize minimumSizeHint() const override { return {300, 160}; }

 protected:
  void paintEvent(QPaintEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  bool event(QEvent* event) override;

 private:
  [[nodiscard]] QRectF plotRect() const;
  [[nodiscard]] double rowHeight() const;
  [[nodiscard]] double xOf(double seconds) const;
  [[nodiscard]] double secondsAt(double x) const;
  [[nodiscard]] QRectF blockRect(const TimelineBlock& b) const;
  [[nodiscard]] const TimelineBlock* blockAt(QPointF pos) const;

  std::shared_ptr<const TimelineData> data_ = std::make_shared<const TimelineData>();
  long long lastPainted_ = 0;
  bool aggregated_ = false;
  double viewStart_ = 0;
  double viewSpan_ = 1;
  bool dragging_ = false;
  double dragStartX_ = 0;
  double dragStartView_ = 0;
};

}  // namespace distplan::gui
