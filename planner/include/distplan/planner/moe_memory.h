// Memory and communication terms of Mixture-of-Experts layers (docs/moe.md, "Memory" and
// "Communication"): the routed experts' model states sharded by expert parallelism and by ZeRO
// over the expert data-parallel group, the activations a MoE layer keeps for its backward, and
// the bytes of one expert-parallel all-to-all. Inline like memory_terms.h, which the search's
// lean path compiles into its loop; one truth for planner, simulator, search and exports.
#pragma once

#include <cmath>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// How one stage's tp·cp·dp ranks hold the expert layers: Megatron-Core's MoE parallel folding
/// (parallel_state.py, initialize_model_parallel: expert_data_parallel_size = world /
/// (pp·ep·etp); docs/layout.md): etp · ep · edp = tp · cp · dp.
struct ExpertLayout {
  Count ep = 1;   // expert parallel: each rank holds num_experts / ep routed experts
  Count etp = 1;  // expert tensor parallel: each routed expert's FFN split etp ways
  Count edp = 1;  // expert data parallel: replicas of one expert shard, ZeRO's shard group
};
[[nodiscard]] inline ExpertLayout expert_layout(const ParallelSpec& p) noexcept {
  return {.ep = p.ep, .etp = p.etp, .edp = p.tp * p.cp * p.dp / (p.ep * p.etp)};
}

/// Routed-expert parameters one GPU holds in one MoE layer: num_experts / ep experts, each FFN
/// split etp ways as a tensor-parallel MLP (Shoeybi et al. 2019, sec. 3): the column-parallel
/// input projection and its bias split, the row-parallel output projection split and its bias
/// replicated. The router and the shared experts belong to the dense part.
[[nodiscard]] Count routed_expert_params_per_gpu(const ModelSpec& m, Count ep, Count etp) noexcept;

/// Parameters per TP rank of a MoE layer's dense part (everything but the routed experts):
/// the layer op table's norms and grouped-query attention (split as the table splits them), the
/// router h -> num_experts and its expert bias (replicated on the TP ranks, as Megatron-Core's
/// TopKRouter weight is), the shared experts as tensor-parallel MLPs and their gate (replicated).
/// Not for MLA attention (model.mla), whose split is not modelled.
[[nodiscard]] Count moe_layer_dense_params_per_tp_rank(const ModelSpec& m, Count tp) noexcept;

/// Model-state bytes of the routed experts of one GPU's MoE layers.
struct ExpertStateBytes {
  Bytes weights = 0, gradients = 0, optimizer = 0;
  [[nodiscard]] Bytes total() const noexcept { return weights + gradients + optimizer; }
};
/// ZeRO over the expert data-parallel group (Megatron-Core's distributed optimizer shards expert
/// parameters over the expert-data-parallel group; Rajbhandari et al. 2020, Figure 1): each MoE
/// layer's experts are one unit, padded to a multiple of edp like the dense units
/// (memory_terms.h). `per_layer` is routed_expert_params_per_gpu(); `optimizer_per_param` is
/// optimizer_bytes_per_param().
[[nodiscard]] inline ExpertStateBytes expert_state_bytes(Count per_layer, Count moe_layers,
                                                         int zero_stage, Count edp,
                                                         Bytes weight_bytes, Bytes gradient_bytes,
                                                         Bytes optimizer_per_param) noexcept {
  const bool zero = zero_stage > 0 && edp > 1;
  const Count shard = zero ? (per_layer + edp - 1) / edp : per_layer;
  const Count full = zero ? shard * edp : per_layer;
  ExpertStateBytes b;
  b.weights = (zero_stage >= 3 ? shard : full) * moe_layers * weight_bytes;
  b.gradients = (zero_stage >= 2 ? shard : full) * moe_layers * gradient_bytes;
  b.optimizer = (zero_stage >= 1 ? shard : full) * moe_layers * optimizer_per_param;
  return b;
}

/// Routed token copies one GPU's experts take per MoE layer and micro-batch. `tokens` enter the
/// layer on each GPU (b·s/tp: Megatron-Core routes sequence-parallel shards); the ep·etp ranks
/// send their tokens · top_k copies to ep expert groups, whose etp ranks each see the whole
/// group's share, so a GPU takes tokens · top_k · etp copies on an even split. `factor` is the
/// capacity factor when one is set (an expert drops what exceeds its capacity), or else the
/// dropless load-imbalance assumption (Assumptions::moe_load_imbalance): the busiest GPU's share
/// over the even one.
[[nodiscard]] inline Count routed_tokens_per_gpu(Count tokens, Count top_k, Count etp,
                                                 double factor) noexcept {
  return static_cast<Count>(std::ceil(static_cast<double>(tokens * top_k * etp) * factor - 1e-9));
}

/// Bytes one MoE layer keeps for its backward per micro-batch on one GPU (Megatron-Core's
/// router.py, token_dispatcher.py, moe_utils.py permute/unpermute, experts.py):
struct MoeLayerActivation {
  Bytes router = 0;       // scores (compute dtype) and the boolean routing map, tokens × E;
                          // without shared experts also its input, tokens × h
  Bytes permutation = 0;  // index maps of the permute on both sides of the all-to-all (int64)
                          // and the expert outputs the combine weights by the router's scores
  Bytes experts = 0;      // expert FFN: input, input-projection output, activation output
  [[nodiscard]] Bytes total() const noexcept { return router + permutation + experts; }
};
/// `tokens` and `routed` as routed_tokens_per_gpu(); `expert_ffn` one expert's width per GPU
/// (expert_ffn_hidden_size / etp); `cb` the compute dtype's bytes. FP8: the expert GEMMs keep
/// their inputs quantised, one byte per element (and the recipe's block scales), as the layer
/// table's linears do (layer_ops.cpp); the activation's input stays in the compute dtype.
[[nodiscard]] inline MoeLayerActivation moe_layer_activation(
    const ModelSpec& m, Count tokens, Count routed, Count expert_ffn, Bytes cb,
    Fp8Recipe fp8 = Fp8Recipe::none) noexcept {
  const Count h = m.hidden_size;
  const Count e = m.moe.num_experts;
  const bool is_gated = gated(m.mlp);
  MoeLayerActivation a;
  a.router = tokens * e * (cb + 1);
  // The router's input (the post-attention norm's output) for its weight gradient: without
  // shared experts no other op keeps it (Megatron-Core's TopKRouter saves it through its linear;
  // with shared experts the shared MLP's input is the same tensor, counted by the layer table).
  if (m.moe.num_shared_experts == 0) a.router += tokens * h * cb;
  constexpr Bytes kIndex = 8;
  a.permutation = tokens * m.moe.top_k * kIndex + routed * kIndex + routed * h * cb;
  const Count act_in = (is_gated ? 2 : 1) * expert_ffn;  // the activation's input
  if (fp8 == Fp8Recipe::none) {
    a.experts = routed * (h + act_in + expert_ffn) * cb;
    return a;
  }
  a.experts = routed * ((h + expert_ffn) + act_in * cb);
  if (fp8 == Fp8Recipe::blockwise || fp8 == Fp8Recipe::mxfp8) {
    const Count block = fp8 == Fp8Recipe::mxfp8 ? 32 : 128;
    const Bytes scale = fp8 == Fp8Recipe::mxfp8 ? 1 : 4;
    a.experts += routed * ((h + block - 1) / block + (expert_ffn + block - 1) / block) * scale;
  }
  return a;
}

/// Bytes one GPU sends in one expert-parallel all-to-all (the dispatch or the combine, forward
/// or backward): its tokens · top_k routed copies of hidden_size elements, of which the share
/// (ep − 1)/ep goes to other ranks (an even split; Lepikhin et al. 2021, GShard, sec. 3.2;
/// Megatron-Core's MoEAlltoAllTokenDispatcher).
[[nodiscard]] inline double ep_all_to_all_bytes(Count tokens, Count top_k, Count hidden,
                                                Bytes dtype_bytes, Count ep) noexcept {
  if (ep <= 1) return 0;
  return static_cast<double>(tokens * top_k * hidden * dtype_bytes) * static_cast<double>(ep - 1) /
         static_cast<double>(ep);
}

/// Whether an ep group's all-to-all stays inside a node: in the expert rank order
/// rank = etp_rank + etp·(ep_rank + ep·(edp_rank + edp·pp_rank)) (docs/layout.md) the group spans
/// etp·ep consecutive ranks, inside one node when that span divides the node.
[[nodiscard]] inline bool ep_group_intra_node(Count ep, Count etp, Count gpus_per_node) noexcept {
  const Count span = ep * etp;
  return span <= gpus_per_node && gpus_per_node % span == 0;
}

/// Whether the expert data-parallel group (the experts' gradient reduction, apart from the
/// dense data-parallel one) stays inside a node: its ranks are etp·ep apart, etp·ep·edp in all.
[[nodiscard]] inline bool edp_group_intra_node(const ExpertLayout& e,
                                               Count gpus_per_node) noexcept {
  const Count span = e.etp * e.ep * e.edp;
  return span <= gpus_per_node && gpus_per_node % span == 0;
}

}  // namespace distplan
