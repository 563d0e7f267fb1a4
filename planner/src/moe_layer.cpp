// A MoE layer as the planner plans it (moe_layer.h; docs/moe.md, "Plan").
#include "distplan/planner/moe_layer.h"

#include <algorithm>

#include "distplan/planner/fp8.h"

namespace distplan {

namespace {

bool is_routed_mlp_op(const LayerOp& op) noexcept {
  return op.name == "mlp_in" || op.name == "mlp_out" || op.kind == OpKind::activation;
}

}  // namespace

LayerTable planner_layer_table(const ModelSpec& m, const TrainingSpec& t) {
  if (!m.moe.enabled()) return build_layer_table(m, t);
  ModelSpec x = m;
  const MoeSpec& e = m.moe;
  if (e.num_shared_experts > 0) {
    // The shared experts run on every token as one tensor-parallel MLP (Megatron-Core's
    // SharedExpertMLP: num_shared_experts · shared width in one FFN; DeepSeekMoE, Dai et al. 2024,
    // sec. 3.2). Its weights, FLOPs and saved tensors are the table's feed-forward ops.
    x.ffn_hidden_size = e.num_shared_experts * e.shared_expert_ffn_hidden_size;
    return build_layer_table(x, t);
  }
  const LayerTable full = build_layer_table(x, t);
  LayerTable out;
  for (const LayerOp& op : full) {
    if (!is_routed_mlp_op(op)) out.ops[static_cast<std::size_t>(out.num_ops++)] = op;
  }
  return out;
}

Count planner_layer_params_per_tp_rank(const ModelSpec& m, const LayerTable& table,
                                       Count tp) noexcept {
  return m.moe.enabled() ? moe_layer_dense_params_per_tp_rank(m, tp)
                         : layer_parameters_per_tp_rank(table, tp);
}

MoeLayerPlan moe_layer_plan(const ModelSpec& m, const Assumptions& a, DType precision,
                            Count micro_batch, Count local_seq, Count tp, bool sp, Count ep,
                            Count etp, Fp8Recipe fp8) noexcept {
  MoeLayerPlan x;
  const MoeSpec& e = m.moe;
  if (!e.enabled() || ep < 1 || etp < 1) return x;
  const Bytes cb = bytes_of(precision);
  x.tokens = micro_batch * local_seq / (sp && tp > 1 ? tp : 1);
  x.load_factor = e.capacity_factor ? *e.capacity_factor : a.moe_load_imbalance;
  x.routed = routed_tokens_per_gpu(x.tokens, e.top_k, etp, x.load_factor);
  x.local_experts = e.num_experts / ep;
  x.expert_ffn = e.expert_ffn_hidden_size / etp;
  x.expert_params = routed_expert_params_per_gpu(m, ep, etp);
  x.router_params = e.num_experts * m.hidden_size + (e.router_bias ? e.num_experts : 0);
  x.all_to_all_bytes = x.tokens * e.top_k * m.hidden_size * cb;
  x.fp8 = fp8;
  x.activation = moe_layer_activation(m, x.tokens, x.routed, x.expert_ffn, cb, fp8);
  return x;
}

MoeLayerPlan moe_layer_plan(const Scenario& s) noexcept {
  const ParallelSpec& p = s.parallel;
  return moe_layer_plan(s.model, s.assumptions, s.training.precision, s.training.micro_batch_size,
                        s.local_seq_length(), p.tp, p.sequence_parallel, p.ep, p.etp,
                        s.training.fp8);
}

LayerActivation add_moe_activation(LayerActivation dense, const MoeLayerPlan& x,
                                   Recompute recompute) noexcept {
  if (!x.enabled()) return dense;
  const Bytes routed = x.activation.total();
  if (recompute == Recompute::full) {
    dense.working += routed;  // the layer input is kept; the replay rebuilds the rest
  } else {
    dense.kept += routed;
  }
  // The experts' input-projection output, the largest tensor the routed part saves.
  dense.largest_elements = std::max(dense.largest_elements, x.routed * 2 * x.expert_ffn);
  return dense;
}

LayerFlops moe_layer_flops(const ModelSpec& m, Count tokens) noexcept {
  LayerFlops f;
  const MoeSpec& e = m.moe;
  if (!e.enabled()) return f;
  const double h = static_cast<double>(m.hidden_size);
  const double fe = static_cast<double>(e.expert_ffn_hidden_size);
  const double in_out = (gated(m.mlp) ? 2.0 : 1.0) * fe;
  // With a capacity factor c < 1 the experts take c of the routed copies and drop the rest
  // (docs/moe.md, "FLOPs of dropped tokens"): model FLOPs count the copies computed, as the
  // step time does, so MFU stays the utilisation of the work done. c >= 1 (and dropless)
  // computes every copy; padding up to the capacity is not model work.
  const double computed = e.capacity_factor ? std::min(1.0, *e.capacity_factor) : 1.0;
  const double per_token = 2.0 * h * static_cast<double>(e.num_experts) +
                           computed * static_cast<double>(e.top_k) * 2.0 * h * (in_out + fe);
  f.forward = static_cast<double>(tokens) * per_token;
  f.backward_input = f.forward;
  f.backward_weight = f.forward;
  return f;
}

PassCosts moe_pass_costs(const ModelSpec& m, const MoeLayerPlan& x, const DeviceRates& r) noexcept {
  PassCosts c;
  if (!x.enabled()) return c;
  const double e = static_cast<double>(r.element_bytes);
  const double h = static_cast<double>(m.hidden_size);
  const double E = static_cast<double>(m.moe.num_experts);
  const double T = static_cast<double>(x.tokens);
  const double P = T * static_cast<double>(m.moe.top_k);  // copies this GPU sends
  const double R = static_cast<double>(x.routed);         // copies its experts take
  // Router: logits = x W_r^T (h -> E), then softmax or sigmoid and top-k over fp32 scores
  // (Megatron-Core router.py), read and written once each way.
  c.forward += gemm_seconds(r, T, E, h) + memory_seconds(r, T * E * 2 * 4, 2);
  c.backward_input += gemm_seconds(r, T, h, E) + memory_seconds(r, T * E * 3 * 4, 2);
  c.backward_weight += gemm_seconds(r, E, h, T);
  // Permutation (moe_utils.py permute/unpermute): before the dispatch read T and write P rows,
  // after it sort R rows by expert; the combine mirrors both and sums the top_k copies per token.
  // The backward runs the same data movement in reverse.
  const double permute = e * h * (2 * (T + P) + 4 * R);
  c.forward += memory_seconds(r, permute, 4);
  c.backward_input += memory_seconds(r, permute, 4);
  // Experts as a grouped GEMM (Megatron-Core's GroupedMLP / TEGroupedMLP): local_experts GEMMs
  // of R / local_experts rows each.
  const double n_exp = static_cast<double>(x.local_experts);
  const double M = R / n_exp;
  const double f = static_cast<double>(x.expert_ffn);
  const double in_out = (gated(m.mlp) ? 2.0 : 1.0) * f;
  // A grouped GEMM (CUTLASS / cuBLAS grouped kernels) runs its per-expert problems below a dense
  // GEMM of the same tiles (per-group scheduling and prologues): `grouped_gemm_efficiency`.
  // FP8 experts run their GEMMs at the fp8 rate.
  const bool fp8 = r.fp8_peak > 0;
  const double g = 1.0 / r.grouped_gemm_efficiency;
  auto grouped = [&](double a, double b, double k) {
    return g * gemm_seconds(r, a, b, k, n_exp, fp8);
  };
  c.forward += grouped(M, in_out, h) + grouped(M, h, f);
  c.backward_input += grouped(M, h, in_out) + grouped(M, f, h);
  c.backward_weight += grouped(in_out, h, M) + grouped(h, f, M);
  if (fp8) {
    // Quantisation of each GEMM's input (forward: x and the activation output; backward: the
    // output gradients of both), read in the compute dtype, written in both fp8 layouts.
    c.forward += memory_seconds(r, R * (h + f) * (e + 2), 2);
    c.backward_input += memory_seconds(r, R * (h + in_out) * (e + 2), 2);
  }
  // The activation between the projections: read in_out, write f; backward reads both and the
  // output gradient, writes the input gradient.
  c.forward += memory_seconds(r, R * (in_out + f) * e, 1);
  c.backward_input += memory_seconds(r, R * (2 * in_out + f) * e, 1);
  return c;
}

Count moe_expert_weight_params(const ModelSpec& m, const MoeLayerPlan& x) noexcept {
  if (!x.enabled()) return 0;
  const Count in = (gated(m.mlp) ? 2 : 1) * x.expert_ffn;
  return x.local_experts * (in + x.expert_ffn) * m.hidden_size;
}

Bytes fp8_moe_layer_state_bytes(const ModelSpec& m, const LayerTable& table, const MoeLayerPlan& x,
                                Count tp, Fp8Recipe r, const Assumptions& a) noexcept {
  Bytes b = fp8_layer_state_bytes(table, tp, r, a);
  if (x.enabled())
    b += fp8_weight_state_bytes(moe_expert_weight_params(m, x), 2 * x.local_experts, r, a);
  return b;
}

}  // namespace distplan
