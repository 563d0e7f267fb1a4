// Every CPU op's backward against a float64 central finite difference of the forward.
// The scalar probed is L = sum(out * r) for a fixed random r, so dL/dout = r is what the backward
// receives; each input element is perturbed by +-1e-6 and (L+ - L-)/2e-6 compared with the
// analytic gradient (truncation error O(eps^2), far below the 1e-6 tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"

namespace distplan::backend::cpu {
namespace {

using Vec = std::vector<double>;

Vec random_vec(std::size_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(gen);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` with the finite-difference gradient of `loss` w.r.t. `x`.
void expect_grad(const std::function<double()>& loss, Vec& x, const Vec& analytic,
                 const char* what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  constexpr double eps = 1e-6;
  double max_err = 0, max_ref = 1e-3;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double lp = loss();
    x[i] = keep - eps;
    const double lm = loss();
    x[i] = keep;
    const double fd = (lp - lm) / (2 * eps);
    max_err = std::max(max_err, std::abs(fd - analytic[i]));
    max_ref = std::max(max_ref, std::abs(fd));
  }
  EXPECT_LT(max_err / max_ref, 1e-6) << what;
}

TEST(CpuOps, LinearBackwardMatchesFiniteDifference) {
  const Count N = 5, I = 4, O = 3;
  Vec x = random_vec(N * I, 1), w = random_vec(O * I, 2), bias = random_vec(O, 3),
      r = random_vec(N * O, 4);
  auto loss = [&] {
    Vec y(N * O);
    linear_forward(x.data(), w.data(), bias.data(), y.data(), N, I, O);
    return dot(y, r);
  };
  Vec dx(N * I), dw(O * I, 0.0), db(O, 0.0);
  linear_backward_input(r.data(), w.data(), dx.data(), N, I, O);
  linear_backward_weight(r.data(), x.data(), dw.data(), db.data(), N, I, O);
  expect_grad(loss, x, dx, "dx");
  expect_grad(loss, w, dw, "dw");
  expect_grad(loss, bias, db, "dbias");
}

TEST(CpuOps, LayerNormBackwardMatchesFiniteDifference) {
  const Count N = 3, C = 8;
  Vec x = random_vec(N * C, 5), g = random_vec(C, 6, 0.5, 1.5), be = random_vec(C, 7),
      r = random_vec(N * C, 8);
  Vec mean(N), rstd(N);
  auto loss = [&] {
    Vec y(N * C);
    layernorm_forward(x.data(), g.data(), be.data(), y.data(), mean.data(), rstd.data(), N, C,
                      1e-5);
    return dot(y, r);
  };
  loss();
  Vec dx(N * C), dg(C, 0.0), db(C, 0.0);
  layernorm_backward(r.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                     db.data(), N, C);
  expect_grad(loss, x, dx, "dx");
  expect_grad(loss, g, dg, "dgamma");
  expect_grad(loss, be, db, "dbeta");
}

TEST(CpuOps, RmsNormBackwardMatchesFiniteDifference) {
  const Count N = 3, C = 8;
  Vec x = random_vec(N * C, 9), g = random_vec(C, 10, 0.5, 1.5), r = random_vec(N * C, 11);
  Vec rstd(N);
  auto loss = [&] {
    Vec y(N * C);
    rmsnorm_forward(x.data(), g.data(), y.data(), rstd.data(), N, C, 1e-5);
    return dot(y, r);
  };
  loss();
  Vec dx(N * C), dg(C, 0.0);
  rmsnorm_backward(r.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), N, C);
  expect_grad(loss, x, dx, "dx");
  expect_grad(loss, g, dg, "dgamma");
}

TEST(CpuOps, GeluAndSwigluBackwardMatchFiniteDifference) {
  const Count n = 17;
  Vec x = random_vec(n, 12, -3, 3), up = random_vec(n, 13), r = random_vec(n, 14);
  auto gelu_loss = [&] {
    Vec y(n);
    gelu_forward(x.data(), y.data(), n);
    return dot(y, r);
  };
  Vec dx(n);
  gelu_backward(r.data(), x.data(), dx.data(), n);
  expect_grad(gelu_loss, x, dx, "gelu dx");

  auto swiglu_loss = [&] {
    Vec y(n);
    swiglu_forward(x.data(), up.data(), y.data(), n);
    return dot(y, r);
  };
  Vec dg(n), du(n);
  swiglu_backward(r.data(), x.data(), up.data(), dg.data(), du.data(), n);
  expect_grad(swiglu_loss, x, dg, "swiglu dgate");
  expect_grad(swiglu_loss, up, du, "swiglu dup");
}

TEST(CpuOps, EmbeddingAndPositionBackwardMatchFiniteDifference) {
  const Count s = 3, b = 2, N = s * b, C = 4, V = 5, start = 2;
  std::vector<std::int32_t> ids = {2, 3, 6, 0, 4, 3};  // rows [2, 7): id 0 is another shard's
  Vec table = random_vec(V * C, 15), pos = random_vec(s * C, 16), r = random_vec(N * C, 17);
  auto loss = [&] {
    Vec y(N * C);
    embedding_forward(ids.data(), table.data(), y.data(), N, C, start, V);
    add_position_forward(pos.data(), y.data(), s, b, C);
    return dot(y, r);
  };
  Vec dt(V * C, 0.0), dp(s * C, 0.0);
  embedding_backward(ids.data(), r.data(), dt.data(), N, C, start, V);
  add_position_backward(r.data(), dp.data(), s, b, C);
  expect_grad(loss, table, dt, "dtable");
  expect_grad(loss, pos, dp, "dpos");
  // Token id 0 lies outside this shard's rows [2, 7): its output row holds only the position.
  Vec y(N * C);
  embedding_forward(ids.data(), table.data(), y.data(), N, C, start, V);
  for (Count c = 0; c < C; ++c) EXPECT_EQ(y[3 * C + c], 0.0);
}

TEST(CpuOps, RotaryBackwardIsTheInverseRotation) {
  const Count s = 4, b = 2, heads = 2, d = 8;
  Vec x = random_vec(s * b * heads * d, 18), r = random_vec(x.size(), 19);
  auto loss = [&] {
    Vec y = x;
    rotary_forward(y.data(), s, b, heads, d, 10000.0);
    return dot(y, r);
  };
  Vec dx = r;
  rotary_backward(dx.data(), s, b, heads, d, 10000.0);
  expect_grad(loss, x, dx, "rotary dx");
}

class AttentionTest : public ::testing::TestWithParam<bool> {};

TEST_P(AttentionTest, BackwardMatchesFiniteDifference) {
  const bool flash = GetParam();
  const Count s = 5, b = 2, a = 4, g = 2, d = 3;  // GQA: two query heads per key/value head
  Vec q = random_vec(s * b * a * d, 20), k = random_vec(s * b * g * d, 21),
      v = random_vec(s * b * g * d, 22), r = random_vec(s * b * a * d, 23);
  Vec out(q.size()), probs(b * a * s * s), lse(b * a * s);
  auto run = [&] {
    if (flash) {
      flash_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), s, b, a, g, d);
    } else {
      attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, b, a, g, d);
    }
  };
  auto loss = [&] {
    run();
    return dot(out, r);
  };
  run();
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  if (flash) {
    flash_attention_backward(r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                             dq.data(), dk.data(), dv.data(), s, b, a, g, d);
  } else {
    attention_backward(r.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(), dk.data(),
                       dv.data(), s, b, a, g, d);
  }
  expect_grad(loss, q, dq, "dq");
  expect_grad(loss, k, dk, "dk");
  expect_grad(loss, v, dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(StandardAndFlash, AttentionTest, ::testing::Values(false, true));

TEST(CpuOps, FlashAndStandardAttentionAgree) {
  const Count s = 6, b = 1, a = 2, g = 2, d = 4;
  Vec q = random_vec(s * b * a * d, 24), k = random_vec(s * b * g * d, 25),
      v = random_vec(s * b * g * d, 26);
  Vec o1(q.size()), o2(q.size()), probs(b * a * s * s), lse(b * a * s);
  attention_forward(q.data(), k.data(), v.data(), o1.data(), probs.data(), s, b, a, g, d);
  flash_attention_forward(q.data(), k.data(), v.data(), o2.data(), lse.data(), s, b, a, g, d);
  for (std::size_t i = 0; i < o1.size(); ++i) EXPECT_NEAR(o1[i], o2[i], 1e-12);
  // Causality: the first query sees only the first key, so its output is v_0 exactly.
  for (Count e = 0; e < d; ++e) EXPECT_NEAR(o1[e], v[e], 1e-12);
}

TEST(CpuOps, VocabParallelCrossEntropyMatchesFiniteDifferenceAcrossShards) {
  // Two shards of a vocab of 6, combined as the TP reductions would (max, sum, sum).
  const Count N = 4, V = 6, Vl = 3;
  std::vector<std::int32_t> targets = {0, 4, 2, 5};
  Vec logits = random_vec(N * V, 27, -2, 2), r = random_vec(N, 28);
  auto shard = [&](const Vec& full, int t) {
    Vec out(N * Vl);
    for (Count n = 0; n < N; ++n)
      for (Count j = 0; j < Vl; ++j) out[n * Vl + j] = full[n * V + t * Vl + j];
    return out;
  };
  auto combine = [&](Vec& mx, Vec& se, Vec& tl) {
    Vec m0(N), m1(N);
    ce_local_max(shard(logits, 0).data(), m0.data(), N, Vl);
    ce_local_max(shard(logits, 1).data(), m1.data(), N, Vl);
    for (Count n = 0; n < N; ++n) mx[n] = std::max(m0[n], m1[n]);
    Vec s0(N), s1(N), t0(N), t1(N);
    ce_local_sumexp(shard(logits, 0).data(), mx.data(), s0.data(), N, Vl);
    ce_local_sumexp(shard(logits, 1).data(), mx.data(), s1.data(), N, Vl);
    ce_local_target(shard(logits, 0).data(), targets.data(), t0.data(), N, Vl, 0);
    ce_local_target(shard(logits, 1).data(), targets.data(), t1.data(), N, Vl, Vl);
    for (Count n = 0; n < N; ++n) {
      se[n] = s0[n] + s1[n];
      tl[n] = t0[n] + t1[n];
    }
  };
  auto loss = [&] {
    Vec mx(N), se(N), tl(N), l(N);
    combine(mx, se, tl);
    ce_loss(mx.data(), se.data(), tl.data(), l.data(), N);
    return dot(l, r);
  };
  Vec mx(N), se(N), tl(N);
  combine(mx, se, tl);
  Vec grad(N * V);
  for (int t = 0; t < 2; ++t) {
    Vec g(N * Vl);
    ce_backward(shard(logits, t).data(), mx.data(), se.data(), targets.data(), r.data(), g.data(),
                N, Vl, t * Vl);
    for (Count n = 0; n < N; ++n)
      for (Count j = 0; j < Vl; ++j) grad[n * V + t * Vl + j] = g[n * Vl + j];
  }
  expect_grad(loss, logits, grad, "dlogits");
}

TEST(CpuOps, AdamStepMatchesClosedFormFirstStep) {
  // After one step from zero moments, m_hat = g and v_hat = g^2, so the update is
  // lr * g / (|g| + eps) = lr * sign(g) (Kingma & Ba 2015, sec. 2) plus decoupled decay lr*wd*p.
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -0.1f, 0.0f}, m(3, 0.f), v(3, 0.f);
  AdamConfig c;
  c.lr = 0.01f;
  c.weight_decay = 0.1f;
  c.eps = 0.0f;
  const std::vector<float> p0 = p;
  adam_step(p.data(), g.data(), m.data(), v.data(), 2, c, 1, 1.0f);
  EXPECT_NEAR(p[0], p0[0] - 0.01f * (1.0f + 0.1f * p0[0]), 1e-6);
  EXPECT_NEAR(p[1], p0[1] - 0.01f * (-1.0f + 0.1f * p0[1]), 1e-6);
  EXPECT_EQ(p[2], p0[2]);  // n = 2: the third element is untouched
}

TEST(CpuOps, SgdMomentumAccumulatesVelocity) {
  std::vector<float> p = {1.0f}, g = {2.0f}, buf = {0.0f};
  sgd_step(p.data(), g.data(), buf.data(), 1, 0.1f, 0.9f, 0.5f);  // buf = 1, p = 0.9
  sgd_step(p.data(), g.data(), buf.data(), 1, 0.1f, 0.9f, 0.5f);  // buf = 1.9, p = 0.71
  EXPECT_NEAR(buf[0], 1.9f, 1e-6);
  EXPECT_NEAR(p[0], 0.71f, 1e-6);
}

TEST(CpuOps, OverflowCheckFindsInfAndNan) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f};
  EXPECT_FALSE(has_overflow(x.data(), 3));
  x[1] = INFINITY;
  EXPECT_TRUE(has_overflow(x.data(), 3));
  x[1] = NAN;
  EXPECT_TRUE(has_overflow(x.data(), 3));
}

}  // namespace
}  // namespace distplan::backend::cpu
