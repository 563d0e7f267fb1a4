// What the timeline chart draws: the simulated step as plain values, filled from the simulator's
// trace by PlanSession, so the widget knows nothing of the simulator's types.
#pragma once

#include <array>
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
  /// The pass belongs to a chunk whose activations flow from the last stage back towards stage 0
  /// (a V schedule's second chunk, virtual stage 2p - 1 - s); false: from stage 0 onwards.
  bool upward = false;
  bool operator==(const TimelineBlock&) const = default;
};

/// One lane (a stage's compute or communication row): its blocks ordered by start, and the running
/// maximum of their ends, so the first block reaching a time is a binary search.
struct TimelineLane {
  std::vector<std::uint32_t> order;
  std::vector<double> starts;
  std::vector<double> maxEnds;
  /// Seconds of the first k blocks (k = 0..n), all of them, the forward passes and the
  /// weight-gradient passes: the busy time of any window is two binary searches (busySeconds), so
  /// passes far narrower than a pixel are drawn as the share of each pixel they fill.
  std::vector<double> busyPrefix;
  std::vector<double> forwardPrefix;
  std::vector<double> weightPrefix;
  bool operator==(const TimelineLane&) const = default;
};

struct TimelineData {
  int num_stages = 0;
  double step_seconds = 0;
  bool v_shape = false;  // chunks placed in a V: each pass shows its chunk's direction
  std::vector<TimelineBlock> blocks;
  std::vector<QString> labels;  // shared by the blocks (a few kinds), not one string per block
  /// Per stage: the planner's MoE token all-to-all seconds per micro-batch, forward + backward
  /// (Estimate::stage_costs[].ep_communication), already inside the passes' durations; empty for
  /// a dense model.
  std::vector<double> moe_all_to_all_seconds;
  // Filled by indexTimeline (on the simulation's worker, not the UI thread).
  std::vector<TimelineLane> lanes;  // 2 per stage: compute, communication
  std::array<int, 6> kindCounts{};  // blocks per BlockKind
  bool operator==(const TimelineData&) const = default;
};

/// Builds `lanes` and `kindCounts` from `blocks`.
void indexTimeline(TimelineData& data);

/// Busy seconds of `lane` in [t0, t1), split by kind: blocks of one lane follow one another (a
/// stream), so the time before t is the whole blocks that start earlier, less the part of the
/// last of them that runs past t. Overlapping blocks (a communication lane's concurrent sends)
/// count each, so `all` can exceed t1 - t0. `hint`: a block index near t0 and t1, where the
/// searches start (any value gives the same answer).
struct LaneBusy {
  double all = 0;
  double forward = 0;
  double weight = 0;
};
[[nodiscard]] LaneBusy busySeconds(const TimelineData& data, const TimelineLane& lane, double t0,
                                   double t1, std::size_t hint = 0);

}  // namespace distplan::gui
