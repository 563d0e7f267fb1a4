// What the timeline chart draws: the simulated step as plain values, filled from the simulator's
// trace by PlanSession, so the widget knows nothing of the simulator's types.
#pragma once

#include <vector>

#include <QString>

namespace distplan::gui {

enum class BlockKind { forward, backward, backward_weight, communication, optimizer, other };

struct TimelineBlock {
  int stage = 0;
  BlockKind kind = BlockKind::other;
  int microbatch = -1;  // -1 when the block is not tied to one micro-batch
  int chunk = 0;        // virtual chunk (interleaved schedules)
  double start_seconds = 0;
  double end_seconds = 0;
  QString label;  // what the tooltip names ("dp reduce_scatter gradients", ...)
  bool operator==(const TimelineBlock&) const = default;
};

struct TimelineData {
  int num_stages = 0;
  double step_seconds = 0;
  std::vector<TimelineBlock> blocks;
  bool operator==(const TimelineData&) const = default;
};

}  // namespace distplan::gui
