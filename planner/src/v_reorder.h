// The V-Half / V-Min authors' reordering ("squeeze", Qi et al. 2024, Sec. 4.2) of a building-block
// slot table (v_schedule.cpp).
#pragma once

#include <array>
#include <vector>

#include "distplan/planner/units.h"

namespace distplan::detail {

/// Unit-time slots of one stage: [kind][micro-batch] for the kinds F chunk 0, F chunk 1, B chunk 1,
/// B chunk 0 (the building block's order) and, when present, W.
using StageSlots = std::vector<std::vector<Count>>;

/// The authors' schedule_from_pattern with do_reorder (sail-sg/zero-bubble-pipeline-parallelism,
/// megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py, reorder, put_w,
/// mem_of_stage, eager_execution_time; commit 064369d6): the warm-up and cool-down passes moved
/// to the earliest free slot their dependencies allow without raising the stage's activation peak
/// (twice: with the W passes placed, then without), then executed eagerly in unit time. Returns
/// each stage's four F/B kinds' start slots; the W passes go into the empty slots as before.
[[nodiscard]] std::vector<StageSlots> squeeze_v_block(std::vector<StageSlots> slots);

}  // namespace distplan::detail
