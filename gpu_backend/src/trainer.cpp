// The sharded model and its training step (docs/gpu_backend.md). Layers follow the planner's
// layer op table (planner/src/layer_ops.cpp) op by op and save exactly its tensors; parameters are
// grouped in units (each layer, the embedding, the LM head) as the planner's ZeRO model shards,
// gathers and reduces them (planner/src/estimate.cpp).
#include "trainer_impl.h"

#include "distplan/planner/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/device_ops.h"
#include "distplan/gpu_backend/gradient_dump.h"
#include "distplan/gpu_backend/ring_attention.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"
#include "distplan/simulator/simulate.h"
#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {
namespace trainer_detail {

Trainer::Trainer(const Scenario& s, const RunOptions& o, ProcessGroups& g)
    : s_(s),
      m_(s.model),
      t_(s.training),
      p_(s.parallel),
      o_(o),
      g_(g),
      alloc_(o.device, o.capacity_bytes) {
  cb_ = t_.precision;
  gb_ = t_.grad_accumulation_dtype;
  tp_ = p_.tp;
  // ZeRO shards over the data-and-context-parallel ranks (Scenario::zero_shard).
  S_ = p_.zero_stage == 0 ? 1 : s.zero_shard();
  sp_ = p_.sequence_parallel && tp_ > 1;
  stage_ = g.coords.pp;
  pp_ = p_.pp;
  v_ = p_.virtual_stages;
  vee_ = v_shape(p_.schedule);
  bidir_ = bidirectional(p_.schedule);
  nmb_ = s.num_microbatches();
  cp_ = p_.cp;
  sl_ = s.local_seq_length();
  for (Count i = 0; i < sl_; ++i)
    positions_.push_back(cp_ == 1 ? i : ring::global_position(i, sl_, cp_, g.coords.cp));
  N_ = t_.micro_batch_size * sl_;
  Nl_ = sp_ ? N_ / tp_ : N_;
  h_ = m_.hidden_size;
  vocab_ = padded_vocab(s);
  vl_ = vocab_ / tp_;
  a_l_ = m_.num_attention_heads / tp_;
  g_l_ = m_.num_kv_heads / tp_;
  d_ = m_.head_dim();
  f_l_ = m_.ffn_hidden_size / tp_;
  mi_l_ = (m_.mlp == Mlp::swiglu ? 2 : 1) * f_l_;
  // zb_auto's order comes from the planner's stage times, the same on every rank.
  program_ = p_.schedule == Schedule::zb_auto ? sim::scenario_program(s, estimate(s))
                                              : sim::make_schedule(p_.schedule, pp_, nmb_, v_);
  // The planner's layer op table: fine-tuning's flow is per op (planner/peft.h).
  table_ = planner_layer_table(m_, t_);
  for (int i = 0; i < table_.num_ops; ++i) {
    const std::string_view n = table_.ops[static_cast<std::size_t>(i)].name;
    if (n == "input_norm") op_.norm1 = i;
    if (n == "qkv") op_.qkv = i;
    if (n == "attention") op_.attention = i;
    if (n == "attention_out") op_.attn_out = i;
    if (n == "post_attention_norm") op_.norm2 = i;
    if (n == "mlp_in") op_.mlp_in = i;
    if (n == "swiglu" || n == "gelu") op_.activation = i;
    if (n == "mlp_out") op_.mlp_out = i;
  }
  build_units();
  if (t_.precision == DType::fp16) loss_scale_ = 65536.0f;
}

Measurement Trainer::train() {
  Measurement out;
  RankMeasurement rm;
  for (Count step = 1; step <= o_.steps; ++step) {
    g_.log.clear();
    alloc_.reset_peaks();
    executed_.clear();
    timeline_.clear();
    const auto t0 = now();
    step_t0_ = t0;
    const auto [loss, skipped] = train_step(step);
    rm.step_seconds = since(t0);
    out.losses.push_back(loss);
    out.skipped.push_back(skipped);
  }
  if (!o_.dump_weights.empty()) dump_weights();
  rm.rank = g_.world_rank;
  rm.coords = g_.coords;
  rm.memory = alloc_.stats();
  rm.actions = executed_;
  rm.timeline = timeline_;
  rm.communication = g_.log.entries();
  rm.moe = moe_routing_;
  rm.optimizer_seconds = optimizer_seconds_;
  out.ranks.push_back(std::move(rm));
  return out;
}

}  // namespace trainer_detail

using trainer_detail::Trainer;

bool emulates(Framework f) noexcept {
  // The trainer keeps Megatron-LM's copies (compute-dtype weights, gradient buffers in
  // grad_accumulation_dtype, fp32 master weights and Adam moments, Megatron-style saved tensors)
  // and replays PyTorch's caching allocator: the conventions of megatron and of generic, the
  // textbook. DeepSpeed's and torchtitan's copies, buckets and loss differ by up to ±50 % per
  // category (docs/memory.md, "Framework profiles"): a comparison would report those differences
  // as prediction error.
  return f == Framework::generic || f == Framework::megatron;
}

void check_supported(const Scenario& s) {
  if (!emulates(s.training.framework)) {
    throw InputError("/training/framework",
                     fmt::format("the backend trains with Megatron-LM's conventions (framework "
                                 "megatron or generic), not {}'s copies, buckets and loss; a "
                                 "validation would report their differences as prediction error. "
                                 "Plan, simulate or search it, or validate with megatron",
                                 to_string(s.training.framework)));
  }
  const ParallelSpec& lever = s.parallel;
  if (lever.offload_optimizer != Offload::none || lever.offload_params != Offload::none) {
    throw InputError(lever.offload_optimizer != Offload::none ? "/parallel/offload_optimizer"
                                                              : "/parallel/offload_params",
                     "the backend keeps every model state on its device; offload is planned, not "
                     "validated");
  }
  if (s.training.fp8 != Fp8Recipe::none) {
    throw InputError("/training/precision",
                     "the backend trains in fp32, fp16 or bf16; fp8 is planned, not validated");
  }
  if (s.model.qk_norm) {
    throw InputError("/model/qk_norm",
                     "the backend has no RMSNorm over each query and key head (Qwen3); plan or "
                     "simulate the model");
  }
  if (bidirectional(s.parallel.schedule) &&
      (s.model.tied_embeddings || s.parallel.zero_stage >= 2)) {
    // validate_scenario refuses both for DualPipe (not planned); a Scenario built in code could
    // still carry them, and the trainer's mirror exchange assumes untied, unsharded gradients.
    throw InputError(s.model.tied_embeddings ? "/model/tied_embeddings" : "/parallel/zero_stage",
                     "the backend runs dualpipe with untied embeddings and ZeRO 0 or 1, as the "
                     "planner plans it");
  }
  if (s.parallel.recompute == Recompute::selective_op) {
    // The trainer keeps Megatron-style saved tensors; torchtitan's per-op policy saves op outputs.
    throw InputError("/parallel/recompute",
                     "the backend does not run per-op selective checkpointing (selective_op); "
                     "plan or simulate it, or train with none, selective or full");
  }
  if (s.training.dropout > 0)
    throw InputError("/training/dropout", "the backend trains without dropout");
  if (s.model.mlp == Mlp::geglu) {
    throw InputError("/model/mlp",
                     "the backend's MLPs are GeLU or SwiGLU; plan or simulate a GeGLU model");
  }
  if (s.model.position_embedding == PositionEmbedding::alibi) {
    throw InputError("/model/position_embedding",
                     "the backend has no ALiBi attention bias; plan or simulate the model");
  }
  if (s.model.embedding_norm) {
    throw InputError("/model/embedding_norm",
                     "the backend has no norm after the embedding; plan or simulate the model");
  }
  if (s.model.tied_embeddings && s.parallel.zero_stage >= 2) {
    throw InputError("/model/tied_embeddings",
                     "the backend implements tied embeddings with ZeRO 0 and 1 only");
  }
  if (s.parallel.zero_stage > 0 && s.parallel.dp % s.shard_size() != 0) {
    throw InputError("/parallel/fsdp_shard_size", "fsdp_shard_size must divide dp");
  }
  if (s.parallel.cp > 1 &&
      s.training.seq_length %
              (2 * s.parallel.cp * (s.parallel.sequence_parallel ? s.parallel.tp : 1)) !=
          0) {
    // Every variant takes its rows as Megatron-Core's get_batch_on_this_cp_rank cuts them: 2·cp
    // load-balanced chunks (Transformer Engine's all-to-all reorders the same chunk ids).
    throw InputError("/training/seq_length",
                     "the backend cuts each sequence into 2*cp load-balanced chunks (times tp "
                     "under sequence parallelism) for every cp_comm; seq_length must divide "
                     "into them");
  }
  if (s.parallel.cp > 1 && s.training.attention != Attention::flash) {
    throw InputError("/training/attention",
                     "context parallelism splits flash attention across ranks; train with "
                     "attention flash");
  }
  if (s.parallel.sequence_parallel && s.local_seq_length() % s.parallel.tp != 0) {
    throw InputError("/training/seq_length",
                     "sequence parallelism needs seq_length / cp divisible by tp");
  }
  check_moe_supported(s);
  const PeftSpec& pe = s.training.peft;
  if (pe.enabled()) {
    // Fine-tuning as the planner plans it (validate_scenario refuses the rest), on float units.
    if (pe.quantized() && s.parallel.zero_stage >= 3) {
      throw InputError(
          "/parallel/zero_stage",
          "the backend shards a quantized base with ZeRO 0, 1 and 2 only (FSDP-QLoRA's "
          "16-bit quant storage is planned, not run)");
    }
    if (pe.adapters() && !pe.quantized() &&
        pe.base_dtype != (pe.base_storage == BaseStorage::fp32   ? DType::fp32
                          : pe.base_storage == BaseStorage::fp16 ? DType::fp16
                                                                 : DType::bf16)) {
      throw InputError("/training/peft/base_dtype",
                       "the backend holds a frozen layer in one dtype: base_dtype must be "
                       "base_storage's");
    }
    if (pe.dropout > 0)
      throw InputError("/training/peft/dropout", "the backend trains LoRA without lora dropout");
    if (pe.paged_optimizer) {
      throw InputError("/training/peft/paged_optimizer",
                       "the backend has no paged (unified-memory) optimizer states");
    }
    if (s.model.tied_embeddings && pe.freeze_embeddings && s.parallel.pp > 1 &&
        !v_shape(s.parallel.schedule)) {
      throw InputError("/training/peft/freeze_embeddings",
                       "the backend's LM head unit holds the final norm and the tied copy "
                       "together: a frozen tied copy needs pp = 1");
    }
    if (s.parallel.offload_optimizer != Offload::none) {
      throw InputError("/parallel/offload_optimizer",
                       "the backend does not offload fine-tuning's optimizer states");
    }
  }
  (void)pipeline_split(s);  // any split the planner plans (pipeline_split.h)
}

Measurement run(const Scenario& s, const RunOptions& opts) {
  check_supported(s);
  if (s.training.peft.quantized() && opts.device != Device::cpu) {
    throw InputError("/training/peft/base_storage",
                     "the backend keeps a quantized base on the CPU device (its bitsandbytes "
                     "storage has no CUDA kernels here); validate it with --device cpu");
  }
  check_moe_supported(s, opts.device, opts.comm);
  // The CUDA device keeps every tensor and working array in device memory (measured by the
  // tracking allocator over the device block cache); the trainer's ops run there (device_ops.h).
  // Multi-rank CUDA runs need the NCCL groups.
  std::unique_ptr<ProcessGroups> groups;
  if (opts.comm == CommBackend::emulated) {
    groups = make_emulated_groups(s.parallel, opts.emulate_rank, opts.device);
  } else if (opts.device == Device::cuda) {
#ifdef DISTPLAN_HAVE_NCCL
    // One GPU per rank of this host, whichever launcher started the job.
    check_nccl_pipeline(s.parallel);
    mpi_init_if_needed();
    cuda::set_device(mpi_local_rank() % std::max(cuda::device_count(), 1));
    groups = make_nccl_groups(s.parallel);
#else
    throw std::runtime_error("multi-rank CUDA runs need a build with NCCL and MPI");
#endif
  } else {
    groups = make_mpi_groups(s.parallel);
  }
  return run_on_groups(s, opts, *groups);
}

void check_supported_on(const Scenario& s, Device device) {
  check_supported(s);
  if (device == Device::cuda && s.parallel.cp > 1) {
    // The ring's steps run the CPU kernels (ring_attention.h) on host buffers.
    throw InputError("/parallel/cp",
                     "the CUDA device does not run context parallelism; validate cp > 1 on the "
                     "CPU (--device cpu)");
  }
}

void check_nccl_pipeline(const ParallelSpec& p) {
  // The V schedules add exchanges in both directions between the same pair of stages (chunk 0
  // down, chunk 1 up), which one NCCL stream would order against each other as it does
  // interleaved_1f1b's; none of them has run over NCCL.
  // zb_auto's order (like ZB-H2's) has not run over NCCL either. DualPipe sends both ways
  // between every pair of neighbours (direction 0 down, direction 1 up) and deadlocks in the
  // rendezvous model as the V schedules do (pipeline_rendezvous_test.cpp).
  if (p.pp > 1 && (p.schedule == Schedule::interleaved_1f1b || p.schedule == Schedule::zb_h2 ||
                   p.schedule == Schedule::zb_auto || two_chunks(p.schedule))) {
    throw InputError("/parallel/schedule",
                     "multi-GPU runs over NCCL take gpipe, 1f1b and zb_h1 pipelines; this "
                     "schedule's point-to-point exchanges can wait on each other on one NCCL "
                     "stream (run it on the CPU with MPI, or one rank with --emulate-rank)");
  }
}

Measurement run_on_groups(const Scenario& s, const RunOptions& opts, ProcessGroups& groups) {
  check_supported_on(s, opts.device);
  if (opts.device == Device::cuda) dev::set_fp32_gemm_tf32(opts.tf32);
  Trainer trainer(s, opts, groups);
  return trainer.train();
}

}  // namespace distplan::backend
