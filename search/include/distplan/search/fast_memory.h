// The search's lean memory path: the peak bytes per GPU of a layout, exactly as the planner's
// estimate() computes them, without building an Estimate. It calls the planner's per-stage
// memory terms (memory_terms.h, the function estimate() uses) and evaluates only the
// stages that can hold the peak: the first, the second and the last (docs/search.md, "Speed").
// A layout that does not fit needs nothing more; one that fits is estimated in full.
// tests/search/fast_memory_test.cpp checks equality with estimate() over whole spaces.
#pragma once

#include <vector>

#include "distplan/planner/layout.h"

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/op_costs.h"
#include "distplan/planner/spec.h"
#include "distplan/search/space.h"

namespace distplan::search {

class FastMemory {
 public:
  explicit FastMemory(const Scenario& base);

  /// Precomputes what depends on (tp, pp, dp, micro-batch) only.
  void set_outer(const Outer& o);
  /// Peak bytes per GPU of a layout whose outer part is the last set_outer().
  [[nodiscard]] Bytes peak_bytes(const Layout& l) const noexcept;
  [[nodiscard]] Bytes capacity_bytes() const noexcept { return base_.cluster.gpu.memory_bytes; }
  /// A lower bound of the walked step (sim::plan): m micro-batches through a stage's op costs
  /// (the planner's own), after the first micro-batch's forward through the stages before it
  /// where steps do not overlap; every communication and optimizer term left out
  /// (docs/search.md, "Ranking by the walk"). tests/search checks it is a bound.
  [[nodiscard]] Seconds step_lower_bound(const Layout& l) const noexcept;

 private:
  [[nodiscard]] Bytes stage_total(const Layout& l, Count stage,
                                  const StageLayerMix& mix) const noexcept;
  // The stages' layer mix (planner layout.h) for this layout: pp's even split, or, for a MoE
  // model whose layers are of two kinds, the placement of the layout's schedule and chunks
  // (computed once per schedule and virtual-stage count of the outer combination).
  [[nodiscard]] const std::vector<StageLayerMix>& mix(const Layout& l) const;

  Scenario base_;
  LayerTable table_;
  Outer outer_{};
  Count vocab_ = 0;         // padded for this tp
  Count layer_params_ = 0;  // per TP rank
  Count num_microbatches_ = 0;
  std::vector<StageLayerMix> even_mix_;  // stage_layer_mix at one chunk per stage (1F1B)
  bool mixed_ = false;                   // a MoE model with dense-MLP layers too
  struct MixEntry {
    Schedule schedule;
    Count virtual_stages;
    std::vector<StageLayerMix> mix;
  };
  mutable std::vector<MixEntry> mix_cache_;  // this outer combination's, per (schedule, v)
  Bytes fp8_state_ = 0;             // one layer's fp8 weight copies and scales (planner fp8.h)
  Bytes fp8_dense_state_ = 0;       // a MoE model's dense-MLP layer's
  LayerActivation act_[2][4] = {};  // [sequence parallel][recompute], per layer per micro-batch
  LayerActivation dense_act_[2][4] = {};  // the same for a MoE model's dense-MLP layers
  Count dense_params_ = 0;                // per TP rank, a MoE model's dense-MLP layer
  LayerTable dense_table_;
  PassCosts dense_layer_[2] = {};
  // The planner's op costs (op_costs.h) of one micro-batch on one GPU, [sequence parallel]:
  // one layer, and the last stage's norm, LM head and loss.
  PassCosts layer_[2] = {};
  PassCosts head_[2] = {};
  // MoE (planner moe_layer.h): one layer's routed experts per GPU at this ep, and the routed
  // part's op costs, [sequence parallel]; 0 for a dense model.
  Count expert_params_ = 0;
  Count edp_ = 1;
  PassCosts routed_[2] = {};
};

}  // namespace distplan::search
