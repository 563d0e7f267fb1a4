// The MoE block's arithmetic (moe_layer.h). Dispatch order follows Megatron-Core's
// MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py): token copies are
// permuted so that each destination rank's rows are contiguous and, within them, sorted by local
// expert; a counts exchange tells each rank how many rows of each local expert it receives; the
// rows go out in one all-to-all, the experts run, and the outputs come back in the reverse
// all-to-all, to be weighted by the router's scores and summed per token.
#include "distplan/gpu_backend/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "distplan/planner/check.h"

namespace distplan::backend::moe {

template <class T>
Routing<T> route(const T* logits, const T* bias, Count n, const RouterConfig& c) {
  const Count E = c.experts, k = c.top_k;
  Routing<T> r;
  r.scores.resize(static_cast<std::size_t>(n * E));
  r.pick.resize(static_cast<std::size_t>(n * k));
  r.weight.resize(static_cast<std::size_t>(n * k));
  std::vector<Count> order(static_cast<std::size_t>(E));
  std::vector<T> sel(static_cast<std::size_t>(E));
  for (Count t = 0; t < n; ++t) {
    const T* z = logits + t * E;
    T* p = r.scores.data() + t * E;
    if (c.kind == Router::softmax) {
      const T mx = *std::max_element(z, z + E);
      T sum = 0;
      for (Count e = 0; e < E; ++e) sum += p[e] = std::exp(z[e] - mx);
      for (Count e = 0; e < E; ++e) p[e] /= sum;
    } else {
      for (Count e = 0; e < E; ++e) p[e] = T(1) / (T(1) + std::exp(-z[e]));
    }
    for (Count e = 0; e < E; ++e) sel[e] = p[e] + (bias != nullptr ? bias[e] : T(0));
    std::iota(order.begin(), order.end(), Count{0});
    std::stable_sort(order.begin(), order.end(), [&](Count a, Count b) { return sel[a] > sel[b]; });
    T norm = 0;
    for (Count j = 0; j < k; ++j) norm += p[order[j]];
    for (Count j = 0; j < k; ++j) {
      r.pick[t * k + j] = order[j];
      r.weight[t * k + j] = p[order[j]] / norm;
    }
  }
  return r;
}

template <class T>
void route_backward(const Routing<T>& r, const T* dweight, T* dlogits, Count n,
                    const RouterConfig& c) {
  const Count E = c.experts, k = c.top_k;
  std::vector<T> dp(static_cast<std::size_t>(E));
  for (Count t = 0; t < n; ++t) {
    const T* p = r.scores.data() + t * E;
    const Count* pick = r.pick.data() + t * k;
    const T* dw = dweight + t * k;
    // w_j = p_j / S with S the sum of the chosen p: dp_i = dw_i / S - sum_j dw_j p_j / S^2.
    T S = 0, dot = 0;
    for (Count j = 0; j < k; ++j) S += p[pick[j]];
    for (Count j = 0; j < k; ++j) dot += dw[j] * p[pick[j]];
    std::fill(dp.begin(), dp.end(), T(0));
    for (Count j = 0; j < k; ++j) dp[pick[j]] = dw[j] / S - dot / (S * S);
    T* dz = dlogits + t * E;
    if (c.kind == Router::softmax) {
      T s = 0;
      for (Count e = 0; e < E; ++e) s += p[e] * dp[e];
      for (Count e = 0; e < E; ++e) dz[e] = p[e] * (dp[e] - s);
    } else {
      for (Count e = 0; e < E; ++e) dz[e] = dp[e] * p[e] * (T(1) - p[e]);
    }
  }
}

namespace {

template <class T>
T silu(T g) {
  return g / (T(1) + std::exp(-g));
}

// y (r, out) = x (r, in) w^T with w (out, in).
template <class T>
void matmul_nt(const T* x, const T* w, T* y, Count r, Count in, Count out) {
  for (Count i = 0; i < r; ++i)
    for (Count o = 0; o < out; ++o) {
      T s = 0;
      for (Count c = 0; c < in; ++c) s += x[i * in + c] * w[o * in + c];
      y[i * out + o] = s;
    }
}
// dx (r, in) = dy (r, out) w (out, in).
template <class T>
void matmul_nn(const T* dy, const T* w, T* dx, Count r, Count in, Count out) {
  for (Count i = 0; i < r; ++i)
    for (Count c = 0; c < in; ++c) {
      T s = 0;
      for (Count o = 0; o < out; ++o) s += dy[i * out + o] * w[o * in + c];
      dx[i * in + c] = s;
    }
}
// dw (out, in) += dy^T (out, r) x (r, in).
template <class T>
void matmul_tn_acc(const T* dy, const T* x, T* dw, Count r, Count in, Count out) {
  for (Count o = 0; o < out; ++o)
    for (Count c = 0; c < in; ++c) {
      T s = 0;
      for (Count i = 0; i < r; ++i) s += dy[i * out + o] * x[i * in + c];
      dw[o * in + c] += s;
    }
}

}  // namespace

template <class T>
void expert_forward(const T* x, const T* w_in, const T* w_out, T* fc1, T* act, T* y, Count r,
                    Count h, Count f) {
  matmul_nt(x, w_in, fc1, r, h, 2 * f);
  for (Count i = 0; i < r; ++i)
    for (Count j = 0; j < f; ++j)
      act[i * f + j] = silu(fc1[i * 2 * f + j]) * fc1[i * 2 * f + f + j];
  matmul_nt(act, w_out, y, r, f, h);
}

template <class T>
void expert_backward(const T* dy, const T* x, const T* w_in, const T* w_out, const T* fc1,
                     const T* act, T* dx, T* dw_in, T* dw_out, Count r, Count h, Count f) {
  std::vector<T> dact(static_cast<std::size_t>(r * f)), dfc1(static_cast<std::size_t>(r * 2 * f));
  matmul_nn(dy, w_out, dact.data(), r, f, h);
  matmul_tn_acc(dy, act, dw_out, r, f, h);
  for (Count i = 0; i < r; ++i)
    for (Count j = 0; j < f; ++j) {
      const T g = fc1[i * 2 * f + j], u = fc1[i * 2 * f + f + j];
      const T sg = T(1) / (T(1) + std::exp(-g));
      const T d = dact[i * f + j];
      dfc1[i * 2 * f + j] = d * u * sg * (T(1) + g * (T(1) - sg));  // d silu(g) = s (1 + g (1 - s))
      dfc1[i * 2 * f + f + j] = d * g * sg;
    }
  matmul_nn(dfc1.data(), w_in, dx, r, h, 2 * f);
  matmul_tn_acc(dfc1.data(), x, dw_in, r, h, 2 * f);
}

template <class T>
Exchange<T> local_exchange() {
  Exchange<T> ex;
  ex.counts = [](const std::vector<Count>& send) { return send; };
  ex.rows = [](const T* in, const std::vector<Count>& send_rows, T* out,
               const std::vector<Count>& recv_rows, Count width, Count, Traffic) {
    DISTPLAN_CHECK(send_rows == recv_rows, "a one-rank exchange receives what it sends");
    std::copy(in, in + send_rows.front() * width, out);
  };
  return ex;
}

namespace {

template <class T>
void check_weights(const BlockWeights<T>& w, const Exchange<T>& ex) {
  DISTPLAN_CHECK(w.local * ex.size == w.router.experts, "local experts * ep != num_experts");
  DISTPLAN_CHECK(
      static_cast<Count>(w.w_in.size()) == w.local && static_cast<Count>(w.w_out.size()) == w.local,
      "one weight pair per local expert");
}

}  // namespace

template <class T>
std::vector<T> block_forward(const BlockWeights<T>& w, const T* x, Count n, BlockSaved<T>& sv,
                             const Exchange<T>& ex) {
  check_weights(w, ex);
  const Count E = w.router.experts, k = w.router.top_k, h = w.h, f = w.f, L = w.local;
  const auto ranks = static_cast<std::size_t>(ex.size);
  // Router: logits (n, E) = x w_router^T, then the selection.
  std::vector<T> logits(static_cast<std::size_t>(n * E));
  matmul_nt(x, w.router_w, logits.data(), n, h, E);
  sv.routing = route(logits.data(), w.router_bias, n, w.router);
  // Permute: the copies in (destination rank, local expert, token, choice) order.
  std::vector<Count> copies(static_cast<std::size_t>(n * k));
  std::iota(copies.begin(), copies.end(), Count{0});
  const auto& pick = sv.routing.pick;
  std::stable_sort(copies.begin(), copies.end(),
                   [&](Count a, Count b) { return pick[a] < pick[b]; });
  sv.slot_of.assign(copies.size(), 0);
  sv.sent_token.resize(copies.size());
  std::vector<Count> per_expert(static_cast<std::size_t>(E), 0);  // = (rank, local expert)
  for (std::size_t i = 0; i < copies.size(); ++i) {
    sv.slot_of[static_cast<std::size_t>(copies[i])] = static_cast<Count>(i);
    sv.sent_token[i] = copies[i] / k;
    ++per_expert[static_cast<std::size_t>(pick[copies[i]])];
  }
  const std::vector<Count> from = ex.counts(per_expert);  // (source rank, local expert)
  sv.send_rows.assign(ranks, 0);
  sv.recv_rows.assign(ranks, 0);
  sv.recv_expert.clear();
  for (std::size_t r = 0; r < ranks; ++r)
    for (Count le = 0; le < L; ++le) {
      sv.send_rows[r] += per_expert[r * L + le];
      sv.recv_rows[r] += from[r * L + le];
      sv.recv_expert.insert(sv.recv_expert.end(), from[r * L + le], le);
    }
  const Count S = sv.sent(), R = sv.received();
  std::vector<T> xs(static_cast<std::size_t>(S * h));
  for (Count i = 0; i < S; ++i)
    std::copy(x + sv.sent_token[i] * h, x + (sv.sent_token[i] + 1) * h, xs.data() + i * h);
  sv.x_in.assign(static_cast<std::size_t>(R * h), T(0));
  ex.rows(xs.data(), sv.send_rows, sv.x_in.data(), sv.recv_rows, h, sv.sent(),
          Traffic::dispatch_forward);
  // Experts on contiguous runs of equal local expert.
  sv.fc1.assign(static_cast<std::size_t>(R * 2 * f), T(0));
  sv.act.assign(static_cast<std::size_t>(R * f), T(0));
  std::vector<T> y(static_cast<std::size_t>(R * h));
  for (Count a = 0; a < R;) {
    Count b = a;
    while (b < R && sv.recv_expert[b] == sv.recv_expert[a]) ++b;
    const auto le = static_cast<std::size_t>(sv.recv_expert[a]);
    expert_forward(sv.x_in.data() + a * h, w.w_in[le], w.w_out[le], sv.fc1.data() + a * 2 * f,
                   sv.act.data() + a * f, y.data() + a * h, b - a, h, f);
    a = b;
  }
  // Combine: the outputs return, weighted and summed per token.
  sv.y_back.assign(static_cast<std::size_t>(S * h), T(0));
  ex.rows(y.data(), sv.recv_rows, sv.y_back.data(), sv.send_rows, h, sv.sent(),
          Traffic::combine_forward);
  std::vector<T> out(static_cast<std::size_t>(n * h), T(0));
  for (Count t = 0; t < n; ++t)
    for (Count j = 0; j < k; ++j) {
      const T wt = sv.routing.weight[t * k + j];
      const T* yr = sv.y_back.data() + sv.slot_of[t * k + j] * h;
      for (Count c = 0; c < h; ++c) out[t * h + c] += wt * yr[c];
    }
  return out;
}

template <class T>
std::vector<T> block_backward(const BlockWeights<T>& w, const T* x, const T* dy, Count n,
                              const BlockSaved<T>& sv, BlockGrads<T>& g, const Exchange<T>& ex) {
  check_weights(w, ex);
  const Count E = w.router.experts, k = w.router.top_k, h = w.h, f = w.f, L = w.local;
  const Count S = sv.sent(), R = sv.received();
  if (g.router_w.empty()) {
    g.router_w.assign(static_cast<std::size_t>(E * h), T(0));
    g.w_in.assign(static_cast<std::size_t>(L), std::vector<T>(static_cast<std::size_t>(2 * f * h)));
    g.w_out.assign(static_cast<std::size_t>(L), std::vector<T>(static_cast<std::size_t>(h * f)));
  }
  // Combine backward: d weight = <dy, y>, d y = weight * dy, sent back to the experts.
  std::vector<T> dweight(static_cast<std::size_t>(n * k)), dys(static_cast<std::size_t>(S * h));
  for (Count t = 0; t < n; ++t)
    for (Count j = 0; j < k; ++j) {
      const Count slot = sv.slot_of[t * k + j];
      const T wt = sv.routing.weight[t * k + j];
      const T* yr = sv.y_back.data() + slot * h;
      T d = 0;
      for (Count c = 0; c < h; ++c) {
        d += dy[t * h + c] * yr[c];
        dys[slot * h + c] = wt * dy[t * h + c];
      }
      dweight[t * k + j] = d;
    }
  std::vector<T> dye(static_cast<std::size_t>(R * h));
  ex.rows(dys.data(), sv.send_rows, dye.data(), sv.recv_rows, h, sv.sent(),
          Traffic::combine_backward);
  std::vector<T> dxe(static_cast<std::size_t>(R * h));
  for (Count a = 0; a < R;) {
    Count b = a;
    while (b < R && sv.recv_expert[b] == sv.recv_expert[a]) ++b;
    const auto le = static_cast<std::size_t>(sv.recv_expert[a]);
    expert_backward(dye.data() + a * h, sv.x_in.data() + a * h, w.w_in[le], w.w_out[le],
                    sv.fc1.data() + a * 2 * f, sv.act.data() + a * f, dxe.data() + a * h,
                    g.w_in[le].data(), g.w_out[le].data(), b - a, h, f);
    a = b;
  }
  // Dispatch backward: the input gradients return and add up per token.
  std::vector<T> dxs(static_cast<std::size_t>(S * h));
  ex.rows(dxe.data(), sv.recv_rows, dxs.data(), sv.send_rows, h, sv.sent(),
          Traffic::dispatch_backward);
  std::vector<T> dx(static_cast<std::size_t>(n * h), T(0));
  for (Count i = 0; i < S; ++i)
    for (Count c = 0; c < h; ++c) dx[sv.sent_token[i] * h + c] += dxs[i * h + c];
  // Router.
  std::vector<T> dlogits(static_cast<std::size_t>(n * E));
  route_backward(sv.routing, dweight.data(), dlogits.data(), n, w.router);
  matmul_tn_acc(dlogits.data(), x, g.router_w.data(), n, h, E);
  std::vector<T> dxr(static_cast<std::size_t>(n * h));
  matmul_nn(dlogits.data(), w.router_w, dxr.data(), n, h, E);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dxr[i];
  return dx;
}

#define DISTPLAN_MOE_INSTANTIATE(T)                                                              \
  template Routing<T> route(const T*, const T*, Count, const RouterConfig&);                     \
  template void route_backward(const Routing<T>&, const T*, T*, Count, const RouterConfig&);     \
  template void expert_forward(const T*, const T*, const T*, T*, T*, T*, Count, Count, Count);   \
  template void expert_backward(const T*, const T*, const T*, const T*, const T*, const T*, T*,  \
                                T*, T*, Count, Count, Count);                                    \
  template Exchange<T> local_exchange();                                                         \
  template std::vector<T> block_forward(const BlockWeights<T>&, const T*, Count, BlockSaved<T>&, \
                                        const Exchange<T>&);                                     \
  template std::vector<T> block_backward(const BlockWeights<T>&, const T*, const T*, Count,      \
                                         const BlockSaved<T>&, BlockGrads<T>&,                   \
                                         const Exchange<T>&);
DISTPLAN_MOE_INSTANTIATE(float)
DISTPLAN_MOE_INSTANTIATE(double)
#undef DISTPLAN_MOE_INSTANTIATE

}  // namespace distplan::backend::moe
