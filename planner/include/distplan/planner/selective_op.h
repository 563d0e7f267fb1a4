// torchtitan's per-op selective activation checkpointing (activation_checkpoint.mode "selective",
// selective_ac_option "op"): inside each checkpointed transformer block the outputs of the ops on
// a save list are kept and everything else is recomputed in the backward. The save list holds
// aten.mm, the flash and memory-efficient SDPA kernels, reduce_scatter_tensor and max/abs (float8
// scales); of the matmuls only the odd-numbered ones (1st, 3rd, ...) of each block forward are
// saved, "every second mm" is recomputed (pytorch/torchtitan,
// torchtitan/parallelisms/parallelize_llama.py, _save_list and _custom_policy, commit 9dec370;
// the same rule in torchtitan/distributed/activation_checkpoint.py, SelectiveAC). The matmuls are
// those torchtitan's Llama runs, unfused: wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or the two MLP
// matmuls (GeLU). docs/memory.md, "Per-op selective checkpointing".
#pragma once

#include <array>

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// Per op of the layer table: the share of its forward the policy re-runs in the backward
/// (0 for a saved op, 1 for a recomputed one, in between for a fused GEMM of several matmuls).
[[nodiscard]] std::array<double, kMaxLayerOps> selective_op_recompute_share(
    const LayerTable& table) noexcept;

/// Bytes one layer keeps from its forward to its backward for one micro-batch on one GPU: the
/// block's input (the checkpoint's argument) plus the saved op outputs.
[[nodiscard]] Bytes selective_op_kept_bytes(const LayerTable& table, const ModelSpec& model,
                                            const TrainingSpec& training, Count tp,
                                            bool sequence_parallel) noexcept;

}  // namespace distplan
