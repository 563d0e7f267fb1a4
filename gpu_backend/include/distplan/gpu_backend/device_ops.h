// The trainer's ops by device: the CPU oracle (cpu_ops.h) on Device::cpu, the CUDA kernels
// (cuda.h) on Device::cuda. Every pointer is memory of device `d` (a DeviceArray's data(), a
// tensor's data): host memory on the CPU, device memory on CUDA, where the op runs without a
// copy to or from the host. Ids and targets are int32 arrays of the same device. Scratch (the
// 16-bit copies a tensor-core GEMM reads) comes from the working-array cache (cuda::pool_alloc),
// outside the tracking allocator, so the measured memory per category is the same on both
// devices. Without a CUDA build every call runs the CPU op.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/memory.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/units.h"

namespace distplan::backend::dev {

void layernorm_forward(Device d, const float* x, const float* gamma, const float* beta, float* y,
                       float* mean, float* rstd, Count N, Count C, double eps);
void layernorm_backward(Device d, const float* dy, const float* x, const float* gamma,
                        const float* mean, const float* rstd, float* dx, float* dgamma,
                        float* dbeta, Count N, Count C);
void rmsnorm_forward(Device d, const float* x, const float* gamma, float* y, float* rstd, Count N,
                     Count C, double eps);
void rmsnorm_backward(Device d, const float* dy, const float* x, const float* gamma,
                      const float* rstd, float* dx, float* dgamma, Count N, Count C);
void gelu_forward(Device d, const float* x, float* y, Count n);
void gelu_backward(Device d, const float* dy, const float* x, float* dx, Count n);
void swiglu_forward(Device d, const float* gate, const float* up, float* y, Count n);
void swiglu_backward(Device d, const float* dy, const float* gate, const float* up, float* dgate,
                     float* dup, Count n);
/// Standard causal attention (materialised probs); dq, dk, dv are overwritten.
void attention_forward(Device d, const float* q, const float* k, const float* v, float* out,
                       float* probs, Count s, Count b, Count a, Count g, Count hd);
void attention_backward(Device d, const float* dout, const float* q, const float* k, const float* v,
                        const float* probs, float* dq, float* dk, float* dv, Count s, Count b,
                        Count a, Count g, Count hd);
/// The table is the V x C elements of `table` from `offset`, read where it lives (cast to fp32
/// on the device on CUDA, no host copy).
void embedding_forward(Device d, const std::int32_t* ids, const Tensor& table, Count offset,
                       float* out, Count N, Count C, Count vocab_start, Count V);
/// dtable accumulates.
void embedding_backward(Device d, const std::int32_t* ids, const float* dout, float* dtable,
                        Count N, Count C, Count vocab_start, Count V);
void ce_local_max(Device d, const float* logits, float* row_max, Count N, Count V);
void ce_local_sumexp(Device d, const float* logits, const float* row_max, float* sumexp, Count N,
                     Count V);
void ce_local_target(Device d, const float* logits, const std::int32_t* targets,
                     float* target_logit, Count N, Count V, Count vocab_start);

/// Flash-style causal attention (lse (b,a,s) saved; backward overwrites dq, dk, dv).
void flash_attention_forward(Device d, const float* q, const float* k, const float* v, float* out,
                             float* lse, Count s, Count b, Count a, Count g, Count hd);
void flash_attention_backward(Device d, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, float* dq,
                              float* dk, float* dv, Count s, Count b, Count a, Count g, Count hd);
/// Rotary position embedding in place on x (s,b,heads,hd); backward the inverse rotation.
void rotary_forward(Device d, float* x, Count s, Count b, Count heads, Count hd, double theta);
void rotary_backward(Device d, float* dx, Count s, Count b, Count heads, Count hd, double theta);

// ---- GEMMs, row-major as cpu_ops.h ------------------------------------------------------------
/// CUDA: this thread's fp32 GEMMs on TF32 tensor cores (cuda::set_fp32_gemm_tf32); no effect on
/// the CPU.
void set_fp32_gemm_tf32(bool on);
/// dW (O,I) += dy^T x; dbias (O) += column sums of dy (may be null); dW and dbias fp32. dy and x
/// hold values of `dtype` (the compute dtype the trainer rounded them to): on CUDA a 16-bit dtype
/// casts them to it on the device (exact) and runs the GEMM on tensor cores with fp32
/// accumulation, as the forward's GEMMs; fp32 runs in fp32 (TF32 when asked).
void linear_backward_weight(Device d, DType dtype, const float* dy, const float* x, float* dw,
                            float* dbias, Count N, Count I, Count O);

// ---- GEMMs of a device-resident weight: W is the O x I elements of `w` from `w_offset`, in the
// tensor's storage dtype (the run's compute dtype), where the tensor lives. On CUDA x (or dy) is
// cast to W's dtype on the device, and a 16-bit W runs on tensor cores with fp32 accumulation
// (cuBLASLt); the result is cast back to fp32 (16-bit results are rounded to W's dtype, as the
// trainer's rounding does). On the CPU W is read as fp32 and the oracle runs.
/// y (N,O) = x (N,I) W^T (+ bias)
void linear_forward(Device d, const float* x, const Tensor& w, Count w_offset, const float* bias,
                    float* y, Count N, Count I, Count O);
/// dx (N,I) = dy (N,O) W
void linear_backward_input(Device d, const float* dy, const Tensor& w, Count w_offset, float* dx,
                           Count N, Count I, Count O);

// ---- ops on tensors where they live (the tensor's allocator device)
// ------------------------------
/// True when any element of [off, off + n) of `t` is inf or NaN.
[[nodiscard]] bool has_overflow(Device d, const Tensor& t, Count off, Count n);
/// dst[off + k] += g[k] for k < n, in fp32, rounded to dst's storage dtype: a gradient
/// accumulated where it lives.
void add_into(Device d, Tensor& dst, Count off, const float* g, Count n);
/// Waits until the device has finished all work queued on it (every stream); no-op on the CPU.
void synchronize(Device d);
/// Copies `bytes` bytes between two buffers of device `d` (host memory on the CPU).
void copy_bytes(Device d, void* dst, const void* src, std::size_t bytes);
/// Elements [off, off + n) of `t` as fp32 into `out`, or written from `in` (rounded to the
/// tensor's storage dtype, nearest even): Tensor::read/write without leaving the device.
void read_tensor(Device d, const Tensor& t, Count off, float* out, Count n);
void write_tensor(Device d, Tensor& t, Count off, const float* in, Count n);

// ---- elementwise and layout ops on working arrays -----------------------------------------------
/// y = a + b (y may alias a or b).
void add(Device d, const float* a, const float* b, float* y, Count n);
/// x *= a (the LoRA scale alpha / r).
void scale(Device d, float* x, float a, Count n);
/// y (N,O) += bias (O) on every row.
void add_bias_rows(Device d, float* y, const float* bias, Count N, Count O);
/// out (C) += column sums of x (N,C), rows in order on the CPU.
void col_sum(Device d, const float* x, float* out, Count N, Count C);
/// x rounded in place through `dtype` storage (no-op for fp32): the compute dtype's rounding.
void round_to(Device d, float* x, Count n, DType dtype);
/// Copies a rows x cols block between row-major arrays of leading dimensions src_ld and dst_ld
/// (elements); the pointers address the block's first element: splits and packs of fused
/// projections.
void copy_block(Device d, float* dst, Count dst_ld, const float* src, Count src_ld, Count rows,
                Count cols);
/// The softmax of the logits (cpu::ce_softmax) and, in place on it, d loss / d logits
/// (cpu::ce_softmax_grad).
void ce_softmax(Device d, const float* logits, const float* row_max, const float* sumexp,
                float* softmax, Count N, Count V);
void ce_softmax_grad(Device d, float* p, const std::int32_t* targets, Count N, Count V,
                     Count vocab_start, float scale);

/// One optimizer step (Adam/AdamW, or SGD with momentum when `sgd`) on state that stays on the
/// device: fp32 master weights (`master`, from `master_off`), the moments (fp32, n elements; SGD
/// keeps its momentum in `m`), gradients in any storage type (from
/// `grad_off`, cast to fp32 on the device when 16-bit), and, when `weights` is not null, its
/// compute-dtype copy refreshed from the master (round to nearest even) from `weights_off`.
/// Device::cuda only (the CPU trainer updates host copies with cpu::adam_step / cpu::sgd_step).
struct OptimizerOnDevice {
  const Tensor* grads = nullptr;
  Count grad_off = 0;
  Tensor* master = nullptr;
  Count master_off = 0;
  Tensor* m = nullptr;
  Tensor* v = nullptr;
  Tensor* weights = nullptr;
  Count weights_off = 0;
  Count n = 0;
  cpu::AdamConfig config;
  long long step = 1;
  float grad_scale = 1.0f;
  bool sgd = false;
  float momentum = 0.9f;  // SGD's
};
void optimizer_step_on_device(Device d, const OptimizerOnDevice& a);

}  // namespace distplan::backend::dev
