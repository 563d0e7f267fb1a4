// Every CUDA op against the CPU oracle (cpu_ops.h) on random inputs, by normalised error
// ||cuda - cpu||_2 / ||cpu||_2: below 1e-5 for fp32 kernels, 1e-2 for bf16/fp16 GEMM inputs
// (8 and 11 mantissa bits: relative rounding 2^-8 = 3.9e-3 and 2^-11 per input, accumulated in
// fp32). Skips itself where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/cuda.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/gpu_backend/tensor.h"

namespace distplan::backend {
namespace {

using Vec = std::vector<float>;

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible"

template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    p_ = static_cast<T*>(cuda::device_alloc_zeroed(n_ * sizeof(T)));
    cuda::copy_to_device(p_, h.data(), n_ * sizeof(T));
  }
  explicit Dev(std::size_t n) : n_(n) {
    p_ = static_cast<T*>(cuda::device_alloc_zeroed(n_ * sizeof(T)));
  }
  ~Dev() { cuda::device_free(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    cuda::copy_to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

Vec random(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = d(g);
  return v;
}

double nerr(const Vec& got, const Vec& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  const double e = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  // Every error into the test's record (gtest --gtest_output=json; scripts/gpu_validate.sh).
  static std::string test;
  static int k = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info != nullptr) {
    const std::string name = std::string(info->test_suite_name()) + "." + info->name();
    if (name != test) test = name, k = 0;
    ::testing::Test::RecordProperty("normalised_error_" + std::to_string(k++), std::to_string(e));
  }
  return e;
}

constexpr int N = 48, I = 64, O = 96;

TEST(CudaOps, LinearMatchesTheOracleInEveryInputType) {
  REQUIRE_GPU();
  const Vec x = random(N * I, 1), w = random(O * I, 2), b = random(O, 3), dy = random(N * O, 4);
  Vec y(N * O), dx(N * I), dw(O * I, 0.0f), db(O, 0.0f);
  cpu::linear_forward(x.data(), w.data(), b.data(), y.data(), N, I, O);
  cpu::linear_backward_input(dy.data(), w.data(), dx.data(), N, I, O);
  cpu::linear_backward_weight(dy.data(), x.data(), dw.data(), db.data(), N, I, O);
  for (const auto& [t, tol] : {std::pair{cuda::Type::fp32, 1e-5}, std::pair{cuda::Type::bf16, 1e-2},
                               std::pair{cuda::Type::fp16, 1e-2}}) {
    SCOPED_TRACE(static_cast<int>(t));
    Dev<float> x32(x), w32(w), b32(b), dy32(dy), y32(N * O), dx32(N * I), dw32(O * I), db32(O);
    Dev<std::uint16_t> xs(N * I * 2), ws(O * I * 2), dys(N * O * 2), ys(N * O * 2), dxs(N * I * 2);
    auto in = [&](Dev<float>& f, Dev<std::uint16_t>& s, std::size_t n) -> void* {
      if (t == cuda::Type::fp32) return f.get();
      cuda::cast(cuda::Type::fp32, f.get(), t, s.get(), n);
      return s.get();
    };
    void* xd = in(x32, xs, N * I);
    void* wd = in(w32, ws, O * I);
    void* dyd = in(dy32, dys, N * O);
    void* yd = t == cuda::Type::fp32 ? static_cast<void*>(y32.get()) : ys.get();
    void* dxd = t == cuda::Type::fp32 ? static_cast<void*>(dx32.get()) : dxs.get();
    cuda::linear_forward(t, xd, wd, b32.get(), yd, N, I, O);
    cuda::linear_backward_input(t, dyd, wd, dxd, N, I, O);
    cuda::linear_backward_weight(t, dyd, xd, dw32.get(), db32.get(), N, I, O);
    if (t != cuda::Type::fp32) {
      cuda::cast(t, yd, cuda::Type::fp32, y32.get(), N * O);
      cuda::cast(t, dxd, cuda::Type::fp32, dx32.get(), N * I);
    }
    cuda::synchronize();
    EXPECT_LT(nerr(y32.host(), y), tol);
    EXPECT_LT(nerr(dx32.host(), dx), tol);
    EXPECT_LT(nerr(dw32.host(), dw), tol);
    EXPECT_LT(nerr(db32.host(), db), tol);
  }
}

TEST(CudaOps, NormsMatchTheOracle) {
  REQUIRE_GPU();
  const Vec x = random(N * I, 5), g = random(I, 6), b = random(I, 7), dy = random(N * I, 8);
  Vec y(N * I), mean(N), rstd(N), dx(N * I), dg(I, 0.0f), db(I, 0.0f);
  cpu::layernorm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), N, I,
                         1e-5);
  cpu::layernorm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(),
                          dg.data(), db.data(), N, I);
  Dev<float> xd(x), gd(g), bd(b), dyd(dy), yd(N * I), md(N), rd(N), dxd(N * I), dgd(I), dbd(I);
  cuda::layernorm_forward(xd.get(), gd.get(), bd.get(), yd.get(), md.get(), rd.get(), N, I, 1e-5f);
  cuda::layernorm_backward(dyd.get(), xd.get(), gd.get(), md.get(), rd.get(), dxd.get(), dgd.get(),
                           dbd.get(), N, I);
  EXPECT_LT(nerr(yd.host(), y), 1e-5);
  EXPECT_LT(nerr(dxd.host(), dx), 1e-5);
  EXPECT_LT(nerr(dgd.host(), dg), 1e-5);
  EXPECT_LT(nerr(dbd.host(), db), 1e-5);

  Vec ry(N * I), rr(N), rdx(N * I), rdg(I, 0.0f);
  cpu::rmsnorm_forward(x.data(), g.data(), ry.data(), rr.data(), N, I, 1e-5);
  cpu::rmsnorm_backward(dy.data(), x.data(), g.data(), rr.data(), rdx.data(), rdg.data(), N, I);
  Dev<float> ryd(N * I), rrd(N), rdxd(N * I), rdgd(I);
  cuda::rmsnorm_forward(xd.get(), gd.get(), ryd.get(), rrd.get(), N, I, 1e-5f);
  cuda::rmsnorm_backward(dyd.get(), xd.get(), gd.get(), rrd.get(), rdxd.get(), rdgd.get(), N, I);
  EXPECT_LT(nerr(ryd.host(), ry), 1e-5);
  EXPECT_LT(nerr(rdxd.host(), rdx), 1e-5);
  EXPECT_LT(nerr(rdgd.host(), rdg), 1e-5);
}

TEST(CudaOps, ActivationsMatchTheOracle) {
  REQUIRE_GPU();
  const std::size_t n = 4096;
  const Vec x = random(n, 9), u = random(n, 10), dy = random(n, 11);
  Vec y(n), dx(n), sy(n), dg(n), du(n);
  cpu::gelu_forward(x.data(), y.data(), n);
  cpu::gelu_backward(dy.data(), x.data(), dx.data(), n);
  cpu::swiglu_forward(x.data(), u.data(), sy.data(), n);
  cpu::swiglu_backward(dy.data(), x.data(), u.data(), dg.data(), du.data(), n);
  Dev<float> xd(x), ud(u), dyd(dy), yd(n), dxd(n), syd(n), dgd(n), dud(n);
  cuda::gelu_forward(xd.get(), yd.get(), n);
  cuda::gelu_backward(dyd.get(), xd.get(), dxd.get(), n);
  cuda::swiglu_forward(xd.get(), ud.get(), syd.get(), n);
  cuda::swiglu_backward(dyd.get(), xd.get(), ud.get(), dgd.get(), dud.get(), n);
  EXPECT_LT(nerr(yd.host(), y), 1e-5);
  EXPECT_LT(nerr(dxd.host(), dx), 1e-5);
  EXPECT_LT(nerr(syd.host(), sy), 1e-5);
  EXPECT_LT(nerr(dgd.host(), dg), 1e-5);
  EXPECT_LT(nerr(dud.host(), du), 1e-5);
}

TEST(CudaOps, CausalAttentionMatchesTheOracle) {
  REQUIRE_GPU();
  const int s = 32, b = 2, a = 4, g = 2, d = 16;
  const Vec q = random(s * b * a * d, 12), k = random(s * b * g * d, 13),
            v = random(s * b * g * d, 14), dout = random(s * b * a * d, 15);
  Vec out(q.size()), probs(static_cast<std::size_t>(b * a * s * s)), dq(q.size(), 0.0f),
      dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, b, a, g, d);
  cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), probs.data(), dq.data(),
                          dk.data(), dv.data(), s, b, a, g, d);
  Dev<float> qd(q), kd(k), vd(v), dod(dout), od(out.size()), pd(probs.size()), dqd(q.size()),
      dkd(k.size()), dvd(v.size());
  cuda::attention_forward(qd.get(), kd.get(), vd.get(), od.get(), pd.get(), s, b, a, g, d);
  cuda::attention_backward(dod.get(), qd.get(), kd.get(), vd.get(), pd.get(), dqd.get(), dkd.get(),
                           dvd.get(), s, b, a, g, d);
  EXPECT_LT(nerr(od.host(), out), 1e-5);
  EXPECT_LT(nerr(pd.host(), probs), 1e-5);
  EXPECT_LT(nerr(dqd.host(), dq), 1e-5);
  EXPECT_LT(nerr(dkd.host(), dk), 1e-5);
  EXPECT_LT(nerr(dvd.host(), dv), 1e-5);
}

TEST(CudaOps, EmbeddingAndCrossEntropyMatchTheOracle) {
  REQUIRE_GPU();
  const int n = 40, C = 32, V = 64, start = 64;  // this shard holds ids [64, 128)
  std::vector<std::int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37) % 160;
  const Vec table = random(V * C, 16), dout = random(n * C, 17), logits = random(n * V, 18);
  Vec out(n * C), dtab(V * C, 0.0f), mx(n), se(n), tl(n), dl(n * V);
  const Vec dloss = random(n, 19);
  cpu::embedding_forward(ids.data(), table.data(), out.data(), n, C, start, V);
  cpu::embedding_backward(ids.data(), dout.data(), dtab.data(), n, C, start, V);
  cpu::ce_local_max(logits.data(), mx.data(), n, V);
  cpu::ce_local_sumexp(logits.data(), mx.data(), se.data(), n, V);
  cpu::ce_local_target(logits.data(), ids.data(), tl.data(), n, V, start);
  cpu::ce_backward(logits.data(), mx.data(), se.data(), ids.data(), dloss.data(), dl.data(), n, V,
                   start);
  Dev<std::int32_t> idd(ids);
  Dev<float> td(table), dod(dout), ld(logits), dld(dloss), od(out.size()), dtd(dtab.size()), mxd(n),
      sed(n), tld(n), dlg(dl.size());
  cuda::embedding_forward(idd.get(), td.get(), od.get(), n, C, start, V);
  cuda::embedding_backward(idd.get(), dod.get(), dtd.get(), n, C, start, V);
  cuda::ce_local_max(ld.get(), mxd.get(), n, V);
  cuda::ce_local_sumexp(ld.get(), mxd.get(), sed.get(), n, V);
  cuda::ce_local_target(ld.get(), idd.get(), tld.get(), n, V, start);
  cuda::ce_backward(ld.get(), mxd.get(), sed.get(), idd.get(), dld.get(), dlg.get(), n, V, start);
  EXPECT_LT(nerr(od.host(), out), 1e-6);
  EXPECT_LT(nerr(dtd.host(), dtab), 1e-5);
  EXPECT_LT(nerr(mxd.host(), mx), 1e-7);
  EXPECT_LT(nerr(sed.host(), se), 1e-5);
  EXPECT_LT(nerr(tld.host(), tl), 1e-7);
  EXPECT_LT(nerr(dlg.host(), dl), 1e-5);
}

TEST(CudaOps, AdamCastsAndOverflowMatchTheOracle) {
  REQUIRE_GPU();
  const std::size_t n = 1000;
  Vec w = random(n, 20), m(n, 0.0f), v(n, 0.0f);
  const Vec g = random(n, 21);
  Dev<float> wd(w), gd(g), md(n), vd(n);
  cpu::AdamConfig c;
  c.weight_decay = 0.01f;
  for (int step = 1; step <= 3; ++step) {
    cpu::adam_step(w.data(), g.data(), m.data(), v.data(), n, c, step, 0.5f);
    cuda::adam_step(wd.get(), gd.get(), md.get(), vd.get(), n, c.lr, c.beta1, c.beta2, c.eps,
                    c.weight_decay, c.decoupled, step, 0.5f);
  }
  EXPECT_LT(nerr(wd.host(), w), 1e-6);
  EXPECT_LT(nerr(md.host(), m), 1e-6);
  EXPECT_LT(nerr(vd.host(), v), 1e-6);
  // Casts round to nearest even, as the host's storage conversion (tensor.h).
  Dev<std::uint16_t> bf(n), hf(n);
  Dev<float> back(n);
  cuda::cast(cuda::Type::fp32, gd.get(), cuda::Type::bf16, bf.get(), n);
  cuda::cast(cuda::Type::fp32, gd.get(), cuda::Type::fp16, hf.get(), n);
  const auto bh = bf.host(), hh = hf.host();
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(bh[i], float_to_bf16(g[i])) << i;
    EXPECT_EQ(hh[i], float_to_fp16(g[i])) << i;
  }
  EXPECT_FALSE(cuda::has_overflow(gd.get(), n));
  Vec bad = g;
  bad[n / 2] = std::numeric_limits<float>::infinity();
  Dev<float> badd(bad);
  EXPECT_TRUE(cuda::has_overflow(badd.get(), n));
}

}  // namespace
}  // namespace distplan::backend
