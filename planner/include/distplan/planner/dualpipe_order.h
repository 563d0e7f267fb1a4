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
