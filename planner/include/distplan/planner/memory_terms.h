// Memory per GPU of one pipeline stage, term by term (docs/memory.md). Written once here and used
// by the planner's estimate() and by the search's lean path (search/src/fast_memory.cpp), so a
// new term reaches both. Everything is per GPU; parameter counts are per TP rank.
#pragma once

#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// The layout figures the memory terms depend on.
struct MemoryLayout {
  Count tp = 1;
  Count pp = 1;
  Count virtual_stages = 1;
  Count micro_batch_size = 1;
  Count num_microbatches = 1;  // per pipeline per step
  int zero_stage = 0;
  Count shard = 1;  // ZeRO shard group size S (fsdp_shard_size, default dp); 1 at ZeRO-0
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  Schedule schedule = Schedule::one_f_one_b;
};
[[nodiscard]] MemoryLayout memory_layout(const Scenario& s) noexcept;

/// Optimizer bytes per parameter, the ZeRO paper's K (Rajbhandari et al. 2020, sec. 3.1).
[[nodiscard]] Bytes optimizer_bytes_per_param(const TrainingSpec& t) noexcept;

/// Parameters per TP rank of the units one stage holds (docs/memory.md, "Units"); a unit that the
/// stage does not hold has count 0.
struct StageUnitParams {
  Count layer = 0, layers = 0;          // one layer's parameters, and the stage's layer count
  Count embedding = 0, embeddings = 0;  // stage 0
  Count head = 0, heads = 0;            // final norm and LM head, last stage
  [[nodiscard]] Count total() const noexcept {
    return layer * layers + embedding * embeddings + head * heads;
  }
};
[[nodiscard]] StageUnitParams stage_unit_params(const ModelSpec& m, Count tp, Count pp, int stage,
                                                Count layers, Count padded_vocab,
                                                Count layer_params_per_tp_rank) noexcept;

/// Everything of StageMemory but the layer range (first_layer, end_layer), for one GPU of
/// `stage`. `act` is layer_activation() for the layout's tp, sequence parallelism and recompute
/// (and the training's micro-batch size).
[[nodiscard]] StageMemory stage_memory(const Scenario& base, const MemoryLayout& l,
                                       const StageUnitParams& units, const LayerActivation& act,
                                       int stage, Count padded_vocab) noexcept;

}  // namespace distplan
