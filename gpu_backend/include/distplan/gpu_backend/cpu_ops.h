// CPU ops: the oracle every other device is checked against. Plain functions over contiguous
// arrays, instantiated for float (training) and double (finite-difference checks).
//
// Dimension letters: N tokens (= s*b, token index = s_i*b + b_i, sequence-major as in Megatron),
// C channels, I/O linear in/out features, s sequence, b micro-batch, a query heads, g key/value
// heads (GQA: a multiple of g), d head dim, V (local) vocab rows.
// Backward functions *accumulate* into weight gradients and *overwrite* input gradients.
#pragma once

#include <cstdint>

#include "distplan/planner/units.h"

namespace distplan::backend::cpu {

// --- embedding ------------------------------------------------------------------------------
/// out (N,C) = table[ids - vocab_start] (V,C) for ids inside [vocab_start, vocab_start + V), else 0
/// (vocab-parallel embedding; the TP all-reduce sums the shards).
template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* out, Count N, Count C,
                       Count vocab_start, Count V);
/// dtable (V,C) += scatter of dout (N,C) to the rows of in-range ids.
template <class T>
void embedding_backward(const std::int32_t* ids, const T* dout, T* dtable, Count N, Count C,
                        Count vocab_start, Count V);
/// out (N,C) += pos (S,C) broadcast: token n sits at position n / b.
template <class T>
void add_position_forward(const T* pos, T* out, Count s, Count b, Count C);
template <class T>
void add_position_backward(const T* dout, T* dpos, Count s, Count b, Count C);

// --- norms ----------------------------------------------------------------------------------
/// x (N,C) -> out (N,C); mean, rstd (N). beta may be null (no bias).
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* out, T* mean, T* rstd, Count N,
                       Count C, double eps);
template <class T>
void layernorm_backward(const T* dout, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, Count N, Count C);
/// RMSNorm: out = x * rstd * gamma; rstd (N).
template <class T>
void rmsnorm_forward(const T* x, const T* gamma, T* out, T* rstd, Count N, Count C, double eps);
template <class T>
void rmsnorm_backward(const T* dout, const T* x, const T* gamma, const T* rstd, T* dx, T* dgamma,
                      Count N, Count C);

// --- linear: y (N,O) = x (N,I) W^T + bias, W (O,I) ---------------------------------------------
template <class T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, Count N, Count I, Count O);
/// dx (N,I) = dy (N,O) W
template <class T>
void linear_backward_input(const T* dy, const T* w, T* dx, Count N, Count I, Count O);
/// dW (O,I) += dy^T x; dbias (O) += sum_n dy (dbias may be null)
template <class T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, Count N, Count I, Count O);

// --- activations ------------------------------------------------------------------------------
/// GeLU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2's form).
template <class T>
void gelu_forward(const T* x, T* y, Count n);
template <class T>
void gelu_backward(const T* dy, const T* x, T* dx, Count n);
/// SwiGLU (Shazeer 2020): y = silu(gate) * up.
template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, Count n);
template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, Count n);

// --- rotary position embedding (Su et al. 2021), in place on q or k (s,b,heads,d)
// -----------------
/// Pairs (i, i + d/2) rotated by angle pos * theta^(-2i/d) (GPT-NeoX / Llama layout).
template <class T>
void rotary_forward(T* x, Count s, Count b, Count heads, Count d, double theta);
/// The inverse rotation applied to a gradient.
template <class T>
void rotary_backward(T* dx, Count s, Count b, Count heads, Count d, double theta);
/// Both of the above with row i at position pos[i] (context parallelism's load-balanced chunks) or
/// at i when pos is null; sign +1 rotates, -1 applies the inverse rotation (the backward).
template <class T>
void rotary_at(T* x, const Count* pos, Count s, Count b, Count heads, Count d, double theta,
               double sign);

// --- causal attention core -------------------------------------------------------------------
// q (s,b,a,d), k and v (s,b,g,d), out (s,b,a,d). Softmax scale 1/sqrt(d).
/// Standard: materialises probs (b,a,s,s) (saved for backward).
template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, Count s, Count b,
                       Count a, Count g, Count d);
template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* probs, T* dq,
                        T* dk, T* dv, Count s, Count b, Count a, Count g, Count d);
/// Flash-style (Dao et al. 2022): saves only the log-sum-exp lse (b,a,s); the backward recomputes
/// the probabilities from q, k and lse, and uses out for D = rowsum(dout * out).
template <class T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* out, T* lse, Count s, Count b,
                             Count a, Count g, Count d);
template <class T>
void flash_attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, T* dq, T* dk, T* dv, Count s, Count b, Count a, Count g,
                              Count d);

// --- vocab-parallel cross-entropy (Megatron: Shoeybi et al. 2019, sec. 3)
// ------------------------- logits (N,V) hold this rank's vocab rows [vocab_start, vocab_start +
// V). Three reductions over the TP group combine the pieces: max, sum of exp, target logit.
template <class T>
void ce_local_max(const T* logits, T* row_max, Count N, Count V);
template <class T>
void ce_local_sumexp(const T* logits, const T* row_max, T* sumexp, Count N, Count V);
/// The target's logit where it falls in this shard, else 0.
template <class T>
void ce_local_target(const T* logits, const std::int32_t* targets, T* target_logit, Count N,
                     Count V, Count vocab_start);
/// loss_n = log(sumexp_n) + max_n - target_logit_n.
template <class T>
void ce_loss(const T* row_max, const T* sumexp, const T* target_logit, T* loss, Count N);
/// dlogits (N,V) = (softmax - onehot) * dloss_n.
/// The fp32 softmax of the logits from their row max and sum of exponentials:
/// exp(l - max) / sumexp, evaluated in double.
template <class T>
void ce_softmax(const T* logits, const T* row_max, const T* sumexp, T* softmax, Count N, Count V);
/// d loss / d logits in place on the softmax p: (p - onehot(target - vocab_start)) * scale.
template <class T>
void ce_softmax_grad(T* p, const std::int32_t* targets, Count N, Count V, Count vocab_start,
                     T scale);
template <class T>
void ce_backward(const T* logits, const T* row_max, const T* sumexp, const std::int32_t* targets,
                 const T* dloss, T* dlogits, Count N, Count V, Count vocab_start);

// --- optimizers on fp32 master weights ---------------------------------------------------------
struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW, Loshchilov & Hutter 2019); Adam adds it to g
  bool decoupled = true;
};
/// Adam/AdamW (Kingma & Ba 2015) step `step` (1-based) with bias correction; grad scaled by
/// `grad_scale` first (1/loss_scale, 1/num_microbatches).
void adam_step(float* master, const float* grad, float* m, float* v, Count n, const AdamConfig& c,
               Count step, float grad_scale);
/// SGD with momentum: buf = mu*buf + g; p -= lr*buf.
void sgd_step(float* master, const float* grad, float* momentum, Count n, float lr, float mu,
              float grad_scale);

/// True when any element is inf or NaN (the loss-scale overflow check).
[[nodiscard]] bool has_overflow(const float* x, Count n);

}  // namespace distplan::backend::cpu
