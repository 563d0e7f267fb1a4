// DualPipe's pass order (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipe.py, commit 3da1bbe,
// DualPipe.step): one order for both users, the simulator's program (make_dualpipe) and the
// planner's activation peak (docs/simulator.md, "DualPipe").
#pragma once

#include <cstdint>
#include <vector>

#include "distplan/planner/units.h"

namespace distplan {

struct DualPipePass {
  enum class Op : std::uint8_t { forward, backward, backward_input, backward_weight };
  Op op = Op::forward;
  Count microbatch = 0;
  Count chunk = 0;            // the micro-batch's direction (layout.h, dualpipe_direction)
  bool overlap_next = false;  // a forward overlapped with the next pass (an F&B pair)
};
using DualPipeOrder = std::vector<std::vector<DualPipePass>>;  // [stage] passes in order

/// The eight steps of DualPipe.step on every stage (schedule.h, make_dualpipe, spells them out).
/// Throws InputError at /parallel/schedule unless p is even and m even with m >= 2p.
[[nodiscard]] DualPipeOrder dualpipe_order(Count p, Count m);

/// DualPipeV's order (deepseek-ai/DualPipe dualpipe/dualpipev.py, commit 3da1bbe; schedule.h,
/// make_dualpipe_v, spells out its eight steps): the V placement, `chunk` the V's chunk 0 or 1.
/// Throws InputError at /parallel/schedule unless m >= 2p.
[[nodiscard]] DualPipeOrder dualpipe_v_order(Count p, Count m);

/// Peak bytes of a stage's saved activations along `passes` (one stage's order): a (micro-batch,
/// chunk) set lives from its forward to its whole backward or its weight pass and holds
/// `chunk_bytes[chunk]` (the simulator's accounting, simulate.cpp).
[[nodiscard]] Bytes order_activation_peak(const std::vector<DualPipePass>& passes,
                                          const std::vector<Bytes>& chunk_bytes);

/// Peak bytes of saved activations on `stage` along its order: a (micro-batch, chunk) set lives
/// from its forward to its whole backward or its weight pass and holds `chunk_bytes`, plus
/// `first_bytes` on the first model stage (chunk 0 of stage 0, chunk 1 of stage p - 1) and
/// `last_bytes` on the last (chunk 0 of stage p - 1, chunk 1 of stage 0). Also the peak count of
/// sets (`peak_sets`).
struct DualPipePeak {
  Count peak_sets = 0;
  Bytes peak_bytes = 0;
};
[[nodiscard]] DualPipePeak dualpipe_activation_peak(Count p, Count m, Count stage,
                                                    Bytes chunk_bytes, Bytes first_bytes,
                                                    Bytes last_bytes);

}  // namespace distplan
