// CUDA memory, copies, the checked-call handler and the cuBLAS GEMMs (row-major y = x W^T mapped
// onto column-major cuBLAS: y^T = W x^T). Compiled only with CUDA.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_api.h"
#include "cuda_check.h"
#include "distplan/gpu_backend/memory.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"

namespace distplan::backend::cuda {

void check_failed(const char* library, const char* message, const char* expression,
                  const char* function, const char* file, int line) {
  throw std::runtime_error(std::string(library) + " error '" + message + "' in " + expression +
                           " (" + function + ", " + file + ":" + std::to_string(line) + ")");
}

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

void set_device(int index) {
  DISTPLAN_CUDA_CHECK(cudaSetDevice(index));
}

void* device_alloc_zeroed(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemory("cudaMalloc of " + std::to_string(bytes) + " bytes: out of device memory");
  }
  DISTPLAN_CUDA_CHECK(e);
  DISTPLAN_CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

void device_free(void* p) noexcept {
  (void)cudaFree(p);
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  DISTPLAN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  DISTPLAN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void copy_on_device(void* dst, const void* src, std::size_t bytes) {
  DISTPLAN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
void zero_on_device(void* dst, std::size_t bytes) {
  DISTPLAN_CUDA_CHECK(cudaMemset(dst, 0, bytes));
}
void copy_rows_on_device(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                         std::size_t row_bytes, std::size_t rows) {
  DISTPLAN_CHECK(row_bytes <= dst_pitch && row_bytes <= src_pitch, "row wider than its pitch");
  if (rows == 0 || row_bytes == 0) return;
  DISTPLAN_CUDA_CHECK(
      cudaMemcpy2D(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice));
}
std::string device_name() {
  int dev = 0;
  DISTPLAN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  DISTPLAN_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}
int compute_capability() {
  int dev = 0, major = 0, minor = 0;
  DISTPLAN_CUDA_CHECK(cudaGetDevice(&dev));
  DISTPLAN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  DISTPLAN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
}
void synchronize() {
  DISTPLAN_CUDA_CHECK(cudaDeviceSynchronize());
}

EventTimer::EventTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  DISTPLAN_CUDA_CHECK(cudaEventCreate(&a));
  DISTPLAN_CUDA_CHECK(cudaEventCreate(&b));
  start_ = a;
  stop_ = b;
}
EventTimer::~EventTimer() {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void EventTimer::start() {
  DISTPLAN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_)));
}
void EventTimer::stop() {
  DISTPLAN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_)));
}
double EventTimer::seconds() {
  DISTPLAN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0;
  DISTPLAN_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return ms * 1e-3;
}

void read_as_float(const void* data, int dtype, long long offset, long long n, float* out) {
  const auto t = static_cast<Type>(dtype);
  const std::size_t es = t == Type::fp32 ? 4 : 2;
  const char* src = static_cast<const char*>(data) + offset * static_cast<long long>(es);
  if (t == Type::fp32) {
    copy_to_host(out, src, static_cast<std::size_t>(n) * 4);
    return;
  }
  std::vector<std::uint16_t> h(static_cast<std::size_t>(n));
  copy_to_host(h.data(), src, h.size() * 2);
  for (std::size_t i = 0; i < h.size(); ++i)
    out[i] = t == Type::bf16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
}

void write_from_float(void* data, int dtype, long long offset, long long n, const float* in) {
  const auto t = static_cast<Type>(dtype);
  const std::size_t es = t == Type::fp32 ? 4 : 2;
  char* dst = static_cast<char*>(data) + offset * static_cast<long long>(es);
  if (t == Type::fp32) {
    copy_to_device(dst, in, static_cast<std::size_t>(n) * 4);
    return;
  }
  std::vector<std::uint16_t> h(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < h.size(); ++i)
    h[i] = t == Type::bf16 ? float_to_bf16(in[i]) : float_to_fp16(in[i]);
  copy_to_device(dst, h.data(), h.size() * 2);
}

namespace {
std::size_t pool_class(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20;
  const std::size_t q = bytes <= (std::size_t{1} << 20) ? kSmall : kLarge;
  return std::max<std::size_t>(q, (bytes + q - 1) / q * q);
}
struct Pool {
  std::mutex mu;
  std::unordered_multimap<std::size_t, void*> free;  // size class -> cached block
};
Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: blocks may be returned during static teardown
  return *p;
}
}  // namespace

void* pool_alloc(std::size_t bytes) {
  const std::size_t cls = pool_class(bytes);
  void* p = nullptr;
  {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lock(pl.mu);
    if (auto it = pl.free.find(cls); it != pl.free.end()) {
      p = it->second;
      pl.free.erase(it);
    }
  }
  if (p == nullptr) {
    const cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw OutOfMemory("cudaMalloc of " + std::to_string(cls) +
                        " bytes (a working array): out of device memory");
    }
    DISTPLAN_CUDA_CHECK(e);
  }
  DISTPLAN_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
  return p;
}

void pool_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  Pool& pl = pool();
  std::lock_guard<std::mutex> lock(pl.mu);
  pl.free.emplace(pool_class(bytes), p);
}

std::size_t device_used_bytes() {
  std::size_t free = 0, total = 0;
  DISTPLAN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

namespace {

cublasHandle_t handle() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    DISTPLAN_CUBLAS_CHECK(cublasCreate(&x));
    return x;
  }();
  return h;
}

cudaDataType_t data_type(Type t) {
  switch (t) {
    case Type::bf16:
      return CUDA_R_16BF;
    case Type::fp16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// fp32 GEMM inputs on TF32 tensor cores (set_fp32_gemm_tf32); per thread like the handles.
thread_local bool g_tf32 = false;

cublasLtHandle_t lt_handle() {
  thread_local cublasLtHandle_t h = [] {
    cublasLtHandle_t x = nullptr;
    DISTPLAN_CUBLAS_CHECK(cublasLtCreate(&x));
    return x;
  }();
  return h;
}

// cuBLASLt's workspace: one device buffer per thread, allocated on first use and kept (a
// cudaMalloc/cudaFree per GEMM would synchronise the device). 32 MiB: NVIDIA's recommendation
// for Hopper (cuBLAS documentation, "cublasSetWorkspace"). Outside the tracking allocator, as
// the planner counts it in the runtime reserve.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;
void* lt_workspace() {
  thread_local void* w = [] {
    void* p = nullptr;
    DISTPLAN_CUDA_CHECK(cudaMalloc(&p, kLtWorkspaceBytes));
    return p;
  }();
  return w;
}

// Owns the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major C (m,n) = op(A) op(B) + beta C through cuBLASLt: bf16/fp16 inputs on tensor cores
// with fp32 accumulation (CUBLAS_COMPUTE_32F), fp32 inputs in fp32 or, when asked, TF32
// (CUBLAS_COMPUTE_32F_FAST_TF32). C may be fp32 while A and B are 16-bit (weight gradients).
// Falls back to cublasGemmEx when the heuristic offers no algorithm. m, n, k > 0.
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, Type at,
          int lda, const void* B, Type bt, int ldb, float beta, void* C, Type ct, int ldc) {
  const float alpha = 1.0f;
  const cublasComputeType_t compute =
      at == Type::fp32 && g_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtDescs d;
  DISTPLAN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  DISTPLAN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DISTPLAN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
  DISTPLAN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.a, data_type(at), na ? m : k, na ? k : m, lda));
  DISTPLAN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.b, data_type(bt), nb ? k : n, nb ? n : k, ldb));
  DISTPLAN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, data_type(ct), m, n, ldc));
  DISTPLAN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const std::size_t ws = kLtWorkspaceBytes;
  DISTPLAN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), d.op, d.a, d.b, d.c, d.c,
                                                           d.pref, 1, &heur, &found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
    DISTPLAN_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), d.op, &alpha, A, d.a, B, d.b, &beta, C, d.c,
                                         C, d.c, &heur.algo, lt_workspace(), ws, nullptr));
    return;
  }
  DISTPLAN_CUBLAS_CHECK(cublasGemmEx(handle(), ta, tb, m, n, k, &alpha, A, data_type(at), lda, B,
                                     data_type(bt), ldb, &beta, C, data_type(ct), ldc, compute,
                                     CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void set_fp32_gemm_tf32(bool on) {
  g_tf32 = on;
}

namespace {
std::size_t elem_bytes(Type t) {
  return t == Type::fp32 ? 4 : 2;
}
}  // namespace

void linear_forward(Type t, const void* x, const void* w, const float* bias, void* y, int N, int I,
                    int O) {
  if (N <= 0 || O <= 0) return;
  if (I <= 0) {  // an empty sum: y = bias
    zero_on_device(y, static_cast<std::size_t>(N) * O * elem_bytes(t));
    if (bias != nullptr) add_bias(t, y, bias, N, O);
    return;
  }
  // y^T (O,N) = W (O,I) x^T (I,N); row-major W is column-major W^T (I,O).
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, w, t, I, x, t, I, 0.0f, y, t, O);
  if (bias != nullptr) add_bias(t, y, bias, N, O);
}

void linear_backward_input(Type t, const void* dy, const void* w, void* dx, int N, int I, int O) {
  if (N <= 0 || I <= 0) return;
  if (O <= 0) {
    zero_on_device(dx, static_cast<std::size_t>(N) * I * elem_bytes(t));
    return;
  }
  // dx^T (I,N) = W^T (I,O) dy^T (O,N).
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, w, t, I, dy, t, O, 0.0f, dx, t, I);
}

void linear_backward_weight(Type t, const void* dy, const void* x, float* dw, float* dbias, int N,
                            int I, int O) {
  // dW^T (I,O) += x^T (I,N) dy (N,O); fp32 output.
  if (N > 0 && I > 0 && O > 0)
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, x, t, I, dy, t, O, 1.0f, dw, Type::fp32, I);
  if (dbias == nullptr || N <= 0 || O <= 0) return;
  if (t == Type::fp32) {
    bias_grad(static_cast<const float*>(dy), dbias, N, O);
    return;
  }
  const std::size_t n = static_cast<std::size_t>(N) * O;
  auto* dy32 = static_cast<float*>(pool_alloc(n * sizeof(float)));
  cast(t, dy, Type::fp32, dy32, n);
  bias_grad(dy32, dbias, N, O);
  pool_free(dy32, n * sizeof(float));
}

}  // namespace distplan::backend::cuda
