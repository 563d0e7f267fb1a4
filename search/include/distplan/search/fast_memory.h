// The search's lean memory path: the peak bytes per GPU of a layout, exactly as the planner's
// estimate() computes them, without building an Estimate. It calls the planner's per-stage
// memory terms (memory_terms.h, the function estimate() uses) and evaluates only the
// stages that can hold the peak: the first, the second and the last, every stage where a MoE
// model's layer kinds change, or every stage when the split gives a stage's chunks unequal layers
// or layer kinds (docs/search.md, "Speed").
// A layout that does not fit needs nothing more; one that fits is estimated in full.
// tests/search/fast_memory_test.cpp checks equality with estimate() over whole spaces.
#pragma once

#include <vector>

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
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
  // The layout's layers per stage and chunk (pipeline_split.h), for this outer's pp, and their
  // kinds (layout.h: a MoE model's MoE and dense-MLP layers, windowed attention).
  struct Split {
    Schedule schedule = Schedule::one_f_one_b;  // its placement: interleaved, V or DualPipe
    Count v = 1;
    SplitChoice choice = SplitChoice::even;
    std::vector<std::vector<Count>> chunks;        // [stage][chunk], layers of both kinds
    std::vector<std::vector<Count>> dense_chunks;  // [stage][chunk], a MoE model's dense-MLP
    std::vector<std::vector<LayerKinds>> kinds;    // [stage][chunk]
    std::vector<StageLayerMix> mix;                // [stage]
    std::vector<Count> stage_layers;               // [stage]
    bool uneven_chunks = false;  // some stage's chunks differ in layers or layer kinds
  };
  [[nodiscard]] const Split& split_of(const Layout& l) const;
  [[nodiscard]] Bytes stage_total(const Layout& l, Count stage, const Split& split) const noexcept;

  Scenario base_;
  LayerTable table_;
  LayerTable dense_table_;  // a MoE model's dense-MLP layer (planner build_layer_table)
  bool mixed_ = false;      // a MoE model with dense-MLP layers too
  Outer outer_{};
  Count vocab_ = 0;         // padded for this tp
  Count layer_params_ = 0;  // per TP rank
  Count dense_params_ = 0;  // per TP rank, a MoE model's dense-MLP layer
  Count num_microbatches_ = 0;
  mutable std::vector<Split> splits_;  // the splits seen since set_outer()
  Bytes fp8_state_ = 0;                // one layer's fp8 weight copies and scales (planner fp8.h)
  Bytes fp8_dense_state_ = 0;          // a MoE model's dense-MLP layer's
  LayerActivation act_[2][4] = {};     // [sequence parallel][recompute], per layer per micro-batch
  LayerActivation dense_act_[2][4] = {};  // the same for a MoE model's dense-MLP layers
  // The planner's op costs (op_costs.h) of one micro-batch on one GPU, [sequence parallel]:
  // one layer, a MoE model's dense-MLP layer, a windowed layer less a full-attention one, and
  // the last stage's norm, LM head and loss.
  PassCosts layer_[2] = {};
  PassCosts dense_layer_[2] = {};
  PassCosts window_delta_[2] = {};
  PassCosts head_[2] = {};
  // MoE (planner moe_layer.h): one layer's routed experts per GPU at this ep, and the routed
  // part's op costs, [sequence parallel]; 0 for a dense model.
  Count expert_params_ = 0;
  Count edp_ = 1;
  PassCosts routed_[2] = {};
};

}  // namespace distplan::search
