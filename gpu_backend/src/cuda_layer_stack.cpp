// One GPT layer stack, forward + backward, on device-resident data (cuda.h: time_layer_stack):
// the measurement behind "CUDA layer stack >= 50% of bf16 peak" (docs/gpu_backend.md). Plain C++
// over the checked device interface; compiled only with CUDA.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda_api.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"

namespace distplan::backend::cuda {
namespace {

// A zeroed device allocation, freed with the scope; counts its bytes into `total`.
class Buf {
 public:
  Buf() = default;
  Buf(std::size_t bytes, double& total) {
    DISTPLAN_CHECK(bytes > 0, "empty device buffer");
    p_ = device_alloc_zeroed(bytes);
    total += static_cast<double>(bytes);
  }
  Buf(Buf&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Buf& operator=(Buf&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (p_ != nullptr) device_free(p_);
  }
  float* f() { return static_cast<float*>(p_); }
  void* v() { return p_; }

 private:
  void* p_ = nullptr;
};

struct Layer {
  Buf wqkv, wo, w1, w2;                 // bf16 (3h,h), (h,h), (f,h), (h,f)
  Buf g1, b1, g2, b2;                   // fp32 (h)
  Buf dwqkv, dwo, dw1, dw2;             // fp32, accumulated
  Buf dg1, db1, dg2, db2;               // fp32 (h)
  Buf x, mean1, rstd1, ln1;             // saved: x fp32 (N,h), ln1 bf16 (N,h)
  Buf q, k, v, probs, attn;             // fp32 (N,h) x3, fp32 (b,a,s,s), bf16 (N,h)
  Buf x2, mean2, rstd2, ln2, fc1, act;  // fp32, fp32, fp32, bf16 (N,h), fp32 (N,f), bf16 (N,f)
};

std::size_t z(long long a) {
  DISTPLAN_CHECK(a > 0, "layer stack dimension must be positive");
  return static_cast<std::size_t>(a);
}

// Deterministic small values (uniform in +-scale) as bf16 or fp32 host data.
std::vector<std::uint16_t> bf16_values(std::size_t n, std::uint32_t seed, float scale) {
  std::vector<std::uint16_t> out(n);
  std::uint32_t s = seed * 2654435761u + 1u;
  for (auto& e : out) {
    s = s * 1664525u + 1013904223u;
    e = float_to_bf16(scale * (static_cast<float>(s >> 8) * (2.0f / 16777216.0f) - 1.0f));
  }
  return out;
}
std::vector<float> f32_values(std::size_t n, std::uint32_t seed, float scale) {
  std::vector<float> out(n);
  std::uint32_t s = seed * 2654435761u + 7u;
  for (auto& e : out) {
    s = s * 1664525u + 1013904223u;
    e = scale * (static_cast<float>(s >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
  return out;
}

}  // namespace

LayerStackTiming time_layer_stack(const LayerStackConfig& c) {
  const int h = c.hidden, a = c.heads, f = c.ffn > 0 ? c.ffn : 4 * c.hidden, s = c.seq, b = c.batch;
  DISTPLAN_CHECK(h > 0 && a > 0 && h % a == 0, "hidden must be a positive multiple of heads");
  DISTPLAN_CHECK(s > 0 && b > 0 && c.layers > 0 && c.reps > 0, "layer stack sizes must be > 0");
  DISTPLAN_CHECK(static_cast<long long>(s) * b * std::max(3 * h, f) < (1ll << 31),
                 "layer stack activations over 2^31 elements");
  const int d = h / a, N = s * b, wide = std::max(3 * h, f);
  const std::size_t Nh = z(1ll * N * h), Nf = z(1ll * N * f), Nw = z(1ll * N * wide);
  const std::size_t P = z(1ll * b * a * s * s);
  LayerStackTiming out;
  double& mem = out.device_bytes;

  std::vector<Layer> layers(static_cast<std::size_t>(c.layers));
  const std::vector<float> ones(z(h), 1.0f);
  std::uint32_t seed = 1;
  for (Layer& L : layers) {
    auto weight = [&](std::size_t rows, std::size_t cols) {
      Buf w(rows * cols * 2, mem);
      // Uniform with standard deviation 0.02 (GPT-2's init): half-width 0.02 * sqrt(3).
      const auto vals = bf16_values(rows * cols, seed++, 0.0346410f);
      copy_to_device(w.v(), vals.data(), vals.size() * 2);
      return w;
    };
    L.wqkv = weight(z(3ll * h), z(h));
    L.wo = weight(z(h), z(h));
    L.w1 = weight(z(f), z(h));
    L.w2 = weight(z(h), z(f));
    for (Buf* g : {&L.g1, &L.g2}) {
      *g = Buf(z(h) * 4, mem);
      copy_to_device(g->v(), ones.data(), ones.size() * 4);
    }
    L.b1 = Buf(z(h) * 4, mem);
    L.b2 = Buf(z(h) * 4, mem);
    L.dwqkv = Buf(z(3ll * h) * z(h) * 4, mem);
    L.dwo = Buf(z(h) * z(h) * 4, mem);
    L.dw1 = Buf(z(f) * z(h) * 4, mem);
    L.dw2 = Buf(z(h) * z(f) * 4, mem);
    for (Buf* g : {&L.dg1, &L.db1, &L.dg2, &L.db2}) *g = Buf(z(h) * 4, mem);
    L.x = Buf(Nh * 4, mem);
    L.mean1 = Buf(z(N) * 4, mem);
    L.rstd1 = Buf(z(N) * 4, mem);
    L.ln1 = Buf(Nh * 2, mem);
    L.q = Buf(Nh * 4, mem);
    L.k = Buf(Nh * 4, mem);
    L.v = Buf(Nh * 4, mem);
    L.probs = Buf(P * 4, mem);
    L.attn = Buf(Nh * 2, mem);
    L.x2 = Buf(Nh * 4, mem);
    L.mean2 = Buf(z(N) * 4, mem);
    L.rstd2 = Buf(z(N) * 4, mem);
    L.ln2 = Buf(Nh * 2, mem);
    L.fc1 = Buf(Nf * 4, mem);
    L.act = Buf(Nf * 2, mem);
  }
  // Scratch: fp32 and bf16 (N, max(3h, f)), the input and two fp32 (N,h) ping-pong buffers,
  // fp32 (N,h) temporaries, bf16 (N,h) GEMM operands.
  Buf t32(Nw * 4, mem), u32(Nw * 4, mem), tb(Nw * 2, mem), X0(Nh * 4, mem), X1(Nh * 4, mem),
      a32(Nh * 4, mem), e32(Nh * 4, mem), dq(Nh * 4, mem), dk(Nh * 4, mem), dv(Nh * 4, mem),
      hb(Nh * 2, mem), hb2(Nh * 2, mem), Xin(Nh * 4, mem);
  {
    const auto x0 = f32_values(Nh, 12345, 1.0f);
    copy_to_device(Xin.v(), x0.data(), Nh * 4);
  }
  const bool thin = !c.gemm_only;
  const Type B = Type::bf16, F = Type::fp32;
  const std::size_t row = z(h) * 4, row3 = z(3ll * h) * 4;

  auto forward = [&](Layer& L, float* in, float* y) {
    copy_on_device(L.x.v(), in, Nh * 4);
    if (thin) {
      layernorm_forward(L.x.f(), L.g1.f(), L.b1.f(), a32.f(), L.mean1.f(), L.rstd1.f(), N, h,
                        1e-5f);
      cast(F, a32.v(), B, L.ln1.v(), Nh);
    }
    linear_forward(B, L.ln1.v(), L.wqkv.v(), nullptr, tb.v(), N, h, 3 * h);
    if (thin) {
      cast(B, tb.v(), F, t32.v(), z(3ll * N * h));
      copy_rows_on_device(L.q.v(), row, t32.f(), row3, row, z(N));
      copy_rows_on_device(L.k.v(), row, t32.f() + h, row3, row, z(N));
      copy_rows_on_device(L.v.v(), row, t32.f() + 2 * h, row3, row, z(N));
      attention_forward(L.q.f(), L.k.f(), L.v.f(), a32.f(), L.probs.f(), s, b, a, a, d);
      cast(F, a32.v(), B, L.attn.v(), Nh);
    }
    linear_forward(B, L.attn.v(), L.wo.v(), nullptr, hb.v(), N, h, h);
    if (thin) {
      cast(B, hb.v(), F, a32.v(), Nh);
      add(L.x.f(), a32.f(), L.x2.f(), Nh);
      layernorm_forward(L.x2.f(), L.g2.f(), L.b2.f(), a32.f(), L.mean2.f(), L.rstd2.f(), N, h,
                        1e-5f);
      cast(F, a32.v(), B, L.ln2.v(), Nh);
    }
    linear_forward(B, L.ln2.v(), L.w1.v(), nullptr, tb.v(), N, h, f);
    if (thin) {
      cast(B, tb.v(), F, L.fc1.v(), Nf);
      gelu_forward(L.fc1.f(), t32.f(), Nf);
      cast(F, t32.v(), B, L.act.v(), Nf);
    }
    linear_forward(B, L.act.v(), L.w2.v(), nullptr, hb.v(), N, f, h);
    if (thin) {
      cast(B, hb.v(), F, a32.v(), Nh);
      add(L.x2.f(), a32.f(), y, Nh);
    }
  };
  // dy (N,h) -> dx (N,h); weight gradients accumulate.
  auto backward = [&](Layer& L, float* dy, float* dx) {
    if (thin) cast(F, dy, B, hb.v(), Nh);
    linear_backward_input(B, hb.v(), L.w2.v(), tb.v(), N, f, h);
    linear_backward_weight(B, hb.v(), L.act.v(), L.dw2.f(), nullptr, N, f, h);
    if (thin) {
      cast(B, tb.v(), F, t32.v(), Nf);
      gelu_backward(t32.f(), L.fc1.f(), u32.f(), Nf);
      cast(F, u32.v(), B, tb.v(), Nf);
    }
    linear_backward_input(B, tb.v(), L.w1.v(), hb2.v(), N, h, f);
    linear_backward_weight(B, tb.v(), L.ln2.v(), L.dw1.f(), nullptr, N, h, f);
    if (thin) {
      cast(B, hb2.v(), F, a32.v(), Nh);
      layernorm_backward(a32.f(), L.x2.f(), L.g2.f(), L.mean2.f(), L.rstd2.f(), e32.f(), L.dg2.f(),
                         L.db2.f(), N, h);
      add(e32.f(), dy, e32.f(), Nh);
      cast(F, e32.v(), B, hb.v(), Nh);
    }
    linear_backward_input(B, hb.v(), L.wo.v(), hb2.v(), N, h, h);
    linear_backward_weight(B, hb.v(), L.attn.v(), L.dwo.f(), nullptr, N, h, h);
    if (thin) {
      cast(B, hb2.v(), F, a32.v(), Nh);
      zero_on_device(dq.v(), Nh * 4);
      zero_on_device(dk.v(), Nh * 4);
      zero_on_device(dv.v(), Nh * 4);
      attention_backward(a32.f(), L.q.f(), L.k.f(), L.v.f(), L.probs.f(), dq.f(), dk.f(), dv.f(), s,
                         b, a, a, d);
      copy_rows_on_device(t32.f(), row3, dq.f(), row, row, z(N));
      copy_rows_on_device(t32.f() + h, row3, dk.f(), row, row, z(N));
      copy_rows_on_device(t32.f() + 2 * h, row3, dv.f(), row, row, z(N));
      cast(F, t32.v(), B, tb.v(), z(3ll * N * h));
    }
    linear_backward_input(B, tb.v(), L.wqkv.v(), hb2.v(), N, h, 3 * h);
    linear_backward_weight(B, tb.v(), L.ln1.v(), L.dwqkv.f(), nullptr, N, h, 3 * h);
    if (thin) {
      cast(B, hb2.v(), F, a32.v(), Nh);
      layernorm_backward(a32.f(), L.x.f(), L.g1.f(), L.mean1.f(), L.rstd1.f(), dx, L.dg1.f(),
                         L.db1.f(), N, h);
      add(dx, e32.f(), dx, Nh);
    }
  };
  // The input stays in Xin; activations and gradients ping-pong between X0 and X1.
  auto step = [&] {
    float* bufs[2] = {X0.f(), X1.f()};
    float* cur = Xin.f();
    int k = 0;
    for (Layer& L : layers) {
      forward(L, cur, bufs[k]);
      cur = bufs[k];
      k ^= 1;
    }
    // d loss / d y: the stack's output stands in for the head's gradient.
    float* dy = bufs[k];
    float* dx = cur;
    copy_on_device(dy, cur, Nh * 4);
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
      backward(*it, dy, dx);
      std::swap(dy, dx);
    }
  };
  step();  // warm-up: cuBLAS heuristics, module load
  synchronize();
  EventTimer timer;
  timer.start();
  for (int r = 0; r < c.reps; ++r) step();
  timer.stop();
  out.seconds = timer.seconds() / c.reps;
  const LayerStackFlops fl = layer_stack_flops(c);
  out.gemm_flops = fl.gemm;
  out.model_flops = fl.gemm + fl.attention_causal;
  out.noncausal_model_flops = fl.gemm + fl.attention_full;
  return out;
}

}  // namespace distplan::backend::cuda
