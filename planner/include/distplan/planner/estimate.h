// The planner's answer for one scenario: memory per pipeline stage by category, communication per
// collective, FLOPs, per-stage costs for the simulator, and an analytic step time.
// Every figure is per GPU unless its name says otherwise. Derivations: docs/memory.md,
// docs/communication.md, docs/flops.md, docs/time.md.
#pragma once

#include <string_view>
#include <vector>

#include "distplan/planner/spec.h"
#include "distplan/planner/traffic.h"
#include "distplan/planner/units.h"

namespace distplan {

struct StageMemory {
  int stage = 0;
  Count first_layer = 0;  // layers [first_layer, end_layer) (with interleaving: of the first chunk)
  Count end_layer = 0;
  Count num_layers = 0;  // transformer layers on this GPU (all its chunks)
  // Per chunk (virtual_stages of them, chunk order; pipeline_split.h): its transformer layers,
  // and the bytes one micro-batch saves through it (its layers, plus the embedding's or the final
  // norm and LM head's tensors on the chunk that holds them).
  std::vector<Count> chunk_layers;
  std::vector<Bytes> chunk_activation_bytes;
  Count parameters = 0;  // parameters one GPU of this stage holds before ZeRO-3 sharding
  double inflight_microbatches =
      0;                      // peak micro-batches with saved activations (stage-equivalents)
  Count inflight_chunks = 0;  // the same in (micro-batch, chunk) pairs; = above when v = 1
  Bytes activation_bytes_per_microbatch = 0;  // one micro-batch through all of this GPU's layers
  Bytes embedding_activation_bytes = 0;  // of the above: the first virtual stage's own (dropout)
  Bytes head_activation_bytes = 0;       // of the above: the last virtual stage's (norm, LM head)
  Bytes weights_bytes = 0;
  Bytes frozen_weights_bytes = 0;  // of weights_bytes: fine-tuning's frozen parameters (peft.h)
  Bytes gradients_bytes = 0;
  Bytes optimizer_bytes = 0;
  Bytes activations_bytes = 0;
  Bytes working_bytes = 0;  // of activations_bytes: the recompute working set of one layer
  Bytes buffers_bytes = 0;
  Bytes runtime_bytes = 0;
  Bytes transient_bytes = 0;  // inside a layer's backward: activation gradients, framework buckets
  // Live on top of the saved activations while a backward pass runs: the recompute working set of
  // one layer and the transient. Unlike the two fields above (what is live at the stage's joint
  // peak, which may fall after a forward), it does not depend on where the peak falls.
  Bytes backward_extra_bytes = 0;
  Bytes total_bytes = 0;  // GPU memory: the categories above
  // What PyTorch's caching allocator has handed out at the peak (max_memory_allocated), and what
  // the device holds then: the allocator's segments plus the runtime outside it (nvidia-smi).
  // generic: allocated = total - runtime, reserved = total (docs/memory.md).
  Bytes allocated_bytes = 0;
  Bytes reserved_bytes = 0;
  Bytes host_bytes = 0;  // offloaded model states and pinned swap buffers in host memory
  Bytes nvme_bytes = 0;  // model states swapped to NVMe
  bool operator==(const StageMemory&) const = default;
};

struct MemoryEstimate {
  Bytes capacity_bytes = 0;
  Bytes peak_bytes = 0;
  int peak_stage = 0;
  Bytes peak_allocated_bytes = 0;  // the largest stage allocated_bytes
  Bytes peak_reserved_bytes = 0;   // the largest stage reserved_bytes
  bool fits = false;               // peak_reserved_bytes <= capacity_bytes
  std::vector<StageMemory> stages;
  // Offload: per node, the node's GPUs (min(num_gpus, gpus_per_node)) times the stage with the
  // most; host_fits is false only when cluster.host_memory_bytes is given and exceeded.
  Bytes host_bytes_per_node = 0;
  Bytes host_capacity_bytes = 0;
  bool host_fits = true;
  Bytes nvme_bytes_per_node = 0;
  bool operator==(const MemoryEstimate&) const = default;
};

// ep: the expert-parallel group of a MoE layer's token all-to-all; edp: the expert data-parallel
// group that reduces (and ZeRO-shards) the routed experts' gradients (docs/communication.md).
// etp: the expert tensor-parallel group that gathers a MoE layer's routed tokens after the
// all-to-all and reduce-scatters the experts' outputs (Megatron-Core's expert-TP group).
enum class Group { dp, dp_replicate, tp, pp, embedding, cp, ep, edp, etp };
enum class CollectiveOp { all_reduce, reduce_scatter, all_gather, send_recv, all_to_all };
enum class Link { intra_node, inter_node };
[[nodiscard]] std::string_view to_string(Group v) noexcept;
[[nodiscard]] std::string_view to_string(CollectiveOp v) noexcept;
[[nodiscard]] std::string_view to_string(Link v) noexcept;

/// Ring wire bytes one GPU sends for one call with buffer size S on a group of n
/// (nccl-tests' bus-bandwidth factors; docs/communication.md).
[[nodiscard]] Bytes ring_wire_bytes(CollectiveOp op, Bytes buffer_bytes, Count group_size) noexcept;

struct Collective {
  Group group = Group::dp;
  CollectiveOp op = CollectiveOp::all_reduce;
  Link link = Link::intra_node;
  Traffic purpose = Traffic::layer_activations;  // what it moves (traffic.h)
  Count group_size = 1;
  Bytes bytes_per_call = 0;  // buffer handed to the collective
  Count calls_per_step = 0;
  Bytes wire_bytes_per_gpu_per_step = 0;
  Seconds seconds_per_step = 0;  // alpha-beta time of all calls, before overlap
  /// For display: "gradients (layers)", "activations (forward)".
  [[nodiscard]] std::string_view what() const noexcept { return to_string(purpose); }
  bool operator==(const Collective&) const = default;
};

struct CommunicationEstimate {
  Bytes wire_bytes_per_gpu_per_step = 0;
  std::vector<Collective>
      collectives;  // for the busiest GPU (per entry: the stage that sends most)
  bool operator==(const CommunicationEstimate&) const = default;
};

struct ComputeEstimate {
  // The model's forward + backward, all GPUs, with causal attention (half the s x s products:
  // Megatron-LM's convention; docs/flops.md): the MFU numerator.
  Flops model_flops_per_step = 0;
  // What the GPUs run: plus recomputation, and the masked half of the s x s products where
  // standard attention computes it (flash attention skips it).
  Flops hardware_flops_per_step = 0;
  bool operator==(const ComputeEstimate&) const = default;
};

/// One chunk's share of a stage's costs per micro-batch: its layers, and the embedding or the final
/// norm, LM head and loss on the chunk that holds them (pipeline_split.h). The simulator times
/// each chunk's passes with these.
struct ChunkCosts {
  Count layers = 0;
  Count parameters = 0;  // per TP rank: its layers' and units' (ZeRO gathers and reduces them)
  Seconds forward = 0;
  Seconds backward_input = 0;
  Seconds backward_weight = 0;
  Seconds recompute = 0;         // included in backward_input
  Seconds tp_communication = 0;  // included in forward and backward_input
  bool operator==(const ChunkCosts&) const = default;
};

/// Time of one micro-batch through one GPU of a stage (all its chunks together: the sums of
/// `chunks`), the figures the simulator schedules. Includes the TP collectives, which sit on the
/// critical path.
struct StageCosts {
  Seconds forward = 0;
  Seconds backward_input = 0;   // backward w.r.t. activations (B in the zero-bubble paper)
  Seconds backward_weight = 0;  // backward w.r.t. weights (W)
  Seconds recompute = 0;  // forward recomputation inside the backward (included in backward_input)
  // TP collectives per micro-batch (forward + backward) that the passes above wait on: all of
  // them, or with assumptions.tp_comm_overlap what the GEMMs leave exposed. An overlapped F&B
  // pair (DualPipe) can hide this much behind the other pass's computation, no more.
  Seconds tp_communication = 0;
  Seconds p2p = 0;  // one activation send to the next stage (or a gradient to the previous)
  Seconds cp_communication = 0;  // context-parallel exchanges per micro-batch (exposed part),
                                 // included in forward and backward_input
  Seconds ep_communication = 0;  // MoE token all-to-alls per micro-batch (dispatch and combine,
                                 // forward + backward), included in forward and backward_input
  Seconds zero3_gather = 0;  // ZeRO-3 parameter all-gathers per micro-batch (forward + backward)
  Seconds grad_reduce = 0;   // DP/ZeRO gradient reduction per step
  Seconds param_gather = 0;  // ZeRO-1/2 parameter all-gather after the optimizer step
  Seconds optimizer = 0;     // optimizer step (memory bound)
  Bytes wire_bytes_per_step = 0;   // ring wire bytes one GPU of this stage sends per step
  std::vector<ChunkCosts> chunks;  // one per chunk (virtual_stages), chunk order
  bool operator==(const StageCosts&) const = default;
};

/// Offload traffic and host work per step, for the stage with the most (docs/time.md, "Offload").
/// Its times are inside the stage costs: gradient copies in grad_reduce, parameter fetches in
/// zero3_gather, CPU optimizer, NVMe swaps and the parameter upload in optimizer.
struct OffloadEstimate {
  Bytes pcie_bytes_per_gpu_per_step = 0;   // host <-> GPU, both directions
  Bytes nvme_bytes_per_node_per_step = 0;  // reads and writes
  Seconds pcie_seconds = 0;                // per step, before overlap
  Seconds nvme_seconds = 0;
  Seconds cpu_optimizer_seconds = 0;
  bool operator==(const OffloadEstimate&) const = default;
};

/// Which engine timed a step. estimate() alone gives the closed forms of docs/time.md, a lower
/// bound of the step that the search prunes with; sim::plan() gives the walk of the schedule
/// program over the stage costs (the simulator's), which is what plan, simulate, search and
/// calibrate report (docs/time.md, "One timing engine").
enum class TimeEngine { lower_bound, schedule_walk };
[[nodiscard]] std::string_view to_string(TimeEngine v) noexcept;

struct TimeEstimate {
  TimeEngine engine = TimeEngine::lower_bound;
  Seconds step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;               // model FLOPs / (step time * GPUs * dense peak)
  double bubble_fraction = 0;   // idle share of the stages' time inside the step
  Seconds compute_seconds = 0;  // busy time of the slowest stage
  Seconds bubble_seconds = 0;
  Seconds exposed_communication_seconds = 0;
  Seconds optimizer_seconds = 0;
  bool operator==(const TimeEstimate&) const = default;
};

struct Estimate {
  Count parameters = 0;  // the model's, unpadded vocab
  Count padded_vocab_size = 0;
  Count num_microbatches = 0;  // per pipeline per step
  MemoryEstimate memory;
  CommunicationEstimate communication;
  ComputeEstimate compute;
  std::vector<StageCosts> stage_costs;
  OffloadEstimate offload;
  TimeEstimate time;
  bool operator==(const Estimate&) const = default;
};

/// Tokens per second and model FLOPs utilisation of a step of `step_seconds` (docs/flops.md,
/// "MFU"): the scenario's global batch of tokens, and its model FLOPs over the cluster's dense
/// peak in the compute dtype. 0 for a step of no time.
[[nodiscard]] double tokens_per_second(const Scenario& s, Seconds step_seconds) noexcept;
[[nodiscard]] double model_flops_utilization(const Scenario& s, Flops model_flops_per_step,
                                             Seconds step_seconds) noexcept;

/// Estimates a validated scenario (validate_scenario() must have accepted it).
[[nodiscard]] Estimate estimate(const Scenario& scenario);

/// The collectives of one GPU of pipeline stage `stage` (the estimate lists the busiest stage's).
[[nodiscard]] std::vector<Collective> stage_communication(const Scenario& scenario, int stage);

}  // namespace distplan
