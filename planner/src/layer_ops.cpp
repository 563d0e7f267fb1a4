// The layer op table (docs/layer_ops.md). Activation entries reproduce Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models", sec. 4.1 and Table 2:
// attention 11sbh + 5as^2b, MLP 19sbh, two norms 4sbh => sbh(34 + 5as/h) for a GPT layer with
// dropout, standard attention and 16-bit activations.
#include "distplan/planner/layer_ops.h"

#include <algorithm>
#include <cmath>

#include "distplan/planner/check.h"
#include "distplan/planner/selective_op.h"

namespace distplan {
namespace {

struct Builder {
  LayerTable& table;
  LayerOp& add(OpKind kind, std::string_view name) {
    DISTPLAN_CHECK(table.num_ops < kMaxLayerOps, "layer table full");
    LayerOp& op = table.ops[table.num_ops++];
    op.kind = kind;
    op.name = name;
    return op;
  }
  static void save(LayerOp& op, SavedTensor t) {
    DISTPLAN_CHECK(op.num_saved < kMaxSavedPerOp, "too many saved tensors");
    op.saved[op.num_saved++] = t;
  }
};

// A GEMM y = x W^T (+ b) with W of shape (out, in): 2*in*out FLOPs per token forward, the same
// again for dX = dY W and for dW = dY^T X (Narayanan et al. 2021, sec. 5.1).
LayerOp& add_linear(Builder& b, std::string_view name, LinearKind kind, Count in, Count out,
                    bool bias, Bytes act_bytes, TpShard input_shard,
                    Fp8Recipe fp8 = Fp8Recipe::none) {
  LayerOp& op = b.add(OpKind::linear, name);
  op.linear = kind;
  op.in_features = in;
  op.out_features = out;
  op.weight_params = in * out;
  op.bias_params = bias ? out : 0;
  op.param_shard = TpShard::tp;
  // Column-parallel biases split with the output; row-parallel biases are added after the
  // reduction and stay replicated (Shoeybi et al. 2019, Fig. 3).
  op.bias_shard = kind == LinearKind::column_parallel ? TpShard::tp : TpShard::replicated;
  op.forward_flops_per_token = 2.0 * static_cast<double>(in) * static_cast<double>(out);
  op.backward_input_factor = 1.0;
  op.backward_weight_factor = 1.0;
  Builder::save(
      op, {.name = "input", .per_token = in, .bytes_per_element = act_bytes, .shard = input_shard});
  // Block-scaled fp8 inputs keep their scales: one fp32 per 1x128 tile (blockwise, DeepSeek-V3
  // sec. 3.3.1) or one E8M0 byte per 1x32 block (MXFP8, OCP Microscaling spec v1.0).
  if (fp8 == Fp8Recipe::blockwise || fp8 == Fp8Recipe::mxfp8) {
    const bool mx = fp8 == Fp8Recipe::mxfp8;
    const Count block = mx ? 32 : 128;
    Builder::save(op, {.name = "input_scales",
                       .per_token = (in + block - 1) / block,
                       .bytes_per_element = mx ? 1 : 4,
                       .shard = input_shard});
  }
  return op;
}

// A norm over `width` features (the hidden size unless stated: MLA's latent norms).
LayerOp& add_norm(Builder& b, std::string_view name, const ModelSpec& m, Bytes act_bytes,
                  Count width = 0) {
  if (width == 0) width = m.hidden_size;
  LayerOp& op = b.add(OpKind::norm, name);
  op.in_features = op.out_features = width;
  op.weight_params = width;
  op.bias_params = m.norm == Norm::layernorm ? width : 0;
  op.param_shard = TpShard::replicated;
  op.bias_shard = TpShard::replicated;
  // The input only: mean and rstd are recomputed from it in backward (they are O(sb) fp32 values,
  // which Korthikanti et al. also leave out).
  Builder::save(
      op,
      {.name = "input", .per_token = width, .bytes_per_element = act_bytes, .shard = TpShard::sp});
  return op;
}

void add_dropout(Builder& b, std::string_view name, const ModelSpec& m) {
  LayerOp& op = b.add(OpKind::dropout, name);
  // A one-byte mask per element, in the sequence-parallel region.
  Builder::save(
      op,
      {.name = "mask", .per_token = m.hidden_size, .bytes_per_element = 1, .shard = TpShard::sp});
}

// Multi-head latent attention's projections (DeepSeek-AI 2024, "DeepSeek-V2", eqs. 9-18), as
// Megatron-Core builds them (megatron/core/transformer/multi_latent_attention.py with the
// Transformer Engine spec): the down-projections linear_q_down_proj (h -> q_lora_rank) and
// linear_kv_down_proj (h -> kv_lora_rank + qk_rope_head_dim) are duplicated TELinears, whole on
// every TP rank and run on the rank's sequence shard; the latents are normed (q_layernorm,
// kv_layernorm, fused into the up-projections' TELayerNormColumnParallelLinear, which gathers the
// normed latent under sequence parallelism) and projected up column-parallel, linear_q_up_proj to
// the a heads' queries (d_qk each) and linear_kv_up_proj to their keys without rotary part and
// values (qk_nope + v each); the shared rotary key part is gathered beside them. Without a query
// rank (DeepSeek-V2-Lite) the queries come straight from h (linear_q_proj, column-parallel).
// Saved for backward: the layer input's norm output once (both down-projections read the same
// tensor; in FP8 each keeps its own quantised copy), each latent's norm input and output. The
// core then saves q, k, v as the attention sees them.
void add_mla_projections(Builder& b, const ModelSpec& m, Bytes act, Bytes lin, Fp8Recipe fp8) {
  const MlaSpec& x = m.mla;
  const Count h = m.hidden_size;
  const Count a = m.num_attention_heads;
  const bool bias = m.bias;
  auto duplicated = [&](std::string_view name, Count out, Bytes saved) {
    LayerOp& op =
        add_linear(b, name, LinearKind::duplicated, h, out, bias, saved, TpShard::sp, fp8);
    op.param_shard = op.bias_shard = TpShard::replicated;
    return &op;
  };
  if (x.q_lora_rank > 0) {
    duplicated("q_down", x.q_lora_rank, lin);
    add_norm(b, "q_norm", m, act, x.q_lora_rank);
    add_linear(b, "q_up", LinearKind::column_parallel, x.q_lora_rank, a * m.attention_qk_head_dim(),
               bias, lin, TpShard::sp, fp8);
  } else {
    add_linear(b, "q_proj", LinearKind::column_parallel, h, a * m.attention_qk_head_dim(), bias,
               lin, TpShard::sp, fp8);
  }
  // The kv down-projection reads the tensor the query projection saved: only an FP8 copy is new.
  LayerOp* kv_down = duplicated("kv_down", x.kv_lora_rank + x.qk_rope_head_dim, lin);
  if (fp8 == Fp8Recipe::none) kv_down->num_saved = 0;
  add_norm(b, "kv_norm", m, act, x.kv_lora_rank);
  add_linear(b, "kv_up", LinearKind::column_parallel, x.kv_lora_rank,
             a * (x.qk_nope_head_dim + x.v_head_dim), bias, lin, TpShard::sp, fp8);
}

}  // namespace

LayerTable build_layer_table(const ModelSpec& m, const TrainingSpec& t) {
  LayerTable table;
  Builder b{table};
  const Bytes act = bytes_of(t.precision);
  const bool dropout = t.dropout > 0.0;
  const Count h = m.hidden_size;
  const Count kvh = m.kv_hidden();
  const Count qh = m.q_hidden();  // a * head_dim: h unless head_dim is explicit (Qwen3)
  const Count f = m.ffn_hidden_size;
  const Count a = m.num_attention_heads;

  add_norm(b, "input_norm", m, act);
  // Qwen2's attention has biases on q, k and v only (Hugging Face Qwen2Attention:
  // q_proj/k_proj/v_proj bias=True, o_proj bias=False).
  // FP8: each linear saves its input quantised, one byte per element, for the weight gradient
  // (Transformer Engine module/linear.py and layernorm_linear.py keep the fp8 input; DeepSeek-V3,
  // sec. 3.3.2, caches the Linear inputs in FP8). The attention output stays saved in bf16 for
  // flash attention's backward as well, so attention_out adds its fp8 copy to it.
  const Fp8Recipe fp8 = t.fp8;
  const Bytes lin = fp8 != Fp8Recipe::none ? 1 : act;
  const Bytes attn_out = fp8 != Fp8Recipe::none ? act + 1 : act;
  if (m.mla.enabled()) {
    add_mla_projections(b, m, act, lin, fp8);
  } else {
    add_linear(b, "qkv", LinearKind::column_parallel, h, qh + 2 * kvh, m.bias || m.qkv_bias, lin,
               TpShard::sp, fp8);
  }

  LayerOp& attn = b.add(OpKind::attention_core, "attention");
  // QK^T and (softmax)V: 2*h FLOPs each per query token per key (all heads), forward; backward
  // computes two GEMMs per forward GEMM and has no weights (Narayanan et al. 2021, eq. 1).
  // MLA: QK^T over d_qk, (softmax)V over d_v, every head (Model::attention_*).
  attn.forward_flops_per_token_per_key =
      2.0 * static_cast<double>(m.attention_q_width() + m.attention_out_width());
  attn.backward_input_factor = 2.0;
  attn.backward_weight_factor = 0.0;
  if (m.attention_sinks) {
    // gpt-oss's sinks (HF GptOssAttention.sinks): one learned logit per head, split with the
    // heads by tensor parallelism (held in the op's second parameter slot, beside the q/k norm
    // weights); the softmax's log-sum-exp (kept below) already includes it.
    attn.bias_params = a;
    attn.bias_shard = TpShard::tp;
  }
  if (m.qk_norm) {
    // Qwen3's q_norm and k_norm (HF Qwen3Attention): an RMSNorm weight of head_dim each, shared by
    // all heads and so whole on every TP rank; each keeps its input (the projected q and k).
    attn.weight_params = 2 * m.head_dim();
    attn.param_shard = TpShard::replicated;
    Builder::save(
        attn,
        {.name = "q_norm_input", .per_token = qh, .bytes_per_element = act, .shard = TpShard::tp});
    Builder::save(
        attn,
        {.name = "k_norm_input", .per_token = kvh, .bytes_per_element = act, .shard = TpShard::tp});
  }
  Builder::save(attn, {.name = "q",
                       .per_token = m.attention_q_width(),
                       .bytes_per_element = act,
                       .shard = TpShard::tp});
  // Keys and values as the score and context GEMMs see them. Flash attention reads the kv heads
  // directly; unfused attention first expands them to all a heads and its batched GEMMs save the
  // expanded copies (Megatron-LM megatron/core/transformer/dot_product_attention.py repeats the
  // query groups before baddbmm/bmm; Hugging Face transformers' repeat_kv in
  // models/llama/modeling_llama.py eager_attention_forward), so under GQA the standard core saves
  // what MHA saves.
  const bool expanded = t.attention == Attention::standard;
  const Count k_saved = expanded ? a * m.attention_qk_head_dim() : m.attention_k_width();
  const Count v_saved = expanded ? a * m.attention_v_head_dim() : m.attention_v_width();
  Builder::save(
      attn, {.name = "k", .per_token = k_saved, .bytes_per_element = act, .shard = TpShard::tp});
  Builder::save(
      attn, {.name = "v", .per_token = v_saved, .bytes_per_element = act, .shard = TpShard::tp});
  if (t.attention == Attention::standard) {
    // Softmax output (a s x s per sequence), and with dropout its mask and dropped output.
    Builder::save(attn, {.name = "probs",
                         .per_token_per_key = a,
                         .bytes_per_element = act,
                         .shard = TpShard::tp,
                         .dropped_by_selective = true});
    if (dropout) {
      Builder::save(attn, {.name = "dropout_mask",
                           .per_token_per_key = a,
                           .bytes_per_element = 1,
                           .shard = TpShard::tp,
                           .dropped_by_selective = true});
      Builder::save(attn, {.name = "dropout_out",
                           .per_token_per_key = a,
                           .bytes_per_element = act,
                           .shard = TpShard::tp,
                           .dropped_by_selective = true});
    }
  } else {
    // Flash attention keeps the fp32 log-sum-exp per head per token and recomputes the scores
    // (Dao et al. 2022, Algorithm 2); its output is the saved input of attention_out.
    Builder::save(
        attn, {.name = "logsumexp", .per_token = a, .bytes_per_element = 4, .shard = TpShard::tp});
  }

  add_linear(b, "attention_out", LinearKind::row_parallel, m.attention_out_width(), h, m.bias,
             attn_out, TpShard::tp, fp8);
  // Gemma 2/3's norm of the attention output before the residual add (post_attention_layernorm
  // in transformers modeling_gemma2.py; its pre_feedforward_layernorm is the next norm here).
  if (m.sandwich_norm) add_norm(b, "attention_out_norm", m, act);
  if (dropout) add_dropout(b, "attention_dropout", m);
  b.add(OpKind::residual_add, "attention_residual");

  add_norm(b, "post_attention_norm", m, act);
  const Count mlp_in_out = gated(m.mlp) ? 2 * f : f;  // gate and up fused when gated
  add_linear(b, "mlp_in", LinearKind::column_parallel, h, mlp_in_out, m.bias, lin, TpShard::sp,
             fp8);
  LayerOp& actv = b.add(OpKind::activation, to_string(m.mlp));
  Builder::save(
      actv,
      {.name = "input", .per_token = mlp_in_out, .bytes_per_element = act, .shard = TpShard::tp});
  add_linear(b, "mlp_out", LinearKind::row_parallel, f, h, m.bias, lin, TpShard::tp, fp8);
  if (m.sandwich_norm) add_norm(b, "mlp_out_norm", m, act);  // post_feedforward_layernorm
  if (dropout) add_dropout(b, "mlp_dropout", m);
  b.add(OpKind::residual_add, "mlp_residual");
  return table;
}

Count layer_parameters(const LayerTable& table) noexcept {
  Count n = 0;
  for (const LayerOp& op : table) n += op.weight_params + op.bias_params;
  return n;
}

Count layer_parameters_per_tp_rank(const LayerTable& table, Count tp) noexcept {
  Count n = 0;
  for (const LayerOp& op : table) {
    n += op.param_shard == TpShard::tp ? op.weight_params / tp : op.weight_params;
    n += op.bias_shard == TpShard::tp ? op.bias_params / tp : op.bias_params;
  }
  return n;
}

void add_saved_tensors(const LayerOp& op, Count b, Count s, Count tp, bool sequence_parallel,
                       SavedSums& sums) noexcept {
  for (int i = 0; i < op.num_saved; ++i) {
    const SavedTensor& t = op.saved[i];
    const Bytes elems = b * s * (t.per_token + t.per_token_per_key * s);
    Bytes bytes = elems * t.bytes_per_element;
    const bool sharded = t.shard == TpShard::tp || (t.shard == TpShard::sp && sequence_parallel);
    if (t.bytes_per_element > 1)
      sums.largest = std::max(sums.largest, sharded ? elems / tp : elems);
    if (sharded) bytes /= tp;
    sums.all += bytes;
    if (t.dropped_by_selective) sums.dropped += bytes;
  }
}

LayerActivation layer_activation(const LayerTable& table, const ModelSpec& model,
                                 const TrainingSpec& training, Count tp, bool sequence_parallel,
                                 Recompute recompute) noexcept {
  const Count b = training.micro_batch_size;
  const Count s = training.seq_length;
  SavedSums sums;
  for (const LayerOp& op : table) add_saved_tensors(op, b, s, tp, sequence_parallel, sums);
  const Bytes all = sums.all, dropped = sums.dropped;
  const Count largest = sums.largest;
  LayerActivation out;
  out.largest_elements = largest;
  switch (recompute) {
    case Recompute::none:
      out.kept = all;
      break;
    case Recompute::selective:
      // The dropped tensors (the s x s softmax output and its dropout) are rebuilt for the layer
      // whose backward runs (Korthikanti et al. 2022, sec. 5: recomputed in the backward pass).
      out.kept = all - dropped;
      out.working = dropped;
      break;
    case Recompute::full: {
      // Only the layer input survives (Korthikanti Table 2, "full": 2sbh), split along the
      // sequence under sequence parallelism. The layer being recomputed rebuilds all it saves and
      // reuses the kept input as its first saved tensor.
      const Bytes in = b * s * model.hidden_size * bytes_of(training.precision);
      out.kept = sequence_parallel ? in / tp : in;
      out.working = all - out.kept;
      break;
    }
    case Recompute::selective_op:
      // torchtitan's per-op policy (selective_op.h). The layer whose backward runs rebuilds its
      // saved set; counted whole (some rebuilt tensors alias kept outputs: an upper bound).
      out.kept = selective_op_kept_bytes(table, model, training, tp, sequence_parallel);
      out.working = all;
      break;
  }
  return out;
}

Bytes layer_activation_bytes(const LayerTable& table, const ModelSpec& model,
                             const TrainingSpec& training, Count tp, bool sequence_parallel,
                             Recompute recompute) noexcept {
  return layer_activation(table, model, training, tp, sequence_parallel, recompute).kept;
}

double attention_keys_fraction(const AttentionWindowSpec& window, Count seq) noexcept {
  if (!window.enabled() || window.size >= seq || seq <= 0) return 1.0;
  const double s = static_cast<double>(seq);
  const double w = static_cast<double>(window.size);
  const double full = s * (s + 1) / 2;
  if (window.kind == WindowKind::sliding) return (s * w - w * (w - 1) / 2) / full;
  // Chunked: whole chunks of w and a last one of the remainder.
  const double n = std::floor(s / w);
  const double rest = s - n * w;
  return (n * w * (w + 1) / 2 + rest * (rest + 1) / 2) / full;
}

LayerFlops layer_flops(const LayerTable& table, Count micro_batch, Count seq,
                       const AttentionWindowSpec* window) noexcept {
  LayerFlops f;
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq);
  // Of the s x s square, causal attention needs the half below the diagonal; a window keeps its
  // share of those causal pairs (attention_keys_fraction), the rest is masked.
  const double kept = 0.5 * (window ? attention_keys_fraction(*window, seq) : 1.0);
  const std::array<double, kMaxLayerOps> op_share = selective_op_recompute_share(table);
  int index = 0;
  for (const LayerOp& op : table) {
    const double fwd = tokens * (op.forward_flops_per_token +
                                 op.forward_flops_per_token_per_key * static_cast<double>(seq));
    f.forward += fwd;
    f.backward_input += op.backward_input_factor * fwd;
    f.backward_weight += op.backward_weight_factor * fwd;
    bool selective = false;
    for (int i = 0; i < op.num_saved; ++i) selective |= op.saved[i].dropped_by_selective;
    if (selective) f.selective_recompute += fwd;
    f.selective_op_recompute += op_share[index++] * fwd;
    const double masked =
        (1.0 - kept) * tokens * op.forward_flops_per_token_per_key * static_cast<double>(seq);
    f.causal_masked_forward += masked;
    f.causal_masked += masked * (1.0 + op.backward_input_factor + op.backward_weight_factor);
  }
  return f;
}

}  // namespace distplan
