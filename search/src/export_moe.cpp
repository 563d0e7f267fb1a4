// Megatron-LM arguments of a Mixture-of-Experts model and its expert layout (export.h,
// docs/exports.md "Mixture-of-Experts"). Names and choices: Megatron-LM core_v0.15.3
// megatron/training/arguments.py (_add_moe_args, _add_distributed_args).
#include <fmt/format.h>

#include "distplan/planner/moe.h"
#include "distplan/search/export.h"

namespace distplan::search {

void megatron_moe_args(const Scenario& s, std::vector<std::string>& args,
                       std::vector<std::string>& notes) {
  const ModelSpec& m = s.model;
  const MoeSpec& e = m.moe;
  if (!e.enabled()) return;
  auto arg = [&](std::string_view flag, auto value) {
    args.push_back(fmt::format("{} {}", flag, value));
  };
  arg("--num-experts", e.num_experts);
  arg("--moe-router-topk", e.top_k);
  arg("--moe-ffn-hidden-size", e.expert_ffn_hidden_size);
  // Megatron-LM's shared experts are one MLP whose width is the sum of theirs.
  if (e.num_shared_experts > 0) {
    arg("--moe-shared-expert-intermediate-size",
        e.num_shared_experts * e.shared_expert_ffn_hidden_size);
    if (e.shared_expert_gate) {
      notes.push_back(
          "the shared experts' sigmoid gate (Qwen2-MoE) has no Megatron-LM core_v0.15.3 argument");
    }
  }
  // Which layers are MoE layers: an integer frequency counts from layer 0 (layer i is a MoE
  // layer when i % k == 0); leading dense layers and explicit lists need the list, which the
  // argument parser evaluates as a Python expression.
  if (e.first_dense_layers == 0 && e.layers.empty()) {
    arg("--moe-layer-freq", e.layer_frequency);
  } else {
    std::string pattern = "[";
    for (Count i = 0; i < m.num_layers; ++i)
      pattern += fmt::format("{}{}", i > 0 ? "," : "", is_moe_layer(m, i) ? 1 : 0);
    arg("--moe-layer-freq", pattern + "]");
  }
  arg("--moe-router-score-function", e.router == Router::sigmoid ? "sigmoid" : "softmax");
  // The load-balancing loss as the model was trained (Megatron-LM's default is 0.0, which would
  // drop it).
  arg("--moe-aux-loss-coeff", e.aux_loss_coeff);
  // The plan times a rank's experts as grouped GEMMs (docs/moe.md, "Plan"): TE's GroupedLinear.
  args.emplace_back("--moe-grouped-gemm");
  if (e.router_bias) args.emplace_back("--moe-router-enable-expert-bias");
  if (e.capacity_factor) arg("--moe-expert-capacity-factor", *e.capacity_factor);
  // The all-to-all dispatcher is the one distplan's communication terms describe.
  arg("--moe-token-dispatcher-type", "alltoall");
  arg("--expert-model-parallel-size", s.parallel.ep);
  arg("--expert-tensor-parallel-size", s.parallel.etp);
}

}  // namespace distplan::search
