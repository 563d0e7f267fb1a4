// Routed-expert parameters per GPU (moe_memory.h, docs/moe.md "Memory"): one expert is an FFN of
// the model's MLP kind, read from the layer op table like every dense piece (moe.cpp).
#include "distplan/planner/moe_memory.h"

#include "distplan/planner/layer_ops.h"

namespace distplan {

Count routed_expert_params_per_gpu(const ModelSpec& m, Count ep, Count etp) noexcept {
  if (!m.moe.enabled() || ep < 1 || etp < 1) return 0;
  ModelSpec x = m;
  x.ffn_hidden_size = m.moe.expert_ffn_hidden_size;
  Count per_expert = 0;
  for (const LayerOp& op : build_layer_table(x, TrainingSpec{})) {
    // Column-parallel input projection: weight and bias split; row-parallel output projection:
    // weight split, bias replicated (added once after the reduction).
    if (op.name == "mlp_in") per_expert += (op.weight_params + op.bias_params) / etp;
    if (op.name == "mlp_out") per_expert += op.weight_params / etp + op.bias_params;
  }
  return m.moe.num_experts / ep * per_expert;
}

Count moe_layer_dense_params_per_tp_rank(const ModelSpec& m, Count tp) noexcept {
  if (!m.moe.enabled() || tp < 1) return 0;
  const MoeSpec& e = m.moe;
  auto per_rank = [tp](const LayerOp& op) {
    return (op.param_shard == TpShard::tp ? op.weight_params / tp : op.weight_params) +
           (op.bias_shard == TpShard::tp ? op.bias_params / tp : op.bias_params);
  };
  auto is_mlp = [](const LayerOp& op) { return op.name == "mlp_in" || op.name == "mlp_out"; };
  Count n = 0;
  for (const LayerOp& op : build_layer_table(m, TrainingSpec{}))
    if (!is_mlp(op)) n += per_rank(op);
  n += e.num_experts * m.hidden_size + (e.router_bias ? e.num_experts : 0);
  if (e.num_shared_experts > 0) {
    ModelSpec x = m;
    x.ffn_hidden_size = e.shared_expert_ffn_hidden_size;
    Count shared = 0;
    for (const LayerOp& op : build_layer_table(x, TrainingSpec{}))
      if (is_mlp(op)) shared += per_rank(op);
    n += e.num_shared_experts * shared;
    if (e.shared_expert_gate) n += m.hidden_size;
  }
  return n;
}

}  // namespace distplan
