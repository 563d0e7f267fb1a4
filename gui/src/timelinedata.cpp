#include "timelinedata.h"

#include <algorithm>
#include <limits>

namespace distplan::gui {

void indexTimeline(TimelineData& data) {
  data.kindCounts.fill(0);
  data.lanes.assign(static_cast<std::size_t>(std::max(0, data.num_stages)) * 2, TimelineLane{});
  for (std::size_t i = 0; i < data.blocks.size(); ++i) {
    const TimelineBlock& b = data.blocks[i];
    ++data.kindCounts[static_cast<std::size_t>(b.kind)];
    if (b.stage < 0 || b.stage >= data.num_stages) continue;
    const std::size_t lane =
        static_cast<std::size_t>(b.stage) * 2 + (b.kind == BlockKind::communication ? 1 : 0);
    data.lanes[lane].order.push_back(static_cast<std::uint32_t>(i));
  }
  for (TimelineLane& lane : data.lanes) {
    std::stable_sort(lane.order.begin(), lane.order.end(),
                     [&data](std::uint32_t a, std::uint32_t b) {
                       return data.blocks[a].start_seconds < data.blocks[b].start_seconds;
                     });
    const std::size_t n = lane.order.size();
    lane.starts.resize(n);
    lane.maxEnds.resize(n);
    lane.busyPrefix.assign(n + 1, 0.0);
    lane.forwardPrefix.assign(n + 1, 0.0);
    lane.weightPrefix.assign(n + 1, 0.0);
    double maxEnd = -std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < n; ++k) {
      const TimelineBlock& b = data.blocks[lane.order[k]];
      lane.starts[k] = b.start_seconds;
      maxEnd = std::max(maxEnd, b.end_seconds);
      lane.maxEnds[k] = maxEnd;
      const double d = std::max(0.0, b.end_seconds - b.start_seconds);
      lane.busyPrefix[k + 1] = lane.busyPrefix[k] + d;
      lane.forwardPrefix[k + 1] = lane.forwardPrefix[k] + (b.kind == BlockKind::forward ? d : 0.0);
      lane.weightPrefix[k + 1] =
          lane.weightPrefix[k] + (b.kind == BlockKind::backward_weight ? d : 0.0);
    }
  }
}

namespace {

// The first index k with starts[k] >= t, searched outwards from `hint` (a paint walks the lane in
// order, so the answer is a few blocks away: O(log distance) rather than O(log n)).
std::size_t firstStartingAtOrAfter(const std::vector<double>& starts, double t, std::size_t hint) {
  const std::size_t n = starts.size();
  hint = std::min(hint, n);
  std::size_t lo = 0, hi = n;
  if (hint < n && starts[hint] < t) {
    std::size_t step = 1;
    lo = hint + 1;
    while (lo + step < n && starts[lo + step] < t) step *= 2;
    hi = std::min(n, lo + step + 1);
  } else {
    std::size_t step = 1;
    hi = hint;
    while (hi >= step && starts[hi - step] >= t) step *= 2;
    lo = hi >= step ? hi - step : 0;
  }
  return static_cast<std::size_t>(std::lower_bound(starts.begin() + static_cast<std::ptrdiff_t>(lo),
                                                   starts.begin() + static_cast<std::ptrdiff_t>(hi),
                                                   t) -
                                  starts.begin());
}

// Busy seconds before t: the blocks starting before t, less what the last of them runs past t.
LaneBusy busyBefore(const TimelineData& data, const TimelineLane& lane, double t,
                    std::size_t hint) {
  const std::size_t k = firstStartingAtOrAfter(lane.starts, t, hint);
  LaneBusy b{lane.busyPrefix[k], lane.forwardPrefix[k], lane.weightPrefix[k]};
  if (k == 0) return b;
  const TimelineBlock& last = data.blocks[lane.order[k - 1]];
  const double past = std::max(0.0, last.end_seconds - std::max(t, last.start_seconds));
  b.all -= past;
  if (last.kind == BlockKind::forward) b.forward -= past;
  if (last.kind == BlockKind::backward_weight) b.weight -= past;
  return b;
}

}  // namespace

LaneBusy busySeconds(const TimelineData& data, const TimelineLane& lane, double t0, double t1,
                     std::size_t hint) {
  if (lane.busyPrefix.size() != lane.starts.size() + 1 || t1 <= t0) return {};
  const LaneBusy a = busyBefore(data, lane, t0, hint);
  const LaneBusy b = busyBefore(data, lane, t1, hint);
  return {std::max(0.0, b.all - a.all), std::max(0.0, b.forward - a.forward),
          std::max(0.0, b.weight - a.weight)};
}

}  // namespace distplan::gui
