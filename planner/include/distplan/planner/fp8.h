// FP8 training (docs/memory.md and docs/time.md, "FP8"): what a layer keeps in fp8 beyond its
// bf16 state, written once for the memory terms (estimate() and the search's lean path) and the
// op costs. Saved GEMM inputs in fp8 are part of the layer op table (layer_ops.cpp).
#pragma once

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// Linear-layer weight parameters of one layer held by one TP rank: the GEMMs that run in fp8.
[[nodiscard]] inline Count fp8_linear_params_per_rank(const LayerTable& table, Count tp) noexcept {
  Count n = 0;
  for (const LayerOp& op : table) {
    if (op.kind == OpKind::linear) n += op.weight_params / tp;
  }
  return n;
}

/// Persistent fp8 state of one layer on one GPU: Transformer Engine caches each linear weight's
/// fp8 copy for the step's micro-batches in both layouts the GEMMs read (row-wise for the forward
/// and dgrad, column-wise/transposed for wgrad: module/base.py's fp8 weight workspace, one byte
/// each), plus the recipe's scales: per-tensor scale and amax history (delayed scaling:
/// amax_history_len fp32 values and a scale for each of the five fp8 tensors of every linear,
/// three forward (input, weight, output) and two backward (output gradient, input gradient):
/// TE pytorch/module/base.py, num_fp8_tensors = num_gemms * 3 forward, * 2 backward, and
/// DelayedScalingRecipeState's amax_history [len, n] and scale [n]); one fp32 scale per 128x128
/// weight block (blockwise,
/// DeepSeek-V3 sec. 3.3.1); one E8M0 byte per 32 elements in each layout (MXFP8).
/// The same for `w` linear weight parameters in `linears` GEMM weights (a MoE layer's routed
/// experts on one GPU: two per local expert, Transformer Engine's GroupedLinear keeps each
/// expert's weight, scales and amax history apart).
[[nodiscard]] inline Bytes fp8_weight_state_bytes(Count w, Count linears, Fp8Recipe r,
                                                  const Assumptions& a) noexcept {
  if (r == Fp8Recipe::none) return 0;
  Bytes bytes = 2 * w;
  switch (r) {
    case Fp8Recipe::none:
      break;
    case Fp8Recipe::delayed:
      bytes += linears * 5 * (a.fp8_amax_history_len + 1) * 4;
      break;
    case Fp8Recipe::current:
      bytes += linears * 3 * 4;
      break;
    case Fp8Recipe::blockwise:
      bytes += 2 * ((w + 128 * 128 - 1) / (128 * 128)) * 4;
      break;
    case Fp8Recipe::mxfp8:
      bytes += 2 * ((w + 31) / 32);
      break;
  }
  return bytes;
}
[[nodiscard]] inline Bytes fp8_layer_state_bytes(const LayerTable& table, Count tp, Fp8Recipe r,
                                                 const Assumptions& a) noexcept {
  if (r == Fp8Recipe::none) return 0;
  Count linears = 0;
  for (const LayerOp& op : table) linears += op.kind == OpKind::linear ? 1 : 0;
  return fp8_weight_state_bytes(fp8_linear_params_per_rank(table, tp), linears, r, a);
}

}  // namespace distplan
