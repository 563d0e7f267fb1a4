#include "distplan/gpu_backend/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <Eigen/Core>

namespace distplan::backend::cpu {
namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapC = Eigen::Map<const RowMat<T>>;
template <class T>
using Map = Eigen::Map<RowMat<T>>;

// Offsets into q/out (s,b,a,d) and k/v (s,b,g,d).
inline Count qoff(Count si, Count bi, Count h, Count b, Count a, Count d) {
  return ((si * b + bi) * a + h) * d;
}

}  // namespace

template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* out, Count N, Count C,
                       Count vocab_start, Count V) {
  for (Count n = 0; n < N; ++n) {
    const Count row = ids[n] - vocab_start;
    T* o = out + n * C;
    if (row >= 0 && row < V) {
      std::copy(table + row * C, table + (row + 1) * C, o);
    } else {
      std::fill(o, o + C, T(0));
    }
  }
}

template <class T>
void embedding_backward(const std::int32_t* ids, const T* dout, T* dtable, Count N, Count C,
                        Count vocab_start, Count V) {
  for (Count n = 0; n < N; ++n) {
    const Count row = ids[n] - vocab_start;
    if (row < 0 || row >= V) continue;
    for (Count c = 0; c < C; ++c) dtable[row * C + c] += dout[n * C + c];
  }
}

template <class T>
void add_position_forward(const T* pos, T* out, Count s, Count b, Count C) {
  for (Count si = 0; si < s; ++si)
    for (Count bi = 0; bi < b; ++bi)
      for (Count c = 0; c < C; ++c) out[(si * b + bi) * C + c] += pos[si * C + c];
}

template <class T>
void add_position_backward(const T* dout, T* dpos, Count s, Count b, Count C) {
  for (Count si = 0; si < s; ++si)
    for (Count bi = 0; bi < b; ++bi)
      for (Count c = 0; c < C; ++c) dpos[si * C + c] += dout[(si * b + bi) * C + c];
}

template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* out, T* mean, T* rstd, Count N,
                       Count C, double eps) {
  for (Count n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double m = 0;
    for (Count c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<double>(C);
    double var = 0;
    for (Count c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= static_cast<double>(C);
    const double r = 1.0 / std::sqrt(var + eps);
    T* o = out + n * C;
    for (Count c = 0; c < C; ++c) {
      o[c] = static_cast<T>((xr[c] - m) * r * gamma[c] + (beta ? beta[c] : T(0)));
    }
    mean[n] = static_cast<T>(m);
    rstd[n] = static_cast<T>(r);
  }
}

template <class T>
void layernorm_backward(const T* dout, const T* x, const T* gamma, const T* mean, const T* rstd,
                        T* dx, T* dgamma, T* dbeta, Count N, Count C) {
  for (Count n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (Count c = 0; c < C; ++c) {
      const double norm = (xr[c] - mean[n]) * rstd[n];
      const double dnorm = dr[c] * gamma[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<double>(C);
    dnorm_norm_mean /= static_cast<double>(C);
    for (Count c = 0; c < C; ++c) {
      const double norm = (xr[c] - mean[n]) * rstd[n];
      const double dnorm = dr[c] * gamma[c];
      if (dbeta) dbeta[c] += dr[c];
      dgamma[c] += static_cast<T>(norm * dr[c]);
      dx[n * C + c] = static_cast<T>(rstd[n] * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    }
  }
}

template <class T>
void rmsnorm_forward(const T* x, const T* gamma, T* out, T* rstd, Count N, Count C, double eps) {
  for (Count n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double ss = 0;
    for (Count c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (Count c = 0; c < C; ++c) out[n * C + c] = static_cast<T>(xr[c] * r * gamma[c]);
    rstd[n] = static_cast<T>(r);
  }
}

// y_i = g_i x_i r, r = (mean(x^2) + eps)^(-1/2), dr/dx_k = -r^3 x_k / C, so
// dx_k = r dn_k - r^3 x_k / C * sum_i dn_i x_i with dn = dy * g.
template <class T>
void rmsnorm_backward(const T* dout, const T* x, const T* gamma, const T* rstd, T* dx, T* dgamma,
                      Count N, Count C) {
  for (Count n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    const double r = rstd[n];
    double dot = 0;
    for (Count c = 0; c < C; ++c) dot += static_cast<double>(dr[c]) * gamma[c] * xr[c];
    for (Count c = 0; c < C; ++c) {
      dgamma[c] += static_cast<T>(dr[c] * xr[c] * r);
      dx[n * C + c] =
          static_cast<T>(r * dr[c] * gamma[c] - r * r * r * xr[c] * dot / static_cast<double>(C));
    }
  }
}

template <class T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, Count N, Count I, Count O) {
  Map<T> Y(y, N, O);
  Y.noalias() = MapC<T>(x, N, I) * MapC<T>(w, O, I).transpose();
  if (bias) Y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, O);
}

template <class T>
void linear_backward_input(const T* dy, const T* w, T* dx, Count N, Count I, Count O) {
  Map<T>(dx, N, I).noalias() = MapC<T>(dy, N, O) * MapC<T>(w, O, I);
}

template <class T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, Count N, Count I, Count O) {
  Map<T>(dw, O, I).noalias() += MapC<T>(dy, N, O).transpose() * MapC<T>(x, N, I);
  if (dbias) {
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(dbias, O) += MapC<T>(dy, N, O).colwise().sum();
  }
}

namespace {
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)
}

template <class T>
void gelu_forward(const T* x, T* y, Count n) {
  for (Count i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<T>(0.5 * v * (1.0 + std::tanh(kGeluC * (v + 0.044715 * v * v * v))));
  }
}

template <class T>
void gelu_backward(const T* dy, const T* x, T* dx, Count n) {
  for (Count i = 0; i < n; ++i) {
    const double v = x[i];
    const double t = std::tanh(kGeluC * (v + 0.044715 * v * v * v));
    const double du = kGeluC * (1.0 + 3.0 * 0.044715 * v * v);
    dx[i] = static_cast<T>(dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du));
  }
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, Count n) {
  for (Count i = 0; i < n; ++i) {
    const double g = gate[i];
    y[i] = static_cast<T>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, Count n) {
  for (Count i = 0; i < n; ++i) {
    const double g = gate[i];
    const double sg = 1.0 / (1.0 + std::exp(-g));
    dgate[i] = static_cast<T>(dy[i] * up[i] * sg * (1.0 + g * (1.0 - sg)));
    dup[i] = static_cast<T>(dy[i] * g * sg);
  }
}

template <class T>
void rotary_at(T* x, const Count* pos, Count s, Count b, Count heads, Count d, double theta,
               double sign) {
  const Count half = d / 2;
  for (Count si = 0; si < s; ++si)
    for (Count i = 0; i < half; ++i) {
      const double at = static_cast<double>(pos != nullptr ? pos[si] : si);
      const double ang =
          at * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double c = std::cos(ang), sn = sign * std::sin(ang);
      for (Count bi = 0; bi < b; ++bi)
        for (Count h = 0; h < heads; ++h) {
          T* p = x + ((si * b + bi) * heads + h) * d;
          const double x1 = p[i], x2 = p[i + half];
          p[i] = static_cast<T>(x1 * c - x2 * sn);
          p[i + half] = static_cast<T>(x1 * sn + x2 * c);
        }
    }
}

template <class T>
void rotary_forward(T* x, Count s, Count b, Count heads, Count d, double theta) {
  rotary_at(x, nullptr, s, b, heads, d, theta, 1.0);
}
template <class T>
void rotary_backward(T* dx, Count s, Count b, Count heads, Count d, double theta) {
  rotary_at(dx, nullptr, s, b, heads, d, theta, -1.0);
}

namespace {

// Scores of query i against keys 0..i for one (batch, head): scale * q_i . k_j.
template <class T>
void causal_scores(const T* q, const T* k, std::vector<double>& sc, Count i, Count bi, Count h,
                   Count s, Count b, Count a, Count g, Count d) {
  const Count hk = h / (a / g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const T* qi = q + qoff(i, bi, h, b, a, d);
  for (Count j = 0; j <= i; ++j) {
    const T* kj = k + qoff(j, bi, hk, b, g, d);
    double dot = 0;
    for (Count e = 0; e < d; ++e) dot += static_cast<double>(qi[e]) * kj[e];
    sc[j] = dot * scale;
  }
  (void)s;
}

// Query row i's causal softmax, unnormalised: sc[j] = exp(score_j - max) for j <= i (the stable
// form both attention cores share); returns the max and the sum of sc.
template <class T>
std::pair<double, double> causal_exp_row(const T* q, const T* k, std::vector<double>& sc, Count i,
                                         Count bi, Count h, Count s, Count b, Count a, Count g,
                                         Count d) {
  causal_scores(q, k, sc, i, bi, h, s, b, a, g, d);
  const double mx = *std::max_element(sc.begin(), sc.begin() + i + 1);
  double sum = 0;
  for (Count j = 0; j <= i; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
  return {mx, sum};
}

}  // namespace

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, Count s, Count b,
                       Count a, Count g, Count d) {
  std::vector<double> sc(static_cast<std::size_t>(s));
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h) {
      const Count hk = h / (a / g);
      for (Count i = 0; i < s; ++i) {
        const double sum = causal_exp_row(q, k, sc, i, bi, h, s, b, a, g, d).second;
        T* p = probs + ((bi * a + h) * s + i) * s;
        for (Count j = 0; j < s; ++j) p[j] = j <= i ? static_cast<T>(sc[j] / sum) : T(0);
        T* o = out + qoff(i, bi, h, b, a, d);
        for (Count e = 0; e < d; ++e) {
          double acc = 0;
          for (Count j = 0; j <= i; ++j) acc += p[j] * v[qoff(j, bi, hk, b, g, d) + e];
          o[e] = static_cast<T>(acc);
        }
      }
    }
}

namespace {

// Shared backward given the probabilities of row i (p, length i+1) and D_i = sum_j p_ij dp_ij.
template <class T>
void attention_row_backward(const T* dout, const T* q, const T* k, const T* v, const double* p,
                            double D, T* dq, T* dk, T* dv, Count i, Count bi, Count h, Count b,
                            Count a, Count g, Count d) {
  const Count hk = h / (a / g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const T* doi = dout + qoff(i, bi, h, b, a, d);
  const T* qi = q + qoff(i, bi, h, b, a, d);
  T* dqi = dq + qoff(i, bi, h, b, a, d);
  for (Count j = 0; j <= i; ++j) {
    const Count kj = qoff(j, bi, hk, b, g, d);
    double dp = 0;
    for (Count e = 0; e < d; ++e) dp += static_cast<double>(doi[e]) * v[kj + e];
    const double ds = p[j] * (dp - D) * scale;
    for (Count e = 0; e < d; ++e) {
      dv[kj + e] += static_cast<T>(p[j] * doi[e]);
      dqi[e] += static_cast<T>(ds * k[kj + e]);
      dk[kj + e] += static_cast<T>(ds * qi[e]);
    }
  }
}

template <class T>
void zero(T* x, Count n) {
  std::fill(x, x + n, T(0));
}

}  // namespace

template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* probs, T* dq,
                        T* dk, T* dv, Count s, Count b, Count a, Count g, Count d) {
  zero(dq, s * b * a * d);
  zero(dk, s * b * g * d);
  zero(dv, s * b * g * d);
  std::vector<double> p(static_cast<std::size_t>(s));
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h) {
      const Count hk = h / (a / g);
      for (Count i = 0; i < s; ++i) {
        const T* pr = probs + ((bi * a + h) * s + i) * s;
        const T* doi = dout + qoff(i, bi, h, b, a, d);
        double D = 0;
        for (Count j = 0; j <= i; ++j) {
          p[j] = pr[j];
          double dp = 0;
          for (Count e = 0; e < d; ++e)
            dp += static_cast<double>(doi[e]) * v[qoff(j, bi, hk, b, g, d) + e];
          D += p[j] * dp;
        }
        attention_row_backward(dout, q, k, v, p.data(), D, dq, dk, dv, i, bi, h, b, a, g, d);
      }
    }
}

template <class T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* out, T* lse, Count s, Count b,
                             Count a, Count g, Count d) {
  std::vector<double> sc(static_cast<std::size_t>(s));
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h) {
      const Count hk = h / (a / g);
      for (Count i = 0; i < s; ++i) {
        const auto [mx, sum] = causal_exp_row(q, k, sc, i, bi, h, s, b, a, g, d);
        lse[(bi * a + h) * s + i] = static_cast<T>(mx + std::log(sum));
        T* o = out + qoff(i, bi, h, b, a, d);
        for (Count e = 0; e < d; ++e) {
          double acc = 0;
          for (Count j = 0; j <= i; ++j) acc += sc[j] / sum * v[qoff(j, bi, hk, b, g, d) + e];
          o[e] = static_cast<T>(acc);
        }
      }
    }
}

template <class T>
void flash_attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, T* dq, T* dk, T* dv, Count s, Count b, Count a, Count g,
                              Count d) {
  zero(dq, s * b * a * d);
  zero(dk, s * b * g * d);
  zero(dv, s * b * g * d);
  std::vector<double> p(static_cast<std::size_t>(s));
  for (Count bi = 0; bi < b; ++bi)
    for (Count h = 0; h < a; ++h)
      for (Count i = 0; i < s; ++i) {
        causal_scores(q, k, p, i, bi, h, s, b, a, g, d);
        const double l = lse[(bi * a + h) * s + i];
        for (Count j = 0; j <= i; ++j) p[j] = std::exp(p[j] - l);
        const T* doi = dout + qoff(i, bi, h, b, a, d);
        const T* oi = out + qoff(i, bi, h, b, a, d);
        double D = 0;
        for (Count e = 0; e < d; ++e) D += static_cast<double>(doi[e]) * oi[e];
        attention_row_backward(dout, q, k, v, p.data(), D, dq, dk, dv, i, bi, h, b, a, g, d);
      }
}

template <class T>
void ce_local_max(const T* logits, T* row_max, Count N, Count V) {
  for (Count n = 0; n < N; ++n)
    row_max[n] = *std::max_element(logits + n * V, logits + (n + 1) * V);
}

template <class T>
void ce_local_sumexp(const T* logits, const T* row_max, T* sumexp, Count N, Count V) {
  for (Count n = 0; n < N; ++n) {
    double acc = 0;
    for (Count j = 0; j < V; ++j)
      acc += std::exp(static_cast<double>(logits[n * V + j]) - row_max[n]);
    sumexp[n] = static_cast<T>(acc);
  }
}

template <class T>
void ce_local_target(const T* logits, const std::int32_t* targets, T* target_logit, Count N,
                     Count V, Count vocab_start) {
  for (Count n = 0; n < N; ++n) {
    const Count j = targets[n] - vocab_start;
    target_logit[n] = (j >= 0 && j < V) ? logits[n * V + j] : T(0);
  }
}

template <class T>
void ce_loss(const T* row_max, const T* sumexp, const T* target_logit, T* loss, Count N) {
  for (Count n = 0; n < N; ++n) {
    loss[n] =
        static_cast<T>(std::log(static_cast<double>(sumexp[n])) + row_max[n] - target_logit[n]);
  }
}

template <class T>
void ce_softmax(const T* logits, const T* row_max, const T* sumexp, T* softmax, Count N, Count V) {
  for (Count n = 0; n < N; ++n)
    for (Count j = 0; j < V; ++j)
      softmax[n * V + j] =
          static_cast<T>(std::exp(static_cast<double>(logits[n * V + j]) - row_max[n]) / sumexp[n]);
}

template <class T>
void ce_softmax_grad(T* p, const std::int32_t* targets, Count N, Count V, Count vocab_start,
                     T scale) {
  for (Count n = 0; n < N; ++n) {
    const Count t = targets[n] - vocab_start;
    if (t >= 0 && t < V) p[n * V + t] -= T(1);
    for (Count j = 0; j < V; ++j) p[n * V + j] *= scale;
  }
}

template <class T>
void ce_backward(const T* logits, const T* row_max, const T* sumexp, const std::int32_t* targets,
                 const T* dloss, T* dlogits, Count N, Count V, Count vocab_start) {
  for (Count n = 0; n < N; ++n) {
    const Count t = targets[n] - vocab_start;
    for (Count j = 0; j < V; ++j) {
      const double p = std::exp(static_cast<double>(logits[n * V + j]) - row_max[n]) / sumexp[n];
      dlogits[n * V + j] = static_cast<T>((p - (j == t ? 1.0 : 0.0)) * dloss[n]);
    }
  }
}

void adam_step(float* master, const float* grad, float* m, float* v, Count n, const AdamConfig& c,
               Count step, float grad_scale) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
  for (Count i = 0; i < n; ++i) {
    float g = grad[i] * grad_scale;
    if (!c.decoupled) g += c.weight_decay * master[i];
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const double mh = m[i] / bc1, vh = v[i] / bc2;
    double upd = mh / (std::sqrt(vh) + c.eps);
    if (c.decoupled) upd += c.weight_decay * master[i];
    master[i] = static_cast<float>(master[i] - c.lr * upd);
  }
}

void sgd_step(float* master, const float* grad, float* momentum, Count n, float lr, float mu,
              float grad_scale) {
  for (Count i = 0; i < n; ++i) {
    momentum[i] = mu * momentum[i] + grad[i] * grad_scale;
    master[i] -= lr * momentum[i];
  }
}

bool has_overflow(const float* x, Count n) {
  for (Count i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return true;
  return false;
}

#define DISTPLAN_INSTANTIATE(T)                                                                    \
  template void embedding_forward<T>(const std::int32_t*, const T*, T*, Count, Count, Count,       \
                                     Count);                                                       \
  template void embedding_backward<T>(const std::int32_t*, const T*, T*, Count, Count, Count,      \
                                      Count);                                                      \
  template void add_position_forward<T>(const T*, T*, Count, Count, Count);                        \
  template void add_position_backward<T>(const T*, T*, Count, Count, Count);                       \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, T*, T*, Count, Count,       \
                                     double);                                                      \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,    \
                                      T*, Count, Count);                                           \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, Count, Count, double);              \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, Count, Count); \
  template void linear_forward<T>(const T*, const T*, const T*, T*, Count, Count, Count);          \
  template void linear_backward_input<T>(const T*, const T*, T*, Count, Count, Count);             \
  template void linear_backward_weight<T>(const T*, const T*, T*, T*, Count, Count, Count);        \
  template void gelu_forward<T>(const T*, T*, Count);                                              \
  template void gelu_backward<T>(const T*, const T*, T*, Count);                                   \
  template void swiglu_forward<T>(const T*, const T*, T*, Count);                                  \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, Count);                   \
  template void rotary_forward<T>(T*, Count, Count, Count, Count, double);                         \
  template void rotary_at<T>(T*, const Count*, Count, Count, Count, Count, double, double);        \
  template void rotary_backward<T>(T*, Count, Count, Count, Count, double);                        \
  template void attention_forward<T>(const T*, const T*, const T*, T*, T*, Count, Count, Count,    \
                                     Count, Count);                                                \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,    \
                                      T*, Count, Count, Count, Count, Count);                      \
  template void flash_attention_forward<T>(const T*, const T*, const T*, T*, T*, Count, Count,     \
                                           Count, Count, Count);                                   \
  template void flash_attention_backward<T>(const T*, const T*, const T*, const T*, const T*,      \
                                            const T*, T*, T*, T*, Count, Count, Count, Count,      \
                                            Count);                                                \
  template void ce_local_max<T>(const T*, T*, Count, Count);                                       \
  template void ce_local_sumexp<T>(const T*, const T*, T*, Count, Count);                          \
  template void ce_local_target<T>(const T*, const std::int32_t*, T*, Count, Count, Count);        \
  template void ce_loss<T>(const T*, const T*, const T*, T*, Count);                               \
  template void ce_softmax<T>(const T*, const T*, const T*, T*, Count, Count);                     \
  template void ce_softmax_grad<T>(T*, const std::int32_t*, Count, Count, Count, T);               \
  template void ce_backward<T>(const T*, const T*, const T*, const std::int32_t*, const T*, T*,    \
                               Count, Count, Count);

DISTPLAN_INSTANTIATE(float)
DISTPLAN_INSTANTIATE(double)

}  // namespace distplan::backend::cpu
