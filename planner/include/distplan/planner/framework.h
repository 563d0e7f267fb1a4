// Training frameworks as memory sees them: which copies of the model states exist, the buffers a
// framework allocates beside them, the loss's fp32 logits, the backward's transient peak, and the
// runtime and caching-allocator overheads between what tensors need and what the device gives
// out. One profile per framework, every figure a named, overridable field with its source
// (docs/memory.md, "Framework profiles", "Runtime and allocator").
#pragma once

#include <string_view>

#include "distplan/planner/units.h"

namespace distplan {

/// The training framework a scenario assumes (`training.framework`, docs/scenario.md): what it
/// runs (capabilities.h) and how it keeps memory (FrameworkProfile below). `megatron` is
/// Megatron-LM / Megatron-Core (and NeMo, Megatron-Bridge, which drive it), `torchtitan` is
/// PyTorch's torchtitan on FSDP2 and torch.distributed.pipelining (JSON also accepts its former
/// name "fsdp2"), `deepspeed` is DeepSpeed's engine; `generic` keeps distplan's own textbook
/// conventions (the six categories, a flat runtime reserve) and runs every layout distplan models.
/// The scenario reader's default is `megatron`; a default-constructed TrainingSpec is `generic`,
/// the aggregate's zero state, with a zero profile to match.
enum class Framework { generic, megatron, deepspeed, torchtitan };
[[nodiscard]] std::string_view to_string(Framework v) noexcept;
/// The framework and the version whose code its conventions and capabilities are read from, for
/// people ("megatron (Megatron-LM core_v0.15.3)"); tables and exports print it.
[[nodiscard]] std::string_view framework_title(Framework v) noexcept;

/// One framework's memory conventions. Defaults are generic's (all framework terms off).
struct FrameworkProfile {
  // --- Copies of the model states ------------------------------------------------------------
  // Gradients in fp32 whatever the compute dtype: the default of grad_accumulation_dtype when the
  // scenario leaves it out. Megatron-LM forces --accumulate-allreduce-grads-in-fp32 under bf16
  // (megatron/training/arguments.py) and keeps fp32 main_grad buffers
  // (core/distributed/param_and_grad_buffer.py); torchtitan's FSDP2 reduces and keeps sharded
  // gradients in fp32 (MixedPrecisionPolicy reduce_dtype=float32). DeepSpeed does not: its
  // data_types.grad_accum_dtype defaults to the model's dtype (runtime/engine.py get_data_types).
  bool fp32_gradients_with_bf16 = false;
  // The sharded parameters are the fp32 master copy (FSDP2: fully_shard keeps sharded fp32
  // DTensor parameters, MixedPrecisionPolicy(param_dtype=bf16) casts only the all-gathered copy).
  // Under ZeRO-3 the weights are then 4 bytes per sharded parameter and the optimizer holds no
  // separate master copy.
  bool sharded_params_are_master = false;

  // Compute-dtype gradients (`.grad` of the bf16 parameters) stay allocated beside the
  // optimizer's own gradient buffer, unsharded: DeepSpeed's BF16_Optimizer accumulates each
  // backward's bf16 `.grad` into its flat gradients of grad_accum_dtype
  // (update_hp_grads(clear_lp_grads=False)) and frees them only at the start of the next
  // backward (clear_lp_grads), in the pipeline engine (runtime/pipe/engine.py,
  // _exec_backward_pass) and in engine.backward alike. Applies where DeepSpeed picks
  // BF16_Optimizer (bf16_optimizer_layout() in memory_terms.h).
  bool keeps_compute_dtype_gradients = false;
  // The same accumulation upcasts one parameter's gradient at a time (`lp.grad.to(fp32)` in
  // BF16_Optimizer.update_hp_grads): a transient of 4 bytes per element of the stage's largest
  // parameter tensor (the word embedding on the stages that hold it), after a backward, when the
  // recompute working set is freed. Where BF16_Optimizer runs with fp32 gradients.
  bool gradient_upcast_transient = false;
  // The ZeRO optimizer's step upcasts its gradient partition to the fp32 master's dtype before
  // stepping (DeepSpeed runtime/zero/stage_1_and_2.py step: flatten(averaged_gradients).to(fp32),
  // one parameter group at a time; stage3.py per sub-group of zero_optimization.sub_group_size):
  // a transient of 4 bytes per element of the partition (ZeRO-3: at most a sub-group), after the
  // backward. Applies to ZeRO 1-3 with gradients below fp32 and the optimizer on the GPU.
  bool optimizer_step_upcast = false;
  // FSDP under a pipeline keeps every unit gathered and its gradient unsharded for the whole
  // step: torchtitan's fsdp_reshard_after_forward "default" does not reshard after the forward
  // when pipelining (models/llama3/infra/parallelize.py apply_fsdp), and
  // torch.distributed.pipelining turns resharding after backward and gradient reduction off for
  // every micro-batch but the last (stage.py, backward_maybe_with_nosync:
  // set_reshard_after_backward(False), set_requires_gradient_sync(False)); FSDP2 accumulates the
  // unsharded gradient in reduce_dtype (fp32). Under ZeRO-3 with pp > 1 the stage's weights then
  // hold its gathered compute-dtype copy beside the fp32 shard, and its gradients are unsharded.
  bool fsdp_unsharded_with_pipeline = false;
  // A pipeline engine that keeps each in-flight micro-batch's stage output until that
  // micro-batch's backward: DeepSpeed's PipelineEngine stores it in pipe_buffers['outputs']
  // (runtime/pipe/engine.py, _exec_forward_pass; freed in _exec_backward_pass), partitioned over
  // the tensor-parallel group when tp > 1 (PartitionedTensor, `pipeline.pipe_partitioned`, on by
  // default): tokens x h x cb / tp per micro-batch on every stage that sends activations, with
  // one chunk per stage (DeepSpeed's TrainSchedule has no virtual stages).
  // Megatron-LM frees the output's storage once sent (deallocate_output_tensor): no term there.
  bool pipeline_output_buffers = false;

  // --- Buckets (elements; 0 = none beyond the gradient buffer) --------------------------------
  // DeepSpeed ZeRO-1/2 `reduce_bucket_size` (default 5e8 elements): the contiguous gradient
  // bucket (ipg_buffer in runtime/zero/stage_1_and_2.py) in the compute dtype, `reduce_buckets`
  // of them, twice that with overlap_comm (assumptions.overlap_grad_reduce: double-buffered).
  // Megatron-LM's buckets are views into the gradient buffer and cost nothing here.
  Count reduce_bucket_elements = 0;
  Count reduce_buckets = 1;
  // DeepSpeed ZeRO-3 `stage3_prefetch_bucket_size` (default 5e7 elements): parameters fetched
  // ahead of use in the compute dtype, on top of distplan's gathered-unit window.
  Count prefetch_bucket_elements = 0;

  // --- Loss -------------------------------------------------------------------------------
  // fp32 logit-sized tensors alive at the loss's peak, beside the compute-dtype logits. Megatron's
  // fused vocab-parallel cross-entropy upcasts once and works in place (1); torchtitan and
  // Hugging Face models upcast (`.float()`) and F.cross_entropy keeps its log-softmax output (2).
  Count loss_fp32_copies = 1;
  // Whether the compute-dtype logits are still alive at that peak. torchtitan's train.py deletes
  // them (`del pred`) before loss.backward(), and the loss's peak is then in its backward: the
  // saved fp32 log-softmax, nll_loss's dense gradient of it and log_softmax's input gradient
  // (PyTorch aten/src/ATen/native/LossNLL.cpp and SoftMax.cpp allocate both gradients at the
  // input's full shape): 3 fp32 copies and no compute-dtype logits.
  bool loss_keeps_logits = true;
  // Chunked loss: the logits are computed and freed in this many sequence chunks (1 = none).
  Count loss_chunks = 1;

  // --- Backward transient ------------------------------------------------------------------
  // Activation-gradient tensors of a layer's largest saved tensor alive together while its
  // backward runs (autograd holds an op's output gradient and its input gradient at once: 2).
  // 0: not counted (generic).
  Count backward_gradient_tensors = 0;

  // --- Runtime outside the caching allocator -------------------------------------------------
  // CUDA context with PyTorch's kernels (module lazy loading, CUDA >= 11.7): not seen by
  // torch.cuda.memory_reserved(), seen by nvidia-smi.
  Bytes cuda_context_bytes = 0;
  // NCCL (docs/memory.md, "NCCL communicators"). NCCL <= 2.21 connects every channel's ring and
  // tree when a communicator is created (src/init.cc, initTransportsRank) and each receive
  // connection holds the buffers of the three protocols (src/transport/p2p.cc, p2pRecvSetup),
  // rounded up to CUDA's IPC granularity of 2 MiB: SIMPLE NCCL_BUFFSIZE, LL NCCL_LL_BUFFSIZE,
  // LL128 NCCL_LL128_BUFFSIZE (src/init.cc and src/include/devcomm.h defaults).
  Bytes nccl_buffer_bytes = 0;
  Bytes nccl_ll_buffer_bytes = 0;
  Bytes nccl_ll128_buffer_bytes = 0;
  Count nccl_channels = 0;
  // Per communicator beside its ring and tree buffers. Fitted, see framework.cpp.
  Bytes nccl_communicator_bytes = 0;
  // Process groups that get a communicator of their own beside the layout's tp, dp, cp, ep and
  // pipeline groups (a group used by a collective gets one at its first use):
  // the default (world) group, used by a collective at start-up;
  bool nccl_world_group = false;
  // the model-parallel group (tp x pp ranks), whose all-reduce sums the gradient norm;
  bool nccl_model_parallel_group = false;
  // the whole pipeline group as one communicator (batched send/receive or a loss broadcast over
  // it) — else only a pair communicator per pipeline neighbour (plain send/recv);
  bool nccl_pipeline_group = false;
  // a pair communicator per pipeline neighbour (torch.distributed.send/recv: one per peer pair);
  bool nccl_pipeline_pairs = false;
  // a second tp-sized group of the pipeline engine for its partitioned stage tensors.
  bool nccl_pipeline_slice_group = false;

  // --- Caching allocator ------------------------------------------------------------------
  // cuBLAS workspace, allocated through PyTorch's caching allocator (CUBLAS_WORKSPACE_CONFIG
  // default; one per handle and stream).
  Bytes cublas_workspace_bytes = 0;
  // Reserved beyond allocated for the tensors freed and reallocated each step (activations,
  // buffers, transients): free blocks a new request cannot use (CUDACachingAllocator splits a
  // cached block only when the remainder exceeds 1 MiB and never merges across segments).
  double allocator_fragmentation = 0;
  // false (generic): no runtime or allocator model; cluster.runtime_reserve_bytes is the runtime.
  bool models_allocator = false;

  bool operator==(const FrameworkProfile&) const = default;
};

/// The framework's profile (sources beside each value in framework.cpp).
[[nodiscard]] FrameworkProfile framework_profile(Framework f) noexcept;

/// PyTorch's CUDA caching allocator rules (c10/cuda/CUDACachingAllocator.cpp).
namespace allocator {
inline constexpr Bytes kMinBlockSize = 512;        // every request rounds up to 512 bytes
inline constexpr Bytes kSmallSize = 1 << 20;       // largest "small" request: 1 MiB
inline constexpr Bytes kSmallBuffer = 2 << 20;     // small requests share 2 MiB segments
inline constexpr Bytes kLargeBuffer = 20 << 20;    // requests in (1, 10) MiB: 20 MiB segments
inline constexpr Bytes kMinLargeAlloc = 10 << 20;  // from 10 MiB a request gets its own segment
inline constexpr Bytes kRoundLarge = 2 << 20;      // ... rounded up to 2 MiB

/// A request's block size (round_size).
[[nodiscard]] constexpr Bytes block_bytes(Bytes request) noexcept {
  return request < kMinBlockSize ? kMinBlockSize
                                 : (request + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}
/// The segment cudaMalloc'd for a request that no cached block serves (get_allocation_size).
[[nodiscard]] constexpr Bytes segment_bytes(Bytes request) noexcept {
  if (request <= kSmallSize) return kSmallBuffer;
  if (request < kMinLargeAlloc) return kLargeBuffer;
  return (request + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}
/// Whether a cached block of `block` bytes is split to serve `request` bytes (should_split):
/// small-pool blocks whenever 512 bytes remain, large-pool blocks only above 1 MiB.
[[nodiscard]] constexpr bool splits(Bytes block, Bytes request) noexcept {
  const Bytes remaining = block - block_bytes(request);
  return block_bytes(request) <= kSmallSize ? remaining >= kMinBlockSize : remaining > kSmallSize;
}
}  // namespace allocator

}  // namespace distplan
