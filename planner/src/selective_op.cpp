// Per-op selective activation checkpointing (selective_op.h; docs/memory.md).
#include "distplan/planner/selective_op.h"

namespace distplan {
namespace {

// The matmuls one fused linear of the table stands for, as output widths (unsharded), in the
// order torchtitan's Llama calls them: qkv is wq, wk, wv; SwiGLU's mlp_in is w1 (gate), w3 (up).
struct Matmuls {
  std::array<Count, 3> out{};
  int n = 0;
};

// The table's shape: the query width (the attention core's saved q) and whether the MLP is gated.
struct Shape {
  Count q_width = 0;
  bool gated = false;
};

Shape shape_of(const LayerTable& table) noexcept {
  Shape s;
  for (const LayerOp& op : table) {
    if (op.kind == OpKind::activation) s.gated = op.name != "gelu";
    if (op.kind != OpKind::attention_core) continue;
    for (int j = 0; j < op.num_saved; ++j) {
      if (op.saved[j].name == "q") s.q_width = op.saved[j].per_token;
    }
  }
  return s;
}

Matmuls matmuls_of(const LayerOp& op, const Shape& s) noexcept {
  Matmuls mm;
  if (op.name == "qkv") {
    const Count kv = (op.out_features - s.q_width) / 2;
    mm.out = {s.q_width, kv, kv};
    mm.n = 3;
  } else if (op.name == "mlp_in" && s.gated) {
    mm.out = {op.out_features / 2, op.out_features / 2, 0};
    mm.n = 2;
  } else {
    mm.out = {op.out_features, 0, 0};
    mm.n = 1;
  }
  return mm;
}

// torchtitan counts the block's matmuls from 1 and saves those with an odd count.
constexpr bool saved_matmul(int count) noexcept {
  return count % 2 == 1;
}

}  // namespace

std::array<double, kMaxLayerOps> selective_op_recompute_share(const LayerTable& table) noexcept {
  const Shape shape = shape_of(table);
  std::array<double, kMaxLayerOps> share{};
  int count = 0;
  for (int i = 0; i < table.num_ops; ++i) {
    const LayerOp& op = table.ops[i];
    switch (op.kind) {
      case OpKind::linear: {
        const Matmuls mm = matmuls_of(op, shape);
        Count recomputed = 0;
        for (int j = 0; j < mm.n; ++j) {
          if (!saved_matmul(++count)) recomputed += mm.out[j];
        }
        share[i] = static_cast<double>(recomputed) / static_cast<double>(op.out_features);
        break;
      }
      case OpKind::attention_core: {
        // The flash and memory-efficient SDPA kernels are saved. Standard attention is SDPA's
        // math path (its bmm and softmax are not on the list): recomputed.
        bool flash = false;
        for (int j = 0; j < op.num_saved; ++j) flash |= op.saved[j].name == "logsumexp";
        share[i] = flash ? 0.0 : 1.0;
        break;
      }
      default:
        share[i] = 1.0;  // norms, activations, dropout, residual adds, rotary: recomputed
        break;
    }
  }
  return share;
}

Bytes selective_op_kept_bytes(const LayerTable& table, const ModelSpec& model,
                              const TrainingSpec& training, Count tp,
                              bool sequence_parallel) noexcept {
  const Count tokens = training.micro_batch_size * training.seq_length;
  const Bytes act = bytes_of(training.precision);
  const Count h = model.hidden_size;
  // The block input, which the non-reentrant checkpoint keeps (split along the sequence under SP).
  Bytes kept = tokens * h * act / (sequence_parallel ? tp : 1);
  const Shape shape = shape_of(table);
  int count = 0;
  for (const LayerOp& op : table) {
    if (op.kind == OpKind::linear) {
      const Matmuls mm = matmuls_of(op, shape);
      for (int j = 0; j < mm.n; ++j) {
        if (!saved_matmul(++count)) continue;
        // A column-parallel matmul's output is split t ways; a row-parallel one's local matmul
        // writes the full-width partial sum before the reduction.
        const Count width = op.linear == LinearKind::row_parallel ? mm.out[j] : mm.out[j] / tp;
        kept += tokens * width * act;
      }
      // Under sequence parallelism the row-parallel output is reduce-scattered, and
      // reduce_scatter_tensor is on the save list whatever the matmul count.
      if (op.linear == LinearKind::row_parallel && sequence_parallel && tp > 1) {
        kept += tokens * h / tp * act;
      }
    } else if (op.kind == OpKind::attention_core) {
      for (int j = 0; j < op.num_saved; ++j) {
        if (op.saved[j].name != "logsumexp") continue;
        // Flash SDPA's outputs: the attention output (q width) and its fp32 log-sum-exp.
        kept += tokens * shape.q_width / tp * act;
        kept += tokens * op.saved[j].per_token / tp * op.saved[j].bytes_per_element;
      }
    }
  }
  return kept;
}

}  // namespace distplan
