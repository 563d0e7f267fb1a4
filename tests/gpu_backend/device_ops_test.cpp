// The trainer's device-dispatch layer (device_ops.h): on the CPU it is the oracle itself, bit for
// bit; on CUDA (skipped without a GPU) every op matches the oracle by normalised error below 1e-5
// (fp32 kernels, the bound of cuda_ops_test.cpp) and keeps the oracle's accumulate/overwrite
// contract: weight gradients start from non-zero values and must accumulate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/device_ops.h"
#include "distplan/gpu_backend/run.h"

namespace distplan::backend {
namespace {

using Vec = std::vector<float>;
using Outputs = std::map<std::string, Vec>;

Vec random(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Vec v(n);
  for (float& x : v) x = d(g);
  return v;
}

constexpr Count N = 16, C = 24, s = 8, b = 2, a = 4, g = 2, hd = 8, V = 16, V0 = 8;

// Every dispatched op on fixed inputs, through cpu:: directly (`direct`) or dev:: on `d`.
Outputs run_ops(bool direct, Device d) {
  Outputs o;
  const Vec x = random(N * C, 1), gamma = random(C, 2), beta = random(C, 3), dy = random(N * C, 4);
  {  // LayerNorm; dgamma/dbeta accumulate onto non-zero starts.
    Vec y(N * C), mean(N), rstd(N), dx(N * C), dg = random(C, 5), db = random(C, 6);
    if (direct) {
      cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                             rstd.data(), N, C, 1e-5);
      cpu::layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                              dx.data(), dg.data(), db.data(), N, C);
    } else {
      dev::layernorm_forward(d, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                             rstd.data(), N, C, 1e-5);
      dev::layernorm_backward(d, dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                              dx.data(), dg.data(), db.data(), N, C);
    }
    o["ln.y"] = y, o["ln.mean"] = mean, o["ln.rstd"] = rstd, o["ln.dx"] = dx, o["ln.dg"] = dg;
    o["ln.db"] = db;
  }
  {  // RMSNorm.
    Vec y(N * C), rstd(N), dx(N * C), dg = random(C, 7);
    if (direct) {
      cpu::rmsnorm_forward(x.data(), gamma.data(), y.data(), rstd.data(), N, C, 1e-5);
      cpu::rmsnorm_backward(dy.data(), x.data(), gamma.data(), rstd.data(), dx.data(), dg.data(), N,
                            C);
    } else {
      dev::rmsnorm_forward(d, x.data(), gamma.data(), y.data(), rstd.data(), N, C, 1e-5);
      dev::rmsnorm_backward(d, dy.data(), x.data(), gamma.data(), rstd.data(), dx.data(), dg.data(),
                            N, C);
    }
    o["rms.y"] = y, o["rms.rstd"] = rstd, o["rms.dx"] = dx, o["rms.dg"] = dg;
  }
  {  // GeLU and SwiGLU.
    const Count n = N * C;
    const Vec up = random(n, 8);
    Vec y(n), dx(n), sy(n), dgate(n), dup(n);
    if (direct) {
      cpu::gelu_forward(x.data(), y.data(), n);
      cpu::gelu_backward(dy.data(), x.data(), dx.data(), n);
      cpu::swiglu_forward(x.data(), up.data(), sy.data(), n);
      cpu::swiglu_backward(dy.data(), x.data(), up.data(), dgate.data(), dup.data(), n);
    } else {
      dev::gelu_forward(d, x.data(), y.data(), n);
      dev::gelu_backward(d, dy.data(), x.data(), dx.data(), n);
      dev::swiglu_forward(d, x.data(), up.data(), sy.data(), n);
      dev::swiglu_backward(d, dy.data(), x.data(), up.data(), dgate.data(), dup.data(), n);
    }
    o["gelu.y"] = y, o["gelu.dx"] = dx, o["swiglu.y"] = sy, o["swiglu.dgate"] = dgate;
    o["swiglu.dup"] = dup;
  }
  {  // Causal attention with grouped key/value heads; dq, dk, dv start non-zero (overwritten).
    const Vec q = random(s * b * a * hd, 9), k = random(s * b * g * hd, 10),
              v = random(s * b * g * hd, 11), dout = random(s * b * a * hd, 12);
    Vec out(q.size()), probs(static_cast<std::size_t>(b * a * s * s)),
        dq = random(q.size(), 13), dk = random(k.size(), 14), dv = random(v.size(), 15);
    if (direct) {
      cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, b, a, g,
                             hd);
      cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(),
                              dk.data(), dv.data(), s, b, a, g, hd);
    } else {
      dev::attention_forward(d, q.data(), k.data(), v.data(), out.data(), probs.data(), s, b, a, g,
                             hd);
      dev::attention_backward(d, dout.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(),
                              dk.data(), dv.data(), s, b, a, g, hd);
    }
    o["attn.out"] = out, o["attn.probs"] = probs, o["attn.dq"] = dq, o["attn.dk"] = dk;
    o["attn.dv"] = dv;
  }
  {  // Vocab-parallel embedding and cross-entropy pieces over rows [V0, V0 + V) of 2V.
    std::vector<std::int32_t> ids(N), targets(N);
    for (Count n = 0; n < N; ++n) {
      ids[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 7) % (2 * V));
      targets[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 5 + 3) % (2 * V));
    }
    const Vec table = random(V * C, 16), logits = random(N * V, 17);
    Vec e(N * C), dt = random(V * C, 18), mx(N), se(N), tl(N);
    if (direct) {
      cpu::embedding_forward(ids.data(), table.data(), e.data(), N, C, V0, V);
      cpu::embedding_backward(ids.data(), dy.data(), dt.data(), N, C, V0, V);
      cpu::ce_local_max(logits.data(), mx.data(), N, V);
      cpu::ce_local_sumexp(logits.data(), mx.data(), se.data(), N, V);
      cpu::ce_local_target(logits.data(), targets.data(), tl.data(), N, V, V0);
    } else {
      dev::embedding_forward(d, ids.data(), table.data(), e.data(), N, C, V0, V);
      dev::embedding_backward(d, ids.data(), dy.data(), dt.data(), N, C, V0, V);
      dev::ce_local_max(d, logits.data(), mx.data(), N, V);
      dev::ce_local_sumexp(d, logits.data(), mx.data(), se.data(), N, V);
      dev::ce_local_target(d, logits.data(), targets.data(), tl.data(), N, V, V0);
    }
    o["emb.out"] = e, o["emb.dtable"] = dt, o["ce.max"] = mx, o["ce.sumexp"] = se;
    o["ce.target"] = tl;
  }
  return o;
}

double nerr(const Vec& got, const Vec& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

TEST(CpuOps, DeviceDispatchOnTheCpuIsTheOracleBitForBit) {
  const Outputs oracle = run_ops(true, Device::cpu), got = run_ops(false, Device::cpu);
  ASSERT_EQ(got.size(), oracle.size());
  for (const auto& [name, want] : oracle) {
    SCOPED_TRACE(name);
    ASSERT_EQ(got.at(name).size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(want[i])) << i;
      // Bitwise equality, NaN-free (asserted above), so == is exact.
      ASSERT_EQ(got.at(name)[i], want[i]) << i;
    }
  }
}

TEST(CudaOps, DeviceDispatchMatchesTheOracleAndItsAccumulation) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible";
  const Outputs oracle = run_ops(true, Device::cpu), got = run_ops(false, Device::cuda);
  ASSERT_EQ(got.size(), oracle.size());
  for (const auto& [name, want] : oracle) {
    SCOPED_TRACE(name);
    ASSERT_EQ(got.at(name).size(), want.size());
    EXPECT_LT(nerr(got.at(name), want), 1e-5);
  }
}

}  // namespace
}  // namespace distplan::backend
