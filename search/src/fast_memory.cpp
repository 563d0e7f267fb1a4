// The lean memory path: the planner's per-stage memory terms (planner/src/memory_terms.cpp, the
// same function estimate() calls), evaluated only on the stages that can hold the peak.
#include "distplan/search/fast_memory.h"

#include <algorithm>

#include "distplan/planner/estimate.h"
#include "distplan/planner/fp8.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/memory_terms.h"
#include "distplan/planner/moe_layer.h"

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
  const std::vector<Count> layers = stage_layer_counts(s);
  layers_first_ = layers.front();
  layers_second_ = layers.size() > 1 ? layers[1] : layers.front();
  layers_last_ = layers.back();
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
      act_[sp][static_cast<int>(r)] =
          add_moe_activation(layer_activation(table_, s.model, local, o.tp, sp == 1, r), moe, r);
    }
  }
}

Bytes FastMemory::stage_total(const Layout& l, Count st, Count layer_count) const noexcept {
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
  const StageUnitParams units = stage_unit_params(base_.model, l.tp, l.pp, l.schedule, stage,
                                                  layer_count, vocab_, layer_params_);
  StageMemory sm;
  stage_memory(base_, ml, units, act_[l.sequence_parallel ? 1 : 0][static_cast<int>(l.recompute)],
               stage, vocab_, sm);
  return sm.reserved_bytes;  // what fits compares (= total_bytes under the generic profile)
}

Bytes FastMemory::peak_bytes(const Layout& l) const noexcept {
  // Middle stages differ from stage 1 only by fewer or equal layers (stage_layer_counts gives
  // the extra layers to the middle stages in order) and fewer or equal micro-batches in flight
  // (every schedule's count falls with the stage index), and every term grows with both: the
  // peak is on stage 0, 1 or pp - 1.
  if (bidirectional(l.schedule)) {
    // DualPipe: two model stages of num_layers / pp layers on every stage (stage_layer_counts),
    // the embedding and LM head on both ends.
    const Count k = 2 * (base_.model.num_layers / l.pp);
    Bytes peak = std::max(stage_total(l, 0, k), stage_total(l, l.pp - 1, k));
    if (l.pp > 2) peak = std::max(peak, stage_total(l, 1, k));
    return std::max<Bytes>(0, peak);
  }
  Bytes peak = std::max<Bytes>(0, stage_total(l, 0, layers_first_));
  if (l.pp > 1) {
    peak = std::max(peak, stage_total(l, l.pp - 1, layers_last_));
    if (l.pp > 2) peak = std::max(peak, stage_total(l, 1, layers_second_));
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
  auto stage = [&](Count layers, bool last) {
    return static_cast<double>(layers) * per_layer + (last ? head : 0.0);
  };
  const double m = static_cast<double>(stage_passes(l.schedule, num_microbatches_));
  if (bidirectional(l.schedule)) {
    // Two model stages per stage, the ends with the LM head (and embedding), m/2 whole-stage
    // passes per step (layout.h, stage_passes).
    return m * stage(2 * (base_.model.num_layers / l.pp), true);
  }
  // The LM head sits on head_stage(): the last stage, or stage 0 under a V (layout.h).
  const Count head_st = head_stage(l.schedule, l.pp);
  double bound = m * stage(layers_first_, head_st == 0);
  if (l.pp > 1) {
    const double v = static_cast<double>(l.virtual_stages);
    const bool fill = !steps_overlap(l.schedule);
    // Where a stage's last pass is a whole backward of its first chunk, that gradient goes back
    // through every stage before it (GPipe, 1F1B, interleaved 1F1B; estimate.cpp, time()).
    const bool drain = l.schedule == Schedule::gpipe || l.schedule == Schedule::one_f_one_b ||
                       l.schedule == Schedule::interleaved_1f1b;
    const double backward_per_layer = per_layer - forward_per_layer;
    auto around = [&](double layers_before) {
      return (fill ? layers_before / v * forward_per_layer : 0.0) +
             (drain ? layers_before / v * backward_per_layer : 0.0);
    };
    const double before_last = static_cast<double>(base_.model.num_layers - layers_last_);
    bound = std::max(bound, around(before_last) + m * stage(layers_last_, head_st == l.pp - 1));
    bound = std::max(bound, around(static_cast<double>(layers_first_)) +
                                m * stage(layers_second_, head_st == 1));
  }
  return bound;
}

}  // namespace distplan::search
