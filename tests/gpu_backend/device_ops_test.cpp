// The trainer's device-dispatch layer (device_ops.h) on arrays of the device (device_array.h): on
// the CPU it is the oracle itself, bit for bit; on CUDA (skipped without a GPU) every op, run on
// device memory with no host staging, matches the oracle by normalised error below 1e-5 (fp32
// kernels, the bound of cuda_ops_test.cpp) and keeps the oracle's accumulate/overwrite contract:
// gradients that accumulate start from non-zero values, outputs that are overwritten too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/device_array.h"
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

// Every dispatched op on fixed inputs, through cpu:: directly (`direct`) or dev:: on `d`, whose
// arrays live on `d` (device_array.h): inputs go up before the ops and outputs come back after.
Outputs run_ops(bool direct, Device d) {
  Outputs o;
  TrackingAllocator alloc(d);
  auto up = [d](const Vec& v) { return DeviceFloats::from_host(d, v); };
  auto up_ids = [d](const std::vector<std::int32_t>& v) { return DeviceIds::from_host(d, v); };
  const Vec x = random(N * C, 1), gamma = random(C, 2), beta = random(C, 3), dy = random(N * C, 4);
  const DeviceFloats X = up(x), G = up(gamma), B = up(beta), DY = up(dy);
  {  // LayerNorm; dgamma/dbeta accumulate onto non-zero starts.
    Vec y(N * C), mean(N), rstd(N), dx(N * C), dg = random(C, 5), db = random(C, 6);
    if (direct) {
      cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                             rstd.data(), N, C, 1e-5);
      cpu::layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                              dx.data(), dg.data(), db.data(), N, C);
    } else {
      DeviceFloats Y(d, N * C), M(d, N), R(d, N), DX(d, N * C), DG = up(dg), DB = up(db);
      dev::layernorm_forward(d, X.data(), G.data(), B.data(), Y.data(), M.data(), R.data(), N, C,
                             1e-5);
      dev::layernorm_backward(d, DY.data(), X.data(), G.data(), M.data(), R.data(), DX.data(),
                              DG.data(), DB.data(), N, C);
      y = Y.to_host(), mean = M.to_host(), rstd = R.to_host(), dx = DX.to_host();
      dg = DG.to_host(), db = DB.to_host();
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
      DeviceFloats Y(d, N * C), R(d, N), DX(d, N * C), DG = up(dg);
      dev::rmsnorm_forward(d, X.data(), G.data(), Y.data(), R.data(), N, C, 1e-5);
      dev::rmsnorm_backward(d, DY.data(), X.data(), G.data(), R.data(), DX.data(), DG.data(), N, C);
      y = Y.to_host(), rstd = R.to_host(), dx = DX.to_host(), dg = DG.to_host();
    }
    o["rms.y"] = y, o["rms.rstd"] = rstd, o["rms.dx"] = dx, o["rms.dg"] = dg;
  }
  {  // GeLU and SwiGLU.
    const Count n = N * C;
    const Vec up_in = random(n, 8);
    Vec y(n), dx(n), sy(n), dgate(n), dup(n);
    if (direct) {
      cpu::gelu_forward(x.data(), y.data(), n);
      cpu::gelu_backward(dy.data(), x.data(), dx.data(), n);
      cpu::swiglu_forward(x.data(), up_in.data(), sy.data(), n);
      cpu::swiglu_backward(dy.data(), x.data(), up_in.data(), dgate.data(), dup.data(), n);
    } else {
      const DeviceFloats U = up(up_in);
      DeviceFloats Y(d, n), DX(d, n), SY(d, n), DGATE(d, n), DUP(d, n);
      dev::gelu_forward(d, X.data(), Y.data(), n);
      dev::gelu_backward(d, DY.data(), X.data(), DX.data(), n);
      dev::swiglu_forward(d, X.data(), U.data(), SY.data(), n);
      dev::swiglu_backward(d, DY.data(), X.data(), U.data(), DGATE.data(), DUP.data(), n);
      y = Y.to_host(), dx = DX.to_host(), sy = SY.to_host(), dgate = DGATE.to_host();
      dup = DUP.to_host();
    }
    o["gelu.y"] = y, o["gelu.dx"] = dx, o["swiglu.y"] = sy, o["swiglu.dgate"] = dgate;
    o["swiglu.dup"] = dup;
  }
  {  // Causal attention (standard and flash) with grouped key/value heads and rotary embedding;
     // dq, dk, dv start non-zero (overwritten).
    const Vec q = random(s * b * a * hd, 9), k = random(s * b * g * hd, 10),
              v = random(s * b * g * hd, 11), dout = random(s * b * a * hd, 12);
    Vec out(q.size()), probs(static_cast<std::size_t>(b * a * s * s)),
        dq = random(q.size(), 13), dk = random(k.size(), 14), dv = random(v.size(), 15);
    Vec fout(q.size()), lse(static_cast<std::size_t>(b * a * s)), fdq = dq, fdk = dk, fdv = dv;
    Vec rq = q, rdq = dout;
    if (direct) {
      cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, b, a, g,
                             hd);
      cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(),
                              dk.data(), dv.data(), s, b, a, g, hd);
      cpu::flash_attention_forward(q.data(), k.data(), v.data(), fout.data(), lse.data(), s, b, a,
                                   g, hd);
      cpu::flash_attention_backward(dout.data(), q.data(), k.data(), v.data(), fout.data(),
                                    lse.data(), fdq.data(), fdk.data(), fdv.data(), s, b, a, g, hd);
      cpu::rotary_forward(rq.data(), s, b, a, hd, 10000.0);
      cpu::rotary_backward(rdq.data(), s, b, a, hd, 10000.0);
    } else {
      const DeviceFloats Q = up(q), K = up(k), V_ = up(v), DO = up(dout);
      DeviceFloats OUT(d, static_cast<Count>(q.size())), P(d, b * a * s * s),
          DQ = up(dq), DK = up(dk), DV = up(dv), FO(d, static_cast<Count>(q.size())),
          L(d, b * a * s), FDQ = up(fdq), FDK = up(fdk), FDV = up(fdv), RQ = up(rq), RDQ = up(rdq);
      dev::attention_forward(d, Q.data(), K.data(), V_.data(), OUT.data(), P.data(), s, b, a, g,
                             hd);
      dev::attention_backward(d, DO.data(), Q.data(), K.data(), V_.data(), P.data(), DQ.data(),
                              DK.data(), DV.data(), s, b, a, g, hd);
      dev::flash_attention_forward(d, Q.data(), K.data(), V_.data(), FO.data(), L.data(), s, b, a,
                                   g, hd);
      dev::flash_attention_backward(d, DO.data(), Q.data(), K.data(), V_.data(), FO.data(),
                                    L.data(), FDQ.data(), FDK.data(), FDV.data(), s, b, a, g, hd);
      dev::rotary_forward(d, RQ.data(), s, b, a, hd, 10000.0);
      dev::rotary_backward(d, RDQ.data(), s, b, a, hd, 10000.0);
      out = OUT.to_host(), probs = P.to_host(), dq = DQ.to_host(), dk = DK.to_host();
      dv = DV.to_host(), fout = FO.to_host(), lse = L.to_host(), fdq = FDQ.to_host();
      fdk = FDK.to_host(), fdv = FDV.to_host(), rq = RQ.to_host(), rdq = RDQ.to_host();
    }
    o["attn.out"] = out, o["attn.probs"] = probs, o["attn.dq"] = dq, o["attn.dk"] = dk;
    o["attn.dv"] = dv, o["flash.out"] = fout, o["flash.lse"] = lse, o["flash.dq"] = fdq;
    o["flash.dk"] = fdk, o["flash.dv"] = fdv, o["rope.fwd"] = rq, o["rope.bwd"] = rdq;
  }
  {  // Vocab-parallel embedding and cross-entropy over rows [V0, V0 + V) of 2V.
    std::vector<std::int32_t> ids(N), targets(N);
    for (Count n = 0; n < N; ++n) {
      ids[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 7) % (2 * V));
      targets[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 5 + 3) % (2 * V));
    }
    const Vec table = random(V * C, 16), logits = random(N * V, 17);
    Vec e(N * C), dt = random(V * C, 18), mx(N), se(N), tl(N), sm(N * V);
    const float scale = 0.375f;
    if (direct) {
      cpu::embedding_forward(ids.data(), table.data(), e.data(), N, C, V0, V);
      cpu::embedding_backward(ids.data(), dy.data(), dt.data(), N, C, V0, V);
      cpu::ce_local_max(logits.data(), mx.data(), N, V);
      cpu::ce_local_sumexp(logits.data(), mx.data(), se.data(), N, V);
      cpu::ce_local_target(logits.data(), targets.data(), tl.data(), N, V, V0);
      // d loss / d logits by cpu::ce_backward, a second code path: (softmax - onehot) * scale.
      const Vec dloss(N, scale);
      cpu::ce_backward(logits.data(), mx.data(), se.data(), targets.data(), dloss.data(), sm.data(),
                       N, V, V0);
    } else {
      const Tensor t = at_offset(alloc, table, 5, DType::fp32);
      const DeviceIds I = up_ids(ids), T = up_ids(targets);
      const DeviceFloats Lg = up(logits);
      DeviceFloats E(d, N * C), DT = up(dt), MX(d, N), SE(d, N), TL(d, N), SM(d, N * V);
      dev::embedding_forward(d, I.data(), t, 5, E.data(), N, C, V0, V);
      dev::embedding_backward(d, I.data(), DY.data(), DT.data(), N, C, V0, V);
      dev::ce_local_max(d, Lg.data(), MX.data(), N, V);
      dev::ce_local_sumexp(d, Lg.data(), MX.data(), SE.data(), N, V);
      dev::ce_local_target(d, Lg.data(), T.data(), TL.data(), N, V, V0);
      dev::ce_softmax(d, Lg.data(), MX.data(), SE.data(), SM.data(), N, V);
      dev::ce_softmax_grad(d, SM.data(), T.data(), N, V, V0, scale);
      e = E.to_host(), dt = DT.to_host(), mx = MX.to_host(), se = SE.to_host();
      tl = TL.to_host(), sm = SM.to_host();
    }
    o["emb.out"] = e, o["emb.dtable"] = dt, o["ce.max"] = mx, o["ce.sumexp"] = se;
    o["ce.target"] = tl, o["ce.dlogits"] = sm;
  }
  {  // GEMMs of a weight held in a tensor, at an offset inside it; the weight gradient accumulates.
    const Count I = C, O = 40;
    const Vec w = random(O * I, 19), bias = random(O, 20), dyo = random(N * O, 21);
    Vec y(N * O), dx(N * I), dw = random(O * I, 24), dbias = random(O, 25);
    if (direct) {
      cpu::linear_forward(x.data(), w.data(), bias.data(), y.data(), N, I, O);
      cpu::linear_backward_input(dyo.data(), w.data(), dx.data(), N, I, O);
      cpu::linear_backward_weight(dyo.data(), x.data(), dw.data(), dbias.data(), N, I, O);
    } else {
      const Tensor t = at_offset(alloc, w, 7, DType::fp32);
      const DeviceFloats BIAS = up(bias), DYO = up(dyo);
      DeviceFloats Y(d, N * O), DX(d, N * I), DW = up(dw), DB = up(dbias);
      dev::linear_forward(d, X.data(), t, 7, BIAS.data(), Y.data(), N, I, O);
      dev::linear_backward_input(d, DYO.data(), t, 7, DX.data(), N, I, O);
      dev::linear_backward_weight(d, DType::fp32, DYO.data(), X.data(), DW.data(), DB.data(), N, I,
                                  O);
      y = Y.to_host(), dx = DX.to_host(), dw = DW.to_host(), dbias = DB.to_host();
    }
    o["linear.y"] = y, o["linear.dx"] = dx, o["linear.dw"] = dw, o["linear.dbias"] = dbias;
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
      const DeviceFloats A = up(add);
      dev::add_into(d, t, 9, A.data(), N * C);
      DeviceFloats S(d, N * C);
      dev::read_tensor(d, t, 9, S.data(), N * C);
      sum = S.to_host();
    }
    o[dt == DType::fp32 ? "add_into.fp32" : "add_into.bf16"] = sum;
  }
  {  // The residual, bias, column-sum, rounding and block-copy ops on working arrays, against
     // plain loops.
    const Vec bias = random(C, 26);
    Vec sum(N * C), biased = x, cols = random(C, 27), rounded = x, written(N * C), block(N * C);
    const Count bc = 5, src_col = 3, dst_col = 11;  // a 5-column block moved between columns
    if (direct) {
      for (Count i = 0; i < N * C; ++i) sum[i] = x[i] + dy[i];
      for (Count n = 0; n < N; ++n)
        for (Count c = 0; c < C; ++c) biased[n * C + c] += bias[c];
      for (Count n = 0; n < N; ++n)
        for (Count c = 0; c < C; ++c) cols[c] += x[n * C + c];
      for (float& e : rounded) e = round_to(DType::bf16, e);
      for (Count i = 0; i < N * C; ++i) written[i] = round_to(DType::fp16, x[i]);
      for (Count n = 0; n < N; ++n)
        for (Count c = 0; c < bc; ++c) block[n * C + dst_col + c] = x[n * C + src_col + c];
    } else {
      DeviceFloats SUM(d, N * C), BI = up(biased), BIAS = up(bias), COLS = up(cols),
                                  R = up(rounded), W(d, N * C), BL(d, N * C);
      dev::add(d, X.data(), DY.data(), SUM.data(), N * C);
      dev::add_bias_rows(d, BI.data(), BIAS.data(), N, C);
      dev::col_sum(d, X.data(), COLS.data(), N, C);
      dev::round_to(d, R.data(), N * C, DType::bf16);
      Tensor t(alloc, {N * C + 2}, DType::fp16, MemoryTag::temporaries);
      dev::write_tensor(d, t, 2, X.data(), N * C);
      dev::read_tensor(d, t, 2, W.data(), N * C);
      dev::copy_block(d, BL.data() + dst_col, C, X.data() + src_col, C, N, bc);
      sum = SUM.to_host(), biased = BI.to_host(), cols = COLS.to_host(), rounded = R.to_host();
      written = W.to_host(), block = BL.to_host();
    }
    o["add"] = sum, o["add_bias_rows"] = biased, o["col_sum"] = cols, o["round_to.bf16"] = rounded;
    o["tensor.fp16"] = written, o["copy_block"] = block;
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
      if (name == "ce.dlogits") {
        // The oracle is cpu::ce_backward, which rounds once from double; the trainer's path rounds
        // the softmax to fp32 before subtracting and scaling: two float roundings.
        ASSERT_NEAR(got.at(name)[i], want[i], 2e-7 * std::max(1.0f, std::fabs(want[i]))) << i;
        continue;
      }
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
// the device (and the weight gradient's dy and x to the run's dtype), so against the oracle on the
// same rounded inputs only the accumulation order and the result's rounding differ (bound 1e-2,
// cuda_ops_test.cpp). Shapes: empty, odd, several tiles.
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
      Vec want_y(n * o), want_dx(n * i);
      cpu::linear_forward(x.data(), w.data(), bias.data(), want_y.data(), n, i, o);
      cpu::linear_backward_input(dy.data(), w.data(), want_dx.data(), n, i, o);
      const Tensor t = at_offset(alloc, w, 3, dt);
      const auto X = DeviceFloats::from_host(Device::cuda, x);
      const auto DY = DeviceFloats::from_host(Device::cuda, dy);
      const auto BIAS = DeviceFloats::from_host(Device::cuda, bias);
      DeviceFloats Y(Device::cuda, n * o), DX(Device::cuda, n * i);
      dev::linear_forward(Device::cuda, X.data(), t, 3, BIAS.data(), Y.data(), n, i, o);
      dev::linear_backward_input(Device::cuda, DY.data(), t, 3, DX.data(), n, i, o);
      const Vec y = Y.to_host(), dx = DX.to_host();
      // The weight gradient in the same dtype, accumulating onto a non-zero start.
      const Vec dw0 = random(static_cast<std::size_t>(o * i), 35), db0 = random(o, 36);
      Vec want_dw = dw0, want_db = db0;
      cpu::linear_backward_weight(dy.data(), x.data(), want_dw.data(), want_db.data(), n, i, o);
      auto DW = DeviceFloats::from_host(Device::cuda, dw0);
      auto DB = DeviceFloats::from_host(Device::cuda, db0);
      dev::linear_backward_weight(Device::cuda, dt, DY.data(), X.data(), DW.data(), DB.data(), n, i,
                                  o);
      const double tol = dt == DType::fp32 ? 1e-5 : 1e-2;
      if (n > 0) {
        EXPECT_LT(nerr(y, want_y), tol);
        EXPECT_LT(nerr(dx, want_dx), tol);
      }
      EXPECT_LT(nerr(DW.to_host(), want_dw), tol);
      EXPECT_LT(nerr(DB.to_host(), want_db), tol);
    }
  }
}

}  // namespace
}  // namespace distplan::backend
