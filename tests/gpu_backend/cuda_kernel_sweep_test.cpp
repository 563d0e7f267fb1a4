// The CUDA kernels against the CPU oracle (cpu_ops.h) over shape sweeps that exercise what one
// block never does: several blocks, more rows than one grid launches (block-per-row loops past
// 65 535 rows), odd sizes that leave threads and tiles partly empty, zero sizes (nothing
// launched, nothing written), and arrays of more than 2^24 elements (grid-stride loops, 64-bit
// offsets). Normalised error ||cuda - cpu||_2 / ||cpu||_2 below 1e-5 (fp32 kernels). Skips itself
// where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
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

// A device array (at least one element, so zero sizes still have a valid pointer) filled from the
// host, or with `fill`.
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    p_ = static_cast<T*>(cuda::device_alloc_zeroed(std::max<std::size_t>(n_, 1) * sizeof(T)));
    if (n_ > 0) cuda::copy_to_device(p_, h.data(), n_ * sizeof(T));
  }
  Dev(std::size_t n, T fill) : Dev(std::vector<T>(n, fill)) {}
  ~Dev() { cuda::device_free(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_ > 0) cuda::copy_to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

Vec random(std::size_t n, unsigned seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(shift, scale);
  Vec v(n);
  for (float& x : v) x = d(g);
  return v;
}

double nerr(const Vec& got, const Vec& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += static_cast<double>(want[i]) * want[i];
  }
  if (want.empty()) return 0;
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

constexpr double kTol = 1e-5;
// More elements than 2^24 (16 777 216): one past a float's exact integers and far past any
// single launch without grid-stride loops.
constexpr std::size_t kLarge = (std::size_t{1} << 24) + 77;

struct Shape {
  int N, C;
};
std::string name(Shape s) {
  return std::to_string(s.N) + "x" + std::to_string(s.C);
}

// Rows x columns: empty, single element, odd, one row per block, rows past one grid (65 535
// blocks), and 4097 x 4097 > 2^24 elements.
const Shape kNormShapes[] = {{0, 64},  {1, 1},      {3, 7},     {2, 256},
                             {5, 257}, {257, 1000}, {70000, 3}, {4097, 4097}};

TEST(CudaSweep, NormsMatchTheOracleOnEveryShape) {
  REQUIRE_GPU();
  unsigned seed = 1;
  for (const Shape sh : kNormShapes) {
    SCOPED_TRACE(name(sh));
    const std::size_t N = sh.N, C = sh.C, NC = N * C;
    const Vec x = random(NC, seed++, 2.0f, 0.5f), g = random(C, seed++), b = random(C, seed++);
    const Vec dy = random(NC, seed++);
    // LayerNorm
    Vec y(NC), mean(N), rstd(N), dx(NC), dg(C, 0.0f), db(C, 0.0f);
    cpu::layernorm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), sh.N,
                           sh.C, 1e-5);
    cpu::layernorm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(),
                            dg.data(), db.data(), sh.N, sh.C);
    Dev<float> xd(x), gd(g), bd(b), dyd(dy), yd(NC, 7.0f), md(N, 7.0f), rd(N, 7.0f), dxd(NC, 7.0f),
        dgd(C, 0.0f), dbd(C, 0.0f);
    cuda::layernorm_forward(xd.get(), gd.get(), bd.get(), yd.get(), md.get(), rd.get(), sh.N, sh.C,
                            1e-5f);
    cuda::layernorm_backward(dyd.get(), xd.get(), gd.get(), md.get(), rd.get(), dxd.get(),
                             dgd.get(), dbd.get(), sh.N, sh.C);
    cuda::synchronize();
    EXPECT_LT(nerr(yd.host(), y), kTol);
    EXPECT_LT(nerr(md.host(), mean), kTol);
    EXPECT_LT(nerr(rd.host(), rstd), kTol);
    EXPECT_LT(nerr(dxd.host(), dx), kTol);
    EXPECT_LT(nerr(dgd.host(), dg), kTol);
    EXPECT_LT(nerr(dbd.host(), db), kTol);
    // RMSNorm
    Vec ry(NC), rr(N), rdx(NC), rdg(C, 0.0f);
    cpu::rmsnorm_forward(x.data(), g.data(), ry.data(), rr.data(), sh.N, sh.C, 1e-5);
    cpu::rmsnorm_backward(dy.data(), x.data(), g.data(), rr.data(), rdx.data(), rdg.data(), sh.N,
                          sh.C);
    Dev<float> ryd(NC, 7.0f), rrd(N, 7.0f), rdxd(NC, 7.0f), rdgd(C, 0.0f);
    cuda::rmsnorm_forward(xd.get(), gd.get(), ryd.get(), rrd.get(), sh.N, sh.C, 1e-5f);
    cuda::rmsnorm_backward(dyd.get(), xd.get(), gd.get(), rrd.get(), rdxd.get(), rdgd.get(), sh.N,
                           sh.C);
    cuda::synchronize();
    EXPECT_LT(nerr(ryd.host(), ry), kTol);
    EXPECT_LT(nerr(rrd.host(), rr), kTol);
    EXPECT_LT(nerr(rdxd.host(), rdx), kTol);
    EXPECT_LT(nerr(rdgd.host(), rdg), kTol);
  }
}

// Vocabulary shards: one logit, odd, GPT-2's 50 257, rows past one grid, > 2^24 logits. Targets
// fall inside and outside the shard [start, start + V).
const Shape kVocabShapes[] = {{0, 5}, {1, 1}, {3, 7}, {5, 50257}, {70000, 3}, {4100, 4099}};

TEST(CudaSweep, CrossEntropyPiecesMatchTheOracleOnEveryShape) {
  REQUIRE_GPU();
  unsigned seed = 100;
  for (const Shape sh : kVocabShapes) {
    SCOPED_TRACE(name(sh));
    const std::size_t N = sh.N, V = sh.C, NV = N * V;
    const int start = 3;
    const Vec logits = random(NV, seed++, 3.0f), dloss = random(N, seed++);
    std::vector<std::int32_t> t(N);
    std::mt19937 gen(seed++);
    for (auto& e : t) e = static_cast<std::int32_t>(gen() % (V + 6));  // some below/above
    Vec mx(N), se(N), tl(N), dl(NV);
    cpu::ce_local_max(logits.data(), mx.data(), sh.N, sh.C);
    cpu::ce_local_sumexp(logits.data(), mx.data(), se.data(), sh.N, sh.C);
    cpu::ce_local_target(logits.data(), t.data(), tl.data(), sh.N, sh.C, start);
    cpu::ce_backward(logits.data(), mx.data(), se.data(), t.data(), dloss.data(), dl.data(), sh.N,
                     sh.C, start);
    Dev<float> ld(logits), dld(dloss), mxd(N, 7.0f), sed(N, 7.0f), tld(N, 7.0f), dd(NV, 7.0f);
    Dev<std::int32_t> td(t);
    cuda::ce_local_max(ld.get(), mxd.get(), sh.N, sh.C);
    cuda::ce_local_sumexp(ld.get(), mxd.get(), sed.get(), sh.N, sh.C);
    cuda::ce_local_target(ld.get(), td.get(), tld.get(), sh.N, sh.C, start);
    cuda::ce_backward(ld.get(), mxd.get(), sed.get(), td.get(), dld.get(), dd.get(), sh.N, sh.C,
                      start);
    cuda::synchronize();
    EXPECT_EQ(mxd.host(), mx);  // a maximum is exact
    EXPECT_LT(nerr(sed.host(), se), kTol);
    EXPECT_EQ(tld.host(), tl);  // a copy is exact
    EXPECT_LT(nerr(dd.host(), dl), kTol);
    // The trainer's path: the saved fp32 softmax, then (p - onehot) * scale in place, against the
    // oracle's same two steps.
    Vec sm(NV);
    cpu::ce_softmax(logits.data(), mx.data(), se.data(), sm.data(), sh.N, sh.C);
    cpu::ce_softmax_grad(sm.data(), t.data(), sh.N, sh.C, start, 0.25f);
    Dev<float> smd(NV, 7.0f);
    cuda::ce_softmax(ld.get(), mxd.get(), sed.get(), smd.get(), sh.N, sh.C);
    cuda::ce_softmax_grad(smd.get(), td.get(), sh.N, sh.C, start, 0.25f);
    cuda::synchronize();
    EXPECT_LT(nerr(smd.host(), sm), kTol);
  }
}

// Column sums of the bias gradient: one row, odd widths, rows past the 256 row groups of one
// launch (so several partial sums meet in one column).
TEST(CudaSweep, BiasGradientSumsEveryRow) {
  REQUIRE_GPU();
  const Shape shapes[] = {{0, 3}, {1, 1}, {1000, 33}, {70001, 5}, {3, 4099}};
  unsigned seed = 200;
  for (const Shape sh : shapes) {
    SCOPED_TRACE(name(sh));
    const Vec dy = random(static_cast<std::size_t>(sh.N) * sh.C, seed++);
    const Vec start = random(sh.C, seed++);  // accumulates into what is there
    Vec want = start;
    for (int n = 0; n < sh.N; ++n) {
      for (int c = 0; c < sh.C; ++c) want[c] += dy[static_cast<std::size_t>(n) * sh.C + c];
    }
    Dev<float> dyd(dy), dbd(start);
    cuda::bias_grad(dyd.get(), dbd.get(), sh.N, sh.C);
    cuda::synchronize();
    EXPECT_LT(nerr(dbd.host(), want), kTol);
  }
}

// Embedding rows > 2^24 elements in all (4099 tokens x 4097 features) from a 17-row shard that
// starts at id 5; ids outside the shard give zero rows and no gradient.
TEST(CudaSweep, EmbeddingPastTwoToThe24) {
  REQUIRE_GPU();
  const int N = 4099, C = 4097, V = 17, start = 5;
  const Vec table = random(static_cast<std::size_t>(V) * C, 300);
  const Vec dout = random(static_cast<std::size_t>(N) * C, 301);
  std::vector<std::int32_t> ids(N);
  for (int n = 0; n < N; ++n) ids[n] = (n * 7) % (V + 9);
  Vec out(static_cast<std::size_t>(N) * C), dt(static_cast<std::size_t>(V) * C, 0.0f);
  cpu::embedding_forward(ids.data(), table.data(), out.data(), N, C, start, V);
  cpu::embedding_backward(ids.data(), dout.data(), dt.data(), N, C, start, V);
  Dev<float> td(table), od(out.size(), 7.0f), dod(dout), dtd(dt.size(), 0.0f);
  Dev<std::int32_t> idd(ids);
  cuda::embedding_forward(idd.get(), td.get(), od.get(), N, C, start, V);
  cuda::embedding_backward(idd.get(), dod.get(), dtd.get(), N, C, start, V);
  cuda::synchronize();
  EXPECT_EQ(od.host(), out);  // gathers are exact
  EXPECT_LT(nerr(dtd.host(), dt), kTol);
}

// Elementwise kernels past 2^24 elements and at zero: activations, residual add, casts with round
// to nearest even (the CPU's float_to_bf16), Adam, and the overflow check with its only non-finite
// value in the last element.
TEST(CudaSweep, ElementwiseKernelsPastTwoToThe24AndAtZero) {
  REQUIRE_GPU();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, kLarge}) {
    SCOPED_TRACE(n);
    const Count cn = static_cast<Count>(n);
    const Vec x = random(n, 1), u = random(n, 2), dy = random(n, 3);
    Vec y(n), dx(n), sy(n), dg(n), du(n), sum(n);
    cpu::gelu_forward(x.data(), y.data(), cn);
    cpu::gelu_backward(dy.data(), x.data(), dx.data(), cn);
    cpu::swiglu_forward(x.data(), u.data(), sy.data(), cn);
    cpu::swiglu_backward(dy.data(), x.data(), u.data(), dg.data(), du.data(), cn);
    for (std::size_t i = 0; i < n; ++i) sum[i] = x[i] + u[i];
    Dev<float> xd(x), ud(u), dyd(dy), yd(n, 7.0f), dxd(n, 7.0f), syd(n, 7.0f), dgd(n, 7.0f),
        dud(n, 7.0f), sd(n, 7.0f);
    cuda::gelu_forward(xd.get(), yd.get(), n);
    cuda::gelu_backward(dyd.get(), xd.get(), dxd.get(), n);
    cuda::swiglu_forward(xd.get(), ud.get(), syd.get(), n);
    cuda::swiglu_backward(dyd.get(), xd.get(), ud.get(), dgd.get(), dud.get(), n);
    cuda::add(xd.get(), ud.get(), sd.get(), n);
    cuda::synchronize();
    EXPECT_LT(nerr(yd.host(), y), kTol);
    EXPECT_LT(nerr(dxd.host(), dx), kTol);
    EXPECT_LT(nerr(syd.host(), sy), kTol);
    EXPECT_LT(nerr(dgd.host(), dg), kTol);
    EXPECT_LT(nerr(dud.host(), du), kTol);
    EXPECT_EQ(sd.host(), sum);

    // fp32 -> bf16 -> fp32 on the device equals the CPU's rounding bit for bit.
    Dev<std::uint16_t> bf(n, std::uint16_t{0});
    Dev<float> back(n, 7.0f);
    cuda::cast(cuda::Type::fp32, xd.get(), cuda::Type::bf16, bf.get(), n);
    cuda::cast(cuda::Type::bf16, bf.get(), cuda::Type::fp32, back.get(), n);
    cuda::synchronize();
    const std::vector<std::uint16_t> bits = bf.host();
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) mismatches += bits[i] != float_to_bf16(x[i]);
    EXPECT_EQ(mismatches, 0u);
    Vec rounded(n);
    for (std::size_t i = 0; i < n; ++i) rounded[i] = bf16_to_float(float_to_bf16(x[i]));
    EXPECT_EQ(back.host(), rounded);
    // The trainer's in-place rounding of a working array: the same bits as the two casts, for
    // bf16 and fp16.
    for (const auto& [t, dt] :
         {std::pair{cuda::Type::bf16, DType::bf16}, std::pair{cuda::Type::fp16, DType::fp16}}) {
      Dev<float> r(x);
      cuda::round_to(t, r.get(), n);
      cuda::synchronize();
      Vec want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = round_to(dt, x[i]);
      EXPECT_EQ(r.host(), want);
    }

    // Adam (step 3, AdamW decay, gradient scale 1/8).
    Vec w = random(n, 4), m = random(n, 5, 0.01f), v(n, 1e-4f);
    const Vec g = random(n, 6);
    Dev<float> wd(w), md(m), vd(v), gd(g);
    cpu::AdamConfig c;
    c.weight_decay = 0.1f;
    cpu::adam_step(w.data(), g.data(), m.data(), v.data(), cn, c, 3, 0.125f);
    cuda::adam_step(wd.get(), gd.get(), md.get(), vd.get(), n, c.lr, c.beta1, c.beta2, c.eps,
                    c.weight_decay, c.decoupled, 3, 0.125f);
    cuda::synchronize();
    EXPECT_LT(nerr(wd.host(), w), kTol);
    EXPECT_LT(nerr(md.host(), m), kTol);
    EXPECT_LT(nerr(vd.host(), v), kTol);

    // Overflow: none, then one infinity in the last element.
    EXPECT_FALSE(cuda::has_overflow(xd.get(), n));
    if (n > 0) {
      const float inf = std::numeric_limits<float>::infinity();
      cuda::copy_to_device(xd.get() + (n - 1), &inf, sizeof(float));
      EXPECT_TRUE(cuda::has_overflow(xd.get(), n));
    }
  }
}

// The GEMMs (cuBLASLt) on every input type against the oracle over empty, degenerate (an empty
// sum: I = 0), odd and > 2^24-element shapes: fp32 (1e-5), TF32 (inputs rounded to 10 mantissa
// bits: 2^-11 relative each, 5e-3), bf16 and fp16 inputs (the oracle on the rounded inputs; the
// outputs are stored rounded, 1e-2). dW accumulates into what is there; dbias too.
TEST(CudaSweep, GemmsMatchTheOracleOnEveryShapeAndType) {
  REQUIRE_GPU();
  struct G {
    int N, I, O;
  };
  const G shapes[] = {{0, 5, 7},    {1, 1, 1},        {3, 0, 4},
                      {17, 33, 65}, {257, 1000, 129}, {4100, 4097, 2}};
  struct Mode {
    const char* name;
    cuda::Type t;
    bool tf32;
    double tol;
  };
  const Mode modes[] = {{"fp32", cuda::Type::fp32, false, 1e-5},
                        {"tf32", cuda::Type::fp32, true, 5e-3},
                        {"bf16", cuda::Type::bf16, false, 1e-2},
                        {"fp16", cuda::Type::fp16, false, 1e-2}};
  unsigned seed = 600;
  for (const Mode& md : modes) {
    cuda::set_fp32_gemm_tf32(md.tf32);
    for (const G& sh : shapes) {
      SCOPED_TRACE(std::string(md.name) + " " + std::to_string(sh.N) + "x" + std::to_string(sh.I) +
                   "x" + std::to_string(sh.O));
      const std::size_t nx = static_cast<std::size_t>(sh.N) * sh.I;
      const std::size_t nw = static_cast<std::size_t>(sh.O) * sh.I;
      const std::size_t ny = static_cast<std::size_t>(sh.N) * sh.O;
      Vec x = random(nx, seed++), w = random(nw, seed++, 0.05f), dy = random(ny, seed++);
      const Vec bias = random(sh.O, seed++), dw0 = random(nw, seed++), db0 = random(sh.O, seed++);
      const bool half = md.t != cuda::Type::fp32;
      auto round_to = [&](Vec& v) {
        for (float& e : v)
          e = md.t == cuda::Type::bf16 ? bf16_to_float(float_to_bf16(e))
                                       : fp16_to_float(float_to_fp16(e));
      };
      if (half) round_to(x), round_to(w), round_to(dy);
      Vec y(ny), dx(nx), dw = dw0, db = db0;
      cpu::linear_forward(x.data(), w.data(), bias.data(), y.data(), sh.N, sh.I, sh.O);
      cpu::linear_backward_input(dy.data(), w.data(), dx.data(), sh.N, sh.I, sh.O);
      cpu::linear_backward_weight(dy.data(), x.data(), dw.data(), db.data(), sh.N, sh.I, sh.O);
      // Device operands in the storage type.
      auto to_dev = [&](const Vec& v, std::size_t n) {
        auto* p = static_cast<char*>(cuda::device_alloc_zeroed(std::max<std::size_t>(n, 1) * 4));
        Dev<float> f(v);
        if (n > 0) cuda::cast(cuda::Type::fp32, f.get(), md.t, p, n);
        return p;
      };
      char *xd = to_dev(x, nx), *wd = to_dev(w, nw), *dyd = to_dev(dy, ny);
      char *yd = to_dev(Vec(ny, 7.0f), ny), *dxd = to_dev(Vec(nx, 7.0f), nx);
      Dev<float> bd(bias), dwd(dw0), dbd(db0), y32(ny, 0.0f), dx32(nx, 0.0f);
      cuda::linear_forward(md.t, xd, wd, bd.get(), yd, sh.N, sh.I, sh.O);
      cuda::linear_backward_input(md.t, dyd, wd, dxd, sh.N, sh.I, sh.O);
      cuda::linear_backward_weight(md.t, dyd, xd, dwd.get(), dbd.get(), sh.N, sh.I, sh.O);
      if (ny > 0) cuda::cast(md.t, yd, cuda::Type::fp32, y32.get(), ny);
      if (nx > 0) cuda::cast(md.t, dxd, cuda::Type::fp32, dx32.get(), nx);
      cuda::synchronize();
      EXPECT_LT(nerr(y32.host(), y), md.tol);
      EXPECT_LT(nerr(dx32.host(), dx), md.tol);
      EXPECT_LT(nerr(dwd.host(), dw), md.tol);
      EXPECT_LT(nerr(dbd.host(), db), md.tol);
      for (char* p : {xd, wd, dyd, yd, dxd}) cuda::device_free(p);
    }
  }
  cuda::set_fp32_gemm_tf32(false);
}

// Multi-tensor Adam: five tensors of 0, 1, 1000, 70 001 and 2^24 + 77 elements in one launch,
// each against cpu::adam_step (Adam without decoupled decay, step 2, gradient scale 1/4).
TEST(CudaSweep, MultiTensorAdamUpdatesEveryTensorLikeTheOracle) {
  REQUIRE_GPU();
  const std::size_t sizes[] = {0, 1, 1000, 70001, kLarge};
  cpu::AdamConfig c;
  c.decoupled = false;
  c.weight_decay = 0.05f;
  std::vector<Vec> w, g, m, v;
  std::vector<std::unique_ptr<Dev<float>>> wd, gd, md, vd;
  cuda::AdamTensors ts;
  int k = 0;
  for (const std::size_t n : sizes) {
    w.push_back(random(n, 700 + k));
    g.push_back(random(n, 710 + k));
    m.push_back(random(n, 720 + k, 0.01f));
    v.push_back(Vec(n, 2e-4f));
    wd.push_back(std::make_unique<Dev<float>>(w.back()));
    gd.push_back(std::make_unique<Dev<float>>(g.back()));
    md.push_back(std::make_unique<Dev<float>>(m.back()));
    vd.push_back(std::make_unique<Dev<float>>(v.back()));
    ts.t[k] = {wd.back()->get(), gd.back()->get(), md.back()->get(), vd.back()->get(), n};
    cpu::adam_step(w.back().data(), g.back().data(), m.back().data(), v.back().data(),
                   static_cast<Count>(n), c, 2, 0.25f);
    ++k;
  }
  cuda::adam_step_multi(ts, k, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.decoupled, 2,
                        0.25f);
  cuda::synchronize();
  for (int i = 0; i < k; ++i) {
    SCOPED_TRACE(sizes[i]);
    EXPECT_LT(nerr(wd[i]->host(), w[i]), kTol);
    EXPECT_LT(nerr(md[i]->host(), m[i]), kTol);
    EXPECT_LT(nerr(vd[i]->host(), v[i]), kTol);
  }
}

// SGD with momentum (the trainer's SGD on the device) against cpu::sgd_step: two steps, so the
// second reads the momentum the first wrote; sizes 0, 1, 1000 and 2^24 + 77.
TEST(CudaSweep, SgdMomentumUpdatesLikeTheOracle) {
  REQUIRE_GPU();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, kLarge}) {
    SCOPED_TRACE(n);
    Vec w = random(n, 900), mom(n, 0.0f);
    const Vec g1 = random(n, 901), g2 = random(n, 902);
    Dev<float> wd(w), md(mom), g1d(g1), g2d(g2);
    for (const Vec* g : {&g1, &g2})
      cpu::sgd_step(w.data(), g->data(), mom.data(), static_cast<Count>(n), 0.1f, 0.9f, 0.5f);
    cuda::sgd_step(wd.get(), g1d.get(), md.get(), n, 0.1f, 0.9f, 0.5f);
    cuda::sgd_step(wd.get(), g2d.get(), md.get(), n, 0.1f, 0.9f, 0.5f);
    cuda::synchronize();
    if (n == 0) continue;
    EXPECT_LT(nerr(wd.host(), w), kTol);
    EXPECT_LT(nerr(md.host(), mom), kTol);
  }
}

// Fused bias + GeLU and bias + SwiGLU against the bias added on the host and the oracle's
// activation; the saved pre-activation is the biased input exactly.
TEST(CudaSweep, FusedBiasActivationsMatchTheOracle) {
  REQUIRE_GPU();
  const Shape shapes[] = {{0, 4}, {1, 1}, {3, 7}, {4099, 4097}};
  unsigned seed = 800;
  for (const Shape sh : shapes) {
    SCOPED_TRACE(name(sh));
    const std::size_t N = sh.N, O = sh.C;
    const Vec x = random(N * O, seed++), bias = random(O, seed++);
    Vec pre(N * O), y(N * O);
    for (std::size_t i = 0; i < N * O; ++i) pre[i] = x[i] + bias[i % O];
    cpu::gelu_forward(pre.data(), y.data(), static_cast<Count>(N * O));
    Dev<float> xd(x), bd(bias), pd(N * O, 7.0f), yd(N * O, 7.0f);
    cuda::bias_gelu_forward(xd.get(), bd.get(), pd.get(), yd.get(), sh.N, sh.C);
    cuda::synchronize();
    EXPECT_EQ(pd.host(), pre);
    EXPECT_LT(nerr(yd.host(), y), kTol);
    // SwiGLU: the same x read as (N, 2F) with F = O / 2 (odd O drops nothing: F = floor).
    const std::size_t F = O / 2;
    if (F == 0) continue;
    const Vec xs(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(N * 2 * F));
    const Vec bs = random(2 * F, seed++);
    Vec gate(N * F), up(N * F), ys(N * F), pres(N * 2 * F);
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t f = 0; f < F; ++f) {
        gate[n * F + f] = xs[n * 2 * F + f] + bs[f];
        up[n * F + f] = xs[n * 2 * F + F + f] + bs[F + f];
        pres[n * 2 * F + f] = gate[n * F + f];
        pres[n * 2 * F + F + f] = up[n * F + f];
      }
    cpu::swiglu_forward(gate.data(), up.data(), ys.data(), static_cast<Count>(N * F));
    Dev<float> xsd(xs), bsd(bs), psd(N * 2 * F, 7.0f), ysd(N * F, 7.0f);
    cuda::bias_swiglu_forward(xsd.get(), bsd.get(), psd.get(), ysd.get(), sh.N,
                              static_cast<int>(F));
    cuda::synchronize();
    EXPECT_EQ(psd.host(), pres);
    EXPECT_LT(nerr(ysd.host(), ys), kTol);
  }
}

// Tiled causal flash attention against the oracle: one row, odd lengths, GQA groups of 1, 2 and
// 4, sequences that cross the 64-row blocks and the key tiles (32 rows for d <= 128, 16 above),
// head dims 8 to 256, and an empty sequence.
TEST(CudaSweep, FlashAttentionMatchesTheOracleOnEveryShape) {
  REQUIRE_GPU();
  struct A {
    int s, b, a, g, d;
  };
  const A shapes[] = {{0, 1, 2, 1, 8},    {1, 1, 1, 1, 8},    {5, 2, 4, 2, 8},   {33, 1, 3, 1, 16},
                      {130, 2, 4, 4, 64}, {70, 1, 2, 1, 128}, {65, 1, 4, 1, 256}};
  unsigned seed = 400;
  for (const A& x : shapes) {
    SCOPED_TRACE(std::to_string(x.s) + "," + std::to_string(x.b) + "," + std::to_string(x.a) + "," +
                 std::to_string(x.g) + "," + std::to_string(x.d));
    const std::size_t nq = static_cast<std::size_t>(x.s) * x.b * x.a * x.d;
    const std::size_t nk = static_cast<std::size_t>(x.s) * x.b * x.g * x.d;
    const std::size_t nl = static_cast<std::size_t>(x.b) * x.a * x.s;
    const Vec q = random(nq, seed++), k = random(nk, seed++), v = random(nk, seed++);
    const Vec dout = random(nq, seed++);
    Vec out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    cpu::flash_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), x.s, x.b,
                                 x.a, x.g, x.d);
    cpu::flash_attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                  dq.data(), dk.data(), dv.data(), x.s, x.b, x.a, x.g, x.d);
    Dev<float> qd(q), kd(k), vd(v), dod(dout), od(nq, 7.0f), ld(nl, 7.0f), dqd(nq, 7.0f),
        dkd(nk, 7.0f), dvd(nk, 7.0f);
    cuda::flash_attention_forward(qd.get(), kd.get(), vd.get(), od.get(), ld.get(), x.s, x.b, x.a,
                                  x.g, x.d);
    cuda::flash_attention_backward(dod.get(), qd.get(), kd.get(), vd.get(), od.get(), ld.get(),
                                   dqd.get(), dkd.get(), dvd.get(), x.s, x.b, x.a, x.g, x.d);
    cuda::synchronize();
    EXPECT_LT(nerr(od.host(), out), kTol);
    EXPECT_LT(nerr(ld.host(), lse), kTol);
    EXPECT_LT(nerr(dqd.host(), dq), kTol);
    EXPECT_LT(nerr(dkd.host(), dk), kTol);
    EXPECT_LT(nerr(dvd.host(), dv), kTol);
  }
}

// Rotary embedding forward and its inverse: a single pair, odd heads, and > 2^24 elements
// (2049 x 8 x 8 x 128).
TEST(CudaSweep, RotaryMatchesTheOracleOnEveryShape) {
  REQUIRE_GPU();
  struct R {
    int s, b, h, d;
  };
  const R shapes[] = {{0, 1, 1, 8}, {1, 1, 1, 2}, {7, 3, 5, 64}, {2049, 8, 8, 128}};
  unsigned seed = 500;
  for (const R& r : shapes) {
    SCOPED_TRACE(std::to_string(r.s) + "," + std::to_string(r.b) + "," + std::to_string(r.h) + "," +
                 std::to_string(r.d));
    const std::size_t n = static_cast<std::size_t>(r.s) * r.b * r.h * r.d;
    Vec x = random(n, seed++), dx = random(n, seed++);
    Dev<float> xd(x), dxd(dx);
    cpu::rotary_forward(x.data(), r.s, r.b, r.h, r.d, 10000.0);
    cpu::rotary_backward(dx.data(), r.s, r.b, r.h, r.d, 10000.0);
    cuda::rotary_forward(xd.get(), r.s, r.b, r.h, r.d, 10000.0);
    cuda::rotary_backward(dxd.get(), r.s, r.b, r.h, r.d, 10000.0);
    cuda::synchronize();
    EXPECT_LT(nerr(xd.host(), x), kTol);
    EXPECT_LT(nerr(dxd.host(), dx), kTol);
  }
}

}  // namespace
}  // namespace distplan::backend
