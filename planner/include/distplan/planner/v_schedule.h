// The V-shape schedules' pass orders (Qi et al. 2024, "Pipeline Parallelism with Controllable
// Memory": ZB-V, V-Half, V-Min; two chunks per stage, chunk 0 at virtual stage s and chunk 1 at
// 2p - 1 - s, layout.h) and the step they take on given pass times. One order for both users:
// the simulator runs it as its schedule program and the planner takes its step time from the
// longest stage span below (docs/simulator.md, "V schedules").
#pragma once

#include <vector>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"
#include "distplan/planner/zb_auto.h"

namespace distplan {

struct VPass {
  ZbPass pass = ZbPass::forward;
  Count microbatch = 0;
  Count chunk = 0;
};
using VOrder = std::vector<std::vector<VPass>>;  // [stage] passes in the order they run

/// The order of `kind` (zb_v, v_half or v_min) on p stages for m micro-batches: ZB-V as PyTorch's
/// ScheduleZBVZeroBubble builds it, V-Half / V-Min as the authors' building blocks with their
/// reordering (v_reorder.h).
[[nodiscard]] VOrder v_schedule_order(Schedule kind, Count p, Count m);

/// One stage's passes of each of its two chunks (they may differ: pipeline_split.h) and the time
/// of a send to a neighbouring stage.
struct VStageTimes {
  Seconds forward[2] = {0, 0}, backward_input[2] = {0, 0}, backward_weight[2] = {0, 0};
  Seconds p2p = 0;
};

/// The step of `order` when steps overlap (its longest stage span, first pass's start to the
/// later of its last pass's end and its last send's end): each stage runs its passes in order, a
/// pass starting when the stage is free and its input is there. A pass's output goes to the next
/// virtual stage over the sender's link for its direction (activations one link, gradients the
/// other, each sending one message at a time, p2p seconds each); the V's turn at stage p - 1
/// stays on the stage and takes no time. The simulator's rules for these schedules
/// (simulate.cpp), so its step for the same times.
[[nodiscard]] Seconds v_longest_span(const VOrder& order, const std::vector<VStageTimes>& times);

}  // namespace distplan
