// Framework memory profiles (framework.h) and their JSON form (assumptions.framework_profile).
// Sources: docs/memory.md, "Framework profiles" and "Runtime and allocator".
#include "distplan/planner/framework.h"

#include <nlohmann/json.hpp>

#include "json_reader.h"

namespace distplan {

std::string_view to_string(Framework v) noexcept {
  switch (v) {
    case Framework::generic:
      return "generic";
    case Framework::megatron:
      return "megatron";
    case Framework::deepspeed:
      return "deepspeed";
    case Framework::torchtitan:
      return "torchtitan";
  }
  return "generic";
}

std::string_view framework_title(Framework v) noexcept {
  switch (v) {
    case Framework::generic:
      return "generic (distplan's textbook conventions, every layout it models)";
    case Framework::megatron:
      return "megatron (Megatron-LM core_v0.15.3)";
    case Framework::deepspeed:
      return "deepspeed (DeepSpeed v0.18.0)";
    case Framework::torchtitan:
      return "torchtitan (torchtitan v0.2.2, FSDP2 and torch.distributed.pipelining)";
  }
  return "generic";
}

namespace {

// What every PyTorch framework shares: the CUDA runtime, NCCL and the caching allocator.
FrameworkProfile pytorch_runtime() noexcept {
  FrameworkProfile p;
  p.models_allocator = true;
  // CUDA context of a PyTorch process with lazy module loading (CUDA >= 11.7, the default since
  // PyTorch 1.13): about 0.5 GiB on A100/H100 as nvidia-smi shows it beside an empty allocator.
  p.cuda_context_bytes = Bytes{512} << 20;
  // NCCL's per-connection buffers at their defaults (NVIDIA/nccl v2.12.12, src/init.cc and
  // src/include/devcomm.h): SIMPLE NCCL_BUFFSIZE 1 << 22; LL 8 lines x 512 threads x 8 steps x
  // 16 bytes; LL128 120 elements x 640 threads x 8 steps x 8 bytes. Unchanged through 2.28.
  p.nccl_buffer_bytes = Bytes{4} << 20;
  p.nccl_ll_buffer_bytes = Bytes{8} * 512 * 8 * 16;
  p.nccl_ll128_buffer_bytes = Bytes{120} * 640 * 8 * 8;
  // NVLink nodes run 16 channels per communicator in NCCL's topology search on A100/H100
  // systems (NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS bound it).
  p.nccl_channels = 16;
  // Fitted: NVIDIA/nccl issue #964 measured 544 MiB per 2-rank communicator on 4 x A100 (NVLink,
  // PyTorch, after a 4 MB all-reduce); its ring and tree buffers are 2 receive connections x 16
  // channels x 10 MiB = 320 MiB, leaving 224 MiB. The same issue's 688 MiB for 4-rank groups
  // checks it (predicted 704 MiB: data/reference/nccl_communicator_memory.json).
  p.nccl_communicator_bytes = Bytes{224} << 20;
  // PyTorch frameworks run a collective on the default group at start-up (Megatron-LM's
  // pretrain() all-reduces its start time; DeepSpeed's engine and torchtitan build on it).
  p.nccl_world_group = true;
  // cuBLAS workspace: PyTorch's default CUBLAS_WORKSPACE_CONFIG on Hopper, ":4096:8" = 32 MiB
  // (aten/src/ATen/cuda/CublasHandlePool.cpp), allocated through the caching allocator.
  p.cublas_workspace_bytes = Bytes{32} << 20;
  // Assumed, not fitted: reserved exceeds allocated by about 5 % of the bytes freed and
  // reallocated every step. Override with a measured max_memory_reserved / max_memory_allocated.
  p.allocator_fragmentation = 0.05;
  // Autograd holds an op's output gradient and its input gradient together.
  p.backward_gradient_tensors = 2;
  p.fp32_gradients_with_bf16 = true;
  return p;
}

}  // namespace

FrameworkProfile framework_profile(Framework f) noexcept {
  switch (f) {
    case Framework::generic:
      return {};
    case Framework::megatron: {
      // Megatron-LM: fp32 main_grad buffer under bf16, buckets are views into it
      // (core/distributed/param_and_grad_buffer.py); the fused vocab-parallel cross-entropy
      // (core/tensor_parallel/cross_entropy.py) upcasts once and works in place.
      FrameworkProfile p = pytorch_runtime();
      p.loss_fp32_copies = 1;
      // NCCL groups: clip_grad_norm all-reduces the norm over the model-parallel group
      // (core/optimizer/clip_grads.py); pipeline messages go through batch_isend_irecv over the
      // pipeline group (core/pipeline_parallel/p2p_communication.py), whose first call creates a
      // communicator of the whole group (PyTorch docs, torch.distributed.batch_isend_irecv).
      p.nccl_model_parallel_group = true;
      p.nccl_pipeline_group = true;
      return p;
    }
    case Framework::deepspeed: {
      // DeepSpeed ZeRO config defaults (runtime/zero/config.py): reduce_bucket_size 5e8,
      // stage3_prefetch_bucket_size 5e7; overlap_comm off for ZeRO-1/2 (one bucket). Models are
      // Hugging Face's: logits.float() then F.cross_entropy keeps its log-softmax (2 copies).
      FrameworkProfile p = pytorch_runtime();
      p.reduce_bucket_elements = 500'000'000;
      p.reduce_buckets = 1;
      p.prefetch_bucket_elements = 50'000'000;
      p.loss_fp32_copies = 2;
      // BF16_Optimizer keeps the bf16 .grad beside its fp32 gradients and upcasts them one
      // parameter at a time (runtime/bf16_optimizer.py, update_hp_grads, at microsoft/DeepSpeed
      // 15293139f, Feb 2022, and unchanged at 38327e07f, Feb 2025); the pipeline engine keeps
      // every in-flight micro-batch's output (runtime/pipe/engine.py, pipe_buffers['outputs']).
      p.keeps_compute_dtype_gradients = true;
      p.gradient_upcast_transient = true;
      p.pipeline_output_buffers = true;
      // Gradients in the model's dtype unless data_types.grad_accum_dtype says otherwise
      // (runtime/engine.py get_data_types, at tag v0.18.0); the ZeRO optimizers upcast their
      // partition at the step (runtime/zero/stage_1_and_2.py, stage3.py).
      p.fp32_gradients_with_bf16 = false;
      p.optimizer_step_upcast = true;
      // NCCL groups of the pipeline engine (runtime/pipe/topology.py creates its own groups;
      // same commit): send/recv between neighbours (runtime/pipe/p2p.py, torch >= 1.8: one
      // communicator per rank pair in ProcessGroupNCCL), the loss broadcast over the pipeline
      // group (engine.py, _aggregate_total_loss), the model-parallel all-reduce (engine.py at
      // start-up, and the gradient norm), and the slice group that gathers partitioned stage
      // tensors (PartitionedTensor.full), beside the model's own tensor-parallel group.
      p.nccl_model_parallel_group = true;
      p.nccl_pipeline_group = true;
      p.nccl_pipeline_pairs = true;
      p.nccl_pipeline_slice_group = true;
      return p;
    }
    case Framework::torchtitan: {
      // torchtitan on FSDP2: sharded fp32 parameters are the master copy, bf16 only when
      // all-gathered (MixedPrecisionPolicy param_dtype bf16, reduce_dtype fp32). The loss
      // (train.py: cross_entropy(pred.float())) peaks in its backward after `del pred`: the saved
      // fp32 log-softmax plus the nll_loss and log_softmax gradients, 3 fp32 copies and no bf16
      // logits (the forward's bf16 + 2 fp32 is smaller).
      FrameworkProfile p = pytorch_runtime();
      p.sharded_params_are_master = true;
      p.fsdp_unsharded_with_pipeline = true;
      p.loss_fp32_copies = 3;
      p.loss_keeps_logits = false;
      // A 1-D device mesh over every rank reuses the default group (DeviceMesh): the data-parallel
      // group is the world group, not a second one. Pipeline stages exchange through
      // batch_isend_irecv over the pipeline group (torch.distributed.pipelining).
      p.nccl_world_group = false;
      p.nccl_pipeline_group = true;
      return p;
    }
  }
  return {};
}

namespace detail {

void read_framework_profile(const nlohmann::json& doc, const std::string& path,
                            FrameworkProfile& p) {
  ObjectReader r(doc, path);
  constexpr Count kMaxBytes = Count{1} << 44;
  constexpr Count kMaxElements = Count{1} << 40;
  if (auto v = r.boolean("fp32_gradients_with_bf16")) p.fp32_gradients_with_bf16 = *v;
  if (auto v = r.boolean("sharded_params_are_master")) p.sharded_params_are_master = *v;
  if (auto v = r.boolean("keeps_compute_dtype_gradients")) p.keeps_compute_dtype_gradients = *v;
  if (auto v = r.boolean("gradient_upcast_transient")) p.gradient_upcast_transient = *v;
  if (auto v = r.boolean("optimizer_step_upcast")) p.optimizer_step_upcast = *v;
  if (auto v = r.boolean("fsdp_unsharded_with_pipeline")) p.fsdp_unsharded_with_pipeline = *v;
  if (auto v = r.boolean("pipeline_output_buffers")) p.pipeline_output_buffers = *v;
  if (auto v = r.integer("reduce_bucket_elements", 0, kMaxElements)) p.reduce_bucket_elements = *v;
  if (auto v = r.integer("reduce_buckets", 1, 16)) p.reduce_buckets = *v;
  if (auto v = r.integer("prefetch_bucket_elements", 0, kMaxElements))
    p.prefetch_bucket_elements = *v;
  if (auto v = r.integer("loss_fp32_copies", 0, 8)) p.loss_fp32_copies = *v;
  if (auto v = r.integer("loss_chunks", 1, 1 << 20)) p.loss_chunks = *v;
  if (auto v = r.boolean("loss_keeps_logits")) p.loss_keeps_logits = *v;
  if (auto v = r.integer("backward_gradient_tensors", 0, 16)) p.backward_gradient_tensors = *v;
  if (auto v = r.integer("cuda_context_bytes", 0, kMaxBytes)) p.cuda_context_bytes = *v;
  if (auto v = r.integer("nccl_buffer_bytes", 0, kMaxBytes)) p.nccl_buffer_bytes = *v;
  if (auto v = r.integer("nccl_ll_buffer_bytes", 0, kMaxBytes)) p.nccl_ll_buffer_bytes = *v;
  if (auto v = r.integer("nccl_ll128_buffer_bytes", 0, kMaxBytes)) p.nccl_ll128_buffer_bytes = *v;
  if (auto v = r.integer("nccl_channels", 0, 256)) p.nccl_channels = *v;
  if (auto v = r.integer("nccl_communicator_bytes", 0, kMaxBytes)) p.nccl_communicator_bytes = *v;
  if (auto v = r.boolean("nccl_world_group")) p.nccl_world_group = *v;
  if (auto v = r.boolean("nccl_model_parallel_group")) p.nccl_model_parallel_group = *v;
  if (auto v = r.boolean("nccl_pipeline_group")) p.nccl_pipeline_group = *v;
  if (auto v = r.boolean("nccl_pipeline_pairs")) p.nccl_pipeline_pairs = *v;
  if (auto v = r.boolean("nccl_pipeline_slice_group")) p.nccl_pipeline_slice_group = *v;
  if (auto v = r.integer("cublas_workspace_bytes", 0, kMaxBytes)) p.cublas_workspace_bytes = *v;
  if (auto v = r.number("allocator_fragmentation", 0, 4, false)) p.allocator_fragmentation = *v;
  if (auto v = r.boolean("models_allocator")) p.models_allocator = *v;
  r.finish();
}

nlohmann::json framework_profile_json(const FrameworkProfile& p) {
  return {{"fp32_gradients_with_bf16", p.fp32_gradients_with_bf16},
          {"sharded_params_are_master", p.sharded_params_are_master},
          {"keeps_compute_dtype_gradients", p.keeps_compute_dtype_gradients},
          {"gradient_upcast_transient", p.gradient_upcast_transient},
          {"optimizer_step_upcast", p.optimizer_step_upcast},
          {"fsdp_unsharded_with_pipeline", p.fsdp_unsharded_with_pipeline},
          {"pipeline_output_buffers", p.pipeline_output_buffers},
          {"reduce_bucket_elements", p.reduce_bucket_elements},
          {"reduce_buckets", p.reduce_buckets},
          {"prefetch_bucket_elements", p.prefetch_bucket_elements},
          {"loss_fp32_copies", p.loss_fp32_copies},
          {"loss_chunks", p.loss_chunks},
          {"loss_keeps_logits", p.loss_keeps_logits},
          {"backward_gradient_tensors", p.backward_gradient_tensors},
          {"cuda_context_bytes", p.cuda_context_bytes},
          {"nccl_buffer_bytes", p.nccl_buffer_bytes},
          {"nccl_ll_buffer_bytes", p.nccl_ll_buffer_bytes},
          {"nccl_ll128_buffer_bytes", p.nccl_ll128_buffer_bytes},
          {"nccl_channels", p.nccl_channels},
          {"nccl_communicator_bytes", p.nccl_communicator_bytes},
          {"nccl_world_group", p.nccl_world_group},
          {"nccl_model_parallel_group", p.nccl_model_parallel_group},
          {"nccl_pipeline_group", p.nccl_pipeline_group},
          {"nccl_pipeline_pairs", p.nccl_pipeline_pairs},
          {"nccl_pipeline_slice_group", p.nccl_pipeline_slice_group},
          {"cublas_workspace_bytes", p.cublas_workspace_bytes},
          {"allocator_fragmentation", p.allocator_fragmentation},
          {"models_allocator", p.models_allocator}};
}

}  // namespace detail

}  // namespace distplan
