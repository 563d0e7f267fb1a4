// Communication overlapped with computation: the one formula the planner's step time and the
// simulator's overlapped F&B pairs (DualPipe) share (docs/time.md, docs/simulator.md).
#pragma once

#include <algorithm>

#include "distplan/planner/units.h"

namespace distplan {

/// Seconds that `comm` seconds of communication add to a `window` of computation they overlap:
/// what does not fit stays exposed, and the computation it overlaps runs `slowdown` slower while
/// the communication kernels share the SMs (assumptions.overlap_compute_slowdown).
[[nodiscard]] constexpr Seconds exposed_after_overlap(Seconds comm, Seconds window,
                                                      double slowdown) noexcept {
  return std::max(0.0, comm - window) + slowdown * std::min(comm, window);
}

/// Two passes run as one overlapped pair (DualPipe's F&B, DeepSeek-AI 2024, Sec. 3.2.1): `passes`
/// seconds of which `comm` are in-pass communication (TP collectives, all-to-all) that each pass
/// would otherwise wait for. Interleaving the two passes hides one's communication behind the
/// other's computation: the pair takes its computation plus what of the communication stays
/// exposed.
[[nodiscard]] constexpr Seconds overlapped_pair_seconds(Seconds passes, Seconds comm,
                                                        double slowdown) noexcept {
  const Seconds compute = std::max(0.0, passes - comm);
  return compute + exposed_after_overlap(comm, compute, slowdown);
}

}  // namespace distplan
