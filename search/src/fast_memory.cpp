// The lean memory path: the planner's per-stage memory terms (planner/src/memory_terms.cpp, the
// same function estimate() calls), evaluated only on the stages that can hold the peak.
#include "distplan/search/fast_memory.h"

#include <algorithm>
#include <limits>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/fp8.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/memory_terms.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan::search {

FastMemory::FastMemory(const Scenario& base)
    : base_(base), table_(planner_layer_table(base.model, base.training)) {}

void FastMemory::set_outer(const Outer& o) {
  outer_ = o;
  Scenario s = base_;
  Layout l;
  l.tp = o.tp;
  l.pp = o.pp;
  l.dp = o.dp;
  l.micro_batch_size = o.micro_batch_size;
  l.cp = o.cp;
  l.ep = o.ep;
  apply_layout(s, l);
  vocab_ = padded_vocab(s);
  layer_params_ = planner_layer_params_per_tp_rank(s.model, table_, o.tp);
  expert_params_ = routed_expert_params_per_gpu(s.model, o.ep, 1);
  edp_ = s.expert_data_parallel();
  fp8_state_ = fp8_layer_state_bytes(table_, o.tp, base_.training.fp8, base_.assumptions);
  num_microbatches_ = s.num_microbatches();
  splits_.clear();
  // The planner's op costs, as estimate.cpp computes them for this (tp, micro-batch).
  const DeviceRates rates = device_rates(s);
  // One context-parallel rank's tokens (the planner's local training, estimate.cpp).
  TrainingSpec local = s.training;
  local.seq_length = s.local_seq_length();
  for (int sp = 0; sp < 2; ++sp) {
    layer_[sp] = layer_pass_costs(table_, s.model, s.training, o.tp, sp == 1, rates, o.cp);
    head_[sp] = head_pass_costs(s.model, local, vocab_, o.tp, sp == 1, rates);
  }
  for (int sp = 0; sp < 2; ++sp) {
    const MoeLayerPlan moe =
        moe_layer_plan(s.model, s.assumptions, s.training.precision, o.micro_batch_size,
                       local.seq_length, o.tp, sp == 1, o.ep, 1);
    routed_[sp] = moe_pass_costs(s.model, moe, rates);
    for (Recompute r :
         {Recompute::none, Recompute::selective, Recompute::full, Recompute::selective_op}) {
      act_[sp][static_cast<int>(r)] = add_cp_activation(
          add_moe_activation(layer_activation(table_, s.model, local, o.tp, sp == 1, r), moe, r),
          s.model, o.cp, s.parallel.cp_comm, o.micro_batch_size * local.seq_length, o.tp,
          bytes_of(s.training.precision), r);
    }
  }
}

const FastMemory::Split& FastMemory::split_of(const Layout& l) const {
  // Placement classes: the layers per virtual stage depend on the path's length, the chunks'
  // places on the placement.
  const Schedule kind = bidirectional(l.schedule) ? Schedule::dualpipe
                        : v_shape(l.schedule)     ? Schedule::zb_v
                                                  : Schedule::interleaved_1f1b;
  for (const Split& x : splits_)
    if (x.schedule == kind && x.v == l.virtual_stages && x.choice == l.split) return x;
  Split x;
  x.schedule = kind;
  x.v = l.virtual_stages;
  x.choice = l.split;
  const Count pp = outer_.pp, L = base_.model.num_layers;
  const Count path = path_length(kind, pp, x.v);
  // The counts apply_layout's split gives (space.cpp): even, or torchtitan's with weights 1, 1
  // (Megatron's account-for flags give the same where they apply).
  const std::vector<Count> per_vs = l.split == SplitChoice::even
                                        ? even_split(L, path)
                                        : torchtitan_split(L, path, 1, 1, "/parallel");
  x.chunks.resize(static_cast<std::size_t>(pp));
  x.stage_layers.resize(static_cast<std::size_t>(pp));
  for (Count st = 0; st < pp; ++st) {
    auto& c = x.chunks[static_cast<std::size_t>(st)];
    for (Count k = 0; k < x.v; ++k) {
      c.push_back(per_vs[static_cast<std::size_t>(chunk_virtual_stage(kind, pp, st, k))]);
      x.stage_layers[static_cast<std::size_t>(st)] += c.back();
    }
    x.uneven_chunks =
        x.uneven_chunks || std::adjacent_find(c.begin(), c.end(), std::not_equal_to<>()) != c.end();
  }
  splits_.push_back(std::move(x));
  return splits_.back();
}

Bytes FastMemory::stage_total(const Layout& l, Count st, const Split& split) const noexcept {
  MemoryLayout ml;
  ml.tp = l.tp;
  ml.pp = l.pp;
  ml.virtual_stages = l.virtual_stages;
  ml.micro_batch_size = l.micro_batch_size;
  ml.num_microbatches = num_microbatches_;
  ml.zero_stage = l.zero_stage;
  ml.shard = l.zero_stage == 0 ? 1 : (l.fsdp_shard_size > 0 ? l.fsdp_shard_size : l.dp) * l.cp;
  ml.dp = l.dp;
  ml.cp = l.cp;
  ml.fp8_layer_state = fp8_state_;
  ml.cp_comm = base_.parallel.cp_comm;
  ml.sequence_parallel = l.sequence_parallel;
  ml.recompute = l.recompute;
  // zb_auto with the default limit: an upper bound of estimate()'s (search.cpp estimates it).
  ml.zb_memory_limit = l.pp;
  ml.schedule = l.schedule;
  ml.offload_optimizer = base_.parallel.offload_optimizer;  // the search keeps the base's offload
  ml.offload_params = base_.parallel.offload_params;
  if (expert_params_ > 0) {
    ml.ep = l.ep;
    ml.edp = edp_;
    ml.expert_params = expert_params_;
  }
  const int stage = static_cast<int>(st);
  StageUnitParams units =
      stage_unit_params(base_.model, l.tp, l.pp, l.schedule, stage,
                        split.stage_layers[static_cast<std::size_t>(st)], vocab_, layer_params_);
  units.chunk_layers = split.chunks[static_cast<std::size_t>(st)];
  // The stage's first layer (fine-tuning's frozen_layers, which needs virtual_stages = 1).
  if (l.virtual_stages == 1) {
    for (Count i = 0; i < st; ++i) units.first_layer += split.stage_layers[static_cast<std::size_t>(i)];
  }
  StageMemory sm;
  try {
    stage_memory(base_, ml, units, act_[l.sequence_parallel ? 1 : 0][static_cast<int>(l.recompute)],
                 stage, vocab_, sm);
  } catch (const InputError&) {
    // Past 2^63 - 1 bytes (checked.h): no GPU holds it, and validation refuses the layout.
    return std::numeric_limits<Bytes>::max();
  }
  return sm.reserved_bytes;  // what fits compares (= total_bytes under the generic profile)
}

Bytes FastMemory::peak_bytes(const Layout& l) const noexcept {
  const Split& split = split_of(l);
  Bytes peak = std::max<Bytes>(0, stage_total(l, 0, split));
  if (split.uneven_chunks) {
    // Chunks of unequal layers: which stage peaks depends on the schedule's order; every stage.
    for (Count st = 1; st < l.pp; ++st) peak = std::max(peak, stage_total(l, st, split));
    return peak;
  }
  // Middle stages differ from stage 1 only by fewer or equal layers (both rules give the extra
  // layers to the first middle stages) and fewer or equal micro-batches in flight (every
  // schedule's count falls with the stage index), and every term grows with both: the peak is
  // on stage 0, 1 or pp - 1. DualPipe: the embedding and LM head on both ends.
  if (l.pp > 1) {
    peak = std::max(peak, stage_total(l, l.pp - 1, split));
    if (l.pp > 2) peak = std::max(peak, stage_total(l, 1, split));
  }
  return peak;
}

Seconds FastMemory::step_lower_bound(const Layout& l) const noexcept {
  // A lower bound of the walked step (docs/search.md, "Ranking by the walk"). Per micro-batch on
  // one GPU of a stage: its layers' forward, backward and recomputation op costs (the planner's
  // own), plus the norm, LM head and loss on the last stage. The walk's passes add TP, CP and EP
  // communication and blocking sends to these, and an F&B pair hides only communication, so each
  // stage's compute stream is busy at least m times this; and unless steps overlap, a stage
  // starts no earlier than the first micro-batch's forward through the chunks before it.
  const int sp = l.sequence_parallel ? 1 : 0;
  const PassCosts& c = layer_[sp];
  const PassCosts& x = routed_[sp];  // MoE: the routed part (zero for a dense model)
  double per_layer = c.forward + c.backward_input + c.backward_weight + x.forward +
                     x.backward_input + x.backward_weight;
  if (l.recompute == Recompute::full) per_layer += c.forward + x.forward;
  if (l.recompute == Recompute::selective) per_layer += c.selective_recompute;
  if (l.recompute == Recompute::selective_op) per_layer += c.selective_op_recompute;
  const double forward_per_layer = c.forward + x.forward;
  const double head = head_[sp].forward + head_[sp].backward_input + head_[sp].backward_weight;
  // Every stage of the layout's split: its layers, and the LM head where it sits (both ends under
  // DualPipe, stage 0 under a V), m whole-stage passes (m/2 under DualPipe, layout.h).
  const Split& split = split_of(l);
  const double m = static_cast<double>(stage_passes(l.schedule, num_microbatches_));
  const bool fill = l.pp > 1 && !steps_overlap(l.schedule) && !bidirectional(l.schedule);
  // Where a stage's last pass is a whole backward of its first chunk, that gradient goes back
  // through every stage before it (GPipe, 1F1B, interleaved 1F1B; estimate.cpp, time()).
  const bool drain = l.schedule == Schedule::gpipe || l.schedule == Schedule::one_f_one_b ||
                     l.schedule == Schedule::interleaved_1f1b;
  const double backward_per_layer = per_layer - forward_per_layer;
  double bound = 0, before = 0;  // before: the first chunks' layers of the stages before st
  for (Count st = 0; st < l.pp; ++st) {
    const auto i = static_cast<std::size_t>(st);
    const double busy = static_cast<double>(split.stage_layers[i]) * per_layer +
                        (holds_head(l.schedule, l.pp, st) ? head : 0.0);
    const double around = (fill ? before * forward_per_layer : 0.0) +
                          (fill && drain ? before * backward_per_layer : 0.0);
    bound = std::max(bound, around + m * busy);
    before += static_cast<double>(split.chunks[i].front());
  }
  return bound;
}

}  // namespace distplan::search
