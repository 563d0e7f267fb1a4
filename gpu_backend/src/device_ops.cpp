#include "distplan/gpu_backend/device_ops.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
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

// A device copy of `n` host elements (zeros when `host` is null), freed with the scope; `out()`
// copies it back.
template <class T>
class Staged {
 public:
  Staged(const T* host, Count n) : n_(zz(n)) {
    p_ = static_cast<T*>(cuda::device_alloc_zeroed(bytes() == 0 ? sizeof(T) : bytes()));
    if (host != nullptr && n_ > 0) cuda::copy_to_device(p_, host, bytes());
  }
  ~Staged() { cuda::device_free(p_); }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  T* get() { return p_; }
  void out(T* host) const {
    if (n_ > 0) cuda::copy_to_host(host, p_, bytes());
  }

 private:
  std::size_t bytes() const { return n_ * sizeof(T); }
  std::size_t n_;
  T* p_ = nullptr;
};
using F = Staged<float>;
using I32 = Staged<std::int32_t>;
#endif

}  // namespace

void layernorm_forward([[maybe_unused]] Device d, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, Count N, Count C,
                       double eps) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F xd(x, N * C), gd(gamma, C), yd(nullptr, N * C), md(nullptr, N), rd(nullptr, N);
    if (beta != nullptr) {
      F bd(beta, C);
      cuda::layernorm_forward(xd.get(), gd.get(), bd.get(), yd.get(), md.get(), rd.get(), ii(N),
                              ii(C), static_cast<float>(eps));
    } else {
      cuda::layernorm_forward(xd.get(), gd.get(), nullptr, yd.get(), md.get(), rd.get(), ii(N),
                              ii(C), static_cast<float>(eps));
    }
    yd.out(y);
    md.out(mean);
    rd.out(rstd);
    return;
  }
#endif
  cpu::layernorm_forward(x, gamma, beta, y, mean, rstd, N, C, eps);
}

void layernorm_backward([[maybe_unused]] Device d, const float* dy, const float* x,
                        const float* gamma, const float* mean, const float* rstd, float* dx,
                        float* dgamma, float* dbeta, Count N, Count C) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    DISTPLAN_CHECK(dbeta != nullptr, "layernorm_backward on CUDA needs dbeta");
    F dyd(dy, N * C), xd(x, N * C), gd(gamma, C), md(mean, N), rd(rstd, N), dxd(nullptr, N * C),
        dgd(dgamma, C), dbd(dbeta, C);
    cuda::layernorm_backward(dyd.get(), xd.get(), gd.get(), md.get(), rd.get(), dxd.get(),
                             dgd.get(), dbd.get(), ii(N), ii(C));
    dxd.out(dx);
    dgd.out(dgamma);
    dbd.out(dbeta);
    return;
  }
#endif
  cpu::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, N, C);
}

void rmsnorm_forward([[maybe_unused]] Device d, const float* x, const float* gamma, float* y,
                     float* rstd, Count N, Count C, double eps) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F xd(x, N * C), gd(gamma, C), yd(nullptr, N * C), rd(nullptr, N);
    cuda::rmsnorm_forward(xd.get(), gd.get(), yd.get(), rd.get(), ii(N), ii(C),
                          static_cast<float>(eps));
    yd.out(y);
    rd.out(rstd);
    return;
  }
#endif
  cpu::rmsnorm_forward(x, gamma, y, rstd, N, C, eps);
}

void rmsnorm_backward([[maybe_unused]] Device d, const float* dy, const float* x,
                      const float* gamma, const float* rstd, float* dx, float* dgamma, Count N,
                      Count C) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F dyd(dy, N * C), xd(x, N * C), gd(gamma, C), rd(rstd, N), dxd(nullptr, N * C), dgd(dgamma, C);
    cuda::rmsnorm_backward(dyd.get(), xd.get(), gd.get(), rd.get(), dxd.get(), dgd.get(), ii(N),
                           ii(C));
    dxd.out(dx);
    dgd.out(dgamma);
    return;
  }
#endif
  cpu::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, N, C);
}

void gelu_forward([[maybe_unused]] Device d, const float* x, float* y, Count n) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F xd(x, n), yd(nullptr, n);
    cuda::gelu_forward(xd.get(), yd.get(), zz(n));
    yd.out(y);
    return;
  }
#endif
  cpu::gelu_forward(x, y, n);
}

void gelu_backward([[maybe_unused]] Device d, const float* dy, const float* x, float* dx, Count n) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F dyd(dy, n), xd(x, n), dxd(nullptr, n);
    cuda::gelu_backward(dyd.get(), xd.get(), dxd.get(), zz(n));
    dxd.out(dx);
    return;
  }
#endif
  cpu::gelu_backward(dy, x, dx, n);
}

void swiglu_forward([[maybe_unused]] Device d, const float* gate, const float* up, float* y,
                    Count n) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F gd(gate, n), ud(up, n), yd(nullptr, n);
    cuda::swiglu_forward(gd.get(), ud.get(), yd.get(), zz(n));
    yd.out(y);
    return;
  }
#endif
  cpu::swiglu_forward(gate, up, y, n);
}

void swiglu_backward([[maybe_unused]] Device d, const float* dy, const float* gate, const float* up,
                     float* dgate, float* dup, Count n) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F dyd(dy, n), gd(gate, n), ud(up, n), dgd(nullptr, n), dud(nullptr, n);
    cuda::swiglu_backward(dyd.get(), gd.get(), ud.get(), dgd.get(), dud.get(), zz(n));
    dgd.out(dgate);
    dud.out(dup);
    return;
  }
#endif
  cpu::swiglu_backward(dy, gate, up, dgate, dup, n);
}

void attention_forward([[maybe_unused]] Device d, const float* q, const float* k, const float* v,
                       float* out, float* probs, Count s, Count b, Count a, Count g, Count hd) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    DISTPLAN_CHECK(g > 0 && a % g == 0, "query heads must be a multiple of key/value heads");
    F qd(q, s * b * a * hd), kd(k, s * b * g * hd), vd(v, s * b * g * hd),
        od(nullptr, s * b * a * hd), pd(nullptr, b * a * s * s);
    cuda::attention_forward(qd.get(), kd.get(), vd.get(), od.get(), pd.get(), ii(s), ii(b), ii(a),
                            ii(g), ii(hd));
    od.out(out);
    pd.out(probs);
    return;
  }
#endif
  cpu::attention_forward(q, k, v, out, probs, s, b, a, g, hd);
}

void attention_backward([[maybe_unused]] Device d, const float* dout, const float* q,
                        const float* k, const float* v, const float* probs, float* dq, float* dk,
                        float* dv, Count s, Count b, Count a, Count g, Count hd) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    DISTPLAN_CHECK(g > 0 && a % g == 0, "query heads must be a multiple of key/value heads");
    // The kernel accumulates into dq, dk and dv: they start from zero (the CPU op overwrites).
    F dod(dout, s * b * a * hd), qd(q, s * b * a * hd), kd(k, s * b * g * hd),
        vd(v, s * b * g * hd), pd(probs, b * a * s * s), dqd(nullptr, s * b * a * hd),
        dkd(nullptr, s * b * g * hd), dvd(nullptr, s * b * g * hd);
    cuda::attention_backward(dod.get(), qd.get(), kd.get(), vd.get(), pd.get(), dqd.get(),
                             dkd.get(), dvd.get(), ii(s), ii(b), ii(a), ii(g), ii(hd));
    dqd.out(dq);
    dkd.out(dk);
    dvd.out(dv);
    return;
  }
#endif
  cpu::attention_backward(dout, q, k, v, probs, dq, dk, dv, s, b, a, g, hd);
}

void embedding_backward([[maybe_unused]] Device d, const std::int32_t* ids, const float* dout,
                        float* dtable, Count N, Count C, Count vocab_start, Count V) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    I32 idd(ids, N);
    F dod(dout, N * C), dtd(dtable, V * C);
    cuda::embedding_backward(idd.get(), dod.get(), dtd.get(), ii(N), ii(C), ii(vocab_start), ii(V));
    dtd.out(dtable);
    return;
  }
#endif
  cpu::embedding_backward(ids, dout, dtable, N, C, vocab_start, V);
}

void ce_local_max([[maybe_unused]] Device d, const float* logits, float* row_max, Count N,
                  Count V) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F ld(logits, N * V), md(nullptr, N);
    cuda::ce_local_max(ld.get(), md.get(), ii(N), ii(V));
    md.out(row_max);
    return;
  }
#endif
  cpu::ce_local_max(logits, row_max, N, V);
}

void ce_local_sumexp([[maybe_unused]] Device d, const float* logits, const float* row_max,
                     float* sumexp, Count N, Count V) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F ld(logits, N * V), md(row_max, N), sd(nullptr, N);
    cuda::ce_local_sumexp(ld.get(), md.get(), sd.get(), ii(N), ii(V));
    sd.out(sumexp);
    return;
  }
#endif
  cpu::ce_local_sumexp(logits, row_max, sumexp, N, V);
}

void ce_local_target([[maybe_unused]] Device d, const float* logits, const std::int32_t* targets,
                     float* target_logit, Count N, Count V, Count vocab_start) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F ld(logits, N * V), td(nullptr, N);
    I32 tg(targets, N);
    cuda::ce_local_target(ld.get(), tg.get(), td.get(), ii(N), ii(V), ii(vocab_start));
    td.out(target_logit);
    return;
  }
#endif
  cpu::ce_local_target(logits, targets, target_logit, N, V, vocab_start);
}

namespace {
#ifdef DISTPLAN_HAVE_CUDA
// A raw fp32 device buffer outside the tracking allocator (a cast's scratch), freed with the scope.
class DeviceF32 {
 public:
  DeviceF32() = default;
  DeviceF32(const DeviceF32&) = delete;
  DeviceF32& operator=(const DeviceF32&) = delete;
  ~DeviceF32() {
    if (p_ != nullptr) cuda::device_free(p_);
  }
  float* allocate(Count n) {
    DISTPLAN_CHECK(p_ == nullptr && n >= 0, "scratch buffer allocated twice");
    p_ = static_cast<float*>(
        cuda::device_alloc_zeroed(static_cast<std::size_t>(std::max<Count>(n, 1)) * 4));
    return p_;
  }

 private:
  float* p_ = nullptr;
};
cuda::Type cuda_type(DType d) {
  return static_cast<cuda::Type>(static_cast<int>(d));
}
// Elements [off, off + n) of a device tensor as fp32 on the device: the tensor itself when it is
// fp32, else a cast into `scratch`.
const float* fp32_view(const Tensor& t, Count off, Count n, DeviceF32& scratch) {
  DISTPLAN_CHECK(off >= 0 && off + n <= t.numel(), "device view out of range");
  if (t.dtype() == DType::fp32) return t.f32() + off;
  float* out = scratch.allocate(n);
  const char* src = static_cast<const char*>(t.data()) + off * bytes_of(t.dtype());
  cuda::cast(cuda_type(t.dtype()), src, cuda::Type::fp32, out, static_cast<std::size_t>(n));
  return out;
}
#endif
}  // namespace

void set_fp32_gemm_tf32([[maybe_unused]] bool on) {
#ifdef DISTPLAN_HAVE_CUDA
  cuda::set_fp32_gemm_tf32(on);
#endif
}

void flash_attention_forward([[maybe_unused]] Device d, const float* q, const float* k,
                             const float* v, float* out, float* lse, Count s, Count b, Count a,
                             Count g, Count hd) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F qd(q, s * b * a * hd), kd(k, s * b * g * hd), vd(v, s * b * g * hd),
        od(nullptr, s * b * a * hd), ld(nullptr, b * a * s);
    cuda::flash_attention_forward(qd.get(), kd.get(), vd.get(), od.get(), ld.get(), ii(s), ii(b),
                                  ii(a), ii(g), ii(hd));
    od.out(out);
    ld.out(lse);
    return;
  }
#endif
  cpu::flash_attention_forward(q, k, v, out, lse, s, b, a, g, hd);
}

void flash_attention_backward([[maybe_unused]] Device d, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              float* dq, float* dk, float* dv, Count s, Count b, Count a, Count g,
                              Count hd) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F dod(dout, s * b * a * hd), qd(q, s * b * a * hd), kd(k, s * b * g * hd),
        vd(v, s * b * g * hd), od(out, s * b * a * hd), ld(lse, b * a * s),
        dqd(nullptr, s * b * a * hd), dkd(nullptr, s * b * g * hd), dvd(nullptr, s * b * g * hd);
    cuda::flash_attention_backward(dod.get(), qd.get(), kd.get(), vd.get(), od.get(), ld.get(),
                                   dqd.get(), dkd.get(), dvd.get(), ii(s), ii(b), ii(a), ii(g),
                                   ii(hd));
    dqd.out(dq);
    dkd.out(dk);
    dvd.out(dv);
    return;
  }
#endif
  cpu::flash_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, s, b, a, g, hd);
}

void rotary_forward([[maybe_unused]] Device d, float* x, Count s, Count b, Count heads, Count hd,
                    double theta) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F xd(x, s * b * heads * hd);
    cuda::rotary_forward(xd.get(), ii(s), ii(b), ii(heads), ii(hd), theta);
    xd.out(x);
    return;
  }
#endif
  cpu::rotary_forward(x, s, b, heads, hd, theta);
}

void rotary_backward([[maybe_unused]] Device d, float* dx, Count s, Count b, Count heads, Count hd,
                     double theta) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    F xd(dx, s * b * heads * hd);
    cuda::rotary_backward(xd.get(), ii(s), ii(b), ii(heads), ii(hd), theta);
    xd.out(dx);
    return;
  }
#endif
  cpu::rotary_backward(dx, s, b, heads, hd, theta);
}

void linear_backward_weight([[maybe_unused]] Device d, const float* dy, const float* x, float* dw,
                            float* dbias, Count N, Count I, Count O) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) return cuda::linear_backward_weight_host(dy, x, dw, dbias, ii(N), ii(I), ii(O));
#endif
  cpu::linear_backward_weight(dy, x, dw, dbias, N, I, O);
}

namespace {
// The host copy of W for the CPU oracle.
std::vector<float> weight_slice(const Tensor& w, Count off, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= w.numel(), "weight slice out of range");
  std::vector<float> h(static_cast<std::size_t>(n));
  w.read(h.data(), n, off);
  return h;
}
#ifdef DISTPLAN_HAVE_CUDA
const void* device_slice(const Tensor& w, Count off, Count n) {
  DISTPLAN_CHECK(off >= 0 && n >= 0 && off + n <= w.numel(), "weight slice out of range");
  return static_cast<const char*>(w.data()) + off * bytes_of(w.dtype());
}
using U16 = Staged<std::uint16_t>;
#endif
}  // namespace

void linear_forward([[maybe_unused]] Device d, const float* x, const Tensor& w, Count w_offset,
                    const float* bias, float* y, Count N, Count I, Count O) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    const void* wd = device_slice(w, w_offset, O * I);
    const cuda::Type t = cuda_type(w.dtype());
    F xd(x, N * I), yd(nullptr, N * O);
    F bd(bias, bias != nullptr ? O : 0);
    const float* bp = bias != nullptr ? bd.get() : nullptr;
    if (t == cuda::Type::fp32) {
      cuda::linear_forward(t, xd.get(), wd, bp, yd.get(), ii(N), ii(I), ii(O));
    } else {
      U16 xc(nullptr, N * I), yc(nullptr, N * O);
      cuda::cast(cuda::Type::fp32, xd.get(), t, xc.get(), zz(N * I));
      cuda::linear_forward(t, xc.get(), wd, bp, yc.get(), ii(N), ii(I), ii(O));
      cuda::cast(t, yc.get(), cuda::Type::fp32, yd.get(), zz(N * O));
    }
    yd.out(y);
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
    F dyd(dy, N * O), dxd(nullptr, N * I);
    if (t == cuda::Type::fp32) {
      cuda::linear_backward_input(t, dyd.get(), wd, dxd.get(), ii(N), ii(I), ii(O));
    } else {
      U16 dyc(nullptr, N * O), dxc(nullptr, N * I);
      cuda::cast(cuda::Type::fp32, dyd.get(), t, dyc.get(), zz(N * O));
      cuda::linear_backward_input(t, dyc.get(), wd, dxc.get(), ii(N), ii(I), ii(O));
      cuda::cast(t, dxc.get(), cuda::Type::fp32, dxd.get(), zz(N * I));
    }
    dxd.out(dx);
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
    DeviceF32 scratch;
    const float* td = fp32_view(table, offset, V * C, scratch);
    I32 idd(ids, N);
    F od(nullptr, N * C);
    cuda::embedding_forward(idd.get(), td, od.get(), ii(N), ii(C), ii(vocab_start), ii(V));
    od.out(out);
    return;
  }
#endif
  const std::vector<float> th = weight_slice(table, offset, V * C);
  cpu::embedding_forward(ids, th.data(), out, N, C, vocab_start, V);
}

bool has_overflow([[maybe_unused]] Device d, const Tensor& t, Count off, Count n) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    DeviceF32 tmp;
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
    F gd(g, n);
    char* p = static_cast<char*>(dst.data()) + off * bytes_of(dst.dtype());
    if (dst.dtype() == DType::fp32) {
      cuda::add(reinterpret_cast<float*>(p), gd.get(), reinterpret_cast<float*>(p), zz(n));
    } else {
      F sum(nullptr, n);
      cuda::cast(cuda_type(dst.dtype()), p, cuda::Type::fp32, sum.get(), zz(n));
      cuda::add(sum.get(), gd.get(), sum.get(), zz(n));
      cuda::cast(cuda::Type::fp32, sum.get(), cuda_type(dst.dtype()), p, zz(n));
    }
    return;
  }
#endif
  std::vector<float> cur(static_cast<std::size_t>(n));
  dst.read(cur.data(), n, off);
  for (std::size_t k = 0; k < cur.size(); ++k) cur[k] += g[k];
  dst.write(cur.data(), n, off);
}

void copy_bytes([[maybe_unused]] Device d, void* dst, const void* src, std::size_t bytes) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) return cuda::copy_on_device(dst, src, bytes);
#endif
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void adam_step_on_device([[maybe_unused]] Device d, [[maybe_unused]] const AdamOnDevice& a) {
#ifdef DISTPLAN_HAVE_CUDA
  if (on_cuda(d)) {
    DISTPLAN_CHECK(a.m->numel() == a.n && a.v->numel() == a.n, "optimizer state size");
    DISTPLAN_CHECK(a.master->dtype() == DType::fp32, "master weights must be fp32");
    DeviceF32 scratch;
    const float* g = fp32_view(*a.grads, a.grad_off, a.n, scratch);
    float* w = a.master->f32() + a.master_off;
    const cpu::AdamConfig& c = a.config;
    cuda::adam_step(w, g, a.m->f32(), a.v->f32(), zz(a.n), c.lr, c.beta1, c.beta2, c.eps,
                    c.weight_decay, c.decoupled, a.step, a.grad_scale);
    if (a.weights != nullptr) {
      char* dst =
          static_cast<char*>(a.weights->data()) + a.weights_off * bytes_of(a.weights->dtype());
      cuda::cast(cuda::Type::fp32, w, cuda_type(a.weights->dtype()), dst, zz(a.n));
    }
    return;
  }
#endif
  DISTPLAN_CHECK(false, "adam_step_on_device needs the CUDA device");
}

}  // namespace distplan::backend::dev
