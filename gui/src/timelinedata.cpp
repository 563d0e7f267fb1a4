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
    lane.starts.resize(lane.order.size());
    lane.maxEnds.resize(lane.order.size());
    double maxEnd = -std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < lane.order.size(); ++k) {
      const TimelineBlock& b = data.blocks[lane.order[k]];
      lane.starts[k] = b.start_seconds;
      maxEnd = std::max(maxEnd, b.end_seconds);
      lane.maxEnds[k] = maxEnd;
    }
  }
}

}  // namespace distplan::gui
