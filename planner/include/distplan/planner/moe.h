// Parameter counts of Mixture-of-Experts and multi-head latent attention models (docs/moe.md):
// which layers are MoE layers, the parameters of the whole model, of what one token activates,
// and of the multi-token prediction modules, counted apart from the main model.
#pragma once

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// Whether layer `i` (from 0) of the main model is a MoE layer (MoeSpec's placement rule).
[[nodiscard]] bool is_moe_layer(const ModelSpec& m, Count i) noexcept;
/// MoE layers among the layers [first, end) (indices >= num_layers: the MTP modules' layers).
[[nodiscard]] Count moe_layers_in(const ModelSpec& m, Count first, Count end) noexcept;
/// MoE layers among the main model's num_layers.
[[nodiscard]] Count moe_layer_count(const ModelSpec& m) noexcept;

/// Parameters of one layer's attention block: projections, their biases and q/k norms (not the
/// layer's input norm). Grouped-query attention, or MLA when model.mla is enabled.
[[nodiscard]] Count attention_parameters(const ModelSpec& m) noexcept;
/// Parameters of one feed-forward network of width f in the model's MLP kind (with biases when
/// model.bias is set).
[[nodiscard]] Count mlp_parameters(const ModelSpec& m, Count f) noexcept;
/// Parameters of one MoE layer's feed-forward block: the router (and its bias), the routed
/// experts (all of them, or top_k when `active`), the shared experts and their gate.
[[nodiscard]] Count moe_block_parameters(const ModelSpec& m, bool active) noexcept;

struct ParameterCount {
  Count total = 0;   // main model: embeddings, all layers, final norm, LM head
  Count active = 0;  // what one token's forward pass uses (top_k routed experts per MoE layer)
  // The same without the input embedding (token and learned position tables, embedding norm):
  // the parameters whose GEMMs a token runs, the LM head included (the convention of OpenAI's
  // gpt-oss figures and of the 6N FLOPs rule).
  Count active_non_embedding = 0;
  Count mtp = 0;  // multi-token prediction modules, beyond the shared embedding and head
};
/// The model's parameters (unpadded vocabulary). For a dense model total = active and equals
/// model_parameters() of layout.h.
[[nodiscard]] ParameterCount count_parameters(const ModelSpec& m) noexcept;

/// Training FLOPs per token of the main model (forward and backward, 3x the forward), in the
/// convention of Zhao et al. 2025 (DeepSeek-AI, "Insights into DeepSeek-V3", ISCA 2025, Table 2):
/// 2 FLOPs per multiply-add of every active parameter but the input embedding (router, shared
/// and top_k routed experts, MLA projections, LM head), plus causal attention, whose queries see
/// on average seq_length / 2 keys: 2 a (d_qk + d_v) s/2 per token per layer forward. (The layer
/// op table counts attention over all s keys, Narayanan et al. 2021; docs/moe.md.)
[[nodiscard]] double training_flops_per_token(const ModelSpec& m, Count seq_length) noexcept;

}  // namespace distplan
