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
#include <tuple>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/device_ops.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/gpu_backend/tensor.h"

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

// `v` written at element `offset` of a tensor of `dtype` on `alloc`'s device (a parameter inside
// a unit's flat weights).
Tensor at_offset(TrackingAllocator& alloc, const Vec& v, Count offset, DType dtype) {
  Tensor t(alloc, {offset + static_cast<Count>(v.size())}, dtype, MemoryTag::weights);
  t.write(v.data(), static_cast<Count>(v.size()), offset);
  return t;
}

// Every dispatched op on fixed inputs, through cpu:: directly (`direct`) or dev:: on `d`.
Outputs run_ops(bool direct, Device d) {
  Outputs o;
  TrackingAllocator alloc(d);
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
      const Tensor t = at_offset(alloc, table, 5, DType::fp32);
      dev::embedding_forward(d, ids.data(), t, 5, e.data(), N, C, V0, V);
      dev::embedding_backward(d, ids.data(), dy.data(), dt.data(), N, C, V0, V);
      dev::ce_local_max(d, logits.data(), mx.data(), N, V);
      dev::ce_local_sumexp(d, logits.data(), mx.data(), se.data(), N, V);
      dev::ce_local_target(d, logits.data(), targets.data(), tl.data(), N, V, V0);
    }
    o["emb.out"] = e, o["emb.dtable"] = dt, o["ce.max"] = mx, o["ce.sumexp"] = se;
    o["ce.target"] = tl;
  }
  {  // GEMMs of a weight held in a tensor, at an offset inside it.
    const Count I = C, O = 40;
    const Vec w = random(O * I, 19), bias = random(O, 20), dyo = random(N * O, 21);
    Vec y(N * O), dx(N * I);
    if (direct) {
      cpu::linear_forward(x.data(), w.data(), bias.data(), y.data(), N, I, O);
      cpu::linear_backward_input(dyo.data(), w.data(), dx.data(), N, I, O);
    } else {
      const Tensor t = at_offset(alloc, w, 7, DType::fp32);
      dev::linear_forward(d, x.data(), t, 7, bias.data(), y.data(), N, I, O);
      dev::linear_backward_input(d, dyo.data(), t, 7, dx.data(), N, I, O);
    }
    o["linear.y"] = y, o["linear.dx"] = dx;
  }
  for (const DType dt : {DType::fp32, DType::bf16}) {  // A gradient accumulated where it lives.
    Vec start = random(N * C, 22);
    for (float& e : start) e = round_to(dt, e);
    const Vec add = random(N * C, 23);
    Vec sum(N * C);
    if (direct) {
      for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = round_to(dt, start[k] + add[k]);
    } else {
      Tensor t = at_offset(alloc, start, 9, dt);
      dev::add_into(d, t, 9, add.data(), N * C);
      t.read(sum.data(), N * C, 9);
    }
    o[dt == DType::fp32 ? "add_into.fp32" : "add_into.bf16"] = sum;
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

// The 16-bit weights run as they are stored, on tensor cores: x is cast to the weight's dtype on
// the device, so against the oracle on the same rounded inputs only the accumulation order and
// the result's rounding differ (bound 1e-2, cuda_ops_test.cpp). Shapes: empty, odd, several
// tiles.
TEST(CudaOps, TensorWeightGemmsMatchTheOracleInTheirStoredDtype) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible";
  TrackingAllocator alloc(Device::cuda);
  for (const DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (const auto& [n, i, o] :
         {std::tuple<Count, Count, Count>{0, 8, 8}, {1, 1, 1}, {37, 65, 129}, {300, 257, 515}}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(dt)) + " " + std::to_string(n) + "x" +
                   std::to_string(i) + "x" + std::to_string(o));
      // Inputs already representable in the dtype, as the trainer's rounded activations are.
      auto rounded = [dt](Vec v) {
        for (float& e : v) e = round_to(dt, e);
        return v;
      };
      const Vec x = rounded(random(static_cast<std::size_t>(n * i), 31));
      const Vec w = rounded(random(static_cast<std::size_t>(o * i), 32));
      const Vec dy = rounded(random(static_cast<std::size_t>(n * o), 33)), bias = random(o, 34);
      Vec y(n * o), dx(n * i), want_y(n * o), want_dx(n * i);
      cpu::linear_forward(x.data(), w.data(), bias.data(), want_y.data(), n, i, o);
      cpu::linear_backward_input(dy.data(), w.data(), want_dx.data(), n, i, o);
      const Tensor t = at_offset(alloc, w, 3, dt);
      dev::linear_forward(Device::cuda, x.data(), t, 3, bias.data(), y.data(), n, i, o);
      dev::linear_backward_input(Device::cuda, dy.data(), t, 3, dx.data(), n, i, o);
      const double tol = dt == DType::fp32 ? 1e-5 : 1e-2;
      if (n > 0) {
        EXPECT_LT(nerr(y, want_y), tol);
        EXPECT_LT(nerr(dx, want_dx), tol);
      }
    }
  }
}

}  // namespace
}  // namespace distplan::backend
