// The Zero Bubble paper's automatic schedule under a memory limit (Qi et al. 2023, "Zero Bubble
// Pipeline Parallelism", ICLR 2024, Sec. 3.1): a list-scheduling heuristic that places each
// stage's F, B and W passes in time order, warming up with as many forwards as fit before the
// first backward arrives and filling each wait with pending weight passes W, delayed as far as
// the memory limit lets them. The planner takes its step time from it and the simulator runs
// its order (docs/simulator.md, "zb_auto").
#pragma once

#include <cstdint>
#include <vector>

#include "distplan/planner/units.h"

namespace distplan {

/// One micro-batch through one stage: times and the memory each pass adds (the paper's mem_f,
/// mem_b, mem_w, summing to zero; any unit, the same as the limit).
struct ZbAutoStage {
  Seconds forward = 0, backward_input = 0, backward_weight = 0;
  double mem_forward = 1, mem_backward_input = 0, mem_backward_weight = -1;
  double memory_limit = 0;
};

enum class ZbPass : std::uint8_t { forward, backward_input, backward_weight };

struct ZbAutoPass {
  ZbPass pass = ZbPass::forward;
  Count microbatch = 0;
  Seconds end = 0;  // completion time on the heuristic's timeline
};

struct ZbAutoSchedule {
  std::vector<std::vector<ZbAutoPass>> order;  // [stage] passes in the order they run
  /// The longest stage span, first forward's start to last pass's end: the step when steps
  /// overlap (the paper's post-validation, Sec. 4), as its Table 5 counts ZB-1p and ZB-2p.
  Seconds longest_span = 0;
  std::vector<double> peak_memory;  // [stage], in the unit of mem_* (the order's running sum)
};

/// The heuristic of the authors' code (sail-sg/zero-bubble-pipeline-parallelism,
/// megatron/core/pipeline_parallel/auto_schedule.py, Graph.manual_order and initial_solution,
/// commit 6229e790; the same in zerobubble/scheduler/zb.py): eight variants (allow a bubble
/// before the first B or not, prioritise B or not, fill a bubble greedily with W or not), the
/// shortest longest-span kept (the first on ties). `p2p` is the send time between stages.
/// Variants that cannot keep a stage within its limit are skipped; throws InputError at
/// `limit_path` when none can.
[[nodiscard]] ZbAutoSchedule zb_auto_schedule(Count microbatches,
                                              const std::vector<ZbAutoStage>& stages, Seconds p2p,
                                              const char* limit_path);

}  // namespace distplan
