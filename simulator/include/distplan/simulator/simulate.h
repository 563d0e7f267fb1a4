// Discrete-event simulation of one training step of one pipeline (its DP replicas run the same
// timeline): the step time, the bubbles, exposed communication and activation memory over time.
// docs/simulator.md gives the event model, the cost sources and the closed forms the tests check.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"
#include "distplan/simulator/schedule.h"

namespace distplan::sim {

/// API.md's `costs` object: the times of one micro-batch through one whole stage, the same on
/// every stage (a chunk takes 1/v). With backward_weight_seconds, backward_seconds is the
/// input-gradient part only; without it, the weight-gradient time is part of backward_seconds
/// (a split schedule then runs W in zero time). Replaces the whole cost model: no DP/ZeRO
/// communication and no optimizer step.
struct CostOverride {
  Seconds forward_seconds = 0;
  Seconds backward_seconds = 0;
  std::optional<Seconds> backward_weight_seconds;
  Seconds p2p_seconds = 0;
  /// F&B: a forward and a whole backward (B and W) of another micro-batch or chunk run as one
  /// overlapped pair (DualPipe), for the whole stage. Without it, forward + backward (+ weight):
  /// nothing to hide. A pair with an input-gradient pass takes this less the weight time.
  std::optional<Seconds> forward_backward_seconds;
  bool operator==(const CostOverride&) const = default;
};

struct TraceEvent;
struct MemorySample;

/// Receives the trace as the simulation produces it, so a caller can stream it out instead of
/// holding it (SimOptions::trace_sink). May throw; the simulation then stops with that exception.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void slice(const TraceEvent& e) = 0;
  virtual void memory(const MemorySample& m) = 0;
};

struct SimOptions {
  std::optional<CostOverride> costs;
  bool record_trace = false;
  /// With record_trace: events go to this sink as they happen and SimResult::trace and ::memory
  /// stay empty (bounded memory at any size); nullptr: they are stored in the SimResult.
  TraceSink* trace_sink = nullptr;
  /// A custom program (checked with check_program); nullptr: generated from the scenario.
  const SchedulePrograms* program = nullptr;
  /// Also simulate the step with every communication at zero time, to report the exposed part.
  bool exposed_communication = true;
  /// Gradient bucket for the overlapped DP reduction (PyTorch DDP's bucket_cap_mb = 25 default).
  Bytes grad_bucket_bytes = 25 * 1024 * 1024;
  /// Set by another thread to stop the run (Python's Ctrl-C): checked every kCancelCheckEvents
  /// events; simulate() then throws Cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

/// simulate() stopped at SimOptions::cancel.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("the simulation was cancelled") {}
};
/// Events between two looks at SimOptions::cancel (about a millisecond of simulation).
inline constexpr std::uint64_t kCancelCheckEvents = 65536;

/// What a slice of the trace is.
enum class SliceKind : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  optimizer,
  send_activation,  // to the next stage
  send_gradient,    // to the previous stage
  grad_reduce,      // DP / ZeRO gradient reduction (one bucket)
  param_gather,     // ZeRO-1/2 parameter all-gather after the optimizer
  zero3_gather,     // ZeRO-3 parameter all-gather before a forward or backward
};
[[nodiscard]] std::string_view to_string(SliceKind k) noexcept;

/// The per-GPU streams of a stage, one trace track each.
enum class Track : std::uint8_t { compute, send_next, send_prev, dp, zero3 };
[[nodiscard]] std::string_view to_string(Track t) noexcept;

struct TraceEvent {
  std::int32_t stage = 0;
  Track track = Track::compute;
  SliceKind kind = SliceKind::forward;
  std::int32_t microbatch = -1;  // -1 when the slice belongs to no micro-batch
  std::int32_t chunk = -1;
  Seconds start = 0;
  Seconds duration = 0;
  bool operator==(const TraceEvent&) const = default;
};

/// Live activation bytes of a stage from `time` on (recorded with the trace).
struct MemorySample {
  std::int32_t stage = 0;
  Seconds time = 0;
  Bytes activation_bytes = 0;
  bool operator==(const MemorySample&) const = default;
};

struct StageResult {
  int stage = 0;
  Seconds busy_seconds = 0;         // compute stream: forward/backward passes and the optimizer
  Seconds first_start_seconds = 0;  // start of the stage's first pass
  Seconds compute_end_seconds = 0;  // end of its last forward/backward pass
  Seconds end_seconds = 0;          // its optimizer, gradient reduction and sends all done
  /// Idle time of the compute stream between its first and last pass (the per-stage bubble of
  /// Qi et al. 2023, Table 2).
  Seconds span_idle_seconds = 0;
  Count peak_inflight_microbatches = 0;  // distinct micro-batches with saved activations
  Count peak_inflight_chunks = 0;        // (micro-batch, chunk) activation sets; = above when v = 1
  Bytes peak_activation_bytes = 0;
  // The stage's allocated peak over the step: its static bytes (model states, buffers, workspace)
  // plus the largest of the live activations at any pass and, at each backward pass, the live
  // activations with that pass's recompute working set and transient (docs/memory.md).
  Bytes peak_allocated_bytes = 0;
  // The live activations at that peak, and whether it falls at the start of a backward pass (then
  // the recompute working set and the transient are live on top of them) or after a forward.
  Bytes peak_moment_activation_bytes = 0;
  bool peak_in_backward = false;
  // Of busy_seconds: what passes lost to communication they hid (overlap_compute_slowdown).
  Seconds overlap_slowdown_seconds = 0;
  Seconds send_seconds = 0;              // point-to-point sends issued by this stage
  Seconds dp_communication_seconds = 0;  // gradient reduction and parameter gathers
  Seconds optimizer_seconds = 0;
  bool operator==(const StageResult&) const = default;
};

struct SimResult {
  Seconds step_seconds = 0;
  double bubble_fraction = 0;  // 1 - sum(busy) / (p * step)
  /// Step time minus the step time with all communication (p2p, DP, ZeRO) at zero; TP
  /// collectives sit inside the compute passes (StageCosts) and are not part of it.
  Seconds exposed_communication_seconds = 0;
  Count microbatches = 0;
  Count virtual_stages = 1;
  std::uint64_t events = 0;  // events the engine processed (the main run)
  std::vector<StageResult> stages;
  std::vector<TraceEvent> trace;     // when SimOptions::record_trace
  std::vector<MemorySample> memory;  // when SimOptions::record_trace
  bool operator==(const SimResult&) const = default;
};

/// The most (micro-batch, stage, chunk) passes one simulated step may have: 2^24, about 2 s and
/// 500 MB of simulation (a 1F1B step with p = 64 and m = 4096 has 2^18).
inline constexpr double kMaxPasses = 16777216.0;
/// zb_auto builds its program with the Zero Bubble paper's list scheduler before the walk, about 4
/// times the time and memory of a fixed schedule's walk per pass (a 64-stage step of 2^24
/// passes: 35.8 s and 3.2 GB under zb_auto, 8.9 s and 0.8 GB under 1F1B, this machine). So it
/// accepts kMaxPasses / 4.
inline constexpr double kZbAutoPassCost = 4.0;

/// The program the scenario's schedule runs: make_schedule, or for zb_auto the paper's heuristic
/// on the estimate's stage times (the order simulate() times and the CPU backend executes; every
/// rank builds the same one from the same scenario).
[[nodiscard]] SchedulePrograms scenario_program(const Scenario& s, const Estimate& e);

/// Simulates one step. `e` supplies the per-stage costs (e.stage_costs, unless opts.costs) and the
/// activation bytes per micro-batch (e.memory.stages). Throws InputError for a custom program that
/// does not fit the scenario or fails check_program, a schedule the scenario cannot build, or a
/// step of more than kMaxPasses passes.
[[nodiscard]] SimResult simulate(const Scenario& s, const Estimate& e, const SimOptions& opts = {});

/// True when the two pipeline stages' first GPUs sit in different nodes (Megatron-LM rank order,
/// rank = tp + TP*(dp + DP*pp)): their point-to-point traffic crosses the inter-node link.
[[nodiscard]] bool stages_cross_nodes(const Scenario& s, Count stage_a, Count stage_b) noexcept;

}  // namespace distplan::sim
