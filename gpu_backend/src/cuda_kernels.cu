// Thin CUDA kernels of the layer op table, fp32 (formulas as cpu_ops.cpp, the oracle). Norms and
// the cross-entropy reductions run a block per row (block reductions with fp64 partial sums);
// parameter and bias gradients are tiled column sums; attention is still one thread per query
// row; elementwise ops are grid-stride loops. Zero sizes launch nothing.
// No fmt, Eigen or JSON here (TOOLCHAIN.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda_api.h"
#include "cuda_check.h"
#include "distplan/planner/check.h"

namespace distplan::backend::cuda {
namespace {

constexpr int kThreads = 256;
int blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}
#define GRID_STRIDE(i, n) \
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

__device__ float load(Type t, const void* p, std::size_t i) {
  switch (t) {
    case Type::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Type::fp16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
__device__ void store(Type t, void* p, std::size_t i, float v) {
  switch (t) {
    case Type::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case Type::fp16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

__global__ void k_cast(Type from, const void* in, Type to, void* out, std::size_t n) {
  GRID_STRIDE(i, n) store(to, out, i, load(from, in, i));
}
__global__ void k_add_bias(Type t, void* y, const float* bias, std::size_t N, std::size_t O) {
  GRID_STRIDE(i, N * O) store(t, y, i, load(t, y, i) + bias[i % O]);
}
// Sum (or maximum) over the block; every thread gets the result. blockDim.x is a multiple of 32
// (kThreads); every thread of the block must call it. The leading barrier protects `part` from a
// previous call's readers.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = lane < static_cast<int>((blockDim.x + 31) >> 5) ? part[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct Sum {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
__device__ double block_sum(double v) {
  return block_reduce(v, Sum{}, 0.0);
}
__device__ float block_max(float v) {
  return block_reduce(v, Max{}, -INFINITY);
}
// Rows handled by a block-per-row kernel: blockIdx.x, blockIdx.x + gridDim.x, ...
#define BLOCK_ROWS(n, N) for (int n = blockIdx.x; n < (N); n += gridDim.x)
int row_blocks(int N) {
  return N < 65535 ? N : 65535;
}

// Column sums over the rows of a (N, C) array, per column c: mode 0 sum dy (bias gradient);
// 1 LayerNorm: out1 += sum dy * (x - mean) * rstd, out2 += sum dy; 2 RMSNorm: out1 += sum
// dy * x * rstd. Blocks of 32 columns x 8 row lanes, row groups spread over grid.y, one atomic add
// per column and block.
constexpr int kColTile = 32, kRowLanes = 8;
__global__ void k_col_sums(int mode, const float* dy, const float* x, const float* mean,
                           const float* rstd, float* out1, float* out2, int N, int C) {
  const int c = blockIdx.x * kColTile + threadIdx.x;
  double a1 = 0, a2 = 0;
  if (c < C) {
    for (int n = blockIdx.y * kRowLanes + threadIdx.y; n < N; n += gridDim.y * kRowLanes) {
      const std::size_t o = static_cast<std::size_t>(n) * C + c;
      const double g = dy[o];
      if (mode == 0) {
        a1 += g;
      } else if (mode == 1) {
        a1 += g * ((x[o] - mean[n]) * rstd[n]);
        a2 += g;
      } else {
        a1 += g * x[o] * rstd[n];
      }
    }
  }
  __shared__ double s1[kRowLanes][kColTile + 1], s2[kRowLanes][kColTile + 1];
  s1[threadIdx.y][threadIdx.x] = a1;
  s2[threadIdx.y][threadIdx.x] = a2;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double t1 = 0, t2 = 0;
    for (int r = 0; r < kRowLanes; ++r) t1 += s1[r][threadIdx.x], t2 += s2[r][threadIdx.x];
    atomicAdd(out1 + c, static_cast<float>(t1));
    if (out2 != nullptr) atomicAdd(out2 + c, static_cast<float>(t2));
  }
}
void col_sums(int mode, const float* dy, const float* x, const float* mean, const float* rstd,
              float* out1, float* out2, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const int row_groups = (N + kRowLanes - 1) / kRowLanes;
  const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile),
                  static_cast<unsigned>(row_groups < 256 ? row_groups : 256));
  k_col_sums<<<grid, dim3(kColTile, kRowLanes)>>>(mode, dy, x, mean, rstd, out1, out2, N, C);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}

// Block per row: the row's statistics by block reductions (fp64 partial sums, as the oracle's
// accuracy), then the elementwise pass.
__global__ void k_layernorm_fwd(const float* x, const float* g, const float* b, float* y,
                                float* mean, float* rstd, int N, int C, float eps) {
  BLOCK_ROWS(n, N) {
    const float* xr = x + static_cast<std::size_t>(n) * C;
    double s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
    const double mu = block_sum(s) / C;
    double q = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) q += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / sqrt(block_sum(q) / C + eps);
    if (threadIdx.x == 0) {
      mean[n] = static_cast<float>(mu);
      rstd[n] = static_cast<float>(rs);
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      y[static_cast<std::size_t>(n) * C + c] =
          static_cast<float>((xr[c] - mu) * rs) * g[c] + (b ? b[c] : 0.0f);
  }
}
__global__ void k_layernorm_bwd_dx(const float* dy, const float* x, const float* g,
                                   const float* mean, const float* rstd, float* dx, int N, int C) {
  BLOCK_ROWS(n, N) {
    const std::size_t o = static_cast<std::size_t>(n) * C;
    const double mu = mean[n], rs = rstd[n];
    double a1 = 0, a2 = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const double xh = (x[o + c] - mu) * rs;
      const double dxh = static_cast<double>(dy[o + c]) * g[c];
      a1 += dxh;
      a2 += dxh * xh;
    }
    const double s1 = block_sum(a1), s2 = block_sum(a2);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const double xh = (x[o + c] - mu) * rs;
      const double dxh = static_cast<double>(dy[o + c]) * g[c];
      dx[o + c] = static_cast<float>(rs * (dxh - s1 / C - xh * s2 / C));
    }
  }
}
__global__ void k_rmsnorm_fwd(const float* x, const float* g, float* y, float* rstd, int N, int C,
                              float eps) {
  BLOCK_ROWS(n, N) {
    const std::size_t o = static_cast<std::size_t>(n) * C;
    double ms = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      ms += static_cast<double>(x[o + c]) * x[o + c];
    const double rs = 1.0 / sqrt(block_sum(ms) / C + eps);
    if (threadIdx.x == 0) rstd[n] = static_cast<float>(rs);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      y[o + c] = static_cast<float>(x[o + c] * rs) * g[c];
  }
}
__global__ void k_rmsnorm_bwd_dx(const float* dy, const float* x, const float* g, const float* rstd,
                                 float* dx, int N, int C) {
  BLOCK_ROWS(n, N) {
    const std::size_t o = static_cast<std::size_t>(n) * C;
    double a = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      a += static_cast<double>(dy[o + c]) * g[c] * x[o + c];
    const double s = block_sum(a), r = rstd[n];
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      dx[o + c] = static_cast<float>(r * dy[o + c] * g[c] - r * r * r * x[o + c] * s / C);
  }
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi), GPT-2's tanh form
__global__ void k_gelu_fwd(const float* x, float* y, std::size_t n) {
  GRID_STRIDE(i, n) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1 + tanh(kGeluC * (v + 0.044715 * v * v * v))));
  }
}
__global__ void k_gelu_bwd(const float* dy, const float* x, float* dx, std::size_t n) {
  GRID_STRIDE(i, n) {
    const double v = x[i];
    const double u = kGeluC * (v + 0.044715 * v * v * v);
    const double t = tanh(u);
    const double du = kGeluC * (1 + 3 * 0.044715 * v * v);
    dx[i] = static_cast<float>(dy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * du));
  }
}
__global__ void k_swiglu_fwd(const float* gate, const float* up, float* y, std::size_t n) {
  GRID_STRIDE(i, n) {
    const double gv = gate[i];
    const double sg = 1.0 / (1.0 + exp(-gv));
    y[i] = static_cast<float>(gv * sg * up[i]);
  }
}
__global__ void k_swiglu_bwd(const float* dy, const float* gate, const float* up, float* dgate,
                             float* dup, std::size_t n) {
  GRID_STRIDE(i, n) {
    const double gv = gate[i];
    const double sg = 1.0 / (1.0 + exp(-gv));
    dup[i] = static_cast<float>(dy[i] * gv * sg);
    dgate[i] = static_cast<float>(dy[i] * up[i] * sg * (1 + gv * (1 - sg)));
  }
}

__device__ std::size_t qoff(int i, int bi, int h, int b, int a, int d) {
  return ((static_cast<std::size_t>(i) * b + bi) * a + h) * d;
}
// One thread per (bi, h, i) row: scores, softmax into probs, out = probs V.
__global__ void k_attention_fwd(const float* q, const float* k, const float* v, float* out,
                                float* probs, int s, int b, int a, int g, int d) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b * a * s) return;
  const int i = r % s, h = (r / s) % a, bi = r / (s * a);
  const int hk = h / (a / g);
  const double scale = 1.0 / sqrt(static_cast<double>(d));
  float* p = probs + ((static_cast<std::size_t>(bi) * a + h) * s + i) * s;
  const float* qi = q + qoff(i, bi, h, b, a, d);
  double mx = -1e300;
  for (int j = 0; j <= i; ++j) {
    const float* kj = k + qoff(j, bi, hk, b, g, d);
    double acc = 0;
    for (int e = 0; e < d; ++e) acc += static_cast<double>(qi[e]) * kj[e];
    acc *= scale;
    p[j] = static_cast<float>(acc);
    mx = acc > mx ? acc : mx;
  }
  double sum = 0;
  for (int j = 0; j <= i; ++j) sum += exp(static_cast<double>(p[j]) - mx);
  for (int j = 0; j < s; ++j)
    p[j] = j <= i ? static_cast<float>(exp(static_cast<double>(p[j]) - mx) / sum) : 0.0f;
  float* o = out + qoff(i, bi, h, b, a, d);
  for (int e = 0; e < d; ++e) {
    double acc = 0;
    for (int j = 0; j <= i; ++j) acc += static_cast<double>(p[j]) * v[qoff(j, bi, hk, b, g, d) + e];
    o[e] = static_cast<float>(acc);
  }
}
// One thread per (bi, h, i) row: dq of the row, and dk/dv contributions by atomics (GQA heads
// share k/v rows).
__global__ void k_attention_bwd(const float* dout, const float* q, const float* k, const float* v,
                                const float* probs, float* dq, float* dk, float* dv, int s, int b,
                                int a, int g, int d) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b * a * s) return;
  const int i = r % s, h = (r / s) % a, bi = r / (s * a);
  const int hk = h / (a / g);
  const double scale = 1.0 / sqrt(static_cast<double>(d));
  const float* p = probs + ((static_cast<std::size_t>(bi) * a + h) * s + i) * s;
  const float* doi = dout + qoff(i, bi, h, b, a, d);
  const float* qi = q + qoff(i, bi, h, b, a, d);
  double D = 0;
  for (int j = 0; j <= i; ++j) {
    const float* vj = v + qoff(j, bi, hk, b, g, d);
    double dp = 0;
    for (int e = 0; e < d; ++e) dp += static_cast<double>(doi[e]) * vj[e];
    D += p[j] * dp;
  }
  float* dqi = dq + qoff(i, bi, h, b, a, d);
  for (int j = 0; j <= i; ++j) {
    const float* vj = v + qoff(j, bi, hk, b, g, d);
    const float* kj = k + qoff(j, bi, hk, b, g, d);
    double dp = 0;
    for (int e = 0; e < d; ++e) dp += static_cast<double>(doi[e]) * vj[e];
    const double ds = p[j] * (dp - D) * scale;
    float* dkj = dk + qoff(j, bi, hk, b, g, d);
    float* dvj = dv + qoff(j, bi, hk, b, g, d);
    for (int e = 0; e < d; ++e) {
      dqi[e] += static_cast<float>(ds * kj[e]);
      atomicAdd(dkj + e, static_cast<float>(ds * qi[e]));
      atomicAdd(dvj + e, p[j] * doi[e]);
    }
  }
}

// ---- rotary (GPT-NeoX / Llama pairs (i, i + d/2)), in place; sign -1 is the inverse rotation ----
__global__ void k_rotary(float* x, int s, int b, int heads, int d, double theta, double sign) {
  const int half = d / 2;
  GRID_STRIDE(t, static_cast<std::size_t>(s) * b * heads * half) {
    const int i = static_cast<int>(t % half);
    const std::size_t row = t / half;  // (si, bi, h) flattened
    const int si = static_cast<int>(row / (static_cast<std::size_t>(b) * heads));
    const double ang = static_cast<double>(si) * pow(theta, -2.0 * i / static_cast<double>(d));
    const double c = cos(ang), sn = sign * sin(ang);
    float* p = x + row * d;
    const double x1 = p[i], x2 = p[i + half];
    p[i] = static_cast<float>(x1 * c - x2 * sn);
    p[i + half] = static_cast<float>(x1 * sn + x2 * c);
  }
}

// ---- tiled causal flash attention (Dao et al. 2022), fp32 -------------------------------------
// q, out, dq (s,b,a,d); k, v, dk, dv (s,b,g,d); lse (b,a,s). One thread per query row (forward,
// dq) or key row (dk, dv); the block's threads load the other side's rows tile by tile into
// shared memory; tiles wholly above the diagonal are skipped. The forward keeps a running max
// and sum (online softmax) and saves lse = max + log(sum); the backward recomputes
// p = exp(scale q.k - lse) and uses D = rowsum(dout * out).
constexpr int kFlashRows = 64;     // query (or key) rows per block, one per thread
constexpr int kFlashMaxDim = 256;  // head dims up to this (per-thread accumulators)
int flash_tile(int d) {
  return d <= 128 ? 32 : 16;  // shared: two tiles of tile x d floats, at most 32 KiB
}
__device__ std::size_t row_off(int i, int bi, int h, int b, int heads, int d) {
  return ((static_cast<std::size_t>(i) * b + bi) * heads + h) * d;
}

__global__ void k_flash_fwd(const float* q, const float* k, const float* v, float* out, float* lse,
                            int s, int b, int a, int g, int d, int tile) {
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = smem + static_cast<std::size_t>(tile) * d;
  const int bh = blockIdx.y, bi = bh / a, h = bh % a, hk = h / (a / g);
  const int i0 = blockIdx.x * kFlashRows, i = i0 + threadIdx.x;
  const bool live = i < s;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  float qv[kFlashMaxDim], acc[kFlashMaxDim];
  if (live) {
    const float* qi = q + row_off(i, bi, h, b, a, d);
    for (int e = 0; e < d; ++e) qv[e] = qi[e], acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last = min(s, i0 + kFlashRows);  // keys [0, last) reach some row of this block
  for (int j0 = 0; j0 < last; j0 += tile) {
    const int nj = min(tile, s - j0);
    __syncthreads();
    for (int t = threadIdx.x; t < nj * d; t += blockDim.x) {
      const int j = t / d, e = t % d;
      Ks[t] = k[row_off(j0 + j, bi, hk, b, g, d) + e];
      Vs[t] = v[row_off(j0 + j, bi, hk, b, g, d) + e];
    }
    __syncthreads();
    if (!live) continue;
    for (int j = 0; j < nj && j0 + j <= i; ++j) {
      float dot = 0.0f;
      for (int e = 0; e < d; ++e) dot += qv[e] * Ks[j * d + e];
      const float sc = dot * scale;
      const float mn = fmaxf(m, sc);
      const float corr = expf(m - mn), w = expf(sc - mn);
      l = l * corr + w;
      for (int e = 0; e < d; ++e) acc[e] = acc[e] * corr + w * Vs[j * d + e];
      m = mn;
    }
  }
  if (live) {
    float* o = out + row_off(i, bi, h, b, a, d);
    for (int e = 0; e < d; ++e) o[e] = acc[e] / l;
    lse[(static_cast<std::size_t>(bi) * a + h) * s + i] = m + logf(l);
  }
}

// dq: one thread per query row.
__global__ void k_flash_bwd_dq(const float* dout, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, float* dq, int s, int b, int a,
                               int g, int d, int tile) {
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = smem + static_cast<std::size_t>(tile) * d;
  const int bh = blockIdx.y, bi = bh / a, h = bh % a, hk = h / (a / g);
  const int i0 = blockIdx.x * kFlashRows, i = i0 + threadIdx.x;
  const bool live = i < s;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  float qv[kFlashMaxDim], dov[kFlashMaxDim], dqv[kFlashMaxDim];
  float D = 0.0f, L = 0.0f;
  if (live) {
    const std::size_t o = row_off(i, bi, h, b, a, d);
    for (int e = 0; e < d; ++e) {
      qv[e] = q[o + e];
      dov[e] = dout[o + e];
      dqv[e] = 0.0f;
      D += dov[e] * out[o + e];
    }
    L = lse[(static_cast<std::size_t>(bi) * a + h) * s + i];
  }
  const int last = min(s, i0 + kFlashRows);
  for (int j0 = 0; j0 < last; j0 += tile) {
    const int nj = min(tile, s - j0);
    __syncthreads();
    for (int t = threadIdx.x; t < nj * d; t += blockDim.x) {
      const int j = t / d, e = t % d;
      Ks[t] = k[row_off(j0 + j, bi, hk, b, g, d) + e];
      Vs[t] = v[row_off(j0 + j, bi, hk, b, g, d) + e];
    }
    __syncthreads();
    if (!live) continue;
    for (int j = 0; j < nj && j0 + j <= i; ++j) {
      float dot = 0.0f, dp = 0.0f;
      for (int e = 0; e < d; ++e) dot += qv[e] * Ks[j * d + e], dp += dov[e] * Vs[j * d + e];
      const float p = expf(dot * scale - L);
      const float ds = p * (dp - D) * scale;
      for (int e = 0; e < d; ++e) dqv[e] += ds * Ks[j * d + e];
    }
  }
  if (live) {
    float* o = dq + row_off(i, bi, h, b, a, d);
    for (int e = 0; e < d; ++e) o[e] = dqv[e];
  }
}

// dk, dv: one thread per key row of a key/value head, summed over the a/g query heads that share
// it and over the queries at or after the key (no atomics).
__global__ void k_flash_bwd_dkdv(const float* dout, const float* q, const float* k, const float* v,
                                 const float* out, const float* lse, float* dk, float* dv, int s,
                                 int b, int a, int g, int d, int tile) {
  extern __shared__ float smem[];
  float* Qs = smem;
  float* dOs = smem + static_cast<std::size_t>(tile) * d;
  float* Ds = dOs + static_cast<std::size_t>(tile) * d;  // tile
  float* Ls = Ds + tile;                                 // tile
  const int bh = blockIdx.y, bi = bh / g, hk = bh % g, group = a / g;
  const int j0 = blockIdx.x * kFlashRows, j = j0 + threadIdx.x;
  const bool live = j < s;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  float kv[kFlashMaxDim], vv[kFlashMaxDim], dkv[kFlashMaxDim], dvv[kFlashMaxDim];
  if (live) {
    const std::size_t o = row_off(j, bi, hk, b, g, d);
    for (int e = 0; e < d; ++e) kv[e] = k[o + e], vv[e] = v[o + e], dkv[e] = 0.0f, dvv[e] = 0.0f;
  }
  for (int r = 0; r < group; ++r) {
    const int h = hk * group + r;
    // Queries [j0, s) see some key of this block.
    for (int i0 = j0 - j0 % tile; i0 < s; i0 += tile) {
      const int ni = min(tile, s - i0);
      __syncthreads();
      for (int t = threadIdx.x; t < ni * d; t += blockDim.x) {
        const int ii = t / d, e = t % d;
        const std::size_t o = row_off(i0 + ii, bi, h, b, a, d) + e;
        Qs[t] = q[o];
        dOs[t] = dout[o];
      }
      __syncthreads();
      for (int ii = threadIdx.x; ii < ni; ii += blockDim.x) {
        const std::size_t o = row_off(i0 + ii, bi, h, b, a, d);
        float D = 0.0f;
        for (int e = 0; e < d; ++e) D += dOs[ii * d + e] * out[o + e];
        Ds[ii] = D;
        Ls[ii] = lse[(static_cast<std::size_t>(bi) * a + h) * s + i0 + ii];
      }
      __syncthreads();
      if (!live) continue;
      for (int ii = 0; ii < ni; ++ii) {
        if (i0 + ii < j) continue;  // causal: query i sees key j when j <= i
        float dot = 0.0f, dp = 0.0f;
        for (int e = 0; e < d; ++e) dot += Qs[ii * d + e] * kv[e], dp += dOs[ii * d + e] * vv[e];
        const float p = expf(dot * scale - Ls[ii]);
        const float ds = p * (dp - Ds[ii]) * scale;
        for (int e = 0; e < d; ++e) {
          dvv[e] += p * dOs[ii * d + e];
          dkv[e] += ds * Qs[ii * d + e];
        }
      }
    }
  }
  if (live) {
    const std::size_t o = row_off(j, bi, hk, b, g, d);
    for (int e = 0; e < d; ++e) dk[o + e] = dkv[e], dv[o + e] = dvv[e];
  }
}

__global__ void k_embedding_fwd(const std::int32_t* ids, const float* table, float* out, int N,
                                int C, int start, int V) {
  GRID_STRIDE(i, static_cast<std::size_t>(N) * C) {
    const int n = static_cast<int>(i / C), c = static_cast<int>(i % C);
    const int row = ids[n] - start;
    out[i] = row >= 0 && row < V ? table[static_cast<std::size_t>(row) * C + c] : 0.0f;
  }
}
__global__ void k_embedding_bwd(const std::int32_t* ids, const float* dout, float* dtable, int N,
                                int C, int start, int V) {
  GRID_STRIDE(i, static_cast<std::size_t>(N) * C) {
    const int n = static_cast<int>(i / C), c = static_cast<int>(i % C);
    const int row = ids[n] - start;
    if (row >= 0 && row < V) atomicAdd(dtable + static_cast<std::size_t>(row) * C + c, dout[i]);
  }
}
// Block per row, the vocabulary shard strided over the block's threads.
__global__ void k_ce_max(const float* logits, float* mx, int N, int V) {
  BLOCK_ROWS(n, N) {
    const float* l = logits + static_cast<std::size_t>(n) * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_max(m);
    if (threadIdx.x == 0) mx[n] = m;
  }
}
__global__ void k_ce_sumexp(const float* logits, const float* mx, float* se, int N, int V) {
  BLOCK_ROWS(n, N) {
    const float* l = logits + static_cast<std::size_t>(n) * V;
    const double m = mx[n];
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp(static_cast<double>(l[j]) - m);
    s = block_sum(s);
    if (threadIdx.x == 0) se[n] = static_cast<float>(s);
  }
}
__global__ void k_ce_target(const float* logits, const std::int32_t* t, float* tl, int N, int V,
                            int start) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int j = t[n] - start;
  tl[n] = j >= 0 && j < V ? logits[static_cast<std::size_t>(n) * V + j] : 0.0f;
}
__global__ void k_ce_bwd(const float* logits, const float* mx, const float* se,
                         const std::int32_t* t, const float* dloss, float* dl, int N, int V,
                         int start) {
  GRID_STRIDE(i, static_cast<std::size_t>(N) * V) {
    const int n = static_cast<int>(i / V), j = static_cast<int>(i % V);
    double p = exp(static_cast<double>(logits[i]) - mx[n]) / se[n];
    if (j == t[n] - start) p -= 1.0;
    dl[i] = static_cast<float>(p * dloss[n]);
  }
}
__global__ void k_adam(float* w, const float* gr, float* m, float* v, std::size_t n, float lr,
                       float b1, float b2, float eps, float wd, bool decoupled, double bc1,
                       double bc2, float gs) {
  GRID_STRIDE(i, n) {
    float g = gr[i] * gs;
    if (!decoupled) g += wd * w[i];
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    const double mh = m[i] / bc1, vh = v[i] / bc2;
    double upd = mh / (sqrt(vh) + eps);
    if (decoupled) upd += wd * w[i];
    w[i] = static_cast<float>(w[i] - lr * upd);
  }
}
// SGD with momentum (cpu::sgd_step): mom = mu mom + g scale; w -= lr mom.
__global__ void k_sgd(float* w, const float* gr, float* mom, std::size_t n, float lr, float mu,
                      float gs) {
  GRID_STRIDE(i, n) {
    mom[i] = mu * mom[i] + gr[i] * gs;
    w[i] -= lr * mom[i];
  }
}
// Adam/AdamW over up to kMaxAdamTensors tensors in one launch: blockIdx.y picks the tensor, the
// grid's x dimension strides over its elements (the same update as k_adam).
__global__ void k_adam_multi(AdamTensors ts, float lr, float b1, float b2, float eps, float wd,
                             bool decoupled, double bc1, double bc2, float gs) {
  const AdamTensor& t = ts.t[blockIdx.y];
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < t.n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float g = t.grad[i] * gs;
    if (!decoupled) g += wd * t.master[i];
    t.m[i] = b1 * t.m[i] + (1 - b1) * g;
    t.v[i] = b2 * t.v[i] + (1 - b2) * g * g;
    const double mh = t.m[i] / bc1, vh = t.v[i] / bc2;
    double upd = mh / (sqrt(vh) + eps);
    if (decoupled) upd += wd * t.master[i];
    t.master[i] = static_cast<float>(t.master[i] - lr * upd);
  }
}
// y = act(x + bias) with the pre-activation saved for the backward: mode 0 GeLU (tanh form), the
// formulas of k_gelu_fwd; rows of O columns.
__global__ void k_bias_gelu_fwd(const float* x, const float* bias, float* pre, float* y,
                                std::size_t N, std::size_t O) {
  GRID_STRIDE(i, N * O) {
    const float p = x[i] + bias[i % O];
    pre[i] = p;
    const double v = p;
    y[i] = static_cast<float>(0.5 * v * (1 + tanh(kGeluC * (v + 0.044715 * v * v * v))));
  }
}
// SwiGLU on the packed (N, 2F) output of the gate|up projection with its bias: y (N,F).
__global__ void k_bias_swiglu_fwd(const float* x, const float* bias, float* pre, float* y,
                                  std::size_t N, std::size_t F) {
  GRID_STRIDE(i, N * F) {
    const std::size_t n = i / F, f = i % F;
    const float gv = x[n * 2 * F + f] + bias[f];
    const float uv = x[n * 2 * F + F + f] + bias[F + f];
    pre[n * 2 * F + f] = gv;
    pre[n * 2 * F + F + f] = uv;
    const double sg = 1.0 / (1.0 + exp(-static_cast<double>(gv)));
    y[i] = static_cast<float>(gv * sg * uv);
  }
}

__global__ void k_overflow(const float* x, std::size_t n, int* flag) {
  GRID_STRIDE(i, n) if (!isfinite(x[i]))* flag = 1;
}

__global__ void k_scale(float* x, float a, std::size_t n) {
  GRID_STRIDE(i, n) x[i] *= a;
}
__global__ void k_add(const float* a, const float* b, float* y, std::size_t n) {
  GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

__global__ void k_round_to(Type t, float* x, std::size_t n) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    x[i] = t == Type::bf16   ? __bfloat162float(__float2bfloat16_rn(v))
           : t == Type::fp16 ? __half2float(__float2half_rn(v))
                             : v;
  }
}

__global__ void k_ce_softmax(const float* logits, const float* mx, const float* se, float* sm,
                             int N, int V) {
  GRID_STRIDE(i, static_cast<std::size_t>(N) * V) {
    const int n = static_cast<int>(i / V);
    sm[i] = static_cast<float>(exp(static_cast<double>(logits[i]) - mx[n]) / se[n]);
  }
}

__global__ void k_ce_softmax_grad(float* p, const std::int32_t* t, int N, int V, int start,
                                  float scale) {
  GRID_STRIDE(i, static_cast<std::size_t>(N) * V) {
    const int n = static_cast<int>(i / V), j = static_cast<int>(i % V);
    float v = p[i];
    if (j == t[n] - start) v -= 1.0f;
    p[i] = v * scale;
  }
}

dim3 rows(int n) {
  return dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads));
}

}  // namespace

void cast(Type from, const void* in, Type to, void* out, std::size_t n) {
  k_cast<<<blocks_for(n), kThreads>>>(from, in, to, out, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void add_bias(Type t, void* y, const float* bias, int N, int O) {
  k_add_bias<<<blocks_for(static_cast<std::size_t>(N) * O), kThreads>>>(t, y, bias, N, O);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void bias_grad(const float* dy, float* dbias, int N, int O) {
  col_sums(0, dy, nullptr, nullptr, nullptr, dbias, nullptr, N, O);
}
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  k_layernorm_fwd<<<row_blocks(N), kThreads>>>(x, gamma, beta, y, mean, rstd, N, C, eps);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int N, int C) {
  if (N <= 0 || C <= 0) return;
  k_layernorm_bwd_dx<<<row_blocks(N), kThreads>>>(dy, x, gamma, mean, rstd, dx, N, C);
  DISTPLAN_CUDA_CHECK_LAUNCH();
  col_sums(1, dy, x, mean, rstd, dgamma, dbeta, N, C);
}
void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int N, int C,
                     float eps) {
  if (N <= 0 || C <= 0) return;
  k_rmsnorm_fwd<<<row_blocks(N), kThreads>>>(x, gamma, y, rstd, N, C, eps);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd,
                      float* dx, float* dgamma, int N, int C) {
  if (N <= 0 || C <= 0) return;
  k_rmsnorm_bwd_dx<<<row_blocks(N), kThreads>>>(dy, x, gamma, rstd, dx, N, C);
  DISTPLAN_CUDA_CHECK_LAUNCH();
  col_sums(2, dy, x, nullptr, rstd, dgamma, nullptr, N, C);
}
void gelu_forward(const float* x, float* y, std::size_t n) {
  k_gelu_fwd<<<blocks_for(n), kThreads>>>(x, y, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void gelu_backward(const float* dy, const float* x, float* dx, std::size_t n) {
  k_gelu_bwd<<<blocks_for(n), kThreads>>>(dy, x, dx, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void swiglu_forward(const float* gate, const float* up, float* y, std::size_t n) {
  k_swiglu_fwd<<<blocks_for(n), kThreads>>>(gate, up, y, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void swiglu_backward(const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                     std::size_t n) {
  k_swiglu_bwd<<<blocks_for(n), kThreads>>>(dy, gate, up, dgate, dup, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                       int s, int b, int a, int g, int d) {
  if (s <= 0 || b <= 0 || a <= 0) return;
  k_attention_fwd<<<rows(b * a * s), kThreads>>>(q, k, v, out, probs, s, b, a, g, d);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* probs, float* dq, float* dk, float* dv, int s, int b, int a,
                        int g, int d) {
  if (s <= 0 || b <= 0 || a <= 0) return;
  k_attention_bwd<<<rows(b * a * s), kThreads>>>(dout, q, k, v, probs, dq, dk, dv, s, b, a, g, d);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void embedding_forward(const std::int32_t* ids, const float* table, float* out, int N, int C,
                       int vocab_start, int V) {
  k_embedding_fwd<<<blocks_for(static_cast<std::size_t>(N) * C), kThreads>>>(ids, table, out, N, C,
                                                                             vocab_start, V);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int N, int C,
                        int vocab_start, int V) {
  k_embedding_bwd<<<blocks_for(static_cast<std::size_t>(N) * C), kThreads>>>(ids, dout, dtable, N,
                                                                             C, vocab_start, V);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void ce_local_max(const float* logits, float* row_max, int N, int V) {
  if (N <= 0) return;
  k_ce_max<<<row_blocks(N), kThreads>>>(logits, row_max, N, V);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void ce_local_sumexp(const float* logits, const float* row_max, float* sumexp, int N, int V) {
  if (N <= 0) return;
  k_ce_sumexp<<<row_blocks(N), kThreads>>>(logits, row_max, sumexp, N, V);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void ce_local_target(const float* logits, const std::int32_t* targets, float* target_logit, int N,
                     int V, int vocab_start) {
  if (N <= 0) return;
  k_ce_target<<<rows(N), kThreads>>>(logits, targets, target_logit, N, V, vocab_start);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void ce_backward(const float* logits, const float* row_max, const float* sumexp,
                 const std::int32_t* targets, const float* dloss, float* dlogits, int N, int V,
                 int vocab_start) {
  k_ce_bwd<<<blocks_for(static_cast<std::size_t>(N) * V), kThreads>>>(
      logits, row_max, sumexp, targets, dloss, dlogits, N, V, vocab_start);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void adam_step(float* master, const float* grad, float* m, float* v, std::size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, bool decoupled,
               long long step, float grad_scale) {
  const double bc1 = 1 - pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1 - pow(static_cast<double>(beta2), static_cast<double>(step));
  k_adam<<<blocks_for(n), kThreads>>>(master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                      decoupled, bc1, bc2, grad_scale);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void sgd_step(float* master, const float* grad, float* momentum, std::size_t n, float lr, float mu,
              float grad_scale) {
  if (n == 0) return;
  k_sgd<<<blocks_for(n), kThreads>>>(master, grad, momentum, n, lr, mu, grad_scale);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
bool has_overflow(const float* x, std::size_t n) {
  // One device word for the process, allocated on the first check: a cudaMalloc/cudaFree per
  // check would synchronise the device each time (cudaFree waits for all its work).
  static int* const flag = [] {
    int* f = nullptr;
    DISTPLAN_CUDA_CHECK(cudaMalloc(&f, sizeof(int)));
    return f;
  }();
  DISTPLAN_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), 0));
  k_overflow<<<blocks_for(n), kThreads>>>(x, n, flag);
  DISTPLAN_CUDA_CHECK_LAUNCH();
  int h = 0;
  DISTPLAN_CUDA_CHECK(cudaMemcpy(&h, flag, sizeof(int), cudaMemcpyDeviceToHost));
  return h != 0;
}

void add(const float* a, const float* b, float* y, std::size_t n) {
  k_add<<<blocks_for(n), kThreads>>>(a, b, y, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}

void scale(float* x, float a, std::size_t n) {
  if (n == 0) return;
  k_scale<<<blocks_for(n), kThreads>>>(x, a, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}

void round_to(Type t, float* x, std::size_t n) {
  if (t == Type::fp32 || n == 0) return;
  k_round_to<<<blocks_for(n), kThreads>>>(t, x, n);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}

void ce_softmax(const float* logits, const float* row_max, const float* sumexp, float* softmax,
                int N, int V) {
  const std::size_t n = static_cast<std::size_t>(N) * V;
  if (n == 0) return;
  k_ce_softmax<<<blocks_for(n), kThreads>>>(logits, row_max, sumexp, softmax, N, V);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}

void ce_softmax_grad(float* p, const std::int32_t* targets, int N, int V, int vocab_start,
                     float scale) {
  const std::size_t n = static_cast<std::size_t>(N) * V;
  if (n == 0) return;
  k_ce_softmax_grad<<<blocks_for(n), kThreads>>>(p, targets, N, V, vocab_start, scale);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}

void rotary_forward(float* x, int s, int b, int heads, int d, double theta) {
  if (s <= 0 || b <= 0 || heads <= 0 || d < 2) return;
  const std::size_t n = static_cast<std::size_t>(s) * b * heads * (d / 2);
  k_rotary<<<blocks_for(n), kThreads>>>(x, s, b, heads, d, theta, 1.0);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void rotary_backward(float* dx, int s, int b, int heads, int d, double theta) {
  if (s <= 0 || b <= 0 || heads <= 0 || d < 2) return;
  const std::size_t n = static_cast<std::size_t>(s) * b * heads * (d / 2);
  k_rotary<<<blocks_for(n), kThreads>>>(dx, s, b, heads, d, theta, -1.0);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                             int s, int b, int a, int g, int d) {
  if (s <= 0 || b <= 0 || a <= 0 || d <= 0) return;
  DISTPLAN_CHECK(d <= kFlashMaxDim, "flash attention: head dim over 256");
  DISTPLAN_CHECK(g > 0 && a % g == 0, "flash attention: heads not a multiple of kv heads");
  const int tile = flash_tile(d);
  const dim3 grid(static_cast<unsigned>((s + kFlashRows - 1) / kFlashRows),
                  static_cast<unsigned>(b * a));
  const std::size_t shared = 2 * static_cast<std::size_t>(tile) * d * sizeof(float);
  k_flash_fwd<<<grid, kFlashRows, shared>>>(q, k, v, out, lse, s, b, a, g, d, tile);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void flash_attention_backward(const float* dout, const float* q, const float* k, const float* v,
                              const float* out, const float* lse, float* dq, float* dk, float* dv,
                              int s, int b, int a, int g, int d) {
  if (s <= 0 || b <= 0 || a <= 0 || d <= 0) return;
  DISTPLAN_CHECK(d <= kFlashMaxDim, "flash attention: head dim over 256");
  DISTPLAN_CHECK(g > 0 && a % g == 0, "flash attention: heads not a multiple of kv heads");
  const int tile = flash_tile(d);
  const unsigned row_blocks_s = static_cast<unsigned>((s + kFlashRows - 1) / kFlashRows);
  const std::size_t two_tiles = 2 * static_cast<std::size_t>(tile) * d * sizeof(float);
  k_flash_bwd_dq<<<dim3(row_blocks_s, static_cast<unsigned>(b * a)), kFlashRows, two_tiles>>>(
      dout, q, k, v, out, lse, dq, s, b, a, g, d, tile);
  DISTPLAN_CUDA_CHECK_LAUNCH();
  k_flash_bwd_dkdv<<<dim3(row_blocks_s, static_cast<unsigned>(b * g)), kFlashRows,
                     two_tiles + 2 * static_cast<std::size_t>(tile) * sizeof(float)>>>(
      dout, q, k, v, out, lse, dk, dv, s, b, a, g, d, tile);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void adam_step_multi(const AdamTensors& ts, int count, float lr, float beta1, float beta2,
                     float eps, float weight_decay, bool decoupled, long long step,
                     float grad_scale) {
  DISTPLAN_CHECK(count >= 0 && count <= kMaxAdamTensors, "adam_step_multi: too many tensors");
  std::size_t largest = 0;
  for (int i = 0; i < count; ++i) largest = ts.t[i].n > largest ? ts.t[i].n : largest;
  if (count == 0 || largest == 0) return;
  const double bc1 = 1 - pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1 - pow(static_cast<double>(beta2), static_cast<double>(step));
  const dim3 grid(static_cast<unsigned>(blocks_for(largest)), static_cast<unsigned>(count));
  k_adam_multi<<<grid, kThreads>>>(ts, lr, beta1, beta2, eps, weight_decay, decoupled, bc1, bc2,
                                   grad_scale);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void bias_gelu_forward(const float* x, const float* bias, float* pre, float* y, int N, int O) {
  if (N <= 0 || O <= 0) return;
  const std::size_t n = static_cast<std::size_t>(N) * O;
  k_bias_gelu_fwd<<<blocks_for(n), kThreads>>>(x, bias, pre, y, N, O);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
void bias_swiglu_forward(const float* x, const float* bias, float* pre, float* y, int N, int F) {
  if (N <= 0 || F <= 0) return;
  const std::size_t n = static_cast<std::size_t>(N) * F;
  k_bias_swiglu_fwd<<<blocks_for(n), kThreads>>>(x, bias, pre, y, N, F);
  DISTPLAN_CUDA_CHECK_LAUNCH();
}
}  // namespace distplan::backend::cuda
