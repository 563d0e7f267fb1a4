// The lean memory path: the planner's per-stage memory terms (planner/src/memory_terms.cpp, the
// same function estimate() calls), evaluated only on the stages that can hold the peak.
#include "distplan/search/fast_memory.h"

#include <algorithm>

#include "distplan/planner/estimate.h"
#include "distplan/planner/fp8.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/memory_terms.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/moe_layer.h"

namespace distplan::search {

FastMemory::FastMemory(const Scenario& base)
    : base_(base),
      table_(planner_layer_table(base.model, base.training)),
      mixed_(base.model.moe.enabled() && moe_layer_count(base.model) < base.model.num_layers),
      dense_table_(build_layer_table(base.model, base.training)) {}

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
  l.etp = o.etp;
  apply_layout(s, l);
  vocab_ = padded_vocab(s);
  layer_params_ = planner_layer_params_per_tp_rank(s.model, table_, o.tp);
  expert_params_ = routed_expert_params_per_gpu(s.model, o.ep, o.etp);
  edp_ = s.expert_data_parallel();
  // FP8 caches (planner memory_terms.cpp's memory_layout): a MoE layer's with its experts.
  fp8_state_ = fp8_layer_state_bytes(table_, o.tp, base_.training.fp8, base_.assumptions);
  fp8_dense_state_ = 0;
  if (base_.model.moe.enabled() && base_.training.fp8 != Fp8Recipe::none) {
    const MoeLayerPlan plan =
        moe_layer_plan(s.model, s.assumptions, s.training.precision, o.micro_batch_size,
                       s.local_seq_length(), o.tp, false, o.ep, o.etp, s.training.fp8);
    fp8_state_ = fp8_moe_layer_state_bytes(s.model, table_, plan, o.tp, base_.training.fp8,
                                           base_.assumptions);
    fp8_dense_state_ =
        fp8_layer_state_bytes(dense_table_, o.tp, base_.training.fp8, base_.assumptions);
  }
  num_microbatches_ = s.num_microbatches();
  dense_params_ = layer_parameters_per_tp_rank(dense_table_, o.tp);
  even_mix_ = stage_layer_mix(s);
  mix_cache_.clear();
  // The planner's op costs, as estimate.cpp computes them for this (tp, micro-batch).
  const DeviceRates rates = device_rates(s);
  // One context-parallel rank's tokens (the planner's local training, estimate.cpp).
  TrainingSpec local = s.training;
  local.seq_length = s.local_seq_length();
  for (int sp = 0; sp < 2; ++sp) {
    layer_[sp] = layer_pass_costs(table_, s.model, s.training, o.tp, sp == 1, rates, o.cp);
    dense_layer_[sp] =
        mixed_ ? layer_pass_costs(dense_table_, s.model, s.training, o.tp, sp == 1, rates, o.cp)
               : PassCosts{};
    head_[sp] = head_pass_costs(s.model, local, vocab_, o.tp, sp == 1, rates);
  }
  for (int sp = 0; sp < 2; ++sp) {
    const MoeLayerPlan moe =
        moe_layer_plan(s.model, s.assumptions, s.training.precision, o.micro_batch_size,
                       local.seq_length, o.tp, sp == 1, o.ep, o.etp, s.training.fp8);
    routed_[sp] = moe_pass_costs(s.model, moe, rates);
    for (Recompute r :
         {Recompute::none, Recompute::selective, Recompute::full, Recompute::selective_op}) {
      act_[sp][static_cast<int>(r)] =
          add_moe_activation(layer_activation(table_, s.model, local, o.tp, sp == 1, r), moe, r);
      dense_act_[sp][static_cast<int>(r)] =
          layer_activation(dense_table_, s.model, local, o.tp, sp == 1, r);
    }
  }
}

const std::vector<StageLayerMix>& FastMemory::mix(const Layout& l) const {
  // Outside DualPipe, one kind of layer or one chunk per stage: the split of this pp.
  if (!bidirectional(l.schedule) && (!mixed_ || l.virtual_stages == 1)) return even_mix_;
  for (const MixEntry& e : mix_cache_) {
    if (e.schedule == l.schedule && e.virtual_stages == l.virtual_stages) return e.mix;
  }
  Scenario s = base_;
  apply_layout(s, l);
  mix_cache_.push_back({l.schedule, l.virtual_stages, stage_layer_mix(s)});
  return mix_cache_.back().mix;
}

Bytes FastMemory::stage_total(const Layout& l, Count st,
                              const StageLayerMix& layer_mix) const noexcept {
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
  ml.fp8_dense_layer_state = fp8_dense_state_;
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
    ml.etp = l.etp;
    ml.edp = edp_;
    ml.expert_params = expert_params_;
  }
  const int stage = static_cast<int>(st);
  const StageUnitParams units = stage_unit_params(base_.model, l.tp, l.pp, l.schedule, stage,
                                                  layer_mix, vocab_, layer_params_, dense_params_);
  const int sp = l.sequence_parallel ? 1 : 0;
  const int r = static_cast<int>(l.recompute);
  StageMemory sm;
  stage_memory(base_, ml, units, act_[sp][r], dense_act_[sp][r], stage, vocab_, sm);
  return sm.reserved_bytes;  // what fits compares (= total_bytes under the generic profile)
}

Bytes FastMemory::peak_bytes(const Layout& l) const noexcept {
  const std::vector<StageLayerMix>& mx = mix(l);
  auto at = [&](Count st) { return stage_total(l, st, mx[static_cast<std::size_t>(st)]); };
  if (mixed_) {
    // Layers of two kinds: a middle stage may hold more MoE layers than stage 1. Each middle
    // stage whose mix differs from the one before it is evaluated (a run of equal mixes peaks at
    // its first stage, which holds the most micro-batches in flight).
    Bytes peak = std::max<Bytes>(0, at(0));
    if (l.pp > 1) peak = std::max(peak, at(l.pp - 1));
    for (Count st = 1; st < l.pp - 1; ++st) {
      if (st == 1 || !(mx[static_cast<std::size_t>(st)] == mx[static_cast<std::size_t>(st - 1)]))
        peak = std::max(peak, at(st));
    }
    return peak;
  }
  // Middle stages differ from stage 1 only by fewer or equal layers (stage_layer_counts gives
  // the extra layers to the middle stages in order) and fewer or equal micro-batches in flight
  // (every schedule's count falls with the stage index), and every term grows with both: the
  // peak is on stage 0, 1 or pp - 1. DualPipe: two model stages of num_layers / pp layers on
  // every stage, the embedding and LM head on both ends.
  Bytes peak = std::max<Bytes>(0, at(0));
  if (l.pp > 1) {
    peak = std::max(peak, at(l.pp - 1));
    if (l.pp > 2) peak = std::max(peak, at(1));
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
  const PassCosts& d = dense_layer_[sp];  // a MoE model's dense-MLP layers
  double per_dense = d.forward + d.backward_input + d.backward_weight;
  if (l.recompute == Recompute::full) per_dense += d.forward;
  if (l.recompute == Recompute::selective) per_dense += d.selective_recompute;
  if (l.recompute == Recompute::selective_op) per_dense += d.selective_op_recompute;
  const double head = head_[sp].forward + head_[sp].backward_input + head_[sp].backward_weight;
  const std::vector<StageLayerMix>& mx = mix(l);
  // A MoE model's stage: its MoE layers at per_layer, the others at per_dense.
  auto moe_of = [&](const StageLayerMix& x) { return mixed_ ? x.moe_layers : x.layers; };
  auto stage = [&](const StageLayerMix& x, bool last) {
    const Count moe = moe_of(x);
    return static_cast<double>(moe) * per_layer + static_cast<double>(x.layers - moe) * per_dense +
           (last ? head : 0.0);
  };
  auto forward_of = [&](const StageLayerMix& x) {
    const Count moe = moe_of(x);
    return static_cast<double>(moe) * forward_per_layer +
           static_cast<double>(x.layers - moe) * d.forward;
  };
  const double m = static_cast<double>(stage_passes(l.schedule, num_microbatches_));
  if (bidirectional(l.schedule)) {
    // Two model stages per stage, the ends with the LM head (and embedding), m/2 whole-stage
    // passes per step (layout.h, stage_passes).
    double busiest = 0;
    for (const StageLayerMix& x : mx) busiest = std::max(busiest, stage(x, true));
    return m * busiest;
  }
  // The LM head sits on head_stage(): the last stage, or stage 0 under a V (layout.h).
  const Count head_st = head_stage(l.schedule, l.pp);
  double bound = m * stage(mx[0], head_st == 0);
  if (l.pp > 1) {
    const double v = static_cast<double>(l.virtual_stages);
    const bool fill = !steps_overlap(l.schedule);
    // Where a stage's last pass is a whole backward of its first chunk, that gradient goes back
    // through every stage before it (GPipe, 1F1B, interleaved 1F1B; estimate.cpp, time()).
    const bool drain = l.schedule == Schedule::gpipe || l.schedule == Schedule::one_f_one_b ||
                       l.schedule == Schedule::interleaved_1f1b;
    // The fill and drain through the stages before `st`: their layers' forward and backward.
    auto around = [&](Count st) {
      double fwd = 0, all = 0;
      for (Count i = 0; i < st; ++i) {
        fwd += forward_of(mx[static_cast<std::size_t>(i)]);
        all += stage(mx[static_cast<std::size_t>(i)], false);
      }
      return (fill ? fwd / v : 0.0) + (drain ? (all - fwd) / v : 0.0);
    };
    // Without mixed layers stages 1 and pp - 1 bound the others (peak_bytes); with them, every
    // stage is a candidate.
    for (Count st = 1; st < l.pp; ++st) {
      if (!mixed_ && st != 1 && st != l.pp - 1) continue;
      bound =
          std::max(bound, around(st) + m * stage(mx[static_cast<std::size_t>(st)], head_st == st));
    }
  }
  return bound;
}

}  // namespace distplan::search
