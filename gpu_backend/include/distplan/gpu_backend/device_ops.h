// The trainer's ops by device: the CPU oracle (cpu_ops.h) on Device::cpu, the CUDA kernels
// (cuda.h) on Device::cuda. Arrays are host fp32 (the trainer's working copies); on CUDA each call
// stages its inputs into device memory, runs the kernel and copies its outputs back. The staging
// buffers are raw device allocations freed on return, outside the tracking allocator, so the
// measured memory per category is the same on both devices. Without a CUDA build every call runs
// the CPU op.
#pragma once

#include <cstdint>

#include "distplan/gpu_backend/memory.h"
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
void embedding_forward(Device d, const std::int32_t* ids, const float* table, float* out, Count N,
                       Count C, Count vocab_start, Count V);
/// dtable accumulates.
void embedding_backward(Device d, const std::int32_t* ids, const float* dout, float* dtable,
                        Count N, Count C, Count vocab_start, Count V);
void ce_local_max(Device d, const float* logits, float* row_max, Count N, Count V);
void ce_local_sumexp(Device d, const float* logits, const float* row_max, float* sumexp, Count N,
                     Count V);
void ce_local_target(Device d, const float* logits, const std::int32_t* targets,
                     float* target_logit, Count N, Count V, Count vocab_start);

}  // namespace distplan::backend::dev
