// The layer op table: one transformer layer as an ordered list of ops, each with its parameters,
// FLOPs, the tensors it saves for backward and the collective it needs under tensor parallelism.
// Activation memory and FLOPs are sums over this table; the GPU backend implements these ops and
// saves exactly these tensors. Derivation and sources: docs/layer_ops.md.
//
// Dimension letters: b micro-batch size, s sequence length, h hidden size, a attention heads,
// kv key/value heads, d = h/a head dim, f ffn hidden size, V vocab size, t tensor-parallel size.
#pragma once

#include <array>
#include <string_view>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

enum class OpKind {
  norm,            // LayerNorm or RMSNorm
  linear,          // a GEMM with a weight (and optional bias)
  attention_core,  // softmax(QK^T/sqrt(d)) V, causal, incl. rotary on q and k when enabled
  activation,      // GeLU, or SwiGLU's silu(gate) * up
  dropout,         // residual dropout after attention / MLP
  residual_add,
};

/// How a tensor or weight is split across the t ranks of a tensor-parallel group.
enum class TpShard {
  replicated,  // every TP rank holds all of it
  tp,          // split t ways by tensor parallelism (heads, or the ffn dimension)
  sp,          // split t ways along the sequence only when sequence parallelism is on
};

/// Megatron's TP linear flavours (Shoeybi et al. 2019, sec. 3). `duplicated`: the whole weight on
/// every TP rank, run on the rank's own tokens (its sequence shard under sequence parallelism):
/// MLA's down-projections (Megatron-Core multi_latent_attention.py, TELinear
/// parallel_mode="duplicated").
enum class LinearKind { none, column_parallel, row_parallel, duplicated };

/// A tensor an op keeps alive from its forward to its backward.
/// Elements per micro-batch = b * s * (per_token + per_token_per_key * s) before TP/SP sharding.
struct SavedTensor {
  std::string_view name;
  Count per_token = 0;          // elements per token
  Count per_token_per_key = 0;  // elements per token per key position (a for the s x s scores)
  Bytes bytes_per_element = 2;
  TpShard shard = TpShard::replicated;
  bool dropped_by_selective = false;  // recomputed under selective recompute (Korthikanti sec. 5)
};

inline constexpr int kMaxSavedPerOp = 8;  // attention: q/k norm inputs, q, k, v, probs, dropout

struct LayerOp {
  OpKind kind = OpKind::norm;
  std::string_view name;
  LinearKind linear = LinearKind::none;
  Count in_features = 0;    // linear: full (unsharded) input width; norm: its width
  Count out_features = 0;   // linear: full (unsharded) output width; norm: its width
  Count weight_params = 0;  // full (unsharded) parameter count of the weight
  Count bias_params = 0;    // full (unsharded) parameter count of the bias
  TpShard param_shard = TpShard::replicated;  // weight and bias: tp for column/row weights
  TpShard bias_shard = TpShard::replicated;   // row-parallel biases stay replicated
  // Matmul FLOPs per token of the micro-batch, unsharded: forward, backward w.r.t. the input,
  // backward w.r.t. the weight. Attention core FLOPs grow with s: fwd = flops_per_token_per_key*s.
  Flops forward_flops_per_token = 0;
  Flops forward_flops_per_token_per_key = 0;
  Flops backward_input_factor = 1.0;   // backward-input FLOPs = factor * forward
  Flops backward_weight_factor = 0.0;  // backward-weight FLOPs = factor * forward
  std::array<SavedTensor, kMaxSavedPerOp> saved{};
  int num_saved = 0;
};

// A GPT layer with dropout has 12; sandwich norms add 2; MLA's six projections and norms add 5.
inline constexpr int kMaxLayerOps = 20;

/// One transformer layer: ops in forward order.
struct LayerTable {
  std::array<LayerOp, kMaxLayerOps> ops{};
  int num_ops = 0;
  [[nodiscard]] const LayerOp* begin() const { return ops.data(); }
  [[nodiscard]] const LayerOp* end() const { return ops.data() + num_ops; }
};

/// Builds the table for a model and training recipe (dropout, attention kind, dtype).
[[nodiscard]] LayerTable build_layer_table(const ModelSpec& model, const TrainingSpec& training);

/// Parameters of one full (unsharded) layer.
[[nodiscard]] Count layer_parameters(const LayerTable& table) noexcept;
/// Parameters of one layer held by one TP rank (column/row weights split t ways).
[[nodiscard]] Count layer_parameters_per_tp_rank(const LayerTable& table, Count tp) noexcept;

/// Activation bytes of one layer for one micro-batch on one GPU under a recompute mode.
struct LayerActivation {
  Bytes kept = 0;     // saved from the layer's forward to its backward
  Bytes working = 0;  // rebuilt by recomputation while this layer's backward runs (one layer)
  Count largest_elements = 0;  // elements of the largest non-mask tensor it saves (per GPU)
};
/// The tensors one op saves for backward, for one micro-batch of b x s tokens on one GPU of a
/// TP group of `tp`: added to `all` (and to `dropped` where selective recompute drops them), and
/// the largest non-mask one's elements kept in `largest`. One definition for the training and
/// the fine-tuning activations (layer_activation, peft_layer_activation).
struct SavedSums {
  Bytes all = 0, dropped = 0;
  Count largest = 0;
};
void add_saved_tensors(const LayerOp& op, Count b, Count s, Count tp, bool sequence_parallel,
                       SavedSums& sums) noexcept;
/// none: everything saved, no working set. selective: the s x s tensors are dropped and rebuilt
/// in backward. full: only the input is kept; the rest is rebuilt (docs/layer_ops.md).
[[nodiscard]] LayerActivation layer_activation(const LayerTable& table, const ModelSpec& model,
                                               const TrainingSpec& training, Count tp,
                                               bool sequence_parallel,
                                               Recompute recompute) noexcept;

/// Bytes one layer saves for backward for one micro-batch on one GPU (layer_activation().kept).
/// Korthikanti et al. 2022, Table 2, generalised to GQA, SwiGLU, flash attention and no dropout.
/// Full recompute keeps only the layer input (the row "full activation recomputation").
[[nodiscard]] Bytes layer_activation_bytes(const LayerTable& table, const ModelSpec& model,
                                           const TrainingSpec& training, Count tp,
                                           bool sequence_parallel, Recompute recompute) noexcept;

/// Per-layer matmul FLOPs for one micro-batch of b sequences (all TP ranks together).
struct LayerFlops {
  Flops forward = 0;
  Flops backward_input = 0;
  Flops backward_weight = 0;
  Flops selective_recompute = 0;     // forward FLOPs of the ops selective recompute re-runs
  Flops selective_op_recompute = 0;  // forward FLOPs per-op selective checkpointing re-runs
  // Of the above, the s x s products (QK^T and its product with V) above the causal diagonal:
  // half of their square, which a causal model never needs. Flash attention skips it, standard
  // attention computes it and masks it (docs/flops.md, "Conventions").
  Flops causal_masked_forward = 0;
  Flops causal_masked = 0;  // forward + backward
};
/// `window`: the layer's attention window (attention_keys_fraction); null for full attention.
/// A window changes no product of the square (unfused attention computes all of it with a mask)
/// but the causal_masked share: its model FLOPs, and what flash attention runs, are the window's
/// causal pairs.
[[nodiscard]] LayerFlops layer_flops(const LayerTable& table, Count micro_batch, Count seq,
                                     const AttentionWindowSpec* window = nullptr) noexcept;

/// The (query, key) pairs a windowed causal attention computes over a sequence of s tokens, as a
/// fraction of full causal attention's s(s + 1)/2: sliding, s·w - w(w - 1)/2 for w < s; chunked,
/// the chunks' c(c + 1)/2 each. 1 when the window covers the sequence.
[[nodiscard]] double attention_keys_fraction(const AttentionWindowSpec& window, Count seq) noexcept;

}  // namespace distplan
