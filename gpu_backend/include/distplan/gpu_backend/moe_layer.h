// A Mixture-of-Experts feed-forward block on the CPU (docs/gpu_backend.md, "Mixture of Experts"):
// the router, top-k selection, the dispatch of token copies to the experts' ranks, SwiGLU experts
// and the weighted combine, forward and backward. Templated on the element type: the trainer runs
// it in fp32 over an expert-parallel all-to-all, the gradient test in float64 on one rank
// against finite differences (tests/gpu_backend/moe_layer_test.cpp).
#pragma once

#include <functional>
#include <vector>

#include "distplan/planner/spec.h"
#include "distplan/planner/traffic.h"
#include "distplan/planner/units.h"

namespace distplan::backend::moe {

/// Router conventions (docs/moe.md, "Router"):
/// - softmax: p = softmax(logits) over all experts, the top_k largest p chosen, their weights
///   p_i / sum of the chosen p (Mixtral, HF transformers models/mixtral/modeling_mixtral.py
///   MixtralSparseMoeBlock: softmax, topk, "routing_weights /= routing_weights.sum"; Qwen3-MoE
///   models/qwen3_moe/modeling_qwen3_moe.py with norm_topk_prob = true, its config default for
///   the released models).
/// - sigmoid: s = sigmoid(logits); the top_k largest s + bias chosen (router_bias: the
///   per-expert e_score_correction_bias, selection only), weights s_i / sum of the chosen s
///   (DeepSeek-V3, models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3TopkRouter,
///   norm_topk_prob = true). DeepSeek-V3's group-limited selection (n_group, topk_group) and its
///   routed_scaling_factor are not in MoeSpec: the backend selects over all experts with scale 1.
/// Ties: equal selection scores are taken in increasing expert index (a stable sort), so every
/// rank and layout picks the same experts.
struct RouterConfig {
  Count experts = 0;
  Count top_k = 0;
  Router kind = Router::softmax;
};

template <class T>
struct Routing {
  std::vector<T> scores;    // (n, E): softmax probabilities or sigmoid scores
  std::vector<Count> pick;  // (n, k): chosen experts, best first
  std::vector<T> weight;    // (n, k): combine weights
};

/// Routes n tokens from their router logits (n, E). `bias` (E, may be null) shifts selection only.
template <class T>
[[nodiscard]] Routing<T> route(const T* logits, const T* bias, Count n, const RouterConfig& c);
/// d logits (n, E) from d weight (n, k); the selection is piecewise constant (no gradient).
template <class T>
void route_backward(const Routing<T>& r, const T* dweight, T* dlogits, Count n,
                    const RouterConfig& c);

/// One SwiGLU expert on r rows: fc1 = x w_in^T with w_in (2f, h) = [gate rows; up rows],
/// act = silu(gate) * up (r, f), y = act w_out^T with w_out (h, f).
template <class T>
void expert_forward(const T* x, const T* w_in, const T* w_out, T* fc1, T* act, T* y, Count r,
                    Count h, Count f);
/// dx (r, h) is written; dw_in and dw_out are accumulated into.
template <class T>
void expert_backward(const T* dy, const T* x, const T* w_in, const T* w_out, const T* fc1,
                     const T* act, T* dx, T* dw_in, T* dw_out, Count r, Count h, Count f);

/// The expert-parallel all-to-all seen by the block: `size` ranks, this one `rank`.
/// counts: each rank sends send[i] integers to rank i / m (m = send.size() / size) and returns
/// what it receives in the same layout (metadata: how many rows per local expert).
/// rows: sends send_rows[r] rows of `width` elements to rank r (consecutive blocks of `in`),
/// receives recv_rows[r] from rank r into `out`; `token_rows`: the rows of this rank's token-side
/// buffer (its tokens' top-k copies, sent in dispatch and received in combine: the buffer the
/// planner counts); `what` names the call (dispatch or combine, forward or backward).
template <class T>
struct Exchange {
  int size = 1, rank = 0;
  std::function<std::vector<Count>(const std::vector<Count>& send)> counts;
  std::function<void(const T* in, const std::vector<Count>& send_rows, T* out,
                     const std::vector<Count>& recv_rows, Count width, Count token_rows,
                     Traffic what)>
      rows;
};
/// One rank: every row stays here.
template <class T>
[[nodiscard]] Exchange<T> local_exchange();

/// The routed part of one MoE layer on this rank: its router and its `local` experts,
/// experts [rank * local, (rank + 1) * local) of the ep group.
template <class T>
struct BlockWeights {
  Count h = 0, f = 0, local = 0;
  RouterConfig router;
  const T* router_w = nullptr;     // (E, h)
  const T* router_bias = nullptr;  // (E) or null
  std::vector<const T*> w_in;      // per local expert (2f, h)
  std::vector<const T*> w_out;     // per local expert (h, f)
};

/// What the block keeps from its forward to its backward.
template <class T>
struct BlockSaved {
  Routing<T> routing;
  std::vector<Count> slot_of;      // (n, k): the token copy's row among this rank's sent rows
  std::vector<Count> sent_token;   // per sent row: its token
  std::vector<Count> send_rows;    // per rank: rows sent to it
  std::vector<Count> recv_rows;    // per rank: rows received from it
  std::vector<Count> recv_expert;  // per received row: the local expert it goes to
  std::vector<T> x_in;             // received rows (R, h): the experts' input
  std::vector<T> fc1, act;         // (R, 2f), (R, f)
  std::vector<T> y_back;           // expert outputs returned to this rank (S, h)
  [[nodiscard]] Count sent() const { return static_cast<Count>(sent_token.size()); }
  [[nodiscard]] Count received() const { return static_cast<Count>(recv_expert.size()); }
};

/// Forward of n tokens x (n, h): returns the combined routed-expert output (n, h).
template <class T>
[[nodiscard]] std::vector<T> block_forward(const BlockWeights<T>& w, const T* x, Count n,
                                           BlockSaved<T>& sv, const Exchange<T>& ex);

/// Gradients of the block's weights on this rank.
template <class T>
struct BlockGrads {
  std::vector<T> router_w;            // (E, h)
  std::vector<std::vector<T>> w_in;   // per local expert
  std::vector<std::vector<T>> w_out;  // per local expert
};
/// Backward from dy (n, h): returns dx (n, h) and accumulates the weight gradients into `g`
/// (sized on first use).
template <class T>
[[nodiscard]] std::vector<T> block_backward(const BlockWeights<T>& w, const T* x, const T* dy,
                                            Count n, const BlockSaved<T>& sv, BlockGrads<T>& g,
                                            const Exchange<T>& ex);

}  // namespace distplan::backend::moe
