// Op-level compute costs (docs/time.md, "Op costs"): a roofline per kernel,
// max(FLOPs / (peak * efficiency), bytes / achieved HBM bandwidth) + launch.
#include "distplan/planner/op_costs.h"

#include "distplan/planner/peft.h"
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

// Compute clock under a power limit (docs/time.md, "Power"): the preset's efficiencies hold at
// its rated board power; below it the GPU lowers its clock until the tensor cores' draw fits,
// dynamic power ~ f·V² with V ~ f (DVFS) giving f ~ P^(1/3) (`clock_power_exponent`). Memory-
// bound kernels keep the HBM's rate.
static double power_clock(const Scenario& s) noexcept {
  const double tdp = s.cluster.gpu.tdp_watts;
  const double limit = s.cluster.power_limit_watts;
  if (tdp <= 0 || limit <= 0 || limit >= tdp) return 1.0;
  return std::pow(limit / tdp, s.assumptions.clock_power_exponent);
}

DeviceRates device_rates(const Scenario& s) noexcept {
  const GpuSpec& g = s.cluster.gpu;
  const Assumptions& a = s.assumptions;
  const TrainingSpec& t = s.training;
  DeviceRates r;
  r.clock = power_clock(s);
  r.peak = dense_peak(g, t.precision) * r.clock;
  r.gemm_efficiency = a.compute_efficiency > 0 ? a.compute_efficiency : g.gemm_efficiency;
  r.k_overhead = g.gemm_k_overhead;
  r.sms = static_cast<double>(g.sm_count);
  r.hbm =
      g.memory_bandwidth * (a.memory_efficiency > 0 ? a.memory_efficiency : g.memory_efficiency);
  // Whole-step CUDA graphs replay the kernels with no host launch gap between them.
  r.launch = t.cuda_graphs ? 0.0 : a.kernel_launch_seconds;
  r.kernels = t.kernels;
  // PyTorch's scaled_dot_product_attention (eager and compiled stacks) runs FlashAttention-2;
  // the fused stacks run cuDNN's / Transformer Engine's kernel (the preset's flash figures).
  const bool sdpa = t.kernels != Kernels::fused;
  r.flash_forward = sdpa && g.sdpa_forward_efficiency > 0 ? g.sdpa_forward_efficiency
                                                          : g.flash_forward_efficiency;
  r.flash_backward = sdpa && g.sdpa_backward_efficiency > 0 ? g.sdpa_backward_efficiency
                                                            : g.flash_backward_efficiency;
  r.element_bytes = bytes_of(t.precision);
  r.grouped_gemm_efficiency = a.grouped_gemm_efficiency;
  if (t.fp8 != Fp8Recipe::none) {
    const bool mx = t.fp8 == Fp8Recipe::mxfp8;
    r.fp8_recipe = t.fp8;
    r.fp8_peak = (mx ? g.peak_flops.mxfp8 : g.peak_flops.fp8) * r.clock;
    const double fp8 = g.fp8_gemm_efficiency > 0 ? g.fp8_gemm_efficiency : g.gemm_efficiency;
    const double ceiling = mx && g.mxfp8_gemm_efficiency > 0 ? g.mxfp8_gemm_efficiency : fp8;
    r.fp8_gemm_efficiency = a.fp8_compute_efficiency > 0 ? a.fp8_compute_efficiency : ceiling;
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
  inv_fp8_gemm_rate = fp8_peak > 0 ? 1.0 / (fp8_peak * fp8_gemm_efficiency) : 0.0;
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

// Element-wise ops as eager PyTorch runs them (docs/time.md, "Kernel fusion"): bytes moved per
// element of the op's bf16 input (or gated output, or logit), and kernels launched, counted from
// the forward ops and their autograd backward in torchtitan's llama model at 9dec370
// (torchtitan/models/norms.py RMSNorm, models/llama/model.py apply_rotary_emb, FeedForward,
// repeat_kv, and train.py's cross_entropy(pred.float())). Fused stacks (Transformer Engine,
// Megatron-LM's fused kernels) and torch.compile read each input and write each output once
// (the figures in layer_pass_costs); compile leaves SDPA's layout copies and the loss (compiled
// per transformer block) as they are.
struct EagerOp {
  double forward_bytes, backward_bytes, forward_kernels, backward_kernels;
};
// RMSNorm: x.float() (2 + 4), pow (4 + 4), mean (4), x * rsqrt (4 + 4), type_as (4 + 2),
// * weight (2 + 2); backward: the mirror of each plus the weight's reduction.
constexpr EagerOp kEagerRmsNorm{36, 76, 6, 11};
// Rotary on q or k: .float() (2 + 4), complex multiply (4 + 4), type_as (4 + 2); backward alike.
constexpr EagerOp kEagerRotary{20, 20, 3, 3};
// SwiGLU per output element: silu(a) (2 + 2), silu(a) * b (4 + 2); backward dy * b, dy *
// silu(a), silu's backward (6 each).
constexpr EagerOp kEagerSwiglu{10, 18, 2, 3};
// Cross-entropy per logit: .float() (2 + 4), log_softmax (4 + 4); backward: nll_loss's dense
// gradient (4), log_softmax's backward (4 + 4 + 4), the cast back (4 + 2).
constexpr EagerOp kEagerCrossEntropy{14, 22, 2, 3};

// Quantisation bytes per element of an FP8 linear's input (forward) or output gradient
// (backward), read in the compute dtype `e` and written as the row-wise and column-wise fp8
// copies the forward and the two backward GEMMs read (TE's cast_transpose): delayed scaling
// takes its scale from the amax history in the same pass; current scaling (TE
// Float8CurrentScaling, torchao's dynamic tensorwise) first reads the tensor for its amax;
// blockwise and MXFP8 scale each block inside the cast, writing one scale per 128 or 32 values
// (fp32, E8M0) per copy.
double fp8_cast_bytes(Fp8Recipe recipe, double e) noexcept {
  switch (recipe) {
    case Fp8Recipe::current:
      return 2 * e + 2;
    case Fp8Recipe::blockwise:
      return e + 2 + 2 * 4.0 / 128;
    case Fp8Recipe::mxfp8:
      return e + 2 + 2 * 1.0 / 32;
    case Fp8Recipe::delayed:
    case Fp8Recipe::none:
      break;
  }
  return e + 2;
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

namespace {

// The layer's op costs; with `flow` (fine-tuning) only the backward halves the flow runs;
// `windowed`: its attention within model.attention_window.
PassCosts layer_costs(const LayerTable& table, const ModelSpec& m, const TrainingSpec& t, Count tp,
                      bool sp, const DeviceRates& r, Count cp, const PeftLayerFlow* flow,
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
  const double heads = static_cast<double>(m.num_attention_heads) / tpd;  // per rank
  const bool dropout = t.dropout > 0;
  const bool eager = r.kernels == Kernels::eager;
  const bool eager_rms = eager && m.norm == Norm::rmsnorm;
  const std::array<double, kMaxLayerOps> op_share = selective_op_recompute_share(table);
  int index = 0;
  for (const LayerOp& op : table) {
    double fwd = 0, bin = 0, bw = 0;
    switch (op.kind) {
      case OpKind::norm: {
        // Read x, write y; backward reads dy and x, writes dx (gamma/beta grads reduce in the
        // same kernel pair). Eager RMSNorm is composed of point-wise ops (kEagerRmsNorm); eager
        // LayerNorm is one ATen kernel each way. Its width: h, or an MLA latent's.
        const double w = static_cast<double>(op.in_features);
        if (eager_rms) {
          fwd = memory_seconds(r, T_sp * w * kEagerRmsNorm.forward_bytes,
                               kEagerRmsNorm.forward_kernels);
          bin = memory_seconds(r, T_sp * w * kEagerRmsNorm.backward_bytes,
                               kEagerRmsNorm.backward_kernels);
        } else {
          fwd = memory_seconds(r, T_sp * w * 2 * e, 1);
          bin = memory_seconds(r, T_sp * w * 3 * e, 2);
        }
        break;
      }
      case OpKind::linear: {
        // Column-parallel: all tokens, output split t ways; row-parallel: input split t ways;
        // duplicated (MLA's down-projections): the whole weight over the rank's own tokens.
        const double in = static_cast<double>(op.in_features);
        const double out = static_cast<double>(op.out_features);
        const bool col = op.linear == LinearKind::column_parallel;
        const bool dup = op.linear == LinearKind::duplicated;
        const double N = col ? out / tpd : out;
        const double K = col || dup ? in : in / tpd;
        const double tokens = dup ? T_sp : T;
        const Dim dN(N), dK(K), dTok(tokens);
        const bool fp8 = r.fp8_peak > 0;
        fwd = gemm_time(r, dTok, dN, K, 1, fp8);    // Y = X W^T (bias fused in the epilogue)
        bin = gemm_time(r, dTok, dK, N, 1, fp8);    // dX = dY W
        bw = gemm_time(r, dN, dK, tokens, 1, fp8);  // dW = dY^T X
        if (flow != nullptr) {
          const auto i = static_cast<std::size_t>(index);
          if (!flow->backward_input[i]) bin = 0;
          if (!flow->backward_weight[i]) bw = 0;
        }
        c.gemm_forward += fwd;
        c.gemm_backward += bin + bw;
        if (fp8) {
          // Quantisation, bandwidth bound: the forward casts X, the backward dY, by the recipe
          // (fp8_cast_bytes); current scaling's amax is a kernel of its own. Weights are cast
          // once per step (estimate.cpp, with the optimizer).
          const double cast = fp8_cast_bytes(r.fp8_recipe, e);
          const double kernels = r.fp8_recipe == Fp8Recipe::current ? 2 : 1;
          fwd += memory_seconds(r, tokens * K * cast, kernels);
          bin += memory_seconds(r, tokens * N * cast, kernels);
        }
        break;
      }
      case OpKind::attention_core: {
        // q and the output; K and V together (MLA: d_qk keys, d_v values, every head).
        const double q_bytes = T * static_cast<double>(m.attention_q_width()) / tpd * e;
        const double o_bytes = T * static_cast<double>(m.attention_out_width()) / tpd * e;
        const double kv_bytes =
            T * static_cast<double>(m.attention_k_width() + m.attention_v_width()) / tpd * e;
        const double d_qk = static_cast<double>(m.attention_qk_head_dim());
        const double d_v = static_cast<double>(m.attention_v_head_dim());
        if (t.attention == Attention::flash) {
          // Dao 2023 (FlashAttention-2): causal masking skips half the blocks; the backward
          // recomputes QK^T: 5 GEMM-equivalents against the forward's 2, i.e. 2.5x its FLOPs.
          // Context parallel: 1/cp of the causal work on every rank (2·cp load-balanced chunks,
          // or whole heads under a2a).
          // A window (sliding or chunked) skips the blocks outside it: its share of the causal
          // pairs (FlashAttention-2's window_size, Transformer Engine's window_size).
          const double keys =
              windowed ? attention_keys_fraction(m.attention_window, t.seq_length) : 1.0;
          const double flops = 0.5 * 2.0 * b * s * s * (d_qk + d_v) * heads / cpd * keys;
          const double io = q_bytes + kv_bytes + o_bytes;  // read q, k, v; write o
          fwd = std::max(flops * r.inv_flash_forward_rate, io * r.inv_hbm) + r.launch;
          bin =
              std::max(2.5 * flops * r.inv_flash_backward_rate, 2 * io * r.inv_hbm) + 2 * r.launch;
        } else {
          // Materialised scores (Megatron-LM's fused scale-mask-softmax): QK^T and PV batched
          // over b * heads; the full s x s is computed (no causal skipping).
          const double bh = b * heads;
          const double scores = bh * s * s;
          const double qk = gemm_seconds(r, s, s, d_qk, bh);
          const double pv = gemm_seconds(r, s, d_v, s, bh);
          fwd = qk + pv + memory_seconds(r, scores * 2 * e, 1);            // softmax: read, write
          if (dropout) fwd += memory_seconds(r, scores * (2 * e + 1), 1);  // + 1-byte mask
          // dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q; softmax backward reads P and dP.
          bin = qk + 3 * pv + memory_seconds(r, scores * 3 * e, 1);
          if (dropout) bin += memory_seconds(r, scores * (2 * e + 1), 1);
        }
        if (m.position_embedding == PositionEmbedding::rotary) {
          // Rotary on q and k: read and write them, forward and backward (eager: kEagerRotary
          // per element, each of q and k its own kernels). MLA rotates only the rotary part: the
          // queries' qk_rope_head_dim per head and the one shared key part, gathered whole.
          const double rope_elements =
              m.mla.enabled()
                  ? T * static_cast<double>(m.mla.qk_rope_head_dim) * (heads + 1)
                  : T * static_cast<double>(m.attention_q_width() + m.attention_k_width()) / tpd;
          if (eager) {
            const double elements = rope_elements;
            fwd += memory_seconds(r, elements * kEagerRotary.forward_bytes,
                                  2 * kEagerRotary.forward_kernels);
            bin += memory_seconds(r, elements * kEagerRotary.backward_bytes,
                                  2 * kEagerRotary.backward_kernels);
          } else {
            const double rope = rope_elements * e * 2;
            fwd += memory_seconds(r, rope, 1);
            bin += memory_seconds(r, rope, 1);
          }
        }
        if (r.kernels != Kernels::fused && t.attention == Attention::flash) {
          // PyTorch SDPA's layout (torchtitan's Attention.forward): repeat_kv materialises K
          // and V at the query heads' count when kv < heads (read kv, write 2 q-sized tensors;
          // the backward sums them back), and the (b, heads, s, d) output is made contiguous
          // for the output projection (read and write q-sized, both ways). Fused stacks take
          // GQA and the layout inside the attention kernel.
          fwd += memory_seconds(r, 2 * o_bytes, 1);
          bin += memory_seconds(r, 2 * o_bytes, 1);
          if (m.attention_kv_heads() < m.num_attention_heads) {
            fwd += memory_seconds(r, kv_bytes + 2 * q_bytes, 2);
            bin += memory_seconds(r, 2 * q_bytes + kv_bytes, 2);
          }
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
        if (eager && m.mlp == Mlp::swiglu) {  // measured for silu·up (kEagerSwiglu)
          fwd = memory_seconds(r, T * out_w * kEagerSwiglu.forward_bytes,
                               kEagerSwiglu.forward_kernels);
          bin = memory_seconds(r, T * out_w * kEagerSwiglu.backward_bytes,
                               kEagerSwiglu.backward_kernels);
        } else {
          fwd = memory_seconds(r, T * (width + out_w) * e, 1);
          bin = memory_seconds(r, T * (out_w + 2 * width) * e, 1);  // read dy, x; write dx
        }
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
    if (flow != nullptr) {
      const auto i = static_cast<std::size_t>(index);
      if (!flow->backward_input[i]) {
        if (op.kind == OpKind::attention_core) c.attention_backward -= bin;
        bin = 0;
      }
      if (!flow->backward_weight[i]) bw = 0;
    }
    c.forward += fwd;
    c.selective_op_recompute += op_share[index++] * fwd;
    c.backward_input += bin;
    c.backward_weight += bw;
  }
  return c;
}

}  // namespace

PassCosts layer_pass_costs(const LayerTable& table, const ModelSpec& m, const TrainingSpec& t,
                           Count tp, bool sp, const DeviceRates& r, Count cp,
                           bool windowed) noexcept {
  return layer_costs(table, m, t, tp, sp, r, cp, nullptr, windowed);
}

PassCosts peft_layer_pass_costs(const LayerTable& table, const ModelSpec& m, const TrainingSpec& t,
                                const LoraLayer& lora, const PeftLayerFlow& flow,
                                const DeviceRates& r, bool windowed) noexcept {
  PassCosts c = layer_costs(table, m, t, 1, false, r, 1, &flow, windowed);
  const PeftSpec& peft = t.peft;
  const double e = static_cast<double>(r.element_bytes);
  const double T = static_cast<double>(t.micro_batch_size * t.seq_length);
  const double rank = static_cast<double>(peft.rank);
  const Dim dT(T), dr(rank);
  for (const LoraModule& x : lora) {
    // Hu et al. 2021 (PEFT lora/layer.py Linear.forward): A's GEMM (r outputs), B's GEMM, the
    // scaled add into the base output; backward dB, B's input gradient, dA, and A's input
    // gradient when the gradient goes on below. With lora dropout a dropout of the input per
    // adapter (read, write, one-byte mask).
    const double in = static_cast<double>(x.in), out = static_cast<double>(x.out);
    const Dim din(in), dout(out);
    const bool on = flow.backward_input[static_cast<std::size_t>(x.op)];
    const double f = gemm_time(r, dT, dr, in, 1) + gemm_time(r, dT, dout, rank, 1);
    const double bi = gemm_time(r, dT, dr, out, 1) + (on ? gemm_time(r, dT, din, rank, 1) : 0.0);
    const double bw = gemm_time(r, dout, dr, T, 1) + gemm_time(r, dr, din, T, 1);
    double add = memory_seconds(r, T * out * 3 * e, 1);
    if (peft.dropout > 0) add += memory_seconds(r, T * in * (2 * e + 1), 1);
    c.forward += f + add;
    c.backward_input += bi + (on ? memory_seconds(r, T * in * 3 * e, 1) : 0.0);
    c.backward_weight += bw;
    c.gemm_forward += f;
    c.gemm_backward += bi + bw;
  }
  if (peft.quantized()) {
    // bitsandbytes dequantizes each weight to the compute dtype before its GEMM (MatMul4Bit,
    // autograd/_functions.py v0.49: F.dequantize_4bit in the forward and again for the input
    // gradient; MatMul8bitLt's backward likewise): read the stored values and their state,
    // write n elements.
    for (const WeightTensor& w : layer_weight_tensors(m, peft.naming)) {
      const double stored =
          static_cast<double>(stored_weight_bytes(peft.base_storage, peft.double_quant, w));
      const double once = memory_seconds(r, stored + static_cast<double>(w.numel()) * e, 1);
      c.forward += once;
      int op = -1;
      for (int i = 0; i < table.num_ops; ++i) {
        const std::string_view n = table.ops[static_cast<std::size_t>(i)].name;
        const bool attn = (w.target & (peft_q | peft_k | peft_v | peft_qkv)) != 0;
        if ((attn && n == "qkv") || (w.target == peft_o && n == "attention_out") ||
            ((w.target & (peft_gate | peft_up)) != 0 && n == "mlp_in") ||
            (w.target == peft_down && n == "mlp_out"))
          op = i;
      }
      if (op >= 0 && flow.backward_input[static_cast<std::size_t>(op)]) c.backward_input += once;
    }
  }
  return c;
}

namespace {
// A norm over `bytes` of hidden states outside the layers (the embedding norm, the final norm):
// the forward reads and writes them, the backward reads the input and the output gradient and
// writes the input gradient, in two kernels (the weight gradient's reduction is the second).
void add_norm_costs(PassCosts& c, const DeviceRates& r, const ModelSpec& m, double bytes) noexcept {
  if (r.kernels == Kernels::eager && m.norm == Norm::rmsnorm) {
    const double elements = bytes / static_cast<double>(r.element_bytes);
    c.forward +=
        memory_seconds(r, elements * kEagerRmsNorm.forward_bytes, kEagerRmsNorm.forward_kernels);
    c.backward_input +=
        memory_seconds(r, elements * kEagerRmsNorm.backward_bytes, kEagerRmsNorm.backward_kernels);
    return;
  }
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
  if (m.embedding_norm) add_norm_costs(c, r, m, T_sp * h * e);
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
  add_norm_costs(c, r, m, T_sp * h * e);  // final norm
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
  // PyTorch stacks (eager, or compiled per transformer block) run F.cross_entropy on the
  // upcast logits (kEagerCrossEntropy).
  if (r.kernels != Kernels::fused) {
    c.forward += memory_seconds(r, T * Vt * kEagerCrossEntropy.forward_bytes,
                                kEagerCrossEntropy.forward_kernels);
    c.backward_input += memory_seconds(r, T * Vt * kEagerCrossEntropy.backward_bytes,
                                       kEagerCrossEntropy.backward_kernels);
  } else {
    c.forward += memory_seconds(r, T * Vt * (e + 4), 2);
    c.backward_input += memory_seconds(r, T * Vt * (4 + e), 1);
  }
  if (m.mtp_layers > 0) {
    // Each MTP module (memory_terms.h, mtp_head_parameters) runs the head once more on its own
    // hidden states (final norm, LM head, loss: the costs above) after its hnorm and enorm and
    // its column-parallel projection 2h -> h; its transformer layer is costed with the chunk's
    // layers.
    const double k = static_cast<double>(m.mtp_layers);
    PassCosts x = c;
    add_norm_costs(x, r, m, T_sp * h * e);
    add_norm_costs(x, r, m, T_sp * h * e);
    const Dim dN(h / tpd), dK(2 * h);
    const double pf = gemm_time(r, dT, dN, 2 * h, 1);
    const double pi = gemm_time(r, dT, dK, h / tpd, 1);
    const double pw = gemm_time(r, dN, dK, T, 1);
    x.forward += pf;
    x.backward_input += pi;
    x.backward_weight += pw;
    x.gemm_forward += pf;
    x.gemm_backward += pi + pw;
    c.forward += k * x.forward;
    c.backward_input += k * x.backward_input;
    c.backward_weight += k * x.backward_weight;
    c.gemm_forward += k * x.gemm_forward;
    c.gemm_backward += k * x.gemm_backward;
  }
  return c;
}

}  // namespace distplan
