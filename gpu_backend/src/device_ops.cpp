#include "distplan/gpu_backend/device_ops.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/planner/check.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend::dev {
namespace {

#ifdef DISTPLAN_HAVE_CUDA
bool on_cuda(Device d) {
  return d == Device::cuda;
}

int ii(Count v) {
  DISTPLAN_CHECK(v >= 0 && v <= 0x7FFFFFFF, "CUDA op dimension outside [0, 2^31)");
  return static_cast<int>(v);
}
std::size_t zz(Count v) {
  DISTPLAN_CHECK(v >= 0, "negative CUDA op size");
  return static_cast<std::size_t>(v);
}

// Scratch of `n` elements of `bytes_each` bytes from the working-array cache, returned with the
// scope (the default stream orders its reuse after the kernels that read it).
class Scratch {
 public:
  Scratch(Count n, std::size_t bytes_each) : bytes_(std::max<std::size_t>(zz(n) * bytes_each, 4)) {
    p_ = cuda::pool_alloc(bytes_);
  }
  ~Scratch() { cuda::pool_free(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() { return p_; }
  float* f32() { return static_cast<float*>(p_); }

 private:
  std::size_t bytes_;
  void* p_ = nullptr;
};

cuda::Type cuda_type(DType d) {
  return static_cast<cuda::Type>(static_cast<int>(d));
}
// Elements [off, off + n) of a device tensor as fp32 on the device: the tensor itself when it is
// fp32, else a cast into scratch.
const float* fp32_view(const Tensor& t, Count off, Count n, std::optional<Scratch>& scratch) {
  DISTPLAN_CHECK(off >= 0 && off + n <= t.numel(), "device view out of range");
  if (t.dtype() == DType::fp32) return t.f32() + off;
  scratch.emplace(n, sizeof(float));
  const char* src = static_cast<const char*>(t.data()) + off * bytes_of(t.dtype());
  cuda::cast(cuda_type(t.dtype()), src, cuda::Type::fp32, scratch->f32(),
             static_cast<std::size_t>(n));
  return scratch->f32();
}
const void* device_slice(const Tensor& w, Count off, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= w.numel(), "weight slice out of range");
  return static_cast<const char*>(w.data()) + off * bytes_of(w.dtype());
}
#endif

// The host copy of W for the CPU oracle.
std::vector<float> weight_slice(const Tensor& w, Count off, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= w.numel(), "weight slice out of range");
  std::vector<float> h(static_cast<std::size_t>(n));
  w.read(h.data(), n, off);
  return h;
}

}  // namespace

// On CUDA every op below hands its device pointers to the kernel of the same name.
#ifdef DISTPLAN_HAVE_CUDA
#define DISTPLAN_ON_CUDA(call) \
  if (on_cuda(d)) {            \
    call;                      \
    return;                    \
  }
#else
#define DISTPLAN_ON_CUDA(call)
#endif

void layernorm_forward([[maybe_unused]] Device d, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, Count N, Count C,
                       double eps) {
  DISTPLAN_ON_CUDA(cuda::layernorm_forward(x, gamma, beta, y, mean, rstd, ii(N), ii(C),
                                           static_cast<float>(eps)));
  cpu::layernorm_forward(x, gamma, beta, y, mean, rstd, N, C, eps);
}

void layernorm_backward([[maybe_unused]] Device d, const float* dy, const float* x,
                        const float* gamma, const float* mean, const float* rstd, float* dx,
                        float* dgamma, float* dbeta, Count N, Count C) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) DISTPLAN_CHECK(dbeta != nullptr, "layernorm_backward on CUDA needs dbeta");
#endif
  DISTPLAN_ON_CUDA(
      cuda::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, ii(N), ii(C)));
  cpu::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, N, C);
}

void rmsnorm_forward([[maybe_unused]] Device d, const float* x, const float* gamma, float* y,
                     float* rstd, Count N, Count C, double eps) {
  DISTPLAN_ON_CUDA(cuda::rmsnorm_forward(x, gamma, y, rstd, ii(N), ii(C), static_cast<float>(eps)));
  cpu::rmsnorm_forward(x, gamma, y, rstd, N, C, eps);
}

void rmsnorm_backward([[maybe_unused]] Device d, const float* dy, const float* x,
                      const float* gamma, const float* rstd, float* dx, float* dgamma, Count N,
                      Count C) {
  DISTPLAN_ON_CUDA(cuda::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, ii(N), ii(C)));
  cpu::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, N, C);
}

void gelu_forward([[maybe_unused]] Device d, const float* x, float* y, Count n) {
  DISTPLAN_ON_CUDA(cuda::gelu_forward(x, y, zz(n)));
  cpu::gelu_forward(x, y, n);
}

void gelu_backward([[maybe_unused]] Device d, const float* dy, const float* x, float* dx, Count n) {
  DISTPLAN_ON_CUDA(cuda::gelu_backward(dy, x, dx, zz(n)));
  cpu::gelu_backward(dy, x, dx, n);
}

void swiglu_forward([[maybe_unused]] Device d, const float* gate, const float* up, float* y,
                    Count n) {
  DISTPLAN_ON_CUDA(cuda::swiglu_forward(gate, up, y, zz(n)));
  cpu::swiglu_forward(gate, up, y, n);
}

void swiglu_backward([[maybe_unused]] Device d, const float* dy, const float* gate, const float* up,
                     float* dgate, float* dup, Count n) {
  DISTPLAN_ON_CUDA(cuda::swiglu_backward(dy, gate, up, dgate, dup, zz(n)));
  cpu::swiglu_backward(dy, gate, up, dgate, dup, n);
}

void attention_forward([[maybe_unused]] Device d, const float* q, const float* k, const float* v,
                       float* out, float* probs, Count s, Count b, Count a, Count g, Count hd) {
  DISTPLAN_CHECK(g > 0 && a % g == 0, "query heads must be a multiple of key/value heads");
  DISTPLAN_ON_CUDA(
      cuda::attention_forward(q, k, v, out, probs, ii(s), ii(b), ii(a), ii(g), ii(hd)));
  cpu::attention_forward(q, k, v, out, probs, s, b, a, g, hd);
}

void attention_backward([[maybe_unused]] Device d, const float* dout, const float* q,
                        const float* k, const float* v, const float* probs, float* dq, float* dk,
                        float* dv, Count s, Count b, Count a, Count g, Count hd) {
  DISTPLAN_CHECK(g > 0 && a % g == 0, "query heads must be a multiple of key/value heads");
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    // The kernel accumulates into dq, dk and dv; the CPU op overwrites them.
    cuda::zero_on_device(dq, zz(s * b * a * hd) * 4);
    cuda::zero_on_device(dk, zz(s * b * g * hd) * 4);
    cuda::zero_on_device(dv, zz(s * b * g * hd) * 4);
    cuda::attention_backward(dout, q, k, v, probs, dq, dk, dv, ii(s), ii(b), ii(a), ii(g), ii(hd));
    return;
  }
#endif
  cpu::attention_backward(dout, q, k, v, probs, dq, dk, dv, s, b, a, g, hd);
}

void embedding_backward([[maybe_unused]] Device d, const std::int32_t* ids, const float* dout,
                        float* dtable, Count N, Count C, Count vocab_start, Count V) {
  DISTPLAN_ON_CUDA(
      cuda::embedding_backward(ids, dout, dtable, ii(N), ii(C), ii(vocab_start), ii(V)));
  cpu::embedding_backward(ids, dout, dtable, N, C, vocab_start, V);
}

void ce_local_max([[maybe_unused]] Device d, const float* logits, float* row_max, Count N,
                  Count V) {
  DISTPLAN_ON_CUDA(cuda::ce_local_max(logits, row_max, ii(N), ii(V)));
  cpu::ce_local_max(logits, row_max, N, V);
}

void ce_local_sumexp([[maybe_unused]] Device d, const float* logits, const float* row_max,
                     float* sumexp, Count N, Count V) {
  DISTPLAN_ON_CUDA(cuda::ce_local_sumexp(logits, row_max, sumexp, ii(N), ii(V)));
  cpu::ce_local_sumexp(logits, row_max, sumexp, N, V);
}

void ce_local_target([[maybe_unused]] Device d, const float* logits, const std::int32_t* targets,
                     float* target_logit, Count N, Count V, Count vocab_start) {
  DISTPLAN_ON_CUDA(
      cuda::ce_local_target(logits, targets, target_logit, ii(N), ii(V), ii(vocab_start)));
  cpu::ce_local_target(logits, targets, target_logit, N, V, vocab_start);
}

void ce_softmax([[maybe_unused]] Device d, const float* logits, const float* row_max,
                const float* sumexp, float* softmax, Count N, Count V) {
  DISTPLAN_ON_CUDA(cuda::ce_softmax(logits, row_max, sumexp, softmax, ii(N), ii(V)));
  cpu::ce_softmax(logits, row_max, sumexp, softmax, N, V);
}

void ce_softmax_grad([[maybe_unused]] Device d, float* p, const std::int32_t* targets, Count N,
                     Count V, Count vocab_start, float scale) {
  DISTPLAN_ON_CUDA(cuda::ce_softmax_grad(p, targets, ii(N), ii(V), ii(vocab_start), scale));
  cpu::ce_softmax_grad(p, targets, N, V, vocab_start, scale);
}

void set_fp32_gemm_tf32([[maybe_unused]] bool on) {
#ifdef DISTPLAN_HAVE_CUDA
  cuda::set_fp32_gemm_tf32(on);
#endif
}

void flash_attention_forward([[maybe_unused]] Device d, const float* q, const float* k,
                             const float* v, float* out, float* lse, Count s, Count b, Count a,
                             Count g, Count hd) {
  DISTPLAN_ON_CUDA(
      cuda::flash_attention_forward(q, k, v, out, lse, ii(s), ii(b), ii(a), ii(g), ii(hd)));
  cpu::flash_attention_forward(q, k, v, out, lse, s, b, a, g, hd);
}

void flash_attention_backward([[maybe_unused]] Device d, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              float* dq, float* dk, float* dv, Count s, Count b, Count a, Count g,
                              Count hd) {
  DISTPLAN_ON_CUDA(cuda::flash_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, ii(s), ii(b),
                                                  ii(a), ii(g), ii(hd)));
  cpu::flash_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, s, b, a, g, hd);
}

void rotary_forward([[maybe_unused]] Device d, float* x, Count s, Count b, Count heads, Count hd,
                    double theta) {
  DISTPLAN_ON_CUDA(cuda::rotary_forward(x, ii(s), ii(b), ii(heads), ii(hd), theta));
  cpu::rotary_forward(x, s, b, heads, hd, theta);
}

void rotary_backward([[maybe_unused]] Device d, float* dx, Count s, Count b, Count heads, Count hd,
                     double theta) {
  DISTPLAN_ON_CUDA(cuda::rotary_backward(dx, ii(s), ii(b), ii(heads), ii(hd), theta));
  cpu::rotary_backward(dx, s, b, heads, hd, theta);
}

void linear_backward_weight([[maybe_unused]] Device d, [[maybe_unused]] DType dtype,
                            const float* dy, const float* x, float* dw, float* dbias, Count N,
                            Count I, Count O) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    const cuda::Type t = cuda_type(dtype);
    if (t == cuda::Type::fp32) {
      cuda::linear_backward_weight(t, dy, x, dw, dbias, ii(N), ii(I), ii(O));
      return;
    }
    Scratch dyc(N * O, 2), xc(N * I, 2);
    cuda::cast(cuda::Type::fp32, dy, t, dyc.get(), zz(N * O));
    cuda::cast(cuda::Type::fp32, x, t, xc.get(), zz(N * I));
    cuda::linear_backward_weight(t, dyc.get(), xc.get(), dw, nullptr, ii(N), ii(I), ii(O));
    if (dbias != nullptr && N * O > 0) cuda::bias_grad(dy, dbias, ii(N), ii(O));
    return;
  }
#endif
  cpu::linear_backward_weight(dy, x, dw, dbias, N, I, O);
}

void linear_forward([[maybe_unused]] Device d, const float* x, const Tensor& w, Count w_offset,
                    const float* bias, float* y, Count N, Count I, Count O) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    const void* wd = device_slice(w, w_offset, O * I);
    const cuda::Type t = cuda_type(w.dtype());
    if (t == cuda::Type::fp32) {
      cuda::linear_forward(t, x, wd, bias, y, ii(N), ii(I), ii(O));
    } else {
      Scratch xc(N * I, 2), yc(N * O, 2);
      cuda::cast(cuda::Type::fp32, x, t, xc.get(), zz(N * I));
      cuda::linear_forward(t, xc.get(), wd, bias, yc.get(), ii(N), ii(I), ii(O));
      cuda::cast(t, yc.get(), cuda::Type::fp32, y, zz(N * O));
    }
    return;
  }
#endif
  const std::vector<float> wh = weight_slice(w, w_offset, O * I);
  cpu::linear_forward(x, wh.data(), bias, y, N, I, O);
}

void linear_backward_input([[maybe_unused]] Device d, const float* dy, const Tensor& w,
                           Count w_offset, float* dx, Count N, Count I, Count O) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    const void* wd = device_slice(w, w_offset, O * I);
    const cuda::Type t = cuda_type(w.dtype());
    if (t == cuda::Type::fp32) {
      cuda::linear_backward_input(t, dy, wd, dx, ii(N), ii(I), ii(O));
    } else {
      Scratch dyc(N * O, 2), dxc(N * I, 2);
      cuda::cast(cuda::Type::fp32, dy, t, dyc.get(), zz(N * O));
      cuda::linear_backward_input(t, dyc.get(), wd, dxc.get(), ii(N), ii(I), ii(O));
      cuda::cast(t, dxc.get(), cuda::Type::fp32, dx, zz(N * I));
    }
    return;
  }
#endif
  const std::vector<float> wh = weight_slice(w, w_offset, O * I);
  cpu::linear_backward_input(dy, wh.data(), dx, N, I, O);
}

void embedding_forward([[maybe_unused]] Device d, const std::int32_t* ids, const Tensor& table,
                       Count offset, float* out, Count N, Count C, Count vocab_start, Count V) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    std::optional<Scratch> scratch;
    const float* td = fp32_view(table, offset, V * C, scratch);
    cuda::embedding_forward(ids, td, out, ii(N), ii(C), ii(vocab_start), ii(V));
    return;
  }
#endif
  const std::vector<float> th = weight_slice(table, offset, V * C);
  cpu::embedding_forward(ids, th.data(), out, N, C, vocab_start, V);
}

bool has_overflow([[maybe_unused]] Device d, const Tensor& t, Count off, Count n) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    std::optional<Scratch> tmp;
    return cuda::has_overflow(fp32_view(t, off, n, tmp), zz(n));
  }
#endif
  std::vector<float> h(static_cast<std::size_t>(n));
  t.read(h.data(), n, off);
  return cpu::has_overflow(h.data(), n);
}

void add_into([[maybe_unused]] Device d, Tensor& dst, Count off, const float* g, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= dst.numel(), "add_into range");
  if (n == 0) return;
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    char* p = static_cast<char*>(dst.data()) + off * bytes_of(dst.dtype());
    if (dst.dtype() == DType::fp32) {
      cuda::add(reinterpret_cast<float*>(p), g, reinterpret_cast<float*>(p), zz(n));
    } else {
      Scratch sum(n, sizeof(float));
      cuda::cast(cuda_type(dst.dtype()), p, cuda::Type::fp32, sum.f32(), zz(n));
      cuda::add(sum.f32(), g, sum.f32(), zz(n));
      cuda::cast(cuda::Type::fp32, sum.f32(), cuda_type(dst.dtype()), p, zz(n));
    }
    return;
  }
#endif
  std::vector<float> cur(static_cast<std::size_t>(n));
  dst.read(cur.data(), n, off);
  for (std::size_t k = 0; k < cur.size(); ++k) cur[k] += g[k];
  dst.write(cur.data(), n, off);
}

void synchronize([[maybe_unused]] Device d) {
  DISTPLAN_ON_CUDA(cuda::synchronize());
}

void copy_bytes([[maybe_unused]] Device d, void* dst, const void* src, std::size_t bytes) {
  DISTPLAN_ON_CUDA(cuda::copy_on_device(dst, src, bytes));
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void read_tensor([[maybe_unused]] Device d, const Tensor& t, Count off, float* out, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= t.numel(), "read_tensor range");
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    const char* src = static_cast<const char*>(t.data()) + off * bytes_of(t.dtype());
    if (n > 0) cuda::cast(cuda_type(t.dtype()), src, cuda::Type::fp32, out, zz(n));
    return;
  }
#endif
  t.read(out, n, off);
}

void write_tensor([[maybe_unused]] Device d, Tensor& t, Count off, const float* in, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= t.numel(), "write_tensor range");
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    char* dst = static_cast<char*>(t.data()) + off * bytes_of(t.dtype());
    if (n > 0) cuda::cast(cuda::Type::fp32, in, cuda_type(t.dtype()), dst, zz(n));
    return;
  }
#endif
  t.write(in, n, off);
}

void add([[maybe_unused]] Device d, const float* a, const float* b, float* y, Count n) {
  DISTPLAN_ON_CUDA(cuda::add(a, b, y, zz(n)));
  for (Count i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void scale([[maybe_unused]] Device d, float* x, float a, Count n) {
  DISTPLAN_ON_CUDA(cuda::scale(x, a, zz(n)));
  for (Count i = 0; i < n; ++i) x[i] *= a;
}

void add_bias_rows([[maybe_unused]] Device d, float* y, const float* bias, Count N, Count O) {
  DISTPLAN_ON_CUDA(if (N * O > 0) cuda::add_bias(cuda::Type::fp32, y, bias, ii(N), ii(O)));
  for (Count n = 0; n < N; ++n)
    for (Count c = 0; c < O; ++c) y[n * O + c] += bias[c];
}

void col_sum([[maybe_unused]] Device d, const float* x, float* out, Count N, Count C) {
  DISTPLAN_ON_CUDA(if (N * C > 0) cuda::bias_grad(x, out, ii(N), ii(C)));
  for (Count n = 0; n < N; ++n)
    for (Count c = 0; c < C; ++c) out[c] += x[n * C + c];
}

void round_to([[maybe_unused]] Device d, float* x, Count n, DType dtype) {
  if (dtype == DType::fp32) return;
  DISTPLAN_ON_CUDA(cuda::round_to(cuda_type(dtype), x, zz(n)));
  for (Count i = 0; i < n; ++i) x[i] = backend::round_to(dtype, x[i]);
}

void copy_block([[maybe_unused]] Device d, float* dst, Count dst_ld, const float* src, Count src_ld,
                Count rows, Count cols) {
  DISTPLAN_CHECK(rows >= 0 && cols >= 0 && cols <= dst_ld && cols <= src_ld, "copy_block shape");
  DISTPLAN_ON_CUDA(
      cuda::copy_rows_on_device(dst, zz(dst_ld) * 4, src, zz(src_ld) * 4, zz(cols) * 4, zz(rows)));
  for (Count r = 0; r < rows; ++r)
    std::copy(src + r * src_ld, src + r * src_ld + cols, dst + r * dst_ld);
}

void optimizer_step_on_device([[maybe_unused]] Device d,
                              [[maybe_unused]] const OptimizerOnDevice& a) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    DISTPLAN_CHECK(a.m->numel() == a.n && (a.sgd || a.v->numel() == a.n), "optimizer state size");
    DISTPLAN_CHECK(a.master->dtype() == DType::fp32, "master weights must be fp32");
    std::optional<Scratch> scratch;
    const float* g = fp32_view(*a.grads, a.grad_off, a.n, scratch);
    float* w = a.master->f32() + a.master_off;
    const cpu::AdamConfig& c = a.config;
    if (a.sgd) {
      cuda::sgd_step(w, g, a.m->f32(), zz(a.n), c.lr, a.momentum, a.grad_scale);
    } else {
      cuda::adam_step(w, g, a.m->f32(), a.v->f32(), zz(a.n), c.lr, c.beta1, c.beta2, c.eps,
                      c.weight_decay, c.decoupled, a.step, a.grad_scale);
    }
    if (a.weights != nullptr) {
      char* dst =
          static_cast<char*>(a.weights->data()) + a.weights_off * bytes_of(a.weights->dtype());
      cuda::cast(cuda::Type::fp32, w, cuda_type(a.weights->dtype()), dst, zz(a.n));
    }
    return;
  }
#endif
  DISTPLAN_CHECK(false, "optimizer_step_on_device needs the CUDA device");
}

#undef DISTPLAN_ON_CUDA

}  // namespace distplan::backend::dev
