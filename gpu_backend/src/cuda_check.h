// One family of checked calls for CUDA, cuBLAS and NCCL: a failure names the expression, the
// function, the file and the line, and throws std::runtime_error from a [[noreturn]] handler.
// Plain C++ with CUDA headers only: usable from .cu and .cpp files alike.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace distplan::backend::cuda {
[[noreturn]] void check_failed(const char* library, const char* message, const char* expression,
                               const char* function, const char* file, int line);
}  // namespace distplan::backend::cuda

#define DISTPLAN_CUDA_CHECK(expr)                                                               \
  do {                                                                                          \
    const cudaError_t distplan_err_ = (expr);                                                   \
    if (distplan_err_ != cudaSuccess)                                                           \
      ::distplan::backend::cuda::check_failed("CUDA", cudaGetErrorString(distplan_err_), #expr, \
                                              __func__, __FILE__, __LINE__);                    \
  } while (0)

#define DISTPLAN_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                       \
    const cublasStatus_t distplan_st_ = (expr);                                              \
    if (distplan_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::distplan::backend::cuda::check_failed("cuBLAS", cublasGetStatusString(distplan_st_), \
                                              #expr, __func__, __FILE__, __LINE__);          \
  } while (0)

#define DISTPLAN_NCCL_CHECK(expr)                                                              \
  do {                                                                                         \
    const ncclResult_t distplan_nr_ = (expr);                                                  \
    if (distplan_nr_ != ncclSuccess)                                                           \
      ::distplan::backend::cuda::check_failed("NCCL", ncclGetErrorString(distplan_nr_), #expr, \
                                              __func__, __FILE__, __LINE__);                   \
  } while (0)

/// After a kernel launch: the launch's own error.
#define DISTPLAN_CUDA_CHECK_LAUNCH() DISTPLAN_CUDA_CHECK(cudaGetLastError())
