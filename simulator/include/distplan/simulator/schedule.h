// Schedule programs: for each pipeline stage, the ordered list of compute actions it runs in one
// training step. Sends and receives follow from the dependencies. The simulator times a program
// and the GPU backend executes the same program (docs/simulator.md, "Schedules").
//
// Letters used throughout: p = pipeline stages, m = micro-batches per step, v = virtual stages
// (model chunks) per GPU. Chunk c of stage s is virtual stage c*p + s (Megatron-LM's placement),
// or, for the V-shape schedules, s (chunk 0) and 2p - 1 - s (chunk 1): virtual_stage_of() in
// distplan/planner/layout.h is the one map the checker, the simulator and the planner use.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "distplan/planner/layout.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"
#include "distplan/planner/zb_auto.h"

namespace distplan::sim {

/// What one action computes. `backward` is the whole backward (input and weight gradients);
/// `backward_input` and `backward_weight` are its two halves (B and W in Qi et al. 2023).
enum class Op : std::uint8_t { forward, backward, backward_input, backward_weight };

[[nodiscard]] std::string_view to_string(Op op) noexcept;

struct Action {
  Op op = Op::forward;
  std::int32_t microbatch = 0;
  std::int32_t chunk = 0;
  /// A forward that runs overlapped with the next action of its stage, a backward of another
  /// chunk, as one F&B pair (DualPipe, DeepSeek-AI 2024, Sec. 3.2.1): the pair starts when both
  /// inputs have arrived and takes the F&B time, the two passes' computation hiding each other's
  /// in-pass communication (docs/simulator.md, "DualPipe").
  bool overlap_next = false;
  bool operator==(const Action&) const = default;
};

/// One program per stage. Invariants (check_program): every (micro-batch, chunk) pair that runs
/// (all of them; under DualPipe's bidirectional placement those whose chunk is the micro-batch's
/// direction, dualpipe_direction in layout.h) appears on every stage with one forward and either
/// one backward or one backward_input followed later by one backward_weight; every backward follows
/// its forward; the program cannot deadlock.
struct SchedulePrograms {
  Count stages = 0;                           // p
  Count virtual_stages = 1;                   // v
  Count microbatches = 0;                     // m
  bool v_shape = false;                       // chunk placement: V (v = 2) or interleaved
  bool bidirectional = false;                 // DualPipe's two directions (v = 2)
  std::vector<std::vector<Action>> programs;  // [stage][position]
  bool operator==(const SchedulePrograms&) const = default;

  /// Virtual stage of chunk `chunk` on `stage` (layout.h, virtual_stage_of).
  [[nodiscard]] Count virtual_stage(Count stage, Count chunk) const noexcept;
  /// Stage and chunk of virtual stage `vs` on the path of a micro-batch run by chunk `chunk`
  /// (the chunk matters only under the bidirectional placement).
  [[nodiscard]] StageChunk locate(Count vs, Count chunk) const noexcept;
  /// Virtual stages a micro-batch passes: p v, or p under the bidirectional placement.
  [[nodiscard]] Count path_length() const noexcept {
    return bidirectional ? stages : stages * virtual_stages;
  }
  /// Whether micro-batch `mb` runs through chunk `chunk` (always, but under the bidirectional
  /// placement: its direction's chunk only).
  [[nodiscard]] bool runs(Count mb, Count chunk) const noexcept;

  [[nodiscard]] std::size_t num_actions() const noexcept {
    std::size_t n = 0;
    for (const auto& prog : programs) n += prog.size();
    return n;
  }
};

/// GPipe (Huang et al. 2019): all forwards, then all backwards in reverse micro-batch order
/// (the order autograd releases them; any order gives the same time with uniform costs).
[[nodiscard]] SchedulePrograms make_gpipe(Count p, Count m);
/// 1F1B / PipeDream-Flush (Narayanan et al. 2021): stage s runs min(p - s - 1, m) warm-up
/// forwards, then alternates one forward and one backward, then drains the backwards.
[[nodiscard]] SchedulePrograms make_1f1b(Count p, Count m);
/// Megatron-LM's interleaved 1F1B with v chunks per GPU (Narayanan et al. 2021, Sec. 2.2;
/// megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches): warm-up
/// (p - s - 1)*2 + (v - 1)*p virtual micro-batches capped at m*v, with Megatron-LM's default
/// micro-batch group of p. Requires m % p == 0 (InputError).
[[nodiscard]] SchedulePrograms make_interleaved_1f1b(Count p, Count m, Count v);
/// ZB-H1 (Qi et al. 2023, Sec. 2.1): 1F1B's warm-up with the backward split into B and W, stage s
/// deferring its first s weight passes, so every stage keeps at most p micro-batches alive.
[[nodiscard]] SchedulePrograms make_zb_h1(Count p, Count m);
/// ZB-H2 (Qi et al. 2023, Sec. 2.2): min(2(p - s) - 1, m) warm-up forwards and 2s deferred weight
/// passes on stage s (at most 2p - 1 micro-batches alive); a parallelogram when T_F = T_B = T_W.
/// The order of the authors' get_hand_schedule(warmup_c = 2) (sail-sg/zero-bubble-pipeline-
/// parallelism, megatron/core/pipeline_parallel/efficiency.py): F, then B and its due W per step.
[[nodiscard]] SchedulePrograms make_zb_h2(Count p, Count m);

/// ZB-V (Qi et al. 2023, Sec. 6; Qi et al. 2024): two chunks per stage in a V, the backward split
/// into B and W, zero bubble when T_F = T_B = T_W with 1F1B's activation peak (2p chunks of half a
/// stage on stage 0). The order of PyTorch's ScheduleZBVZeroBubble (pytorch/pytorch
/// torch/distributed/pipelining/schedules.py, commit 00722e648b740f91d0e71494baa17891749fd291):
/// 2(p - s) - 1 chunk-0 forwards, s pairs (F chunk 1, F chunk 0), p - s (F, B, W) of chunk 1,
/// then (F, B, W) of chunk 0 and of chunk 1 alternately, then the drain; built for
/// max(m, 2p - 1) micro-batches with those past m left out, as PyTorch does.
[[nodiscard]] SchedulePrograms make_zb_v(Count p, Count m);

/// V-Half and V-Min (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", Sec. 4):
/// the V placement with the authors' stable building block repeated every 6 unit slots. Stage s
/// runs, for micro-batch k, F of chunk 0, F of chunk 1, B of chunk 1 and B of chunk 0 at slots
///   V-Half: 2s, 3p - s - 2, 3p + d + 2s - 1, 6p + d - s - 2   (d = 3 if p is even, else 0)
///   V-Min:  s, 2p - s - 1, 2p + d + s, 4p + d - s - 1          (d = 2 if 3 divides p, else 0)
/// plus 6k; the authors' reordering ("squeeze", v_reorder.h) moves the warm-up and cool-down
/// passes earlier without raising the largest stage's activation peak; each empty slot then takes
/// the oldest pending W (chunk 1's first) and the program is that slot order
/// (sail-sg/zero-bubble-pipeline-parallelism, megatron/core/pipeline_parallel/zerobubble/
/// scheduler/zbv_greedy.py, stable_pattern_v_half / stable_pattern_v_min / put_w / reorder,
/// commit 064369d6a5c670cc20480a201363e3c0a4ec0246).
[[nodiscard]] SchedulePrograms make_v_half(Count p, Count m);
[[nodiscard]] SchedulePrograms make_v_min(Count p, Count m);

/// DualPipeV (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipev.py, commit 3da1bbe, the
/// "cut-in-half" of DualPipe by Sea AI Lab): the V placement, stage s (rank r of p) runs
///   1. 2(p - r - 1) F chunk 0;  2. r + 1 (F chunk 0, F chunk 1);
///   3. p - r - 1 (B chunk 1 split, its W, F chunk 1);
///   4. m - 2p + r + 1 (F0 & B1, F1 & B0) overlapped pairs (the last rank's first F0, B1 not
///      overlapped); 5. p - r - 1 (B chunk 1, F1 & B0);
///   6. r + 1 (B chunk 1, B chunk 0), split from the middle one on (its W deferred);
///   7. p - r - 1 (W, B chunk 0 split);  8. the r + 1 remaining W, first in first out.
/// Backward passes outside steps 3, 6 and 7 are whole (B and W together). Needs m >= 2p.
[[nodiscard]] SchedulePrograms make_dualpipe_v(Count p, Count m);

/// DualPipe (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipe.py, commit 3da1bbe):
/// bidirectional, stage s holds model stages s (chunk 0) and p - 1 - s (chunk 1); micro-batches
/// 0 .. m/2 - 1 enter at stage 0, m/2 .. m - 1 at stage p - 1 (layout.h, dualpipe_locate).
/// With h = min(s, p - 1 - s), n = p/2 and "phase 0" chunk 0 on the first half of the stages and
/// chunk 1 on the second, stage s runs the source's eight steps:
///   1. 2(n - h - 1) F phase 0;  2. h + 1 (F phase 0, F phase 1);
///   3. n - h - 1 (B phase 1 split, the oldest W, F phase 1);
///   4. m/2 - p + h + 1 (F0 & B1, F1 & B0) overlapped pairs (the middle stages' first F0, B1 not
///      overlapped); 5. n - h - 1 (B phase 1, F1 & B0);
///   6. h + 1 (B phase 1, B phase 0), split from the middle one on (its W deferred);
///   7. n - h - 1 (the oldest W, B phase 0 split);  8. the h + 1 remaining W, first in first out.
/// Needs p even and m even with m >= 2p (the source's assertions; InputError at
/// /parallel/schedule otherwise).
[[nodiscard]] SchedulePrograms make_dualpipe(Count p, Count m);

/// zb_auto (Qi et al. 2023, Sec. 3.1): the order of the paper's heuristic (zb_auto_schedule in
/// distplan/planner/zb_auto.h) for these per-stage times and memory limits; its steps overlap.
[[nodiscard]] SchedulePrograms make_zb_auto(Count m, const std::vector<ZbAutoStage>& stages,
                                            Seconds p2p);

/// The generator for a scenario's schedule kind. Throws InputError (path "/parallel/schedule" or
/// "/parallel/virtual_stages") when the kind cannot be built for (p, m, v); zb_auto, which needs
/// the stage times, from make_zb_auto.
[[nodiscard]] SchedulePrograms make_schedule(Schedule kind, Count p, Count m, Count v);

/// Validates a program and throws InputError with a JSON pointer into the schedule document
/// ("/stages/<s>/<i>") and a message naming the stage, position and action. Checks the
/// invariants above and finds deadlocks by executing the dependency graph (no timing).
void check_program(const SchedulePrograms& prog);

/// Text form of one action: "F3", "B3", "BI3", "W3", with ".c" appended when chunk c > 0.
[[nodiscard]] std::string action_to_string(const Action& a);

}  // namespace distplan::sim
