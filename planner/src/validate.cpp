// Semantic checks of a parsed scenario (docs/limits.md lists every rule and bound).
#include "distplan/planner/validate.h"

#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "attention_json.h"
#include "distplan/planner/capabilities.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"
#include "moe_json.h"

namespace distplan {
namespace {

// Byte counts are int64; every per-GPU and per-step figure must stay below this bound, which
// leaves headroom for sums of a few categories.
constexpr double kMaxBytes = 1e18;
constexpr double kMaxParameters = 1e14;

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw InputError(path, msg);
}

// Returns an upper estimate of the model's parameters (double: no integer product yet).
double check_model(const ModelSpec& m) {
  // An explicit head_dim (or MLA's head widths) frees the heads from dividing hidden_size.
  if (m.explicit_head_dim == 0 && !m.mla.enabled() && m.hidden_size % m.num_attention_heads != 0) {
    fail("/model/hidden_size",
         fmt::format("hidden_size={} is not divisible by num_attention_heads={}", m.hidden_size,
                     m.num_attention_heads));
  }
  if (m.num_kv_heads > m.num_attention_heads || m.num_attention_heads % m.num_kv_heads != 0) {
    fail("/model/num_kv_heads", fmt::format("num_kv_heads={} must divide num_attention_heads={}",
                                            m.num_kv_heads, m.num_attention_heads));
  }
  // Parameter count in floating point first: a model too large for int64 arithmetic is
  // rejected before any integer product is formed.
  const double h = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double per_layer = 4.0 * h * h + 3.0 * h * f + 4.0 * h;
  const double total = static_cast<double>(m.num_layers) * per_layer +
                       2.0 * static_cast<double>(m.vocab_size) * h +
                       static_cast<double>(m.max_position_embeddings) * h;
  if (total > kMaxParameters) {
    fail("/model", fmt::format("the model has about {:.3g} parameters, more than the {:.0e} "
                               "distplan supports",
                               total, kMaxParameters));
  }
  return total;
}

// Context parallelism: what Megatron-Core / Transformer Engine run (docs/communication.md,
// "Context parallel"); everything else is refused.
void check_context_parallel(const Scenario& s) {
  const ParallelSpec& p = s.parallel;
  const TrainingSpec& t = s.training;
  const ModelSpec& m = s.model;
  if (p.cp == 1) return;
  // Transformer Engine 2.x (transformer_engine/pytorch/attention/dot_product_attention/
  // context_parallel.py, attn_forward_func_with_cp): sliding-window attention only with the
  // all_gather and a2a variants, and a softmax with sinks (softmax_type other than vanilla) only
  // with a2a.
  if (s.model.attention_window.enabled() && p.cp_comm == CpComm::p2p) {
    fail("/parallel/cp_comm",
         "context parallelism with windowed attention runs as all_gather or a2a (Transformer "
         "Engine's p2p ring does not take a window); set cp_comm to all_gather or a2a");
  }
  if (s.model.attention_sinks && p.cp_comm != CpComm::a2a) {
    fail("/parallel/cp_comm",
         "context parallelism with attention sinks runs as a2a only (Transformer Engine's "
         "softmax_type other than vanilla); set cp_comm to a2a");
  }
  if (t.attention != Attention::flash) {
    fail("/parallel/cp",
         "context parallelism splits fused (flash) attention across ranks; standard attention's "
         "materialised scores are not modelled with it");
  }
  // The causal load balancing cuts each sequence into 2·cp chunks (Megatron-Core
  // get_batch_on_this_cp_rank); with sequence parallelism each chunk is split again over tp.
  const Count chunks =
      (p.cp_comm == CpComm::a2a ? p.cp : 2 * p.cp) * (p.sequence_parallel ? p.tp : 1);
  if (t.seq_length % chunks != 0) {
    fail("/parallel/cp",
         fmt::format("seq_length={} must be a multiple of {}: cp_comm {} cuts each sequence into "
                     "{} equal chunks{}",
                     t.seq_length, chunks, to_string(p.cp_comm),
                     p.cp_comm == CpComm::a2a ? "cp" : "2*cp (causal load balancing)",
                     p.sequence_parallel ? ", each split again over tp (sequence parallel)" : ""));
  }
  if (p.cp_comm == CpComm::a2a) {
    // Ulysses' all-to-all hands each rank whole heads: cp divides the heads of a TP rank, and
    // the KV heads too (replicating KV heads when cp exceeds them is not modelled).
    if ((m.num_attention_heads / p.tp) % p.cp != 0) {
      fail("/parallel/cp", fmt::format("cp_comm a2a gives each rank whole heads: cp={} must divide "
                                       "the {} attention heads per TP rank",
                                       p.cp, m.num_attention_heads / p.tp));
    }
    if ((m.num_kv_heads / p.tp) % p.cp != 0) {
      fail("/parallel/cp",
           fmt::format("cp_comm a2a gives each rank whole heads: cp={} must divide the {} KV "
                       "heads per TP rank (replicated KV heads are not modelled)",
                       p.cp, m.num_kv_heads / p.tp));
    }
  }
}

// Megatron-Core's MoE parallel folding (parallel_state.py, initialize_model_parallel): the tp·dp
// ranks of a stage hold the expert layers as etp · ep · edp, so ep·etp divides tp·cp·dp.
void check_expert_layout(const ModelSpec& m, const ParallelSpec& p) {
  // Shared experts are split by tensor parallelism like the dense MLP.
  if (m.moe.num_shared_experts > 0 && m.moe.shared_expert_ffn_hidden_size % p.tp != 0) {
    fail("/parallel/tp", fmt::format("tp={} does not divide shared_expert_ffn_hidden_size={}", p.tp,
                                     m.moe.shared_expert_ffn_hidden_size));
  }
  if (p.ep == 1 && p.etp == 1) return;
  const char* which = p.ep > 1 ? "/parallel/ep" : "/parallel/etp";
  if (!m.moe.enabled())
    fail(which, "expert parallelism needs a Mixture-of-Experts model (model.moe)");
  if (m.moe.num_experts % p.ep != 0) {
    fail("/parallel/ep",
         fmt::format("ep={} does not divide num_experts={}", p.ep, m.moe.num_experts));
  }
  if ((p.tp * p.cp * p.dp) % (p.ep * p.etp) != 0) {
    fail(which, fmt::format("ep*etp = {}*{} must divide tp*cp*dp = {}*{}*{}: the expert layers "
                            "regroup a stage's tp*cp*dp ranks as etp*ep*expert-dp",
                            p.ep, p.etp, p.tp, p.cp, p.dp));
  }
  if (m.moe.expert_ffn_hidden_size % p.etp != 0) {
    fail("/parallel/etp", fmt::format("etp={} does not divide expert_ffn_hidden_size={}", p.etp,
                                      m.moe.expert_ffn_hidden_size));
  }
}

// Fine-tuning (docs/peft.md, "Limits"): the layouts and models whose PEFT runs distplan models;
// everything else is refused at its field.
void check_peft(const Scenario& s) {
  const PeftSpec& pe = s.training.peft;
  if (!pe.enabled()) return;
  const ModelSpec& m = s.model;
  const ParallelSpec& p = s.parallel;
  const char* at = "/training/peft";
  if (m.moe.enabled() || m.mla.enabled() || m.mtp_layers > 0) {
    fail(std::string(at) + "/method",
         "fine-tuning of Mixture-of-Experts, MLA or multi-token-prediction models is not "
         "modelled (adapters on experts and latent projections)");
  }
  if (pe.adapters() && pe.rank > m.hidden_size) {
    fail(std::string(at) + "/rank", fmt::format("rank={} exceeds hidden_size={}: a LoRA update of "
                                                "that rank is no longer low-rank",
                                                pe.rank, m.hidden_size));
  }
  const bool trains_layers =
      pe.frozen_layers < m.num_layers && (pe.method == PeftMethod::full || pe.targets != 0);
  const bool head_trains =
      pe.method == PeftMethod::full && !(m.tied_embeddings && pe.freeze_embeddings);
  if (!trains_layers && !head_trains) {
    fail(
        std::string(at) + "/frozen_layers",
        fmt::format("frozen_layers={} freezes every layer: nothing would train", pe.frozen_layers));
  }
  if (pe.adapters() && p.tp > 1) {
    fail("/parallel/tp",
         "LoRA adapters under tensor parallelism (Megatron-Bridge's ParallelLinearAdapter and its "
         "gathers) are not modelled; fine-tune with data parallelism, ZeRO / FSDP and pipeline "
         "stages");
  }
  if (p.cp > 1) fail("/parallel/cp", "context parallelism with fine-tuning is not modelled");
  if (s.training.fp8 != Fp8Recipe::none)
    fail("/training/precision", "fp8 GEMMs with fine-tuning are not modelled");
  if (p.recompute == Recompute::selective_op) {
    fail("/parallel/recompute",
         "per-op selective checkpointing with fine-tuning is not modelled (none, selective or "
         "full)");
  }
  if (bidirectional(p.schedule)) {
    fail("/parallel/schedule", "DualPipe's two model copies with fine-tuning are not modelled");
  }
  if (pe.frozen_layers > 0 && p.virtual_stages > 1) {
    fail(std::string(at) + "/frozen_layers",
         "frozen layers with virtual pipeline stages are not modelled (a stage's chunks would "
         "differ)");
  }
  if (p.offload_params != Offload::none) {
    fail("/parallel/offload_params",
         "parameter offload with fine-tuning is not modelled (offload_optimizer is)");
  }
  if (pe.paged_optimizer && p.offload_optimizer != Offload::none) {
    fail(std::string(at) + "/paged_optimizer",
         "a paged optimizer and optimizer offload both move the optimizer states: choose one");
  }
}

}  // namespace

void validate_scenario(const Scenario& s, bool refuse_unplanned) {
  const ModelSpec& m = s.model;
  const ClusterSpec& c = s.cluster;
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  const double parameters = check_model(m);
  detail::check_moe_mla_fields(m, "/model");
  detail::check_attention_fields(m, "/model");

  // Cluster.
  const FlopsPerSecond peak = t.precision == DType::bf16 ? c.gpu.peak_flops.bf16
                              : t.precision == DType::fp16
                                  ? c.gpu.peak_flops.fp16
                                  : std::max(c.gpu.peak_flops.fp32, c.gpu.peak_flops.tf32);
  if (!(peak > 0)) {
    fail("/cluster/gpu/peak_flops",
         fmt::format("the GPU has no peak FLOP/s for precision {}", to_string(t.precision)));
  }
  if (t.fp8 != Fp8Recipe::none) {
    // FP8 GEMMs need FP8 tensor cores (Hopper, Ada, Blackwell, MI300); MXFP8's block scaling
    // needs Blackwell's (docs/time.md, "FP8").
    const bool mx = t.fp8 == Fp8Recipe::mxfp8;
    if (!((mx ? c.gpu.peak_flops.mxfp8 : c.gpu.peak_flops.fp8) > 0)) {
      fail(mx ? "/training/fp8_recipe" : "/training/precision",
           fmt::format("the GPU ({}) has no {} tensor cores (peak_flops.{} is 0)", c.gpu.name,
                       mx ? "MXFP8" : "FP8", mx ? "mxfp8" : "fp8"));
    }
  }
  if (c.runtime_reserve_bytes >= c.gpu.memory_bytes) {
    fail("/cluster/runtime_reserve_bytes",
         fmt::format("runtime_reserve_bytes={} leaves nothing of the GPU's {} bytes",
                     c.runtime_reserve_bytes, c.gpu.memory_bytes));
  }
  if (!(c.intra_node_bandwidth > 0) || !(c.inter_node_bandwidth > 0) ||
      !(c.gpu.memory_bandwidth > 0)) {
    fail("/cluster", "bandwidths must be positive");
  }

  if (m.position_embedding == PositionEmbedding::learned &&
      t.seq_length > m.max_position_embeddings) {
    fail("/training/seq_length",
         fmt::format("seq_length={} exceeds the model's max_position_embeddings={} (learned "
                     "positions)",
                     t.seq_length, m.max_position_embeddings));
  }

  // Layout arithmetic.
  if (p.tp * p.cp * p.pp * p.dp != c.num_gpus) {
    if (p.cp == 1) {
      fail("/parallel", fmt::format("dp*tp*pp = {}*{}*{} = {} does not equal num_gpus={}", p.dp,
                                    p.tp, p.pp, p.dp * p.tp * p.pp, c.num_gpus));
    }
    fail("/parallel", fmt::format("dp*tp*cp*pp = {}*{}*{}*{} = {} does not equal num_gpus={}", p.dp,
                                  p.tp, p.cp, p.pp, p.dp * p.tp * p.cp * p.pp, c.num_gpus));
  }
  if (m.num_attention_heads % p.tp != 0) {
    fail("/parallel/tp",
         fmt::format("tp={} does not divide num_attention_heads={}", p.tp, m.num_attention_heads));
  }
  if (m.num_kv_heads % p.tp != 0) {
    fail("/parallel/tp",
         fmt::format("tp={} does not divide num_kv_heads={}", p.tp, m.num_kv_heads));
  }
  if (m.ffn_hidden_size % p.tp != 0) {
    fail("/parallel/tp",
         fmt::format("tp={} does not divide ffn_hidden_size={}", p.tp, m.ffn_hidden_size));
  }
  check_expert_layout(m, p);
  if (p.sequence_parallel && t.seq_length % p.tp != 0) {
    fail(
        "/parallel/sequence_parallel",
        fmt::format("sequence parallelism splits the sequence: tp={} does not divide seq_length={}",
                    p.tp, t.seq_length));
  }
  check_context_parallel(s);
  if (p.pp > m.num_layers) {
    fail("/parallel/pp", fmt::format("pp={} exceeds num_layers={}", p.pp, m.num_layers));
  }
  if (t.global_batch_size % (p.dp * t.micro_batch_size) != 0) {
    fail("/training/global_batch_size",
         fmt::format("global_batch_size={} is not divisible by dp*micro_batch_size={}*{}={}",
                     t.global_batch_size, p.dp, t.micro_batch_size, p.dp * t.micro_batch_size));
  }
  const Count m_mb = s.num_microbatches();

  if (two_chunks(p.schedule) && p.virtual_stages != 2) {
    fail("/parallel/virtual_stages",
         fmt::format("schedule {} places exactly two chunks on each stage; "
                     "virtual_stages must be 2, not {}",
                     to_string(p.schedule), p.virtual_stages));
  }
  if (p.virtual_stages > 1 && p.schedule != Schedule::interleaved_1f1b && !two_chunks(p.schedule)) {
    fail("/parallel/virtual_stages",
         fmt::format("virtual_stages={} needs schedule interleaved_1f1b (schedule is {})",
                     p.virtual_stages, to_string(p.schedule)));
  }
  if (v_shape(p.schedule) && m_mb < 2 * p.pp) {
    fail("/parallel/schedule",
         fmt::format("{} needs at least 2*pp={} micro-batches per step (the V's warm-up and the "
                     "planner's activation peak assume it); the step has {}",
                     to_string(p.schedule), 2 * p.pp, m_mb));
  }
  if (bidirectional(p.schedule)) {
    // deepseek-ai/DualPipe dualpipe.py: assert num_ranks % 2 == 0; num_chunks % 2 == 0 and
    // num_chunks >= num_ranks * 2.
    if (p.pp < 2 || p.pp % 2 != 0) {
      fail("/parallel/schedule",
           fmt::format("dualpipe needs an even number of pipeline stages (pp >= 2, DualPipe "
                       "asserts num_ranks % 2 == 0); pp is {}",
                       p.pp));
    }
    if (m_mb % 2 != 0 || m_mb < 2 * p.pp) {
      fail("/parallel/schedule",
           fmt::format("dualpipe needs an even number of micro-batches per step, at least "
                       "2*pp={} (DualPipe asserts num_chunks % 2 == 0 and num_chunks >= "
                       "num_ranks * 2); the step has {}",
                       2 * p.pp, m_mb));
    }
    // Not modelled: the copies' gradient sum is taken once per step on full gradients (ZeRO
    // 0/1); ZeRO-2/3 reduce per micro-batch. Tied embeddings would tie four matrices.
    if (p.zero_stage >= 2) {
      fail("/parallel/zero_stage",
           "dualpipe is planned with ZeRO 0 or 1 (its two parameter copies sum their full "
           "gradients once per step; per-micro-batch ZeRO-2/3 reductions are not modelled)");
    }
    if (m.tied_embeddings) {
      fail("/model/tied_embeddings",
           "dualpipe with tied embeddings is not modelled (both end stages hold an embedding "
           "and an LM head copy)");
    }
  }
  if (p.zb_memory_limit_microbatches > 0 && p.schedule != Schedule::zb_auto) {
    fail("/parallel/zb_memory_limit_microbatches",
         fmt::format("only schedule zb_auto takes a memory limit (schedule is {})",
                     to_string(p.schedule)));
  }
  if (p.schedule == Schedule::interleaved_1f1b) {
    if (p.pp > 1 && m_mb % p.pp != 0) {
      fail("/parallel/schedule",
           fmt::format("interleaved 1F1B needs the number of micro-batches ({}) to be a multiple "
                       "of pp={} (Megatron-LM)",
                       m_mb, p.pp));
    }
  }

  // Pipeline split: layers per virtual stage by the scenario's rule (pipeline_split.h), refused at
  // its field where the framework's own code would refuse it.
  (void)pipeline_split(s);

  // ZeRO.
  if (p.fsdp_shard_size < 1 || p.dp % p.fsdp_shard_size != 0) {
    fail("/parallel/fsdp_shard_size",
         fmt::format("fsdp_shard_size={} must divide dp={}", p.fsdp_shard_size, p.dp));
  }
  if (p.zero_stage == 0 && p.fsdp_shard_size != p.dp) {
    fail("/parallel/fsdp_shard_size",
         "hybrid sharding (fsdp_shard_size < dp) needs zero_stage >= 1");
  }

  // Offload: what DeepSpeed runs (docs/memory.md, "Offload"); everything else is refused.
  if (p.offload_optimizer != Offload::none) {
    if (p.zero_stage == 0) {
      fail("/parallel/offload_optimizer",
           "optimizer offload moves the ZeRO optimizer partition (ZeRO-Offload); it needs "
           "zero_stage >= 1");
    }
    if (p.offload_optimizer == Offload::nvme && p.zero_stage != 3) {
      fail("/parallel/offload_optimizer",
           fmt::format("offload to nvme is ZeRO-Infinity, which DeepSpeed runs with ZeRO-3 only; "
                       "zero_stage is {}",
                       p.zero_stage));
    }
    if (!(c.gpu.pcie_bandwidth > 0)) {
      fail("/cluster/gpu/pcie_bandwidth",
           "offload copies over the GPU's host link: the GPU needs a pcie_bandwidth");
    }
  }
  if (p.offload_params != Offload::none) {
    if (p.zero_stage != 3) {
      fail("/parallel/offload_params",
           fmt::format("parameter offload moves the ZeRO-3 parameter partition; it needs "
                       "zero_stage 3, not {}",
                       p.zero_stage));
    }
    if (p.offload_optimizer == Offload::none) {
      fail("/parallel/offload_params",
           "parameter offload with the optimizer on the GPU is not modelled (the GPU optimizer "
           "would step parameters that live on the host); offload the optimizer too");
    }
  }
  if ((p.offload_optimizer == Offload::nvme || p.offload_params == Offload::nvme) &&
      !(c.nvme_bandwidth > 0)) {
    fail("/cluster/nvme_bandwidth",
         "offload to nvme needs the node's NVMe bandwidth (bytes/s, one direction)");
  }

  // Magnitudes: keep every byte count far inside int64 (docs/limits.md).
  const double b = static_cast<double>(t.micro_batch_size);
  const double sq = static_cast<double>(t.seq_length);
  const double h = static_cast<double>(m.hidden_size);
  const double a = static_cast<double>(m.num_attention_heads);
  const double f = static_cast<double>(m.ffn_hidden_size);
  const MoeSpec& moe = m.moe;
  const double shared = static_cast<double>(moe.num_shared_experts) *
                        static_cast<double>(moe.shared_expert_ffn_hidden_size);
  // The s x s attention scores exist only under standard attention (flash attention keeps none).
  const double scores = t.attention == Attention::standard ? 5.0 * a * sq : 0.0;
  const double per_layer_act = b * sq * (40.0 * h + 6.0 * std::max(f, shared) + scores) * 4.0;
  // A MoE layer's routed part (moe_memory.h, moe_layer_activation): the router's scores over
  // every expert, and per routed copy its index maps and, scaled by the capacity or imbalance
  // factor, the copy, its expert's input projection and activation; at fp32, the bound also
  // holds the four all-to-alls a copy takes per micro-batch (issue 29, item 1: 65,536 routed
  // experts over 4 Mi tokens wrapped the total to -9.2e18).
  double routed = 0;
  if (moe.enabled()) {
    const double factor = std::max(
        1.0, moe.capacity_factor ? *moe.capacity_factor : s.assumptions.moe_load_imbalance);
    const double ef = static_cast<double>(moe.expert_ffn_hidden_size);
    routed = b * sq *
             (5.0 * static_cast<double>(moe.num_experts) +
              static_cast<double>(moe.top_k) * (16.0 + factor * (4.0 * h + 3.0 * ef + 2.0) * 4.0));
  }
  const double act = (per_layer_act + routed) * static_cast<double>(m.num_layers) *
                     static_cast<double>(std::max<Count>(m_mb, 1));
  const double logits =
      b * sq * static_cast<double>(m.vocab_size) * 6.0 * static_cast<double>(m_mb);
  if (act > kMaxBytes || logits > kMaxBytes) {
    fail("/training/seq_length",
         fmt::format("activations of {:.3g} bytes per GPU{} exceed the {:.0e} bytes distplan can "
                     "represent; lower seq_length, micro_batch_size or global_batch_size",
                     std::max(act, logits),
                     routed > per_layer_act ? " (most of them MoE routed token copies: top_k per "
                                              "token)"
                                            : "",
                     kMaxBytes));
  }
  // ZeRO-2 reduce-scatters gradients and ZeRO-3 all-gathers parameters once per micro-batch
  // (forward, backward, and a recompute replay), so their bytes per step grow as P·m: bounded at
  // fp32 and three passes (docs/trust.md, finding 2).
  const double model_state_traffic =
      parameters * 4.0 * 3.0 * static_cast<double>(std::max<Count>(m_mb, 1));
  if (p.zero_stage >= 2 && model_state_traffic > kMaxBytes) {
    fail("/training/global_batch_size",
         fmt::format("ZeRO-{} moves the model state once per micro-batch: {} micro-batches of a "
                     "{:.3g}-parameter model exceed the {:.0e} bytes per step distplan can "
                     "represent; lower global_batch_size or raise micro_batch_size",
                     p.zero_stage, m_mb, parameters, kMaxBytes));
  }
  const double tokens = static_cast<double>(t.global_batch_size) * sq;
  if (tokens > 1e15) {
    fail("/training/global_batch_size",
         "global_batch_size * seq_length exceeds 1e15 tokens per step");
  }
  check_peft(s);
  // Once the layout is known to be well formed: what the framework cannot run
  // (capabilities.h), then what is counted but not planned yet.
  if (auto r = framework_refusal(s)) fail(r->path, r->message);
  if (refuse_unplanned) detail::refuse_unplanned_model(s);
}

}  // namespace distplan
