// Ring attention kernels (ring_attention.h): the block attention of one ring step, the merge of
// partial outputs by log-sum-exp, and the block backward, on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "distplan/gpu_backend/ring_attention.h"

namespace distplan::backend::ring {
namespace {

inline Count off(Count si, Count bi, Count h, Count b, Count heads, Count d) {
  return ((si * b + bi) * heads + h) * d;
}

// Scores scale * q_i . k_j of query row i against the visible key rows of the step; returns how
// many (the first `n` of kv rows).
template <class T>
Count scores(const T* q, const T* k, std::vector<double>& sc, Count i, const Step& st, Count bi,
             Count h, Count b, Count a, Count g, Count d) {
  const Count hk = h / (a / g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Count n = st.causal ? std::min(st.offset + i - st.q.begin + 1, st.kv.count) : st.kv.count;
  const T* qi = q + off(i, bi, h, b, a, d);
  for (Count j = 0; j < n; ++j) {
    const T* kj = k + off(st.kv.begin + j, bi, hk, b, g, d);
    double dot = 0;
    for (Count e = 0; e < d; ++e) dot += static_cast<double>(qi[e]) * kj[e];
    sc[static_cast<std::size_t>(j)] = dot * scale;
  }
  return n;
}

}  // namespace

Count global_position(Count i, Count sl, Count cp, Count r) noexcept {
  const Count c = sl / 2;  // chunk length: s / (2 cp)
  return i < c ? r * c + i : (2 * cp - 1 - r) * c + (i - c);
}

Step step_for_block(Count j, Count r, Count sl) noexcept {
  const Count c = sl / 2;
  if (j == r) return {{0, sl}, {0, sl}, true};
  if (j < r) return {{0, sl}, {0, c}, false};
  return {{c, c}, {0, sl}, false};
}

Step all_gather_step(int chunk, Count r, Count cp, Count sl) noexcept {
  const Count c = sl / 2;
  const Count g = chunk == 0 ? r : 2 * cp - 1 - r;  // the chunk's global index
  return {{chunk * c, c}, {0, (g + 1) * c}, true, g * c};
}

template <class T>
void block_forward(const T* q, const T* k, const T* v, T* out, T* lse, Count s, const Step& st,
                   Count b, Count a, Count g, Count d) {
  std::vector<double> sc(static_cast<std::size_t>(st.kv.count));
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h) {
      const Count hk = h / (a / g);
      for (Count i = st.q.begin; i < st.q.begin + st.q.count; ++i) {
        const Count n = scores(q, k, sc, i, st, bi, h, b, a, g, d);
        const double mx = *std::max_element(sc.begin(), sc.begin() + n);
        double sum = 0;
        for (Count j = 0; j < n; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        lse[(bi * a + h) * s + i] = static_cast<T>(mx + std::log(sum));
        T* o = out + off(i, bi, h, b, a, d);
        for (Count e = 0; e < d; ++e) {
          double acc = 0;
          for (Count j = 0; j < n; ++j)
            acc += sc[j] / sum * v[off(st.kv.begin + j, bi, hk, b, g, d) + e];
          o[e] = static_cast<T>(acc);
        }
      }
    }
}

template <class T>
void merge(T* out, T* lse, const T* out_step, const T* lse_step, Count s, Rows rows, Count b,
           Count a, Count d) {
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h)
      for (Count i = rows.begin; i < rows.begin + rows.count; ++i) {
        T& l = lse[(bi * a + h) * s + i];
        const double ls = lse_step[(bi * a + h) * s + i];
        T* o = out + off(i, bi, h, b, a, d);
        const T* os = out_step + off(i, bi, h, b, a, d);
        if (std::isinf(static_cast<double>(l)) && l < 0) {
          l = static_cast<T>(ls);
          std::copy(os, os + d, o);
          continue;
        }
        const double l0 = l;
        const double hi = std::max(l0, ls), lo = std::min(l0, ls);
        const double merged = hi + std::log1p(std::exp(lo - hi));
        const double w0 = std::exp(l0 - merged), ws = std::exp(ls - merged);
        for (Count e = 0; e < d; ++e) o[e] = static_cast<T>(o[e] * w0 + os[e] * ws);
        l = static_cast<T>(merged);
      }
}

template <class T>
void block_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse,
                    T* dq, T* dk, T* dv, Count s, const Step& st, Count b, Count a, Count g,
                    Count d) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(static_cast<std::size_t>(st.kv.count));
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h) {
      const Count hk = h / (a / g);
      for (Count i = st.q.begin; i < st.q.begin + st.q.count; ++i) {
        const Count n = scores(q, k, p, i, st, bi, h, b, a, g, d);
        const double l = lse[(bi * a + h) * s + i];
        for (Count j = 0; j < n; ++j) p[j] = std::exp(p[j] - l);
        const T* doi = dout + off(i, bi, h, b, a, d);
        const T* oi = out + off(i, bi, h, b, a, d);
        const T* qi = q + off(i, bi, h, b, a, d);
        T* dqi = dq + off(i, bi, h, b, a, d);
        double D = 0;
        for (Count e = 0; e < d; ++e) D += static_cast<double>(doi[e]) * oi[e];
        for (Count j = 0; j < n; ++j) {
          const Count row = st.kv.begin + j;
          const T* kj = k + off(row, bi, hk, b, g, d);
          const T* vj = v + off(row, bi, hk, b, g, d);
          T* dkj = dk + off(row, bi, hk, b, g, d);
          T* dvj = dv + off(row, bi, hk, b, g, d);
          double dp = 0;
          for (Count e = 0; e < d; ++e) dp += static_cast<double>(doi[e]) * vj[e];
          const double ds = p[j] * (dp - D) * scale;
          for (Count e = 0; e < d; ++e) {
            dvj[e] = static_cast<T>(dvj[e] + p[j] * doi[e]);
            dqi[e] = static_cast<T>(dqi[e] + ds * kj[e]);
            dkj[e] = static_cast<T>(dkj[e] + ds * qi[e]);
          }
        }
      }
    }
}

#define DISTPLAN_RING_INSTANTIATE(T)                                                              \
  template void block_forward<T>(const T*, const T*, const T*, T*, T*, Count, const Step&, Count, \
                                 Count, Count, Count);                                            \
  template void merge<T>(T*, T*, const T*, const T*, Count, Rows, Count, Count, Count);           \
  template void block_backward<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, \
                                  T*, T*, Count, const Step&, Count, Count, Count, Count);

DISTPLAN_RING_INSTANTIATE(float)
DISTPLAN_RING_INSTANTIATE(double)

}  // namespace distplan::backend::ring
