// Op-level compute costs (docs/time.md, "Op costs"): a roofline per kernel,
// max(FLOPs / (peak * efficiency), bytes / achieved HBM bandwidth) + launch.
#include "distplan/planner/op_costs.h"

#include "distplan/planner/selective_op.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace distplan {
namespace {

// Tensor-core GEMM tiles (rows x columns of C per thread block) that cuBLAS / CUTLASS pick from
// for large fp16/bf16 GEMMs on Ampere and Hopper (CUTLASS default_gemm_configuration.h:
// 256x128, 128x256, 128x128); min_area_waves() takes the best of them, as cuBLAS's heuristic
// does.

}  // namespace

FlopsPerSecond dense_peak(const GpuSpec& g, DType d) noexcept {
  switch (d) {
    case DType::bf16:
      return g.peak_flops.bf16;
    case DType::fp16:
      return g.peak_flops.fp16;
    case DType::fp32:
      return g.peak_flops.tf32 > 0 ? g.peak_flops.tf32 : g.peak_flops.fp32;
  }
  return 0;
}

DeviceRates device_rates(const Scenario& s) noexcept {
  const GpuSpec& g = s.cluster.gpu;
  const Assumptions& a = s.assumptions;
  DeviceRates r;
  r.peak = dense_peak(g, s.training.precision);
  r.gemm_efficiency = a.compute_efficiency > 0 ? a.compute_efficiency : g.gemm_efficiency;
  r.k_overhead = g.gemm_k_overhead;
  r.sms = static_cast<double>(g.sm_count);
  r.hbm =
      g.memory_bandwidth * (a.memory_efficiency > 0 ? a.memory_efficiency : g.memory_efficiency);
  r.launch = a.kernel_launch_seconds;
  r.flash_forward = g.flash_forward_efficiency;
  r.flash_backward = g.flash_backward_efficiency;
  r.element_bytes = bytes_of(s.training.precision);
  if (s.training.fp8 != Fp8Recipe::none) {
    r.fp8_peak = s.training.fp8 == Fp8Recipe::mxfp8 ? g.peak_flops.mxfp8 : g.peak_flops.fp8;
  }
  r.finish();
  return r;
}

void DeviceRates::finish() noexcept {
  inv_hbm = 1.0 / hbm;
  inv_sms = sms > 0 ? 1.0 / sms : 0.0;
  inv_gemm_rate = 1.0 / (peak * gemm_efficiency);
  inv_flash_forward_rate = 1.0 / (peak * flash_forward);
  inv_flash_backward_rate = 1.0 / (peak * flash_backward);
  inv_fp8_gemm_rate = fp8_peak > 0 ? 1.0 / (fp8_peak * gemm_efficiency) : 0.0;
}

namespace {

// ceil for non-negative values below 2^63 without a libm call (std::ceil is one on baseline
// x86-64; the estimate's hot path takes ~200 of them).
inline double ceil_pos(double x) noexcept {
  const double t = static_cast<double>(static_cast<std::int64_t>(x));
  return t < x ? t + 1.0 : t;
}

// A GEMM dimension with its tile counts for the two tile sides (computed once per dimension:
// a linear layer's three GEMMs share theirs).
struct Dim {
  double v, t128, t256;
  explicit Dim(double x) noexcept
      : v(x), t128(ceil_pos(x * (1.0 / 128))), t256(ceil_pos(x * (1.0 / 256))) {}
};

// min over the tiles of (tile area x waves): the SM-time, in tile-areas, of the GEMM's thread
// blocks. Tile and wave quantisation (partial tiles at the edges do full work; the last wave of
// thread blocks leaves SMs idle): NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
// Background". Tile sides are powers of two, so m * (1 / side) is exact; the wave count is an
// integer ratio, taken with a guard against rounding just above an exact multiple.
[[gnu::always_inline]] inline double min_area_waves(const DeviceRates& r, const Dim& m,
                                                    const Dim& n, double batch) noexcept {
  const double per_sm = batch * r.inv_sms;
  auto area_waves = [per_sm](double tiles, double area) {
    return area * ceil_pos(tiles * per_sm - 1e-9);
  };
  // 256x128 and 128x256 have the same area: the one with fewer tiles needs no more waves.
  return std::min(area_waves(std::min(m.t256 * n.t128, m.t128 * n.t256), 256.0 * 128),
                  area_waves(m.t128 * n.t128, 128.0 * 128));
}

[[gnu::always_inline]] inline Seconds gemm_time(const DeviceRates& r, const Dim& m, const Dim& n,
                                                double k, double batch, bool fp8 = false) noexcept {
  if (m.v <= 0 || n.v <= 0 || k <= 0) return 0;
  // 2 m n k batch / (peak * gemm_efficiency(...)), with the quotients cancelled: SM-time in
  // tile-areas times (k + k_overhead) steps (the hot path of every estimate; no division).
  const double work = r.sms > 0 ? r.sms * min_area_waves(r, m, n, batch) * (k + r.k_overhead)
                                : m.v * n.v * batch * (k + r.k_overhead);
  // FP8: the tensor cores' fp8 rate, one-byte A and B, C in the compute dtype (TE's fp8 GEMMs
  // write bf16).
  const double compute = 2.0 * work * (fp8 ? r.inv_fp8_gemm_rate : r.inv_gemm_rate);
  const double e = static_cast<double>(r.element_bytes);
  const double bytes =
      ((fp8 ? 1.0 : e) * (m.v * k + k * n.v) + e * m.v * n.v) * batch;  // A, B read; C written
  return std::max(compute, bytes * r.inv_hbm) + r.launch;
}

}  // namespace

double gemm_efficiency(const DeviceRates& r, double m, double n, double k, double batch) noexcept {
  // Useful work over SM-time: m n batch / (SMs * tile area * waves), best tile.
  const double quant =
      r.sms > 0 ? m * n * batch / (r.sms * min_area_waves(r, Dim(m), Dim(n), batch)) : 1.0;
  // Each tile's main loop over K is preceded by a pipeline fill and followed by the epilogue;
  // they cost about k_overhead of K-steps (short-K GEMMs such as attention's QK^T run far below
  // peak).
  const double k_eff = k / (k + r.k_overhead);
  return r.gemm_efficiency * quant * k_eff;
}

Seconds gemm_seconds(const DeviceRates& r, double m, double n, double k, double batch,
                     bool fp8) noexcept {
  return gemm_time(r, Dim(m), Dim(n), k, batch, fp8 && r.fp8_peak > 0);
}

Seconds memory_seconds(const DeviceRates& r, double bytes, double kernels) noexcept {
  return bytes * r.inv_hbm + kernels * r.launch;
}

PassCosts layer_pass_costs(const LayerTable& table, const ModelSpec& m, const TrainingSpec& t,
                           Count tp, bool sp, const DeviceRates& r, Count cp,
                           bool windowed) noexcept {
  PassCosts c;
  const double e = static_cast<double>(r.element_bytes);
  const double cpd = static_cast<double>(cp);
  const double T = static_cast<double>(t.micro_batch_size * t.seq_length) / cpd;  // local tokens
  const double tpd = static_cast<double>(tp);
  const double T_sp = sp ? T / tpd : T;  // tokens one rank holds in the replicated region
  const double h = static_cast<double>(m.hidden_size);
  const double s = static_cast<double>(t.seq_length);
  const double b = static_cast<double>(t.micro_batch_size);
  const double d = static_cast<double>(m.head_dim());
  const double heads = static_cast<double>(m.num_attention_heads) / tpd;  // per rank
  const bool dropout = t.dropout > 0;
  const Dim dT(T);
  const std::array<double, kMaxLayerOps> op_share = selective_op_recompute_share(table);
  int index = 0;
  for (const LayerOp& op : table) {
    double fwd = 0, bin = 0, bw = 0;
    switch (op.kind) {
      case OpKind::norm:
        // Read x, write y; backward reads dy and x, writes dx (gamma/beta grads reduce in the
        // same kernel pair).
        fwd = memory_seconds(r, T_sp * h * 2 * e, 1);
        bin = memory_seconds(r, T_sp * h * 3 * e, 2);
        break;
      case OpKind::linear: {
        // Column-parallel: all tokens, output split t ways; row-parallel: input split t ways.
        const double in = static_cast<double>(op.in_features);
        const double out = static_cast<double>(op.out_features);
        const bool col = op.linear == LinearKind::column_parallel;
        const double N = col ? out / tpd : out;
        const double K = col ? in : in / tpd;
        const Dim dN(N), dK(K);
        const bool fp8 = r.fp8_peak > 0;
        fwd = gemm_time(r, dT, dN, K, 1, fp8);  // Y = X W^T (bias fused in the epilogue)
        bin = gemm_time(r, dT, dK, N, 1, fp8);  // dX = dY W
        bw = gemm_time(r, dN, dK, T, 1, fp8);   // dW = dY^T X
        c.gemm_forward += fwd;
        c.gemm_backward += bin + bw;
        if (fp8) {
          // Quantisation, bandwidth bound: the forward casts X (read in the compute dtype, write
          // the row-wise and column-wise fp8 copies, TE's cast_transpose), the backward dY alike.
          // Weights are cast once per step (estimate.cpp, with the optimizer).
          fwd += memory_seconds(r, T * K * (e + 2), 1);
          bin += memory_seconds(r, T * N * (e + 2), 1);
        }
        break;
      }
      case OpKind::attention_core: {
        const double q_bytes = T * static_cast<double>(m.q_hidden()) / tpd * e;
        const double kv_bytes = 2 * T * static_cast<double>(m.kv_hidden()) / tpd * e;
        if (t.attention == Attention::flash) {
          // Dao 2023 (FlashAttention-2): causal masking skips half the blocks; the backward
          // recomputes QK^T: 5 GEMM-equivalents against the forward's 2, i.e. 2.5x its FLOPs.
          // Context parallel: 1/cp of the causal work on every rank (2·cp load-balanced chunks,
          // or whole heads under a2a).
          // A window (sliding or chunked) skips the blocks outside it: its share of the causal
          // pairs (FlashAttention-2's window_size, Transformer Engine's window_size).
          const double keys =
              windowed ? attention_keys_fraction(m.attention_window, t.seq_length) : 1.0;
          const double flops = 0.5 * 4.0 * b * s * s * d * heads / cpd * keys;
          const double io = 2 * q_bytes + kv_bytes;  // read q, k, v; write o
          fwd = std::max(flops * r.inv_flash_forward_rate, io * r.inv_hbm) + r.launch;
          bin =
              std::max(2.5 * flops * r.inv_flash_backward_rate, 2 * io * r.inv_hbm) + 2 * r.launch;
        } else {
          // Materialised scores (Megatron-LM's fused scale-mask-softmax): QK^T and PV batched
          // over b * heads; the full s x s is computed (no causal skipping).
          const double bh = b * heads;
          const double scores = bh * s * s;
          const double qk = gemm_seconds(r, s, s, d, bh);
          const double pv = gemm_seconds(r, s, d, s, bh);
          fwd = qk + pv + memory_seconds(r, scores * 2 * e, 1);            // softmax: read, write
          if (dropout) fwd += memory_seconds(r, scores * (2 * e + 1), 1);  // + 1-byte mask
          // dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q; softmax backward reads P and dP.
          bin = qk + 3 * pv + memory_seconds(r, scores * 3 * e, 1);
          if (dropout) bin += memory_seconds(r, scores * (2 * e + 1), 1);
        }
        if (m.position_embedding == PositionEmbedding::rotary) {
          // Rotary on q and k: read and write them, forward and backward.
          const double rope = (q_bytes + kv_bytes / 2) * 2;
          fwd += memory_seconds(r, rope, 1);
          bin += memory_seconds(r, rope, 1);
        }
        if (m.qk_norm) {
          // q and k RMSNorms (Qwen3), costed as the layer norms above: read and write forward;
          // backward reads dy and x and writes dx.
          const double qk = q_bytes + kv_bytes / 2;
          fwd += memory_seconds(r, qk * 2, 2);
          bin += memory_seconds(r, qk * 3, 4);
        }
        bool selective = false;
        for (int i = 0; i < op.num_saved; ++i) selective |= op.saved[i].dropped_by_selective;
        if (selective) c.selective_recompute += fwd;
        c.attention_forward += fwd;
        c.attention_backward += bin;
        break;
      }
      case OpKind::activation: {
        // GeLU: read and write the f/t-wide input; SwiGLU reads gate and up, writes one.
        const double width = static_cast<double>(op.saved[0].per_token) / tpd;
        const double out_w = gated(m.mlp) ? width / 2 : width;
        fwd = memory_seconds(r, T * (width + out_w) * e, 1);
        bin = memory_seconds(r, T * (out_w + 2 * width) * e, 1);  // read dy, x; write dx
        break;
      }
      case OpKind::dropout:
        // Fused with the residual add that follows (Megatron-LM's bias-dropout-add, torch.compile):
        // the forward adds the mask write, the backward reads dy and the mask and writes dx.
        fwd = memory_seconds(r, T_sp * h * 1, 0);
        bin = memory_seconds(r, T_sp * h * (2 * e + 1), 1);
        break;
      case OpKind::residual_add:
        // Read both inputs, write the sum; its backward passes the gradient on unchanged.
        fwd = memory_seconds(r, T_sp * h * 3 * e, 1);
        break;
    }
    c.forward += fwd;
    c.selective_op_recompute += op_share[index++] * fwd;
    c.backward_input += bin;
    c.backward_weight += bw;
  }
  return c;
}

namespace {
// A norm over `bytes` of hidden states outside the layers (the embedding norm, the final norm):
// the forward reads and writes them, the backward reads the input and the output gradient and
// writes the input gradient, in two kernels (the weight gradient's reduction is the second).
void add_norm_costs(PassCosts& c, const DeviceRates& r, double bytes) noexcept {
  c.forward += memory_seconds(r, 2 * bytes, 1);
  c.backward_input += memory_seconds(r, 3 * bytes, 2);
}
}  // namespace

PassCosts embedding_pass_costs(const ModelSpec& m, const TrainingSpec& t, Count tp, bool sp,
                               const DeviceRates& r) noexcept {
  PassCosts c;
  const double e = static_cast<double>(r.element_bytes);
  const double T = static_cast<double>(t.micro_batch_size * t.seq_length);
  const double h = static_cast<double>(m.hidden_size);
  const double T_sp = sp ? T / static_cast<double>(tp) : T;
  // Gather rows (read, write), plus the learned positions' add; backward scatters the gradient.
  const double pos = m.position_embedding == PositionEmbedding::learned ? 1.0 : 0.0;
  c.forward = memory_seconds(r, T * h * 2 * e + pos * T_sp * h * 3 * e, 1 + pos);
  c.backward_weight = memory_seconds(r, T * h * 2 * e + pos * T_sp * h * 2 * e, 1 + pos);
  if (m.embedding_norm) add_norm_costs(c, r, T_sp * h * e);
  return c;
}

PassCosts head_pass_costs(const ModelSpec& m, const TrainingSpec& t, Count padded_vocab, Count tp,
                          bool sp, const DeviceRates& r) noexcept {
  PassCosts c;
  const double e = static_cast<double>(r.element_bytes);
  const double T = static_cast<double>(t.micro_batch_size * t.seq_length);
  const double tpd = static_cast<double>(tp);
  const double h = static_cast<double>(m.hidden_size);
  const double T_sp = sp ? T / tpd : T;
  const double Vt = static_cast<double>(padded_vocab) / tpd;
  add_norm_costs(c, r, T_sp * h * e);  // final norm
  // Vocab-parallel LM head.
  const Dim dT(T), dV(Vt), dh(h);
  const double f = gemm_time(r, dT, dV, h, 1);
  const double bi = gemm_time(r, dT, dh, Vt, 1);
  const double bw = gemm_time(r, dV, dh, T, 1);
  c.forward += f;
  c.backward_input += bi;
  c.backward_weight += bw;
  c.gemm_forward = f;
  c.gemm_backward = bi + bw;
  if (m.final_logit_softcap > 0) {
    // Gemma 2's final softcap, cap·tanh(logits/cap): read and write the logits; its backward
    // reads the saved tanh and the gradient and writes the gradient.
    c.forward += memory_seconds(r, T * Vt * 2 * e, 1);
    c.backward_input += memory_seconds(r, T * Vt * 3 * e, 1);
  }
  // Vocab-parallel cross-entropy (Megatron-LM): read the logits, write the fp32 softmax; backward
  // reads it and writes the logits' gradient.
  c.forward += memory_seconds(r, T * Vt * (e + 4), 2);
  c.backward_input += memory_seconds(r, T * Vt * (4 + e), 1);
  return c;
}

}  // namespace distplan
