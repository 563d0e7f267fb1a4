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

}  // namespace distplan
