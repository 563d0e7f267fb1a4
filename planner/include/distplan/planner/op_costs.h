// Op-level compute costs: each op of the layer op table, and the embedding, LM head and loss,
// timed as a roofline per kernel (docs/time.md, "Op costs"). One cost function for the planner's
// stage costs, the simulator (which schedules those stage costs) and the search's bounds.
#pragma once

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// The device figures the op costs need, resolved once from the GPU preset and the assumptions.
struct DeviceRates {
  FlopsPerSecond peak = 0;     // dense peak of the compute dtype
  double gemm_efficiency = 0;  // ceiling for large, well-shaped GEMMs
  double k_overhead = 0;       // GEMM K-equivalent of a tile's prologue and epilogue
  double sms = 0;              // 0: wave quantisation not modelled
  BytesPerSecond hbm = 0;      // achieved HBM bandwidth (nominal * memory efficiency)
  double inv_hbm = 0;          // 1 / hbm
  Seconds launch = 0;          // per kernel
  double flash_forward = 0;    // achieved / dense peak
  double flash_backward = 0;
  Bytes element_bytes = 2;         // compute dtype
  FlopsPerSecond fp8_peak = 0;     // FP8 (or MXFP8) dense peak of the layers' linear GEMMs; 0: none
  double fp8_gemm_efficiency = 0;  // ceiling of those GEMMs, achieved / fp8_peak
  Fp8Recipe fp8_recipe = Fp8Recipe::none;
  Kernels kernels = Kernels::fused;    // how the element-wise ops run (docs/time.md)
  double clock = 1;                    // compute clock under the power limit, / the rated one
  double grouped_gemm_efficiency = 1;  // MoE grouped GEMMs against a dense GEMM of their shape
  // Reciprocals, so that the per-op costs divide nowhere (the estimate's hot path); set by
  // device_rates() or finish().
  double inv_sms = 0, inv_gemm_rate = 0, inv_flash_forward_rate = 0, inv_flash_backward_rate = 0;
  double inv_fp8_gemm_rate = 0;
  /// Fills the reciprocals from the fields above.
  void finish() noexcept;
};

[[nodiscard]] DeviceRates device_rates(const Scenario& s) noexcept;

/// Dense peak FLOP/s of dtype d (fp32 runs on TF32 tensor cores when the preset gives them).
[[nodiscard]] FlopsPerSecond dense_peak(const GpuSpec& g, DType d) noexcept;

/// Efficiency of one (batched) GEMM C[m,n] += A[m,k] B[k,n]: the ceiling times tile and wave
/// quantisation over the SMs times k / (k + k_overhead), best over the usual tensor-core tiles.
[[nodiscard]] double gemm_efficiency(const DeviceRates& r, double m, double n, double k,
                                     double batch) noexcept;
/// Roofline time of one (batched) GEMM plus its launch; `fp8`: at the fp8 rate with one-byte
/// inputs (r.fp8_peak must be set).
[[nodiscard]] Seconds gemm_seconds(const DeviceRates& r, double m, double n, double k,
                                   double batch = 1, bool fp8 = false) noexcept;
/// A bandwidth-bound kernel (or `kernels` fused ones) moving `bytes` through HBM.
[[nodiscard]] Seconds memory_seconds(const DeviceRates& r, double bytes, double kernels) noexcept;

/// Time of one micro-batch through one pass, on one GPU.
struct PassCosts {
  Seconds forward = 0;
  Seconds backward_input = 0;
  Seconds backward_weight = 0;
  Seconds selective_recompute = 0;     // forward of the ops selective recompute re-runs
  Seconds selective_op_recompute = 0;  // forward of the ops per-op selective checkpointing re-runs
  Seconds gemm_forward = 0;            // of `forward`, the linear layers' GEMMs (TP overlap window)
  Seconds gemm_backward = 0;           // of the backward passes, the linear layers' GEMMs
  Seconds attention_forward = 0;   // of `forward`, the attention core (context-parallel overlap)
  Seconds attention_backward = 0;  // of `backward_input`, the attention core
};

/// One transformer layer (all ops of the table) for a micro-batch of b sequences of length s,
/// on one GPU of a TP group of `tp` (with or without sequence parallelism) and of a
/// context-parallel group of `cp`: the GPU holds s/cp tokens of each sequence and does 1/cp of
/// the causal attention (load-balanced chunks).
/// `windowed`: the layer attends within model.attention_window (its causal work scaled by
/// attention_keys_fraction over the whole sequence).
[[nodiscard]] PassCosts layer_pass_costs(const LayerTable& table, const ModelSpec& m,
                                         const TrainingSpec& t, Count tp, bool sp,
                                         const DeviceRates& r, Count cp = 1,
                                         bool windowed = false) noexcept;

struct LoraLayer;
struct PeftLayerFlow;
/// One layer under fine-tuning (tp = 1; docs/peft.md, "Time"): the table's ops with only the
/// backward halves the flow runs (no weight gradient of a frozen weight), the LoRA adapters'
/// small GEMMs, and a quantized base's dequantization before each GEMM. `windowed` as for
/// layer_pass_costs.
[[nodiscard]] PassCosts peft_layer_pass_costs(const LayerTable& table, const ModelSpec& m,
                                              const TrainingSpec& t, const LoraLayer& lora,
                                              const PeftLayerFlow& flow, const DeviceRates& r,
                                              bool windowed = false) noexcept;

/// The first stage's extra ops: the vocab-parallel embedding lookup (and its gradient scatter).
[[nodiscard]] PassCosts embedding_pass_costs(const ModelSpec& m, const TrainingSpec& t, Count tp,
                                             bool sp, const DeviceRates& r) noexcept;

/// The last stage's extra ops: final norm, vocab-parallel LM head GEMMs and cross-entropy.
[[nodiscard]] PassCosts head_pass_costs(const ModelSpec& m, const TrainingSpec& t,
                                        Count padded_vocab, Count tp, bool sp,
                                        const DeviceRates& r) noexcept;

}  // namespace distplan
