#include "timelinewidget.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QHelpEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>

namespace distplan::gui {

namespace {
constexpr double kLeftMargin = 80;    // stage labels
constexpr double kTopMargin = 28;     // time axis
constexpr double kBottomMargin = 30;  // legend
constexpr double kRightMargin = 12;
constexpr double kCommLaneShare = 0.28;  // of a row's height, under the compute lane
// Passes narrower than this are not drawn one by one (thousands of micro-batches would alternate
// forward and backward colours pixel by pixel): each pixel column is shaded by the share of it the
// lane is busy, so a steady state reads as a solid band and idle time as the hatched bubble.
constexpr double kMinPassPixels = 3.0;
// Pixels either side of a column over which its busy share and kind mix are read.
constexpr double kComputeHaloPixels = 1.0;
constexpr double kCommHaloPixels = 4.0;
constexpr double kMixHaloPixels = 8.0;
const QColor kLaneBackground(0xf4, 0xf4, 0xf4);

/// `c` over the lane background with opacity `alpha` (opaque, so the hatch does not show through).
QColor over(const QColor& c, double alpha) {
  const auto mix = [alpha](int top, int bottom) {
    return static_cast<int>(std::lround(alpha * top + (1 - alpha) * bottom));
  };
  return QColor(mix(c.red(), kLaneBackground.red()), mix(c.green(), kLaneBackground.green()),
                mix(c.blue(), kLaneBackground.blue()));
}

/// The colours of `parts` mixed by weight.
QColor blend(std::initializer_list<std::pair<QColor, double>> parts) {
  double r = 0, g = 0, b = 0, w = 0;
  for (const auto& [c, weight] : parts) {
    r += weight * c.red();
    g += weight * c.green();
    b += weight * c.blue();
    w += weight;
  }
  if (w <= 0) return kLaneBackground;
  return QColor(static_cast<int>(std::lround(r / w)), static_cast<int>(std::lround(g / w)),
                static_cast<int>(std::lround(b / w)));
}

/// A "nice" tick step (1, 2 or 5 × 10^k) giving about `target` ticks over `span`.
double niceStep(double span, int target) {
  const double raw = span / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}
}  // namespace

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setBackgroundRole(QPalette::Base);
  setAutoFillBackground(true);
}

void TimelineWidget::setTimeline(TimelineData data) {
  if (data.lanes.size() != static_cast<std::size_t>(std::max(0, data.num_stages)) * 2) {
    indexTimeline(data);
  }
  setTimeline(std::make_shared<const TimelineData>(std::move(data)));
}

void TimelineWidget::setTimeline(std::shared_ptr<const TimelineData> data) {
  if (!data) data = std::make_shared<const TimelineData>();
  if (data->lanes.size() != static_cast<std::size_t>(std::max(0, data->num_stages)) * 2) {
    TimelineData copy = *data;
    indexTimeline(copy);
    data = std::make_shared<const TimelineData>(std::move(copy));
  }
  const bool sameStep =
      data->step_seconds == data_->step_seconds && data->num_stages == data_->num_stages;
  data_ = std::move(data);
  if (!sameStep) fit();
  update();
}

int TimelineWidget::blockCount(BlockKind kind) const {
  return data_->kindCounts[static_cast<std::size_t>(kind)];
}

QColor TimelineWidget::kindColor(BlockKind kind) {
  switch (kind) {
    case BlockKind::forward:
      return QColor(0x4e, 0x79, 0xa7);
    case BlockKind::backward:
      return QColor(0x59, 0xa1, 0x4f);
    case BlockKind::backward_weight:
      return QColor(0xf2, 0x8e, 0x2b);
    case BlockKind::communication:
      return QColor(0xb0, 0x7a, 0xa1);
    case BlockKind::optimizer:
      return QColor(0x76, 0x76, 0x76);
    case BlockKind::other:
      return QColor(0xbb, 0xbb, 0xbb);
  }
  return Qt::gray;
}

QString TimelineWidget::kindName(BlockKind kind) {
  switch (kind) {
    case BlockKind::forward:
      return tr("forward");
    case BlockKind::backward:
      return tr("backward");
    case BlockKind::backward_weight:
      return tr("weight gradient");
    case BlockKind::communication:
      return tr("communication");
    case BlockKind::optimizer:
      return tr("optimizer");
    case BlockKind::other:
      return tr("other");
  }
  return {};
}

void TimelineWidget::showWindow(double startSeconds, double spanSeconds) {
  if (!(spanSeconds > 0)) return;
  viewStart_ = startSeconds;
  viewSpan_ = spanSeconds;
  update();
}

double TimelineWidget::idleFraction(int stage) const {
  const std::size_t lane = static_cast<std::size_t>(stage) * 2;
  if (stage < 0 || lane >= data_->lanes.size() || data_->step_seconds <= 0) return 0;
  const double busy = busySeconds(*data_, data_->lanes[lane], 0, data_->step_seconds).all;
  return std::clamp(1 - busy / data_->step_seconds, 0.0, 1.0);
}

QColor TimelineWidget::densityColor(bool communication, double columnSeconds,
                                    const LaneBusy& busy) {
  const double share = std::clamp(busy.all / columnSeconds, 0.0, 1.0);
  const QColor base =
      communication
          ? kindColor(BlockKind::communication)
          : blend({{kindColor(BlockKind::forward), busy.forward},
                   {kindColor(BlockKind::backward_weight), busy.weight},
                   {kindColor(BlockKind::backward), busy.all - busy.forward - busy.weight}});
  // A lane busy a few percent of a pixel still shows, faintly; a full one is the mixed colour.
  return over(base, 0.25 + 0.75 * share);
}

void TimelineWidget::fit() {
  viewStart_ = 0;
  viewSpan_ = data_->step_seconds > 0 ? data_->step_seconds * 1.01 : 1.0;
  update();
}

void TimelineWidget::zoom(double factor, double anchorSeconds) {
  const double full = data_->step_seconds > 0 ? data_->step_seconds * 1.01 : 1.0;
  const double span = std::clamp(viewSpan_ / factor, full * 1e-4, full * 4);
  const double share = (anchorSeconds - viewStart_) / viewSpan_;
  viewStart_ = anchorSeconds - share * span;
  viewSpan_ = span;
  update();
}

QRectF TimelineWidget::plotRect() const {
  return QRectF(kLeftMargin, kTopMargin, std::max(1.0, width() - kLeftMargin - kRightMargin),
                std::max(1.0, height() - kTopMargin - kBottomMargin));
}

double TimelineWidget::rowHeight() const {
  return data_->num_stages > 0 ? plotRect().height() / data_->num_stages : plotRect().height();
}

double TimelineWidget::xOf(double seconds) const {
  const QRectF r = plotRect();
  return r.left() + (seconds - viewStart_) / viewSpan_ * r.width();
}

double TimelineWidget::secondsAt(double x) const {
  const QRectF r = plotRect();
  return viewStart_ + (x - r.left()) / r.width() * viewSpan_;
}

QRectF TimelineWidget::blockRect(const TimelineBlock& b) const {
  const double rh = rowHeight();
  const double top = plotRect().top() + b.stage * rh;
  const double pad = std::min(4.0, rh * 0.06);
  const double computeHeight = rh * (1 - kCommLaneShare) - 2 * pad;
  const double x0 = xOf(b.start_seconds);
  const double x1 = std::max(xOf(b.end_seconds), x0 + 1.0);
  if (b.kind == BlockKind::communication) {
    const double laneTop = top + rh * (1 - kCommLaneShare);
    return QRectF(x0, laneTop, x1 - x0, rh * kCommLaneShare - 2 * pad);
  }
  return QRectF(x0, top + pad, x1 - x0, computeHeight);
}

void TimelineWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing, false);
  const QRectF plot = plotRect();
  const QFontMetrics fm(font());
  if (data_->num_stages <= 0) {
    p.drawText(rect(), Qt::AlignCenter, tr("No simulation yet"));
    return;
  }
  const double rh = rowHeight();

  // Time axis, in ms.
  const double step = niceStep(viewSpan_, std::max(2, static_cast<int>(plot.width() / 110)));
  p.setPen(palette().color(QPalette::Mid));
  for (double t = std::ceil(viewStart_ / step) * step; t <= viewStart_ + viewSpan_; t += step) {
    const double x = xOf(t);
    p.setPen(QColor(0xdd, 0xdd, 0xdd));
    p.drawLine(QPointF(x, plot.top()), QPointF(x, plot.bottom()));
    p.setPen(palette().color(QPalette::Text));
    // Centred on its tick, but kept inside the widget: the last tick of a window that ends on a
    // round figure sits near the right edge.
    const QString text =
        tr("%1 ms").arg(t * 1e3, 0, 'f', step * 1e3 < 1 ? 2 : (step * 1e3 < 10 ? 1 : 0));
    const double half = fm.horizontalAdvance(text) / 2.0 + 2;
    const double centre = std::min(x, width() - half);
    p.drawText(QRectF(centre - half, 4, 2 * half, kTopMargin - 6),
               Qt::AlignHCenter | Qt::AlignBottom, text);
  }

  p.save();
  p.setClipRect(plot);
  // Rows shorter than a pixel share it: one row per pixel row is drawn.
  auto rowShown = [&](int s) {
    return rh >= 1 || s == 0 ||
           std::floor(plot.top() + s * rh) != std::floor(plot.top() + (s - 1) * rh);
  };
  // Rows: the step's span hatched, so idle time between blocks shows as bubbles.
  for (int s = 0; s < data_->num_stages; ++s) {
    if (!rowShown(s)) continue;
    const double top = plot.top() + s * rh;
    const QRectF lane(xOf(0), top + std::min(2.0, rh * 0.06), xOf(data_->step_seconds) - xOf(0),
                      std::max(1.0, rh * (1 - kCommLaneShare) - 4));
    p.fillRect(lane, QBrush(QColor(0xf4, 0xf4, 0xf4)));
    p.fillRect(lane, QBrush(QColor(0xc8, 0xc8, 0xc8), Qt::BDiagPattern));
    if (rh >= 4) {
      p.setPen(QColor(0xcc, 0xcc, 0xcc));
      p.drawLine(QPointF(plot.left(), top + rh), QPointF(plot.right(), top + rh));
    }
  }
  // Blocks: only those in the window. One wide enough is drawn as itself; narrower ones shade
  // the pixel columns they fall in by the share of each column the lane is busy (busySeconds).
  lastPainted_ = 0;
  aggregated_ = false;
  const double t0 = secondsAt(plot.left());
  const double t1 = secondsAt(plot.right());
  const auto narrow = [this](const TimelineBlock& b) {
    return xOf(b.end_seconds) - xOf(b.start_seconds) < kMinPassPixels;
  };
  for (std::size_t laneIndex = 0; laneIndex < data_->lanes.size(); ++laneIndex) {
    if (!rowShown(static_cast<int>(laneIndex / 2))) continue;
    const bool commLane = laneIndex % 2 == 1;
    const TimelineLane& lane = data_->lanes[laneIndex];
    const std::size_t n = lane.order.size();
    // The first block that ends at or after t0.
    std::size_t i = static_cast<std::size_t>(
        std::lower_bound(lane.maxEnds.begin(), lane.maxEnds.end(), t0) - lane.maxEnds.begin());
    while (i < n && lane.starts[i] <= t1) {
      const TimelineBlock& b = data_->blocks[lane.order[i]];
      const QRectF r = blockRect(b);
      // A V's returning chunk is drawn lighter and its label carries an up arrow, so both
      // directions of the V stay apart even where the labels do not fit.
      const QColor c = b.upward ? kindColor(b.kind).lighter(135) : kindColor(b.kind);
      if (!narrow(b)) {
        p.fillRect(r, c);
        if (r.width() >= 3 && r.height() >= 3) {
          p.setPen(c.darker(140));
          p.drawRect(r);
        }
        if (b.microbatch >= 0 && b.kind != BlockKind::communication) {
          const QString text =
              QString::number(b.microbatch) +
              (data_->v_shape ? (b.upward ? QStringLiteral("\u2191") : QStringLiteral("\u2193"))
                              : QString());
          if (fm.horizontalAdvance(text) + 4 < r.width() && fm.height() < r.height()) {
            p.setPen(Qt::white);
            p.drawText(r, Qt::AlignCenter, text);
          }
        }
        ++lastPainted_;
        ++i;
        continue;
      }
      // A run of narrow blocks: pixel column after pixel column while they cover it, each column
      // one rectangle whatever the number of passes in it. Short sends are shaded in the
      // communication colour, which its legend entry names; only shaded passes of a compute lane
      // earn the "many passes" entry.
      if (!commLane) aggregated_ = true;
      double column = std::floor(xOf(b.start_seconds));
      std::size_t j = i + 1;  // the first block not yet in the run
      while (column <= plot.right()) {
        const double ta = secondsAt(column);
        const double tb = secondsAt(column + 1);
        const std::size_t from = j;
        j = static_cast<std::size_t>(
            std::lower_bound(lane.starts.begin() + static_cast<std::ptrdiff_t>(j),
                             lane.starts.end(), tb) -
            lane.starts.begin());
        // A wide block starting in this column is the last to start in it (a lane is a stream):
        // it is left to the walk, which draws it whole.
        const bool wideHere = j > from && !narrow(data_->blocks[lane.order[j - 1]]);
        if (wideHere) --j;
        // The share is read over a few pixels around the column (a compute lane's forward and
        // backward passes, a communication lane's sparse sends), so the band reads as one tone
        // rather than a comb; a bubble wider than that window still shows as hatched idle time.
        const double halo = (commLane ? kCommHaloPixels : kComputeHaloPixels) * (tb - ta);
        LaneBusy busy = busySeconds(*data_, lane, ta - halo, tb + halo, j);
        // The kinds' mix over a wider window: a pass one or two pixels wide would otherwise tint
        // alternate columns towards its own colour.
        const double mixHalo = kMixHaloPixels * (tb - ta);
        const LaneBusy mix = busySeconds(*data_, lane, ta - mixHalo, tb + mixHalo, j);
        if (mix.all > 0) {
          busy.forward = busy.all * mix.forward / mix.all;
          busy.weight = busy.all * mix.weight / mix.all;
        }
        // A compute column with nothing of its own stays idle (hatched), whatever its neighbours.
        const bool own = commLane || busySeconds(*data_, lane, ta, tb, j).all > 0;
        if (busy.all > 0 && own) {
          p.fillRect(QRectF(column, r.top(), 1.0, r.height()),
                     densityColor(commLane, tb - ta + 2 * halo, busy));
          ++lastPainted_;
        }
        if (wideHere) break;
        // Go on while the run's blocks reach into the next column or a narrow block starts there;
        // a wide block (drawn whole by the walk) or a gap ends it.
        const bool nextStartsSoon =
            j < n && lane.starts[j] < secondsAt(column + 2 + (commLane ? 2 * kCommHaloPixels : 0));
        if (nextStartsSoon && !narrow(data_->blocks[lane.order[j]])) break;
        if (!(lane.maxEnds[j - 1] > tb || nextStartsSoon)) break;
        column += 1;
      }
      i = j;
    }
  }
  p.restore();

  // Stage labels and the step's end.
  p.setPen(palette().color(QPalette::Text));
  // One label per text height when the rows are thin; with room, the stage's idle share of the
  // step under its name (its bubble, whatever the zoom).
  const int labelEvery = std::max(1, static_cast<int>(std::ceil(fm.height() / std::max(rh, 1e-9))));
  for (int s = 0; s < data_->num_stages; s += labelEvery) {
    const QRectF labelRect(4, plot.top() + s * rh, kLeftMargin - 8,
                           std::max(rh, double(fm.height())));
    QString label = tr("Stage %1").arg(s);
    if (rh >= 2.2 * fm.height()) {
      label += QLatin1Char('\n') + tr("idle %1 %").arg(idleFraction(s) * 100, 0, 'f', 1);
    }
    p.drawText(labelRect, Qt::AlignVCenter | Qt::AlignRight, label);
  }
  const double xEnd = xOf(data_->step_seconds);
  if (xEnd >= plot.left() && xEnd <= plot.right()) {
    p.setPen(QPen(QColor(0xb0, 0x00, 0x20), 1, Qt::DashLine));
    p.drawLine(QPointF(xEnd, plot.top()), QPointF(xEnd, plot.bottom()));
  }

  // Legend.
  double x = plot.left();
  const double y = height() - kBottomMargin + 8;
  auto legend = [&](const QBrush& brush, const QString& text) {
    p.fillRect(QRectF(x, y, 14, 12), brush);
    p.setPen(palette().color(QPalette::Text));
    p.drawText(QPointF(x + 18, y + 11), text);
    x += 18 + fm.horizontalAdvance(text) + 16;
  };
  for (BlockKind k : {BlockKind::forward, BlockKind::backward, BlockKind::backward_weight,
                      BlockKind::communication, BlockKind::optimizer}) {
    if (blockCount(k) > 0) legend(kindColor(k), kindName(k));
  }
  legend(QBrush(QColor(0xa0, 0xa0, 0xa0), Qt::BDiagPattern), tr("idle (bubble)"));
  if (aggregated_) {
    legend(QBrush(blend({{kindColor(BlockKind::forward), 1}, {kindColor(BlockKind::backward), 2}})),
           tr("many passes: shade = busy share (zoom in)"));
  }
  if (data_->v_shape) {
    legend(kindColor(BlockKind::forward).lighter(135),
           tr("lighter, \u2191: chunk 1, back up the V to stage 0"));
  }
}

const TimelineBlock* TimelineWidget::blockAt(QPointF pos) const {
  // The blocks of the two lanes of the stage under the cursor that start before it.
  const double rh = rowHeight();
  const int stage = static_cast<int>(std::floor((pos.y() - plotRect().top()) / rh));
  if (stage < 0 || stage >= data_->num_stages) return nullptr;
  const double tol = secondsAt(pos.x() + 1) - secondsAt(pos.x());
  const double t = secondsAt(pos.x());
  for (int laneKind = 0; laneKind < 2; ++laneKind) {
    const TimelineLane& lane = data_->lanes[static_cast<std::size_t>(stage) * 2 + laneKind];
    std::size_t k = static_cast<std::size_t>(
        std::upper_bound(lane.starts.begin(), lane.starts.end(), t + tol) - lane.starts.begin());
    while (k-- > 0) {
      const TimelineBlock& b = data_->blocks[lane.order[k]];
      if (blockRect(b).adjusted(-1, 0, 1, 0).contains(pos)) return &b;
      if (lane.maxEnds[k] < t - tol) break;  // nothing earlier reaches the cursor
    }
  }
  return nullptr;
}

QString TimelineWidget::blockDescription(const TimelineBlock& b) const {
  QString what = b.label < data_->labels.size() ? data_->labels[b.label] : kindName(b.kind);
  if (b.microbatch >= 0) what += tr(", micro-batch %1").arg(b.microbatch);
  if (data_->v_shape && b.kind != BlockKind::communication && b.microbatch >= 0) {
    what += b.upward ? tr(", chunk %1, from the last stage back to stage 0").arg(b.chunk)
                     : tr(", chunk %1, from stage 0 to the last stage").arg(b.chunk);
  } else if (b.chunk > 0) {
    what += tr(", chunk %1").arg(b.chunk);
  }
  QString text = tr("Stage %1: %2\n%3 – %4 ms (%5 ms)")
                     .arg(b.stage)
                     .arg(what)
                     .arg(b.start_seconds * 1e3, 0, 'f', 3)
                     .arg(b.end_seconds * 1e3, 0, 'f', 3)
                     .arg((b.end_seconds - b.start_seconds) * 1e3, 0, 'f', 3);
  const auto stage = static_cast<std::size_t>(b.stage);
  const bool pass = b.kind == BlockKind::forward || b.kind == BlockKind::backward;
  if (pass && b.stage >= 0 && stage < data_->moe_all_to_all_seconds.size()) {
    text += tr("\nMoE all-to-all (dispatch + combine) inside this stage's forward and backward: "
               "%1 ms per micro-batch")
                .arg(data_->moe_all_to_all_seconds[stage] * 1e3, 0, 'f', 3);
  }
  return text;
}

bool TimelineWidget::event(QEvent* event) {
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    if (const TimelineBlock* b = blockAt(help->pos())) {
      QToolTip::showText(help->globalPos(), blockDescription(*b), this);
    } else {
      QToolTip::hideText();
      event->ignore();
    }
    return true;
  }
  return QWidget::event(event);
}

void TimelineWidget::wheelEvent(QWheelEvent* event) {
  const double steps = event->angleDelta().y() / 120.0;
  if (steps == 0) return;
  zoom(std::pow(1.25, steps), secondsAt(event->position().x()));
  event->accept();
}

void TimelineWidget::mousePressEvent(QMouseEvent* event) {
  if (event->button() == Qt::LeftButton) {
    dragging_ = true;
    dragStartX_ = event->position().x();
    dragStartView_ = viewStart_;
    setCursor(Qt::ClosedHandCursor);
  }
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* event) {
  if (!dragging_) return;
  const double dx = event->position().x() - dragStartX_;
  viewStart_ = dragStartView_ - dx / plotRect().width() * viewSpan_;
  update();
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent*) {
  dragging_ = false;
  unsetCursor();
}

void TimelineWidget::mouseDoubleClickEvent(QMouseEvent*) {
  fit();
}

}  // namespace distplan::gui
