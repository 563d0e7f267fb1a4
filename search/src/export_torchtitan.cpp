// torchtitan job configs (export.h, docs/exports.md "torchtitan"): the plan's layout as the
// TOML keys of torchtitan v0.2.2 (torchtitan/config/job_config.py), with the Llama-3 model
// flavors of torchtitan/models/llama3/__init__.py.
#include <sstream>

#include <fmt/format.h>

#include "distplan/planner/layout.h"
#include "distplan/search/export.h"
#include "export_split.h"

namespace distplan::search {
namespace {

using detail::to_add_lines;
using detail::warning_comment;

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
  if (m.mtp_layers > 0) {
    out.notes.push_back(fmt::format(
        "{} multi-token prediction module(s) on the last stage: the model code must add them (as "
        "DeepSeek-V3's hnorm, enorm, eh_proj, one layer and the shared head)",
        m.mtp_layers));
  }
  if (m.mla.enabled()) {
    // Latent attention is torchtitan's deepseek_v3 model's (its MLA Attention), not llama3's.
    out.notes.push_back(fmt::format(
        "multi-head latent attention (q_lora_rank {}, kv_lora_rank {}, qk_nope_head_dim {}, "
        "qk_rope_head_dim {}, v_head_dim {}) is torchtitan's deepseek_v3 model: register a "
        "\"distplan_custom\" flavor of this shape there",
        m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_nope_head_dim, m.mla.qk_rope_head_dim,
        m.mla.v_head_dim));
    return "\n[model]\nname = \"deepseek_v3\"\nflavor = \"distplan_custom\"\n";
  }
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

std::string_view torchtitan_schedule(Schedule s) {
  // torch.distributed.pipelining get_schedule_class names; the capability table admits no other.
  switch (s) {
    case Schedule::gpipe:
      return "GPipe";
    case Schedule::interleaved_1f1b:
      return "Interleaved1F1B";
    case Schedule::zb_v:
      return "ZBVZeroBubble";
    case Schedule::dualpipe_v:
      return "DualPipeV";
    default:
      return "1F1B";
  }
}

}  // namespace

namespace detail {

Exported torchtitan_export(const Scenario& s, Exported out) {
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  // FSDP2 shards parameters, gradients and optimizer states (ZeRO-3); replicas of a shard group
  // form the HSDP replicate dimension; ZeRO-0 is plain replication (DDP, 1-D only). cp folds into
  // the FSDP mesh as distplan's ZeRO group (dp x cp) does.
  const Count shard_degree = p.zero_stage >= 2 ? s.shard_size() : 1;
  const Count replicate = p.dp / shard_degree;
  const std::string model_section = torchtitan_model(s.model, out);
  out.to_add = {"[model] hf_assets_path: the folder with the tokenizer (vocabulary " +
                    std::to_string(s.model.vocab_size) + ")",
                "[training] dataset (or dataset_path) and steps",
                "[optimizer] lr, weight_decay and [lr_scheduler] warmup_steps, decay_type; "
                "[training] max_norm",
                "[checkpoint] folder and interval"};
  std::ostringstream o;
  o << warning_comment(out);
  o << fmt::format("# {} job config for {} on {} GPUs: tp={}{} pp={} dp={} ZeRO-{}\n",
                   kTorchtitanVersion, s.model.name, s.cluster.num_gpus, p.tp,
                   p.cp > 1 ? fmt::format(" cp={}", p.cp) : "", p.pp, p.dp, p.zero_stage);
  for (const std::string& n : out.notes) o << "# note: " << n << '\n';
  o << to_add_lines(out);
  o << model_section;
  // FP8 through torchao's converters: per-tensor current scaling is float8's "tensorwise"
  // recipe, MXFP8 is mx's "mxfp8_cublas" (components/quantization/float8.py, mx.py).
  if (t.fp8 == Fp8Recipe::current) {
    o << "converters = [\"quantize.linear.float8\"]\n";
  } else if (t.fp8 == Fp8Recipe::mxfp8) {
    o << "converters = [\"quantize.linear.mx\"]\n";
  }
  o << "\n[training]\n";
  // Without a pipeline a local batch is one micro-batch and the rest is gradient accumulation;
  // with a pipeline the local batch is split into pipeline micro-batches.
  o << "local_batch_size = " << (p.pp > 1 ? t.global_batch_size / p.dp : t.micro_batch_size)
    << '\n';
  o << "global_batch_size = " << t.global_batch_size << '\n';
  o << "seq_len = " << t.seq_length << '\n';
  // mixed_precision_param is bfloat16 or float32, mixed_precision_reduce float32 only
  // (config/job_config.py); the capability table refuses the rest.
  o << "mixed_precision_param = "
    << toml_string(t.precision == DType::fp32 ? "float32" : "bfloat16") << '\n';
  o << "mixed_precision_reduce = \"float32\"\n";
  // FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer states on the host.
  if (p.offload_optimizer == Offload::cpu) o << "enable_cpu_offload = true\n";
  o << "\n[parallelism]\n";
  o << "data_parallel_replicate_degree = " << replicate << '\n';
  o << "data_parallel_shard_degree = " << shard_degree << '\n';
  // "default": resharded after the forward without a pipeline, kept gathered with one
  // (models/llama3/infra/parallelize.py apply_fsdp), as the plan's memory counts it.
  // ZeRO-2: parameters stay gathered from the forward to the end of the backward ("never").
  o << "fsdp_reshard_after_forward = " << (p.zero_stage == 2 ? "\"never\"" : "\"default\"") << '\n';
  o << "tensor_parallel_degree = " << p.tp << '\n';
  if (s.assumptions.tp_comm_overlap && p.tp > 1) o << "enable_async_tensor_parallel = true\n";
  o << "pipeline_parallel_degree = " << p.pp << '\n';
  // torchtitan's MoE models shard their routed experts over expert_parallel_degree ranks.
  if (s.model.moe.enabled()) {
    o << "expert_parallel_degree = " << p.ep << '\n';
    o << "expert_tensor_parallel_degree = " << p.etp << '\n';
  }
  if (p.cp > 1) {
    o << "context_parallel_degree = " << p.cp << '\n';
    o << "context_parallel_rotate_method = "
      << toml_string(p.cp_comm == CpComm::p2p ? "alltoall" : "allgather") << '\n';
  }
  if (p.pp > 1) {
    o << "pipeline_parallel_schedule = " << toml_string(torchtitan_schedule(p.schedule)) << '\n';
    o << "pipeline_parallel_microbatch_size = " << t.micro_batch_size << '\n';
    // The plan's split in torchtitan's own terms (export_split.h).
    for (const std::string& line : detail::torchtitan_split_lines(s)) o << line << '\n';
  }
  if (t.fp8 == Fp8Recipe::current) {
    o << "\n[quantize.linear.float8]\nrecipe_name = \"tensorwise\"\n";
  } else if (t.fp8 == Fp8Recipe::mxfp8) {
    o << "\n[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\n";
  }
  o << "\n[activation_checkpoint]\n";
  // torchtitan's mode "selective" with selective_ac_option "op" is selective_op; its default
  // mode (selective, every second layer) is never left in place.
  const bool op_sac = p.recompute == Recompute::selective_op;
  o << "mode = " << toml_string(op_sac ? "selective" : to_string(p.recompute)) << '\n';
  if (op_sac) o << "selective_ac_option = \"op\"\n";
  // Async TP runs under torch.compile only (job_config.py, enable_async_tensor_parallel).
  o << "\n[compile]\nenable = " << (s.assumptions.tp_comm_overlap && p.tp > 1 ? "true" : "false")
    << '\n';
  out.text = o.str();
  return out;
}

}  // namespace detail

}  // namespace distplan::search
