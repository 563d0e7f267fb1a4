// The CUDA device: memory, copies and the kernels of the layer op table on device pointers.
// Declarations only (no CUDA headers), available when built with CUDA (DISTPLAN_HAVE_CUDA).
// Storage is fp32 for every op but the GEMMs, which take fp32, bf16 or fp16 inputs and accumulate
// in fp32 (cuBLASLt, CUBLAS_COMPUTE_32F); casts move between the storage types. The CPU ops
// (cpu_ops.h) are the oracle these kernels are tested against
// (tests/gpu_backend/cuda_ops_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distplan::backend::cuda {

/// Visible GPUs; 0 when there is no driver or device (never throws).
[[nodiscard]] int device_count() noexcept;
/// Selects the GPU this process uses.
void set_device(int index);
/// cudaMalloc + cudaMemset 0; throws OutOfMemory (memory.h) when the device is full.
[[nodiscard]] void* device_alloc_zeroed(std::size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void copy_on_device(void* dst, const void* src, std::size_t bytes);  // may overlap
void zero_on_device(void* dst, std::size_t bytes);
void synchronize();
/// The trainer's working fp32 arrays (device_array.h) come from a cache of freed blocks, by
/// size class (512 B multiples up to 1 MiB, 2 MiB multiples above), so a step never calls
/// cudaMalloc or cudaFree (which synchronise the device) once its shapes have been seen. Blocks
/// are zeroed on the default stream, which orders them after the kernels that used them last.
/// Outside the tracking allocator, as staging buffers were (docs/gpu_backend.md).
[[nodiscard]] void* pool_alloc(std::size_t bytes);
void pool_free(void* p, std::size_t bytes) noexcept;
/// Bytes the device reports in use (cudaMemGetInfo: total - free), the driver's own figure.
[[nodiscard]] std::size_t device_used_bytes();

/// Copies `rows` rows of `row_bytes` between device arrays of row pitches `dst_pitch` and
/// `src_pitch` bytes (cudaMemcpy2D): splits and packs of fused projections.
void copy_rows_on_device(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                         std::size_t row_bytes, std::size_t rows);
/// The selected GPU's name and compute capability (major * 10 + minor).
[[nodiscard]] std::string device_name();
[[nodiscard]] int compute_capability();

/// Storage type codes for GEMM inputs and casts, numbered as planner DType (spec.h).
enum class Type : int { fp32 = 0, fp16 = 1, bf16 = 2 };

/// Elements [offset, offset + n) of a device tensor of storage type `dtype` (a Type code) read
/// into fp32 host memory, or written from it (rounded to nearest even): Tensor::read/write.
void read_as_float(const void* data, int dtype, long long offset, long long n, float* out);
void write_from_float(void* data, int dtype, long long offset, long long n, const float* in);

// --- GEMMs (cuBLAS), row-major as cpu_ops.h: y (N,O) = x (N,I) W^T (+ bias), W (O,I) ---------
/// GEMMs run through cuBLASLt with fp32 accumulation: bf16/fp16 inputs on tensor cores; fp32
/// inputs in full fp32, or on TF32 tensor cores (10-bit mantissa inputs) after
/// set_fp32_gemm_tf32(true) (this thread's GEMMs). Zero sizes are allowed (an empty sum is 0).
void set_fp32_gemm_tf32(bool on);
/// `t` is the storage type of x, w and y; bias (fp32, may be null) is added by a kernel.
void linear_forward(Type t, const void* x, const void* w, const float* bias, void* y, int N, int I,
                    int O);
/// dx (N,I) = dy (N,O) W
void linear_backward_input(Type t, const void* dy, const void* w, void* dx, int N, int I, int O);
/// dW (O,I) += dy^T x (dw fp32); dbias (O) += column sums of dy (fp32 dy only; may be null).
void linear_backward_weight(Type t, const void* dy, const void* x, float* dw, float* dbias, int N,
                            int I, int O);

/// y (N,O) += bias (O) broadcast over rows, in y's storage type; dbias (O) += column sums of dy.
void add_bias(Type t, void* y, const float* bias, int N, int O);
void bias_grad(const float* dy, float* dbias, int N, int O);

// --- thin kernels, fp32 ---------------------------------------------------------------------
void cast(Type from, const void* in, Type to, void* out, std::size_t n);
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int N, int C, float eps);
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int N, int C);
void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int N, int C,
                     float eps);
void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd,
                      float* dx, float* dgamma, int N, int C);
void gelu_forward(const float* x, float* y, std::size_t n);
void gelu_backward(const float* dy, const float* x, float* dx, std::size_t n);
void swiglu_forward(const float* gate, const float* up, float* y, std::size_t n);
void swiglu_backward(const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                     std::size_t n);
/// Causal attention with materialised probabilities probs (b,a,s,s); q (s,b,a,d), k/v (s,b,g,d).
void attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                       int s, int b, int a, int g, int d);
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* probs, float* dq, float* dk, float* dv, int s, int b, int a,
                        int g, int d);
/// Flash-style causal attention (cpu::flash_attention_*): tiled, saves lse (b,a,s) only; the
/// backward overwrites dq, dk and dv. Head dims up to 256.
void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                             int s, int b, int a, int g, int d);
void flash_attention_backward(const float* dout, const float* q, const float* k, const float* v,
                              const float* out, const float* lse, float* dq, float* dk, float* dv,
                              int s, int b, int a, int g, int d);
/// Rotary position embedding in place on x (s,b,heads,d) (cpu::rotary_*).
void rotary_forward(float* x, int s, int b, int heads, int d, double theta);
void rotary_backward(float* dx, int s, int b, int heads, int d, double theta);
void embedding_forward(const std::int32_t* ids, const float* table, float* out, int N, int C,
                       int vocab_start, int V);
void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int N, int C,
                        int vocab_start, int V);
void ce_local_max(const float* logits, float* row_max, int N, int V);
void ce_local_sumexp(const float* logits, const float* row_max, float* sumexp, int N, int V);
void ce_local_target(const float* logits, const std::int32_t* targets, float* target_logit, int N,
                     int V, int vocab_start);
void ce_backward(const float* logits, const float* row_max, const float* sumexp,
                 const std::int32_t* targets, const float* dloss, float* dlogits, int N, int V,
                 int vocab_start);
/// Adam/AdamW on fp32 master weights, as cpu::adam_step.
void adam_step(float* master, const float* grad, float* m, float* v, std::size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, bool decoupled,
               long long step, float grad_scale);
/// SGD with momentum on fp32 master weights, as cpu::sgd_step.
void sgd_step(float* master, const float* grad, float* momentum, std::size_t n, float lr, float mu,
              float grad_scale);
/// Adam/AdamW over several fp32 tensors in one launch (the descriptors travel as the kernel's
/// argument, so no device copy or allocation): each tensor as adam_step.
struct AdamTensor {
  float* master = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  std::size_t n = 0;
};
inline constexpr int kMaxAdamTensors = 32;
struct AdamTensors {
  AdamTensor t[kMaxAdamTensors];
};
void adam_step_multi(const AdamTensors& ts, int count, float lr, float beta1, float beta2,
                     float eps, float weight_decay, bool decoupled, long long step,
                     float grad_scale);
/// Fused bias + activation of a column-parallel projection's output x (N,O), saving the biased
/// pre-activation for the backward (gelu_backward / swiglu_backward on `pre`): GeLU y (N,O);
/// SwiGLU on the packed gate|up (N,2F) with bias (2F), y (N,F).
void bias_gelu_forward(const float* x, const float* bias, float* pre, float* y, int N, int O);
void bias_swiglu_forward(const float* x, const float* bias, float* pre, float* y, int N, int F);
/// True when any element is inf or NaN.
[[nodiscard]] bool has_overflow(const float* x, std::size_t n);
/// y = a + b elementwise (residual connections); y may alias a or b.
void add(const float* a, const float* b, float* y, std::size_t n);
/// x *= a elementwise (the LoRA scale alpha / r).
void scale(float* x, float a, std::size_t n);
/// x rounded in place through storage type t (round to nearest even): the trainer's rounding of
/// an fp32 working array to the compute dtype.
void round_to(Type t, float* x, std::size_t n);
/// The fp32 softmax of vocabulary-parallel logits (N,V) from the row max and sum of exponentials
/// over the TP group: exp(l - max) / sumexp, in double as cpu::ce_softmax.
void ce_softmax(const float* logits, const float* row_max, const float* sumexp, float* softmax,
                int N, int V);
/// d loss / d logits in place on the softmax: (p - onehot(target)) * scale (cpu::ce_softmax_grad).
void ce_softmax_grad(float* p, const std::int32_t* targets, int N, int V, int vocab_start,
                     float scale);

// --- one GPT layer stack, forward + backward, entirely on the device -------------------------
/// Pre-norm GPT layers (LayerNorm, multi-head causal attention, GeLU MLP, no biases) with bf16
/// weights and GEMM inputs, fp32 accumulation and fp32 activations for the thin kernels above:
/// the ops the trainer runs on one rank without TP, with no host round trip in between.
struct LayerStackConfig {
  int hidden = 4096, heads = 32, ffn = 0 /* 0: 4 * hidden */, seq = 2048, batch = 1, layers = 2;
  int reps = 3;            // timed repetitions after one warm-up
  bool gemm_only = false;  // run only the GEMMs (the cuBLAS share of the same step)
};
struct LayerStackTiming {
  double seconds = 0;      // mean over reps of forward + backward, device time (CUDA events)
  double model_flops = 0;  // gemm_flops + causal attention (layer_stack_flops)
  double gemm_flops = 0;   // the GEMM part: per layer 6 N h (4h + 2f)
  double noncausal_model_flops = 0;  // Narayanan et al. 2021: 72 B s h^2 (1 + s / 6h), f = 4h
  double device_bytes = 0;           // device memory the stack allocated
};
[[nodiscard]] LayerStackTiming time_layer_stack(const LayerStackConfig& c);

/// FLOPs of one forward + backward of the layer stack (backward = 2 x forward; no recompute, no
/// LM head). GEMMs: per layer 2 N h (3h + h + 2f) forward, N = b s (Narayanan et al. 2021,
/// "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. for F
/// without recomputation). Attention: Q K^T and P V are 2 d FLOPs per (query, key) pair and head
/// each; a causal mask leaves s (s + 1) / 2 pairs per sequence, the full count (Narayanan's s / 6h
/// term) has s^2. Header-only: the count is tested without a GPU.
struct LayerStackFlops {
  double gemm = 0, attention_causal = 0, attention_full = 0;
};
[[nodiscard]] inline LayerStackFlops layer_stack_flops(const LayerStackConfig& c) {
  const double L = c.layers, b = c.batch, s = c.seq, h = c.hidden;
  const double f = c.ffn > 0 ? c.ffn : 4.0 * c.hidden, N = b * s;
  LayerStackFlops out;
  out.gemm = 3 * L * 2 * N * h * (4 * h + 2 * f);
  // Per head 4 d FLOPs per pair; summed over heads 4 h.
  out.attention_causal = 3 * L * b * 4 * h * (s * (s + 1) / 2);
  out.attention_full = 3 * L * b * 4 * h * s * s;
  return out;
}

/// Device time between two points of the stream the kernels run on (cudaEventRecord /
/// cudaEventElapsedTime): what the GPU spent, without the host's launch overhead or a
/// device-wide synchronisation inside the timed region.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  void stop();
  /// Seconds from start() to stop(); waits for the stop event.
  [[nodiscard]] double seconds();

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace distplan::backend::cuda
