// What the timeline chart draws: the simulated step as plain values, filled from the simulator's
// trace by PlanSession, so the widget knows nothing of the simulator's types.
#pragma once

#include <cstdint>
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
  std::uint16_t label = 0;  // index into TimelineData::labels: what the tooltip names
  bool operator==(const TimelineBlock&) const = default;
};

struct TimelineData {
  int num_stages = 0;
  double step_seconds = 0;
  std::vector<TimelineBlock> blocks;
  std::vector<QString> labels;  // shared by the blocks (a few kinds), not one string per block
  bool operator==(const TimelineData&) const = default;
};

}  // namespace distplan::gui
