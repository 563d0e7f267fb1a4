// Parameter counts of MoE and MLA models (docs/moe.md). Every dense piece (norms, grouped-query
// attention, an FFN of a given width) is read from the layer op table, so a dense model's count
// here is the table's; only the router, the expert multiplicities and MLA's projections are
// written here. Sources: Hugging Face transformers modeling_mixtral.py (MixtralSparseMoeBlock),
// modeling_qwen2_moe.py (shared_expert, shared_expert_gate), modeling_qwen3_moe.py,
// modeling_deepseek_v3.py (DeepseekV3TopkRouter's e_score_correction_bias). MLA's projections are
// the layer table's (DeepseekV3Attention; DeepSeek-AI 2024, "DeepSeek-V2", sec. 2.1).
#include "distplan/planner/moe.h"

#include <algorithm>
#include <string_view>

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"

namespace distplan {
namespace {

Count table_params(const LayerTable& table, std::initializer_list<std::string_view> names) {
  Count n = 0;
  for (const LayerOp& op : table) {
    for (std::string_view name : names) {
      if (op.name == name) n += op.weight_params + op.bias_params;
    }
  }
  return n;
}

}  // namespace

bool is_moe_layer(const ModelSpec& m, Count i) noexcept {
  const MoeSpec& e = m.moe;
  if (!e.enabled()) return false;
  if (!e.layers.empty()) return std::binary_search(e.layers.begin(), e.layers.end(), i);
  if (i < e.first_dense_layers) return false;
  return (i - e.first_dense_layers) % e.layer_frequency == 0;
}

Count moe_layers_in(const ModelSpec& m, Count first, Count end) noexcept {
  const MoeSpec& e = m.moe;
  if (!e.enabled() || end <= first) return 0;
  if (!e.layers.empty()) {
    return static_cast<Count>(std::lower_bound(e.layers.begin(), e.layers.end(), end) -
                              std::lower_bound(e.layers.begin(), e.layers.end(), first));
  }
  // MoE layers among [0, n): ceil((n - first_dense) / frequency) when n > first_dense.
  auto below = [&](Count n) {
    return n <= e.first_dense_layers
               ? Count{0}
               : (n - e.first_dense_layers + e.layer_frequency - 1) / e.layer_frequency;
  };
  return below(end) - below(first);
}

Count moe_layer_count(const ModelSpec& m) noexcept {
  return moe_layers_in(m, 0, m.num_layers);
}

Count attention_parameters(const ModelSpec& m) noexcept {
  // MLA's projections and latent norms are the table's too (layer_ops.cpp, add_mla_projections).
  return table_params(build_layer_table(m, TrainingSpec{}),
                      {"qkv", "q_down", "q_norm", "q_up", "q_proj", "kv_down", "kv_norm", "kv_up",
                       "attention", "attention_out"});
}

Count mlp_parameters(const ModelSpec& m, Count f) noexcept {
  ModelSpec x = m;
  x.ffn_hidden_size = f;
  return table_params(build_layer_table(x, TrainingSpec{}), {"mlp_in", "mlp_out"});
}

Count moe_block_parameters(const ModelSpec& m, bool active) noexcept {
  const MoeSpec& e = m.moe;
  if (!e.enabled()) return 0;
  const Count h = m.hidden_size;
  Count n = e.num_experts * h;  // router: one score per expert, no bias
  if (e.router_bias) n += e.num_experts;
  n += (active ? e.top_k : e.num_experts) * mlp_parameters(m, e.expert_ffn_hidden_size);
  n += e.num_shared_experts * mlp_parameters(m, e.shared_expert_ffn_hidden_size);
  if (e.shared_expert_gate) n += h;
  return n;
}

ParameterCount count_parameters(const ModelSpec& m) noexcept {
  const Count h = m.hidden_size;
  const LayerTable table = build_layer_table(m, TrainingSpec{});
  const Count norms = table_params(
      table, {"input_norm", "post_attention_norm", "attention_out_norm", "mlp_out_norm"});
  const Count attention = attention_parameters(m);
  const Count dense_layer = norms + attention + mlp_parameters(m, m.ffn_hidden_size);
  const Count moe_total = norms + attention + moe_block_parameters(m, false);
  const Count moe_active = norms + attention + moe_block_parameters(m, true);
  const Count moe_layers = moe_layer_count(m);
  const Count dense_layers = m.num_layers - moe_layers;

  Count outer = m.vocab_size * h;  // token embedding
  outer += m.embedding_extra_parameters();
  const Count final_norm = m.norm_parameters();
  outer += final_norm;
  if (!m.tied_embeddings) outer += m.vocab_size * h;  // LM head

  ParameterCount c;
  c.total = outer + dense_layers * dense_layer + moe_layers * moe_total;
  c.active = outer + dense_layers * dense_layer + moe_layers * moe_active;
  c.active_non_embedding = c.active - m.vocab_size * h - m.embedding_extra_parameters();
  // A DeepSeek-V3 MTP module (DeepSeek-V3 report, sec. 2.2; README_WEIGHTS.md): RMSNorms of the
  // hidden state and of the next token's embedding, the projection of their concatenation
  // (2h -> h), one transformer layer placed by the main model's rule, and the output head's norm;
  // the embedding and output head are shared with the main model. MTP module k has layer id
  // num_layers + k (README_WEIGHTS.md, "Loading Rules").
  for (Count k = 0; k < m.mtp_layers; ++k) {
    const Count layer = is_moe_layer(m, m.num_layers + k) ? moe_total : dense_layer;
    c.mtp += 2 * final_norm + 2 * h * h + layer + final_norm;
  }
  return c;
}

double training_flops_per_token(const ModelSpec& m, Count seq_length) noexcept {
  Count input_embedding = m.vocab_size * m.hidden_size;
  if (m.position_embedding == PositionEmbedding::learned)
    input_embedding += m.max_position_embeddings * m.hidden_size;
  // Tied embeddings count the word table once among the parameters, but the LM head's matmul
  // runs all the same (issue 29, item 9: it was dropped with the table).
  const Count tied_head = m.tied_embeddings ? m.vocab_size * m.hidden_size : 0;
  const double matmul_params =
      static_cast<double>(count_parameters(m).active - input_embedding + tied_head);
  const double d_qk = static_cast<double>(
      m.mla.enabled() ? m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim : m.head_dim());
  const double d_v = static_cast<double>(m.mla.enabled() ? m.mla.v_head_dim : m.head_dim());
  const double heads = static_cast<double>(m.num_attention_heads);
  const double attention_forward =
      2.0 * heads * (d_qk + d_v) * static_cast<double>(seq_length) / 2.0;
  // Windowed layers compute their share of the causal pairs (layer_ops.h).
  double layers = 0;
  const double windowed = attention_keys_fraction(m.attention_window, seq_length);
  for (Count i = 0; i < m.num_layers; ++i) layers += is_windowed_layer(m, i) ? windowed : 1.0;
  return 3.0 * (2.0 * matmul_params + layers * attention_forward);
}

}  // namespace distplan
