// Layout exports. Mappings and departures: docs/exports.md.
#include "distplan/search/export.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/units.h"

namespace distplan::search {

std::string_view to_string(ExportFormat f) noexcept {
  switch (f) {
    case ExportFormat::megatron:
      return "megatron";
    case ExportFormat::deepspeed:
      return "deepspeed";
    case ExportFormat::torchtitan:
      return "torchtitan";
  }
  return "?";
}

namespace {

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

// The first comment lines of a Megatron-LM or TOML export when the layout does not fit.
std::string fit_warning(const Exported& e) {
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

std::string schedule_note(const Scenario& s, std::string_view framework) {
  return fmt::format("schedule {} is not built into {}; its default schedule runs instead",
                     to_string(s.parallel.schedule), framework);
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
  if (m.num_kv_heads != m.num_attention_heads) {
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
    if (m.rope_theta == static_cast<double>(static_cast<Count>(m.rope_theta))) {
      arg("--rotary-base", static_cast<Count>(m.rope_theta));
    } else {
      out.notes.push_back(fmt::format(
          "rope_theta {} is not an integer; Megatron-LM's --rotary-base takes integers only",
          m.rope_theta));
    }
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
  } else if (g != t.precision) {
    out.notes.push_back(fmt::format(
        "{} gradients with {} compute cannot be set in Megatron-LM; it keeps {} gradients",
        dtype_name(g), dtype_name(t.precision), t.precision == DType::fp16 ? "fp16" : "fp32"));
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
  if (p.pp > 1 && m.num_layers % p.pp != 0) {
    // Megatron-Core's uneven split: own counts for the first and last stage, the middle equal.
    const std::vector<Count> layers = stage_layer_counts(s);
    const bool middle_equal = p.pp == 2 || std::all_of(layers.begin() + 1, layers.end() - 1,
                                                       [&](Count c) { return c == layers[1]; });
    if (middle_equal) {
      arg("--decoder-first-pipeline-num-layers", layers.front());
      arg("--decoder-last-pipeline-num-layers", layers.back());
    } else {
      out.notes.push_back(fmt::format(
          "the planner's split of {} layers over {} stages has unequal middle stages, which "
          "Megatron-LM cannot express; set pp to a count that divides the layers",
          m.num_layers, p.pp));
    }
  }
  if (p.schedule == Schedule::interleaved_1f1b) {
    arg("--num-layers-per-virtual-pipeline-stage", m.num_layers / (p.pp * p.virtual_stages));
  } else if (p.schedule != Schedule::one_f_one_b && p.pp > 1) {
    out.notes.push_back(schedule_note(s, "Megatron-LM (1F1B)"));
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
  if (p.recompute == Recompute::selective_op) {
    out.notes.push_back(
        "per-op selective checkpointing (selective_op) is torchtitan's policy; Megatron-LM has no "
        "equivalent, so no recompute flag is written and the run keeps every activation");
  }
  if (p.zero_stage >= 1) flag("--use-distributed-optimizer");
  if (p.zero_stage == 1 && hybrid(s)) {
    arg("--num-distributed-optimizer-instances", p.dp / shard(s));
  }
  if (p.zero_stage >= 2) {
    flag("--use-megatron-fsdp");
    arg("--data-parallel-sharding-strategy",
        p.zero_stage == 2 ? "optim_grads" : "optim_grads_params");
    arg("--ckpt-format", "fsdp_dtensor");  // the only format Megatron FSDP accepts
    out.notes.push_back("Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1");
    if (hybrid(s)) {
      out.notes.push_back(fmt::format(
          "Megatron-LM FSDP shards over the whole data-parallel group ({} GPUs), not groups of {}",
          p.dp, shard(s)));
    }
  }
  if (p.offload_optimizer == Offload::cpu) {
    // Megatron-Core's hybrid-device optimizer: the distributed optimizer's states on the host.
    flag("--optimizer-cpu-offload");
    arg("--optimizer-offload-fraction", 1.0);
    flag("--overlap-cpu-optimizer-d2h-h2d");
    if (p.zero_stage >= 2) {
      out.notes.push_back(
          "Megatron-LM offloads the distributed optimizer's states; with Megatron FSDP the "
          "gradients stay on the GPU");
    }
  }
  if (p.offload_optimizer == Offload::nvme || p.offload_params != Offload::none) {
    out.notes.push_back(fmt::format(
        "Megatron-LM has no {} offload; DeepSpeed's ZeRO-Infinity (the deepspeed export) runs it",
        p.offload_params != Offload::none ? "parameter" : "NVMe"));
  }
  if (p.dp > 1 && s.assumptions.overlap_grad_reduce) flag("--overlap-grad-reduce");
  if (p.zero_stage >= 1 && p.dp > 1 && s.assumptions.overlap_param_gather) {
    flag("--overlap-param-gather");
  }

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
  o << fit_warning(out);
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
  nlohmann::ordered_json j;
  j["train_batch_size"] = t.global_batch_size;
  j["train_micro_batch_size_per_gpu"] = t.micro_batch_size;
  j["gradient_accumulation_steps"] = accumulation_steps(s);
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
    zero["stage3_prefetch_bucket_size"] = "auto";
    if (hybrid(s)) zero["mics_shard_size"] = shard(s);
  } else if (hybrid(s)) {
    out.notes.push_back(fmt::format(
        "DeepSpeed shards ZeRO-{} over the whole data-parallel group ({} GPUs), not groups of {}",
        p.zero_stage, p.dp, shard(s)));
  }
  j["zero_optimization"] = zero;
  // Tensor parallelism through AutoTP training; the pipeline through PipelineModule(num_stages=pp).
  if (p.tp > 1) j["tensor_parallel"] = {{"autotp_size", p.tp}};
  if (p.pp > 1) {
    j["pipeline"] = {{"stages", p.pp}, {"partition", "uniform"}};
    if (s.model.num_layers % p.pp != 0) {
      out.notes.push_back(fmt::format(
          "{} layers do not split evenly over {} stages; DeepSpeed's uniform partition places the "
          "extra layers differently from the plan",
          s.model.num_layers, p.pp));
    }
    if (p.schedule != Schedule::one_f_one_b) {
      out.notes.push_back(schedule_note(s, "the DeepSpeed pipeline engine (1F1B)"));
    }
  }
  if (p.recompute != Recompute::none) {
    j["activation_checkpointing"] = {{"partition_activations", p.sequence_parallel},
                                     {"contiguous_memory_optimization", false},
                                     {"number_checkpoints", s.model.num_layers / p.pp}};
    if (p.recompute == Recompute::selective_op) {
      out.notes.push_back(
          "per-op selective checkpointing (selective_op) is torchtitan's policy; DeepSpeed's "
          "activation_checkpointing is full-layer");
    }
    if (p.recompute == Recompute::selective) {
      out.notes.push_back(
          "selective recompute is a model-code choice (Megatron-DeepSpeed "
          "--recompute-granularity selective); DeepSpeed's activation_checkpointing is full-layer");
    }
  }
  if (p.sequence_parallel) {
    out.notes.push_back(
        "sequence parallelism is a model-code choice (Megatron-DeepSpeed --sequence-parallel)");
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
      out.notes.push_back(
          "DeepSpeed-MoE's gates are softmax top-k; the plan's sigmoid router is model code");
    }
  }
  if (t.fp8 != Fp8Recipe::none) {
    out.notes.push_back(fmt::format(
        "FP8 ({} scaling) is Transformer Engine in the model code (te.fp8_autocast); DeepSpeed's "
        "config has no FP8 switch",
        to_string(t.fp8)));
  }
  if (p.cp > 1) {
    out.notes.push_back(
        p.cp_comm == CpComm::a2a
            ? fmt::format("DeepSpeed-Ulysses is a model-code choice (Megatron-DeepSpeed "
                          "--ds-sequence-parallel-size {})",
                          p.cp)
            : fmt::format("DeepSpeed has no {} context parallelism; Megatron-LM "
                          "(--context-parallel-size {}) runs it",
                          to_string(p.cp_comm), p.cp));
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
  out.text = j.dump(2) + "\n";
  return out;
}

std::string toml_string(std::string_view v) {
  return fmt::format("\"{}\"", v);
}

// torchtitan v0.2.2's Llama-3 flavors (torchtitan/models/llama3/__init__.py, llama3_args), with the
// SwiGLU width its FeedForward derives from ffn_dim_multiplier and multiple_of
// (model/model.py: 2/3 of 4·dim, times the multiplier, rounded up to multiple_of). Every flavor
// uses RoPE theta 500000 with Llama-3 scaling factor 8 (model/args.py RoPEScalingArgs) and
// vocabulary 128256.
struct TorchtitanFlavor {
  std::string_view name;
  Count dim, n_layers, n_heads, n_kv_heads;
  double ffn_dim_multiplier;
  Count multiple_of;
};
constexpr TorchtitanFlavor kTorchtitanLlama3[] = {
    {"8B", 4096, 32, 32, 8, 1.3, 1024},
    {"70B", 8192, 80, 64, 8, 1.3, 4096},
    {"405B", 16384, 126, 128, 8, 1.2, 4096},
};
constexpr double kTorchtitanRopeTheta = 500000.0;
constexpr double kTorchtitanRopeScaling = 8.0;
constexpr Count kTorchtitanVocab = 128256;

Count torchtitan_ffn(const TorchtitanFlavor& f) {
  Count hidden = 2 * (4 * f.dim) / 3;
  hidden = static_cast<Count>(f.ffn_dim_multiplier * static_cast<double>(hidden));
  return f.multiple_of * ((hidden + f.multiple_of - 1) / f.multiple_of);
}

// The [model] section: the Llama-3 flavor with this model's shape, or what to register.
std::string torchtitan_model(const ModelSpec& m, Exported& out) {
  if (m.moe.enabled()) {
    // torchtitan's llama3 is dense; its MoE models (qwen3, llama4, deepseek_v3) have their own
    // model code and flavors, none of which this exporter matches by shape.
    out.notes.push_back(fmt::format(
        "torchtitan's llama3 model is dense: this MoE model ({} routed experts of width {}, "
        "top-{}, {} shared) needs one of torchtitan's MoE models (qwen3, llama4, deepseek_v3) "
        "with a \"distplan_custom\" flavor of this shape",
        m.moe.num_experts, m.moe.expert_ffn_hidden_size, m.moe.top_k, m.moe.num_shared_experts));
    return "\n[model]\nname = \"distplan_custom_moe\"\nflavor = \"distplan_custom\"\n";
  }
  const bool llama_architecture = m.mlp == Mlp::swiglu && m.norm == Norm::rmsnorm &&
                                  m.position_embedding == PositionEmbedding::rotary && !m.bias &&
                                  !m.qkv_bias && !m.tied_embeddings && m.explicit_head_dim == 0 &&
                                  !m.qk_norm && !m.embedding_norm;
  std::string flavor;
  for (const TorchtitanFlavor& f : kTorchtitanLlama3) {
    if (llama_architecture && m.hidden_size == f.dim && m.num_layers == f.n_layers &&
        m.num_attention_heads == f.n_heads && m.num_kv_heads == f.n_kv_heads &&
        m.ffn_hidden_size == torchtitan_ffn(f) && m.vocab_size == kTorchtitanVocab &&
        m.rope_theta == kTorchtitanRopeTheta && m.rope_scaling_factor == kTorchtitanRopeScaling) {
      flavor = std::string(f.name);
    }
  }
  if (flavor.empty()) {
    flavor = "distplan_custom";
    if (llama_architecture) {
      out.notes.push_back(fmt::format(
          "no torchtitan Llama-3 flavor has this shape: add \"distplan_custom\" to llama3_args "
          "(dim={}, n_layers={}, n_heads={}, n_kv_heads={}, vocab_size={}, rope_theta={}, an "
          "ffn_dim_multiplier/multiple_of giving a SwiGLU width of {})",
          m.hidden_size, m.num_layers, m.num_attention_heads, m.num_kv_heads, m.vocab_size,
          m.rope_theta, m.ffn_hidden_size));
    } else {
      out.notes.push_back(
          "torchtitan's llama3 model is SwiGLU, RMSNorm, rotary, bias-free and untied, with head "
          "width hidden / heads, no q/k or embedding norms; this model is not, so it needs its "
          "own model code in torchtitan");
    }
  }
  return fmt::format("\n[model]\nname = \"llama3\"\nflavor = {}\n", toml_string(flavor));
}

Exported torchtitan(const Scenario& s, Exported out) {
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  // FSDP2 always shards parameters, gradients and optimizer states (ZeRO-3 layout); replicas of
  // a shard group form the HSDP replicate dimension. ZeRO-0 is plain replication (DDP).
  Count replicate = p.dp;
  Count shard_degree = 1;
  std::string reshard = "default";
  if (p.zero_stage >= 1) {
    shard_degree = shard(s);
    replicate = p.dp / shard_degree;
    if (p.zero_stage <= 2) {
      reshard = "never";  // parameters stay gathered between forward and backward
      out.notes.push_back(fmt::format(
          "torchtitan (FSDP2) has no ZeRO-{}; the nearest is full sharding with "
          "fsdp_reshard_after_forward = \"never\", which also shards parameters at rest",
          p.zero_stage));
    }
  }
  std::string schedule;
  switch (p.schedule) {
    case Schedule::gpipe:
      schedule = "GPipe";
      break;
    case Schedule::one_f_one_b:
      schedule = "1F1B";
      break;
    case Schedule::interleaved_1f1b:
      schedule = "Interleaved1F1B";
      break;
    case Schedule::zb_h1:
    case Schedule::zb_h2:
    case Schedule::zb_auto:
      schedule = "InterleavedZeroBubble";
      break;
    case Schedule::zb_v:
      // torch.distributed.pipelining's ScheduleZBVZeroBubble: two stages per rank in a V
      // (get_schedule_class name "ZBVZeroBubble", pytorch/pytorch schedules.py).
      schedule = "ZBVZeroBubble";
      break;
    case Schedule::dualpipe_v:
      // torch.distributed.pipelining's ScheduleDualPipeV (get_schedule_class name "DualPipeV",
      // pytorch/pytorch torch/distributed/pipelining/schedules.py).
      schedule = "DualPipeV";
      break;
    case Schedule::dualpipe:
      // torch.distributed.pipelining has ScheduleDualPipeV (the cut-in-half) but no
      // bidirectional DualPipe.
      schedule = "1F1B";
      out.notes.push_back(schedule_note(s, "torchtitan (only its cut-in-half, DualPipeV)"));
      break;
    case Schedule::v_half:
    case Schedule::v_min:
      schedule = "ZBVZeroBubble";
      out.notes.push_back(fmt::format(
          "torchtitan has no {} schedule; ZBVZeroBubble places the same V but keeps about {} "
          "times the activations",
          to_string(p.schedule), p.schedule == Schedule::v_half ? 2 : 3));
      break;
  }
  if ((p.schedule == Schedule::zb_h1 || p.schedule == Schedule::zb_h2 ||
       p.schedule == Schedule::zb_auto) &&
      p.pp > 1) {
    out.notes.push_back(fmt::format(
        "schedule {} maps to torch.distributed.pipelining's InterleavedZeroBubble (a looped "
        "schedule with one stage per rank here)",
        to_string(p.schedule)));
  }
  if (p.pp > 1 && s.model.num_layers % p.pp != 0) {
    out.notes.push_back(fmt::format(
        "{} layers do not split evenly over {} stages; set module_fqns_per_model_part to the "
        "plan's split (extra layers on the middle stages)",
        s.model.num_layers, p.pp));
  }
  if (!p.sequence_parallel && p.tp > 1) {
    out.notes.push_back("torchtitan's tensor parallelism always shards the sequence (sp on)");
  }
  // torchtitan v0.2.2 (config/job_config.py): mixed_precision_param is bfloat16 or float32,
  // mixed_precision_reduce float32 only.
  if (t.precision == DType::fp16) {
    out.notes.push_back("torchtitan has no fp16 training; the export uses bfloat16");
  }
  if (t.grad_accumulation_dtype != DType::fp32 && t.precision != DType::fp32) {
    out.notes.push_back(fmt::format(
        "torchtitan reduces gradients in float32 only; the plan's {} gradients become fp32",
        dtype_name(t.grad_accumulation_dtype)));
  }
  // Context parallelism (torch.distributed.tensor.experimental.context_parallel): "alltoall"
  // passes the KV shards around the ring, "allgather" gathers them; Ulysses' head all-to-all
  // has no counterpart.
  if (p.cp > 1 && p.cp_comm == CpComm::a2a) {
    out.notes.push_back(
        "torchtitan's context parallelism is ring attention (rotate method alltoall or "
        "allgather), not DeepSpeed-Ulysses' head all-to-all; the export uses allgather");
  }
  // FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer states together.
  const bool cpu_offload = p.offload_optimizer != Offload::none;
  if (cpu_offload && !(p.zero_stage == 3 && p.offload_optimizer == Offload::cpu &&
                       p.offload_params == Offload::cpu)) {
    out.notes.push_back(
        "torchtitan's enable_cpu_offload (FSDP2 CPUOffloadPolicy) offloads parameters, "
        "gradients and optimizer states to host memory together; the plan offloads less or to "
        "NVMe");
  }
  if (t.fp8 != Fp8Recipe::none) {
    out.notes.push_back(fmt::format(
        "FP8 ({} scaling): enable torchtitan's float8 (or mx for MXFP8) model converter for the "
        "linear layers; the export does not write it",
        to_string(t.fp8)));
  }
  const std::string model_section = torchtitan_model(s.model, out);
  out.to_add = {"[model] hf_assets_path: the folder with the tokenizer (vocabulary " +
                    std::to_string(s.model.vocab_size) + ")",
                "[training] dataset (or dataset_path) and steps",
                "[optimizer] lr, weight_decay and [lr_scheduler] warmup_steps, decay_type; "
                "[training] max_norm",
                "[checkpoint] folder and interval"};
  std::ostringstream o;
  o << fit_warning(out);
  o << fmt::format("# {} job config for {} on {} GPUs: tp={}{} pp={} dp={} ZeRO-{}\n",
                   kTorchtitanVersion, s.model.name, s.cluster.num_gpus, p.tp,
                   p.cp > 1 ? fmt::format(" cp={}", p.cp) : "", p.pp, p.dp, p.zero_stage);
  for (const std::string& n : out.notes) o << "# note: " << n << '\n';
  o << to_add_lines(out);
  o << model_section;
  o << "\n[training]\n";
  // Without a pipeline a local batch is one micro-batch and the rest is gradient accumulation;
  // with a pipeline the local batch is split into pipeline micro-batches.
  o << "local_batch_size = " << (p.pp > 1 ? t.global_batch_size / p.dp : t.micro_batch_size)
    << '\n';
  o << "global_batch_size = " << t.global_batch_size << '\n';
  o << "seq_len = " << t.seq_length << '\n';
  o << "mixed_precision_param = "
    << toml_string(t.precision == DType::fp32 ? "float32" : "bfloat16") << '\n';
  o << "mixed_precision_reduce = \"float32\"\n";
  if (cpu_offload) o << "enable_cpu_offload = true\n";
  o << "\n[parallelism]\n";
  o << "data_parallel_replicate_degree = " << replicate << '\n';
  o << "data_parallel_shard_degree = " << shard_degree << '\n';
  o << "fsdp_reshard_after_forward = " << toml_string(reshard) << '\n';
  o << "tensor_parallel_degree = " << p.tp << '\n';
  o << "pipeline_parallel_degree = " << p.pp << '\n';
  // torchtitan's MoE models shard their routed experts over expert_parallel_degree ranks.
  if (s.model.moe.enabled()) o << "expert_parallel_degree = " << p.ep << '\n';
  if (p.cp > 1) {
    o << "context_parallel_degree = " << p.cp << '\n';
    o << "context_parallel_rotate_method = "
      << toml_string(p.cp_comm == CpComm::p2p ? "alltoall" : "allgather") << '\n';
  }
  if (p.pp > 1) {
    o << "pipeline_parallel_schedule = " << toml_string(schedule) << '\n';
    o << "pipeline_parallel_microbatch_size = " << t.micro_batch_size << '\n';
    // Multi-stage schedules need torchtitan to cut 2 (ZB-V) or v stages per rank.
    if (p.schedule == Schedule::interleaved_1f1b || v_shape(p.schedule)) {
      o << "pipeline_parallel_layers_per_stage = " << s.model.num_layers / (p.pp * p.virtual_stages)
        << '\n';
    }
  }
  o << "\n[activation_checkpoint]\n";
  // torchtitan's mode "selective" with selective_ac_option "op" is selective_op.
  const bool op_sac = p.recompute == Recompute::selective || p.recompute == Recompute::selective_op;
  o << "mode = " << toml_string(op_sac ? "selective" : to_string(p.recompute)) << '\n';
  if (op_sac) o << "selective_ac_option = \"op\"\n";
  out.text = o.str();
  return out;
}

}  // namespace

Exported export_scenario(const Scenario& s, ExportFormat format) {
  // The fit is known before the text is written, so the text can carry the warning.
  const MemoryEstimate mem = estimate(s).memory;
  Exported seed;
  seed.fits = mem.fits;
  seed.peak_bytes = mem.peak_reserved_bytes;  // what fits compares
  seed.capacity_bytes = mem.capacity_bytes;
  switch (format) {
    case ExportFormat::megatron:
      return megatron(s, seed);
    case ExportFormat::deepspeed:
      return deepspeed(s, seed);
    case ExportFormat::torchtitan:
      return torchtitan(s, seed);
  }
  return seed;
}

}  // namespace distplan::search
