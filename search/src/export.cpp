// Layout exports: Megatron-LM arguments and the DeepSpeed config (torchtitan's TOML:
// export_torchtitan.cpp). Each writes exactly the planned layout or refuses; mappings:
// docs/exports.md.
#include "distplan/search/export.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/capabilities.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/units.h"
#include "distplan/simulator/plan.h"
#include "export_split.h"

namespace distplan::search {

std::string_view to_string(ExportFormat f) noexcept {
  switch (f) {
    case ExportFormat::megatron:
      return "megatron";
    case ExportFormat::deepspeed:
      return "deepspeed";
    case ExportFormat::torchtitan:
      return "torchtitan";
    case ExportFormat::peft:
      return "peft";
  }
  return "?";
}

Framework framework_of(ExportFormat f) noexcept {
  switch (f) {
    case ExportFormat::megatron:
      return Framework::megatron;
    case ExportFormat::deepspeed:
      return Framework::deepspeed;
    case ExportFormat::torchtitan:
      return Framework::torchtitan;
    case ExportFormat::peft:
      // Accelerate runs PEFT over FSDP or DeepSpeed: the plan's framework profile stands.
      return Framework::generic;
  }
  return Framework::generic;
}

namespace detail {

std::string warning_comment(const Exported& e) {
  if (e.fits) return {};
  return fmt::format(
      "# WARNING: this layout does not fit: the planner's peak is {:.2f} GiB per GPU, the GPU has "
      "{:.2f} GiB (distplan plan shows what would make it fit)\n",
      to_gib(e.peak_bytes), to_gib(e.capacity_bytes));
}

std::string to_add_lines(const Exported& e) {
  std::string out;
  for (const std::string& a : e.to_add) out += "# you still add: " + a + "\n";
  return out;
}

}  // namespace detail

namespace {

using detail::megatron_split_args;
using detail::SplitArgs;
using detail::to_add_lines;
using detail::torchtitan_split_lines;
using detail::warning_comment;

Count accumulation_steps(const Scenario& s) {
  return s.training.global_batch_size / (s.training.micro_batch_size * s.parallel.dp);
}

Count shard(const Scenario& s) {
  return s.shard_size();
}
bool hybrid(const Scenario& s) {
  return s.parallel.zero_stage > 0 && shard(s) < s.parallel.dp;
}

std::string_view dtype_name(DType d) {
  return d == DType::fp32 ? "fp32" : d == DType::bf16 ? "bf16" : "fp16";
}

Exported megatron(const Scenario& s, Exported out) {
  const ModelSpec& m = s.model;
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  std::vector<std::string> args;
  auto arg = [&](std::string_view flag, auto value) {
    args.push_back(fmt::format("{} {}", flag, value));
  };
  auto flag = [&](std::string_view f) { args.emplace_back(f); };

  // Model shape.
  arg("--num-layers", m.num_layers);
  arg("--hidden-size", m.hidden_size);
  arg("--ffn-hidden-size", m.ffn_hidden_size);
  arg("--num-attention-heads", m.num_attention_heads);
  // An explicit head width (Qwen3): Megatron-LM's --kv-channels, else hidden / heads.
  if (m.explicit_head_dim > 0) arg("--kv-channels", m.explicit_head_dim);
  if (m.qk_norm) flag("--qk-layernorm");  // with --normalization RMSNorm: RMSNorm of q and k
  if (m.embedding_norm) {
    // Megatron-DeepSpeed has --embed-layernorm (BLOOM); Megatron-LM has no such option.
    out.to_add.emplace_back(
        "a norm after the word embedding (Megatron-LM has none; Megatron-DeepSpeed: "
        "--embed-layernorm)");
  }
  if (m.mla.enabled()) {
    // Megatron-Core's MLASelfAttention (core_v0.15.3 arguments.py): --qk-head-dim is the
    // no-rotary part, --qk-pos-emb-head-dim the rotary part; no --q-lora-rank: queries from h.
    flag("--multi-latent-attention");
    if (m.mla.q_lora_rank > 0) arg("--q-lora-rank", m.mla.q_lora_rank);
    arg("--kv-lora-rank", m.mla.kv_lora_rank);
    arg("--qk-head-dim", m.mla.qk_nope_head_dim);
    arg("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim);
    arg("--v-head-dim", m.mla.v_head_dim);
  }
  // The MTP modules, on the last pipeline stage as the plan places them (Megatron-Core's default
  // without --pipeline-model-parallel-layout; the layout's 'm' otherwise).
  if (m.mtp_layers > 0) arg("--mtp-num-layers", m.mtp_layers);
  // MLA's heads each have their own key and value: no query groups.
  if (!m.mla.enabled() && m.num_kv_heads != m.num_attention_heads) {
    flag("--group-query-attention");
    arg("--num-query-groups", m.num_kv_heads);
  }
  arg("--seq-length", t.seq_length);
  arg("--max-position-embeddings", m.position_embedding == PositionEmbedding::learned
                                       ? m.max_position_embeddings
                                       : t.seq_length);
  // ALiBi: Megatron-LM has no such bias (Megatron-DeepSpeed: --position-embedding-type alibi);
  // "none" keeps Megatron-LM from adding positions of its own.
  arg("--position-embedding-type", m.position_embedding == PositionEmbedding::rotary ? "rope"
                                   : m.position_embedding == PositionEmbedding::learned
                                       ? "learned_absolute"
                                       : "none");
  if (m.position_embedding == PositionEmbedding::alibi) {
    out.to_add.emplace_back(
        "ALiBi attention biases (Megatron-LM has none; Megatron-DeepSpeed: "
        "--position-embedding-type alibi)");
  }
  if (m.position_embedding == PositionEmbedding::rotary) {
    // Megatron-LM parses --rotary-base as an integer.
    if (m.rope_theta != static_cast<double>(static_cast<Count>(m.rope_theta))) {
      throw InputError("/model/rope_theta",
                       fmt::format("rope_theta {} is not an integer; Megatron-LM's --rotary-base "
                                   "takes integers only (arguments.py, type=int)",
                                   m.rope_theta));
    }
    arg("--rotary-base", static_cast<Count>(m.rope_theta));
    if (m.rope_scaling_factor > 0) {
      // Megatron-LM's Llama-3 scaling fixes low/high frequency factors 1 and 4 and an original
      // context of 8192, as Llama 3.1 uses.
      flag("--use-rope-scaling");
      arg("--rope-scaling-factor", m.rope_scaling_factor);
    }
  }
  if (m.mlp == Mlp::swiglu) flag("--swiglu");
  if (m.mlp == Mlp::geglu) {
    // Megatron-LM's TransformerConfig has gated_linear_unit and activation_func, but its command
    // line has --swiglu only (megatron/training/arguments.py).
    out.to_add.emplace_back(
        "a GeGLU MLP (Megatron-LM's command line has --swiglu only: set gated_linear_unit and "
        "activation_func=gelu in the TransformerConfig)");
  }
  if (m.norm == Norm::rmsnorm) arg("--normalization", "RMSNorm");
  if (!m.tied_embeddings) flag("--untie-embeddings-and-output-weights");
  if (!m.bias) flag("--disable-bias-linear");
  // Qwen2's q/k/v biases on otherwise bias-free linears (Megatron-LM's --add-qkv-bias).
  if (!m.bias && m.qkv_bias) flag("--add-qkv-bias");
  megatron_moe_args(s, args, out.notes);
  arg("--make-vocab-size-divisible-by", s.assumptions.vocab_pad_multiple);
  arg("--attention-dropout", t.dropout);
  arg("--hidden-dropout", t.dropout);
  if (t.attention == Attention::flash) flag("--use-flash-attn");

  // Precision and optimizer.
  if (t.precision == DType::bf16) flag("--bf16");
  if (t.precision == DType::fp16) flag("--fp16");
  // Gradient dtype (arguments.py validate_args): with --bf16 Megatron accumulates and reduces
  // gradients in fp32 unless --grad-reduce-in-bf16; with --fp16 in fp16 unless
  // --accumulate-allreduce-grads-in-fp32.
  const DType g = t.grad_accumulation_dtype;
  if (t.precision != DType::fp32 && g == DType::fp32) {
    flag("--accumulate-allreduce-grads-in-fp32");
  } else if (t.precision == DType::bf16 && g == DType::bf16) {
    flag("--grad-reduce-in-bf16");
  }
  arg("--optimizer", t.optimizer == Optimizer::sgd ? "sgd" : "adam");
  if (t.fp8 != Fp8Recipe::none) {
    // Transformer Engine FP8 (Megatron-Core --fp8-recipe: per-tensor current scaling is
    // "tensorwise"). Per-tensor recipes use the hybrid format (E4M3 forward, E5M2 gradients, TE's
    // default); blockwise (DeepSeek-V3) and MXFP8 use E4M3 throughout.
    const bool per_tensor = t.fp8 == Fp8Recipe::delayed || t.fp8 == Fp8Recipe::current;
    arg("--fp8-format", per_tensor ? "hybrid" : "e4m3");
    arg("--fp8-recipe", t.fp8 == Fp8Recipe::delayed   ? "delayed"
                        : t.fp8 == Fp8Recipe::current ? "tensorwise"
                                                      : to_string(t.fp8));
    if (t.fp8 == Fp8Recipe::delayed) {
      arg("--fp8-amax-history-len", s.assumptions.fp8_amax_history_len);
      arg("--fp8-amax-compute-algo", "max");
    }
  }

  // Layout.
  arg("--tensor-model-parallel-size", p.tp);
  arg("--pipeline-model-parallel-size", p.pp);
  // The plan's split in Megatron-LM's own flags (export_split.h).
  const SplitArgs split = megatron_split_args(s);
  for (const std::string& a : split.args) args.push_back(a);
  for (const std::string& n : split.notes) out.notes.push_back(n);
  // 1F1B is the default with pp > 1; the capability table admits no other schedule.
  if (p.schedule == Schedule::interleaved_1f1b) {
    // overlap_p2p_comm is on by default in the interleaved schedule (arguments.py); a plan that
    // does not overlap the sends turns it off.
    if (!s.assumptions.overlap_p2p) flag("--no-overlap-p2p-communication");
  }
  if (p.sequence_parallel) flag("--sequence-parallel");
  if (p.cp > 1) {
    // Megatron-Core spells the exchanges p2p, allgather and a2a (arguments.py, --cp-comm-type).
    arg("--context-parallel-size", p.cp);
    arg("--cp-comm-type", p.cp_comm == CpComm::p2p          ? "p2p"
                          : p.cp_comm == CpComm::all_gather ? "allgather"
                                                            : "a2a");
  }
  arg("--micro-batch-size", t.micro_batch_size);
  arg("--global-batch-size", t.global_batch_size);
  if (p.recompute == Recompute::selective) arg("--recompute-granularity", "selective");
  if (p.recompute == Recompute::full) {
    arg("--recompute-granularity", "full");
    arg("--recompute-method", "uniform");
    arg("--recompute-num-layers", 1);
  }
  if (p.zero_stage >= 1) flag("--use-distributed-optimizer");
  // Hybrid sharding: replicas of a shard group (the distributed optimizer's instances, and
  // Megatron FSDP's HSDP, core/distributed/fsdp/mcore_fsdp_adapter.py enable_hsdp).
  if (p.zero_stage >= 1 && hybrid(s)) {
    arg("--num-distributed-optimizer-instances", p.dp / shard(s));
  }
  if (p.zero_stage >= 2) {
    flag("--use-megatron-fsdp");
    arg("--data-parallel-sharding-strategy",
        p.zero_stage == 2 ? "optim_grads" : "optim_grads_params");
    arg("--ckpt-format", "fsdp_dtensor");  // the only format Megatron FSDP accepts
    out.to_add.emplace_back(
        "CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 in the environment (Megatron FSDP asserts "
        "it)");
  } else if (p.tp > 1 || p.cp > 1) {
    out.to_add.emplace_back(
        "CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment (arguments.py asserts it with tensor or "
        "context parallelism before Blackwell)");
  }
  if (p.offload_optimizer == Offload::cpu) {
    // Megatron-Core's hybrid-device optimizer: the distributed optimizer's states on the host;
    // it runs on the precision-aware optimizer's code path, which arguments.py requires.
    flag("--optimizer-cpu-offload");
    arg("--optimizer-offload-fraction", 1.0);
    flag("--use-precision-aware-optimizer");
    flag("--overlap-cpu-optimizer-d2h-h2d");
  }
  // The overlaps the plan assumed.
  const Assumptions& a = s.assumptions;
  if (p.dp * p.cp > 1 && a.overlap_grad_reduce) flag("--overlap-grad-reduce");
  // --overlap-param-gather: the distributed optimizer's all-gather behind the next forward
  // (overlap_param_gather_after_step at ZeRO-1/2; Megatron FSDP's prefetch at ZeRO-3, the
  // overlap_param_gather assumption). arguments.py: it needs --overlap-grad-reduce.
  const bool gather_overlapped =
      p.zero_stage == 3 ? a.overlap_param_gather : a.overlap_param_gather_after_step;
  if (p.zero_stage >= 1 && p.dp * p.cp > 1 && gather_overlapped) {
    if (!a.overlap_grad_reduce) {
      throw InputError("/assumptions/overlap_grad_reduce",
                       fmt::format("{} overlaps the parameter all-gather only beside the gradient "
                                   "reduction (--overlap-param-gather asserts "
                                   "--overlap-grad-reduce): set overlap_grad_reduce true",
                                   kMegatronVersion));
    }
    flag("--overlap-param-gather");
  }
  if (a.tp_comm_overlap && p.tp > 1) flag("--tp-comm-overlap");

  // What every run adds, before what this model needs beyond Megatron-LM (added above).
  out.to_add.insert(
      out.to_add.begin(),
      {fmt::format("the tokenizer (--tokenizer-type, --tokenizer-model; its vocabulary must be {})",
                   m.vocab_size),
       "the data (--data-path, --split)",
       "the run length and learning-rate schedule (--train-iters, --lr, --min-lr, "
       "--lr-decay-style, --lr-warmup-iters), --weight-decay, --clip-grad",
       "checkpoints (--save, --load, --save-interval)"});

  std::ostringstream o;
  o << warning_comment(out);
  if (p.cp > 1) {
    o << fmt::format("# {} pretrain_gpt.py arguments for {} on {} GPUs: tp={} cp={} pp={} dp={}\n",
                     kMegatronVersion, m.name, s.cluster.num_gpus, p.tp, p.cp, p.pp, p.dp);
    o << fmt::format("# (dp = world size / (tp*cp*pp); {} micro-batches per step)\n",
                     accumulation_steps(s));
  } else {
    o << fmt::format("# {} pretrain_gpt.py arguments for {} on {} GPUs: tp={} pp={} dp={}\n",
                     kMegatronVersion, m.name, p.tp * p.pp * p.dp, p.tp, p.pp, p.dp);
    o << fmt::format("# (dp = world size / (tp*pp); {} micro-batches per step)\n",
                     accumulation_steps(s));
  }
  for (const std::string& n : out.notes) o << "# note: " << n << '\n';
  o << to_add_lines(out);
  for (std::size_t i = 0; i < args.size(); ++i) {
    o << args[i] << (i + 1 < args.size() ? " \\\n" : "\n");
  }
  out.text = o.str();
  return out;
}

Exported deepspeed(const Scenario& s, Exported out) {
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  const ModelSpec& m = s.model;
  // JSON has no comments: the header goes first among the notes (stderr).
  out.notes.push_back(fmt::format("{} config for {} on {} GPUs: tp={} pp={} dp={} ZeRO-{}",
                                  kDeepSpeedVersion, s.model.name, s.cluster.num_gpus, p.tp, p.pp,
                                  p.dp, p.zero_stage));
  nlohmann::ordered_json j;
  // DeepSpeed's check (runtime/config.py _batch_assertion): train_batch_size =
  // train_micro_batch_size_per_gpu x gradient_accumulation_steps x its world size, which is the
  // pipeline grid's data-parallel size with a PipelineModule (its mpu) and, for a plain model,
  // dist.get_world_size(): with AutoTP every TP rank counts, each group of tp seeing the same
  // sequences.
  const Count ds_world = p.pp > 1 ? p.dp : p.tp * p.dp;
  j["train_batch_size"] = t.micro_batch_size * accumulation_steps(s) * ds_world;
  j["train_micro_batch_size_per_gpu"] = t.micro_batch_size;
  j["gradient_accumulation_steps"] = accumulation_steps(s);
  if (ds_world != p.dp) {
    out.notes.push_back(fmt::format(
        "train_batch_size counts DeepSpeed's world of {} GPUs (tp x dp): {} sequences per step "
        "reach the model, each seen by the {} ranks of a tensor-parallel group",
        ds_world, t.global_batch_size, p.tp));
  }
  if (t.precision == DType::bf16) j["bf16"] = {{"enabled", true}};
  if (t.precision == DType::fp16) j["fp16"] = {{"enabled", true}};
  if (t.precision != DType::fp32) {
    j["data_types"] = {{"grad_accum_dtype", t.grad_accumulation_dtype == DType::fp32 ? "fp32"
                                            : t.precision == DType::bf16             ? "bf16"
                                                                                     : "fp16"}};
  }
  nlohmann::ordered_json zero;
  zero["stage"] = p.zero_stage;
  zero["overlap_comm"] = s.assumptions.overlap_grad_reduce;
  zero["contiguous_gradients"] = true;
  // The buckets the plan's memory counts (FrameworkProfile, docs/memory.md).
  const FrameworkProfile& fw = s.assumptions.framework_profile;
  if (p.zero_stage == 1 || p.zero_stage == 2)
    zero["reduce_bucket_size"] = fw.reduce_bucket_elements;
  // ZeRO-Offload / ZeRO-Infinity (DeepSpeed zero_optimization.offload_optimizer / offload_param).
  auto offload = [](Offload o) {
    nlohmann::ordered_json j = {{"device", std::string(to_string(o))}, {"pin_memory", true}};
    if (o == Offload::nvme) j["nvme_path"] = "/local_nvme";
    return j;
  };
  if (p.offload_optimizer != Offload::none)
    zero["offload_optimizer"] = offload(p.offload_optimizer);
  if (p.offload_params != Offload::none) zero["offload_param"] = offload(p.offload_params);
  if (p.offload_optimizer == Offload::nvme || p.offload_params == Offload::nvme) {
    out.to_add.push_back(
        "nvme_path: a directory on the node's NVMe (the export writes /local_nvme)");
  }
  if (p.zero_stage == 3) {
    zero["stage3_prefetch_bucket_size"] = fw.prefetch_bucket_elements;
    if (hybrid(s)) zero["mics_shard_size"] = shard(s);
  }
  j["zero_optimization"] = zero;
  // Tensor parallelism through AutoTP training without a pipeline; with one, from the model
  // code (Megatron-DeepSpeed's tensor-parallel layers), which the config does not carry.
  if (p.tp > 1 && p.pp == 1) j["tensor_parallel"] = {{"autotp_size", p.tp}};
  if (p.tp > 1 && p.pp > 1) {
    out.to_add.push_back(fmt::format(
        "tensor parallelism {} in the model code (Megatron-DeepSpeed: --tensor-model-parallel-size "
        "{} with its mpu passed to deepspeed.initialize); AutoTP does not shard a PipelineModule",
        p.tp, p.tp));
  }
  if (p.pp > 1) {
    // The pipeline engine runs TrainSchedule (1F1B); the stages come from the model code. The
    // embedding and tied head weighed as layers give the first and last stage one fewer.
    const bool weighed = split_weighs_embedding_and_head(s);
    out.to_add.push_back(fmt::format(
        "the model as a PipelineModule(layers=..., num_stages={}, partition_method=\"type:<your "
        "decoder layer class>{}\"{}): {} layers per stage, the embedding on the first and the LM "
        "head on the last",
        p.pp, weighed ? "|<your embedding class>" : "",
        p.recompute == Recompute::full ? ", activation_checkpoint_interval=1" : "",
        weighed ? fmt::format("{} (the first and last stage {})", (m.num_layers + 2) / p.pp,
                              (m.num_layers + 2) / p.pp - 1)
                : std::to_string(m.num_layers / p.pp)));
  }
  if (p.recompute == Recompute::full) {
    // Every layer checkpointed (deepspeed.checkpointing.checkpoint; the PipelineModule's
    // activation_checkpoint_interval=1 with a pipeline).
    j["activation_checkpointing"] = {{"partition_activations", false},
                                     {"contiguous_memory_optimization", false},
                                     {"number_checkpoints", s.model.num_layers / p.pp}};
    if (p.pp == 1) {
      out.to_add.emplace_back(
          "deepspeed.checkpointing.checkpoint(layer, ...) around each decoder layer's forward in "
          "the model code");
    }
  }
  if (s.model.mtp_layers > 0) {
    out.to_add.push_back(fmt::format(
        "{} multi-token prediction module(s) in the model code on the last pipeline stage "
        "(DeepSeek-V3's: hnorm, enorm, a 2h -> h projection, one transformer layer, the shared "
        "output head, its own loss)",
        s.model.mtp_layers));
  }
  if (s.model.mla.enabled()) {
    // DeepSpeed has no attention of its own: MLA is the model code's (as in Megatron-DeepSpeed).
    const MlaSpec& x = s.model.mla;
    out.to_add.push_back(fmt::format(
        "multi-head latent attention in the model code (q_lora_rank {}, kv_lora_rank {}, "
        "qk_nope_head_dim {}, qk_rope_head_dim {}, v_head_dim {}; Hugging Face "
        "DeepseekV3Attention's shapes)",
        x.q_lora_rank > 0 ? fmt::format("{}", x.q_lora_rank) : std::string("none"), x.kv_lora_rank,
        x.qk_nope_head_dim, x.qk_rope_head_dim, x.v_head_dim));
  }
  if (s.model.moe.enabled()) {
    // DeepSpeed-MoE (deepspeed/moe/layer.py, MoE): the experts and their expert-parallel size are
    // arguments of the layer in the model code; the JSON config has no MoE field.
    const MoeSpec& e = s.model.moe;
    out.to_add.push_back(fmt::format(
        "the MoE layers in the model code: deepspeed.moe.layer.MoE(hidden_size={}, expert=<a "
        "SwiGLU MLP of width {}>, num_experts={}, ep_size={}, k={}, {}) in each of the model's MoE "
        "layers",
        s.model.hidden_size, e.expert_ffn_hidden_size, e.num_experts, p.ep, e.top_k,
        e.capacity_factor ? fmt::format("capacity_factor={}", *e.capacity_factor)
                          : std::string("drop_tokens=False (dropless)")));
    if (e.num_shared_experts > 0) {
      out.notes.push_back(fmt::format(
          "DeepSpeed-MoE has no shared experts; the plan's {} shared expert(s) of width {} are a "
          "dense MLP beside the MoE layer in the model code (use_residual adds one of the MoE's "
          "own width)",
          e.num_shared_experts, e.shared_expert_ffn_hidden_size));
    }
    if (e.router == Router::sigmoid) {
      throw InputError("/model/moe/router",
                       "DeepSpeed-MoE's gate is a softmax top-k (deepspeed/moe/sharded_moe.py "
                       "TopKGate); it has no sigmoid router");
    }
  }
  if (t.optimizer != Optimizer::sgd) {
    j["optimizer"] = {{"type", t.optimizer == Optimizer::adamw ? "AdamW" : "Adam"}};
  } else {
    j["optimizer"] = {{"type", "SGD"}};
  }
  out.to_add.insert(
      out.to_add.begin(),
      {fmt::format("the tokenizer and data loader in your training script (vocabulary {})",
                   s.model.vocab_size),
       "optimizer.params (lr, betas, weight_decay) and a scheduler (e.g. WarmupDecayLR with "
       "total_num_steps, warmup_num_steps), gradient_clipping",
       "the model code itself (DeepSpeed takes the model from your script)"});
  if (t.peft.enabled()) {
    out.notes.push_back(
        "fine-tuning: this DeepSpeed config is the one Hugging Face Accelerate / Trainer passes "
        "on; the adapters, frozen base and quantization are in export peft");
  }
  out.text = j.dump(2) + "\n";
  return out;
}

}  // namespace

Exported export_scenario(const Scenario& s, ExportFormat format) {
  // The plan's memory and its layout are the framework's own: a plan made under another
  // framework would run with other conventions, so it is refused rather than translated.
  const PeftSpec& pe = s.training.peft;
  if (pe.enabled() && (format == ExportFormat::megatron || format == ExportFormat::torchtitan)) {
    // Neither Megatron-LM nor torchtitan v0.2.2 trains LoRA adapters or a frozen 4-bit base
    // (Megatron-Bridge's PEFT and torchtitan's LoRA converter, pytorch/torchtitan#2484, came
    // later); the peft export runs it.
    throw InputError(
        "/training/peft",
        fmt::format("{} has no fine-tuning with frozen parameters or adapters; "
                    "export peft (Hugging Face PEFT + Accelerate) runs this layout",
                    format == ExportFormat::megatron ? kMegatronVersion : kTorchtitanVersion));
  }
  const Framework fw = framework_of(format);
  if (format != ExportFormat::peft && s.training.framework != fw) {
    throw InputError(
        "/training/framework",
        fmt::format("the plan assumed training.framework {}; an export to {} needs a plan made "
                    "under {} (what it runs, how it keeps memory): set \"framework\": \"{}\" "
                    "in training and plan or search again",
                    to_string(s.training.framework), to_string(format), to_string(fw),
                    to_string(fw)));
  }
  // validate_scenario() refused what the framework cannot run; a scenario built in code is
  // checked here too.
  if (auto r = framework_refusal(s)) throw InputError(r->path, r->message);
  // The fit is known before the text is written, so the text can carry the warning: the plan's
  // (the schedule walk's joint peaks, what `distplan plan` says fits).
  const MemoryEstimate mem = sim::plan(s).memory;
  Exported seed;
  seed.fits = mem.fits;
  seed.peak_bytes = mem.peak_reserved_bytes;  // what fits compares
  seed.capacity_bytes = mem.capacity_bytes;
  switch (format) {
    case ExportFormat::peft:
      return export_peft(s, seed);
    case ExportFormat::megatron:
      return megatron(s, seed);
    case ExportFormat::deepspeed:
      return deepspeed(s, seed);
    case ExportFormat::torchtitan:
      return detail::torchtitan_export(s, seed);
  }
  return seed;
}

std::string fit_warning(const Exported& e) {
  if (e.fits) return {};
  return fmt::format(
      "the layout does not fit: the planner's peak is {:.2f} GiB per GPU, the GPU "
      "has {:.2f} GiB",
      to_gib(e.peak_bytes), to_gib(e.capacity_bytes));
}

Exported export_checked(const Scenario& s, ExportFormat format, bool force) {
  Exported out = export_scenario(s, format);
  if (!out.fits && !force) {
    throw InputError("/parallel", fit_warning(out) +
                                      "; `distplan plan --format table` shows what would make it "
                                      "fit, --force exports it anyway");
  }
  return out;
}

}  // namespace distplan::search
