// A Mixture-of-Experts layer as the planner plans it (docs/moe.md, "Plan"): the layer op table
// of everything but the routed experts (attention, norms, shared experts), and the routed part
// per micro-batch on one GPU: its tokens, the routed copies its experts take, their parameters,
// activations, FLOPs and op costs. estimate(), the simulator (through the stage costs) and the
// search's lean path all take their MoE figures from here.
#pragma once

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/moe_memory.h"
#include "distplan/planner/op_costs.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// The layer table of one transformer layer without its routed experts. A dense model:
/// build_layer_table(). A MoE model: the same table whose feed-forward ops stand for the shared
/// experts (one tensor-parallel MLP of num_shared_experts · shared_expert_ffn_hidden_size, the
/// same weights, FLOPs and saved tensors), or that has no feed-forward ops without shared
/// experts; the post-attention norm, dropout and residual stay.
[[nodiscard]] LayerTable planner_layer_table(const ModelSpec& m, const TrainingSpec& t);

/// Parameters per TP rank of one layer's units that ZeRO shards over the dense data-parallel
/// group: layer_parameters_per_tp_rank() of the table for a dense model; for a MoE model
/// everything but the routed experts (moe_layer_dense_params_per_tp_rank: attention, norms,
/// router, shared experts and their gate).
[[nodiscard]] Count planner_layer_params_per_tp_rank(const ModelSpec& m, const LayerTable& table,
                                                     Count tp) noexcept;

/// The routed part of one MoE layer for one micro-batch on one GPU.
struct MoeLayerPlan {
  Count tokens = 0;            // tokens entering the layer on this GPU (b·s/cp, over tp under SP)
  Count routed = 0;            // routed copies its experts take (routed_tokens_per_gpu)
  Count local_experts = 0;     // num_experts / ep
  Count expert_ffn = 0;        // one expert's width on this GPU: expert_ffn_hidden_size / etp
  Count expert_params = 0;     // routed_expert_params_per_gpu: one layer's routed experts here
  Count router_params = 0;     // router weight and expert bias (replicated on the TP ranks)
  Bytes all_to_all_bytes = 0;  // buffer of one dispatch or combine: tokens · top_k · h · dtype
  MoeLayerActivation activation;
  double load_factor = 1;           // capacity_factor, or else Assumptions::moe_load_imbalance
  Fp8Recipe fp8 = Fp8Recipe::none;  // the expert GEMMs in fp8 (training.fp8)
  [[nodiscard]] bool enabled() const noexcept { return local_experts > 0; }
};
/// `local_seq` is seq_length / cp. Megatron-Core routes each TP rank's sequence-parallel shard
/// (validation requires sequence parallelism for MoE with tp > 1, as Megatron-LM's arguments.py
/// does). A dense model gives a plan that is not enabled().
[[nodiscard]] MoeLayerPlan moe_layer_plan(const ModelSpec& m, const Assumptions& a, DType precision,
                                          Count micro_batch, Count local_seq, Count tp, bool sp,
                                          Count ep, Count etp,
                                          Fp8Recipe fp8 = Fp8Recipe::none) noexcept;
[[nodiscard]] MoeLayerPlan moe_layer_plan(const Scenario& s) noexcept;

/// One MoE layer's activations: the dense table's plus the routed part's (moe_layer_activation),
/// which full recomputation rebuilds in the layer's backward (its working set) and every other
/// mode keeps.
[[nodiscard]] LayerActivation add_moe_activation(LayerActivation dense, const MoeLayerPlan& x,
                                                 Recompute recompute) noexcept;

/// Matmul FLOPs of the routed part of one MoE layer for `tokens` tokens (all GPUs together):
/// the router h -> num_experts and top_k expert FFNs per token, 2 FLOPs per multiply-add forward,
/// as much again for each of the backward's input and weight gradients (Narayanan et al. 2021,
/// sec. 5.1). With a capacity factor below 1 only the copies the experts keep are counted.
[[nodiscard]] LayerFlops moe_layer_flops(const ModelSpec& m, Count tokens) noexcept;

/// Op costs of the routed part on one GPU (docs/time.md, "Op costs"; docs/moe.md, "Time"): the
/// router GEMM, its softmax/sigmoid and top-k, the permutation and un-permutation on both sides of
/// the all-to-all, and the experts as grouped GEMMs (local_experts GEMMs of routed / local_experts
/// rows each, whose tile and wave quantisation gemm_efficiency() prices), their activation.
/// Communication is not included (the estimate adds the all-to-alls).
/// FP8 (r.fp8_peak > 0): the grouped GEMMs at the fp8 rate, each input quantised first (read in
/// the compute dtype, written row- and column-wise in fp8, as the table's linears; op_costs.cpp).
[[nodiscard]] PassCosts moe_pass_costs(const ModelSpec& m, const MoeLayerPlan& x,
                                       const DeviceRates& r) noexcept;

/// Linear weight parameters of one MoE layer's routed experts on one GPU (their GEMMs' weights,
/// biases left out): x.local_experts experts of (in + out)·h / etp.
[[nodiscard]] Count moe_expert_weight_params(const ModelSpec& m, const MoeLayerPlan& x) noexcept;

/// FP8 state of one layer on one GPU (fp8.h): a MoE layer's table (attention, shared experts)
/// and its routed experts' weight caches and scales; a dense model's layer as fp8.h has it.
[[nodiscard]] Bytes fp8_moe_layer_state_bytes(const ModelSpec& m, const LayerTable& table,
                                              const MoeLayerPlan& x, Count tp, Fp8Recipe r,
                                              const Assumptions& a) noexcept;

}  // namespace distplan
