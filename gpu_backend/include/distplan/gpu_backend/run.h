// Runs a scenario for real: the sharded model of the planner's layer op table, trained for a few
// steps on this rank, measuring memory by category, bytes handed to every collective, the executed
// pipeline program and times (docs/gpu_backend.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "distplan/gpu_backend/comm.h"
#include "distplan/gpu_backend/memory.h"
#include "distplan/planner/spec.h"
#include "distplan/simulator/schedule.h"
#include "distplan/simulator/simulate.h"

namespace distplan::backend {

struct RunOptions {
  Count steps = 5;
  CommBackend comm = CommBackend::emulated;  // mpi when the layout has several ranks
  int emulate_rank = 0;                      // the rank an emulated run stands for
  Device device = Device::cpu;
  Bytes capacity_bytes = 0;  // > 0: allocations past it throw OutOfMemory (memory.h)
  std::uint64_t seed = 1234;
  float learning_rate = 1e-3f;
  float weight_decay = 0.01f;
  // Every step trains on the first step's batch (tests that a model can overfit it: a working
  // optimizer must drive that loss down; fresh data every step hides a dead one).
  bool repeat_batch = false;
  // Non-empty: after the first step's gradient reduction, before the optimizer, every rank writes
  // the reduced gradient it holds to DIR/rank<world rank>.grad (gradient_dump.h).
  std::string dump_gradients;
  // Non-empty: after the last step every rank writes the weights it holds (its ZeRO-3 shard, or
  // the whole unit) to DIR/rank<world rank>.weights, in the same format (fine-tuning's tests
  // check that a frozen base is bit for bit what it was).
  std::string dump_weights;
  // CUDA: fp32 GEMM inputs on TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation).
  bool tf32 = false;
};

struct ExecutedAction {
  sim::Action action;
  Seconds seconds = 0;
};

/// Token copies the MoE layers of one rank dispatched in the measured step (forward dispatch,
/// every MoE layer and micro-batch): the routing that happened, to set beside the planner's
/// even-split all-to-all bytes (docs/gpu_backend.md, "Mixture of Experts").
struct MoeRouting {
  Count copies = 0;          // tokens * top_k routed copies sent (to every rank, this one too)
  Count to_other_ranks = 0;  // of which to other ranks of the ep group
  Count received = 0;        // copies this rank's experts took
  bool operator==(const MoeRouting&) const = default;
};

/// One rank's figures for the last (measured) step.
struct RankMeasurement {
  int rank = 0;
  RankCoords coords;
  MemoryStats memory;                   // peaks over the measured step, at requested size
  std::vector<ExecutedAction> actions;  // this stage's program as executed
  /// The executed timeline of the measured step, seconds from the rank's step start: every action
  /// and the optimizer on the compute track, sends, DP/ZeRO reductions and gathers on their
  /// streams (the simulator's tracks and slice kinds; `stage` = this rank's stage).
  std::vector<sim::TraceEvent> timeline;
  std::map<CommLog::Key, CommTotals> communication;  // bytes handed per (group, op, what)
  MoeRouting moe;
  Seconds step_seconds = 0;
  Seconds optimizer_seconds = 0;
};

struct Measurement {
  std::vector<double> losses;          // mean token loss of each step (all ranks agree)
  std::vector<bool> skipped;           // fp16: the step was skipped on overflow
  std::vector<RankMeasurement> ranks;  // every rank on rank 0 (MPI), this rank otherwise
};

/// Trains `steps` steps of `s` as the calling rank. With CommBackend::mpi, MPI must be initialised
/// with tp*cp*dp*pp ranks; rank 0's result holds every rank's measurement, other ranks' only
/// theirs. Throws InputError for layouts the backend does not implement (docs/gpu_backend.md,
/// "Limits").
[[nodiscard]] Measurement run(const Scenario& s, const RunOptions& opts);
/// Throws InputError on /parallel/schedule for a pipeline whose exchanges can wait on each other
/// under NCCL's rules (one stream per rank, each group complete as a whole, messages past the
/// eager buffers sent by rendezvous): interleaved 1F1B, ZB-H2 and the V schedules (zb_v, v_half,
/// v_min, dualpipe_v) with pp > 1.
/// tests/gpu_backend/pipeline_rendezvous_test.cpp reproduces the cycle for exactly these; MPI and
/// emulated runs take every schedule (docs/gpu_backend.md, "Pipeline messages").
void check_nccl_pipeline(const ParallelSpec& p);
/// The same on groups the caller built (for `groups.world_rank`): tests put communicators with
/// other matching rules in (tests/gpu_backend/pipeline_rendezvous_test.cpp).
[[nodiscard]] Measurement run_on_groups(const Scenario& s, const RunOptions& opts,
                                        ProcessGroups& groups);

/// True when built with CUDA and a GPU is visible (cudaGetDeviceCount succeeds with one or more).
[[nodiscard]] bool cuda_available() noexcept;

/// The training frameworks whose conventions the backend trains with (megatron, generic): the
/// others are refused at /training/framework by check_supported.
[[nodiscard]] bool emulates(Framework f) noexcept;
/// Throws InputError naming the field when the backend cannot run `s`: a framework it does not
/// emulate, offload, fp8, q/k norms, and the layouts docs/gpu_backend.md ("Limits") lists. run()
/// and run_on_groups() call it, so every caller (the CLI, tests, a library user) is refused alike.
void check_supported(const Scenario& s);
/// The part of check_supported for Mixture-of-Experts models (nothing for a dense one): throws
/// InputError at the field the CPU trainer does not implement (docs/gpu_backend.md, "Mixture of
/// Experts"). `device` and `comm`: the CUDA device and the emulated communicator refuse MoE
/// layers with ep > 1 or at all (CUDA). `distplan validate` refuses MoE models until the planner
/// plans them; this is the switch it calls once it does.
void check_moe_supported(const Scenario& s, Device device = Device::cpu,
                         CommBackend comm = CommBackend::mpi);
/// Throws InputError naming the field when the backend cannot run `s` on `device` (CUDA: no
/// context parallelism).
void check_supported_on(const Scenario& s, Device device);

}  // namespace distplan::backend
