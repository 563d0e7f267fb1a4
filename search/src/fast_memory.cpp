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
#include "distplan/planner/moe.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan::search {

FastMemory::FastMemory(const Scenario& base)
    : base_(base),
      table_(planner_layer_table(base.model, base.training)),
      dense_table_(build_layer_table(base.model, base.training)),
      mixed_(base.model.moe.enabled() && moe_layer_count(base.model) < base.model.num_layers) {}

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
  splits_.clear();
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
    window_delta_[sp] = PassCosts{};
    if (s.model.attention_window.enabled()) {
      // estimate.cpp's window_delta: a windowed layer's costs less a full-attention layer's.
      const PassCosts w =
          layer_pass_costs(table_, s.model, s.training, o.tp, sp == 1, rates, o.cp, true);
      PassCosts& d = window_delta_[sp];
      d.forward = w.forward - layer_[sp].forward;
      d.backward_input = w.backward_input - layer_[sp].backward_input;
      d.backward_weight = w.backward_weight - layer_[sp].backward_weight;
      d.selective_recompute = w.selective_recompute - layer_[sp].selective_recompute;
      d.selective_op_recompute = w.selective_op_recompute - layer_[sp].selective_op_recompute;
    }
    head_[sp] = head_pass_costs(s.model, local, vocab_, o.tp, sp == 1, rates);
  }
  for (int sp = 0; sp < 2; ++sp) {
    const MoeLayerPlan moe =
        moe_layer_plan(s.model, s.assumptions, s.training.precision, o.micro_batch_size,
                       local.seq_length, o.tp, sp == 1, o.ep, o.etp, s.training.fp8);
    routed_[sp] = moe_pass_costs(s.model, moe, rates);
    for (Recompute r :
         {Recompute::none, Recompute::selective, Recompute::full, Recompute::selective_op}) {
      act_[sp][static_cast<int>(r)] = add_cp_activation(
          add_moe_activation(layer_activation(table_, s.model, local, o.tp, sp == 1, r), moe, r),
          s.model, o.cp, s.parallel.cp_comm, o.micro_batch_size * local.seq_length, o.tp,
          bytes_of(s.training.precision), r);
      dense_act_[sp][static_cast<int>(r)] = add_cp_activation(
          layer_activation(dense_table_, s.model, local, o.tp, sp == 1, r), s.model, o.cp,
          s.parallel.cp_comm, o.micro_batch_size * local.seq_length, o.tp,
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
  // Virtual stage i holds layers first[i] .. first[i] + per_vs[i] - 1 (path order).
  std::vector<Count> first(per_vs.size(), 0);
  for (std::size_t i = 1; i < per_vs.size(); ++i) first[i] = first[i - 1] + per_vs[i - 1];
  const bool moe = base_.model.moe.enabled();
  auto differ = [](const std::vector<Count>& c) {
    return std::adjacent_find(c.begin(), c.end(), std::not_equal_to<>()) != c.end();
  };
  x.chunks.resize(static_cast<std::size_t>(pp));
  x.dense_chunks.resize(static_cast<std::size_t>(pp));
  x.kinds.resize(static_cast<std::size_t>(pp));
  x.stage_layers.resize(static_cast<std::size_t>(pp));
  for (Count st = 0; st < pp; ++st) {
    const auto i = static_cast<std::size_t>(st);
    auto& c = x.chunks[i];
    for (Count k = 0; k < x.v; ++k) {
      const auto vs = static_cast<std::size_t>(chunk_virtual_stage(kind, pp, st, k));
      // The chunk's layers as layer_kinds counts them (the MTP modules' with the last layer).
      x.kinds[i].push_back(layer_kinds(base_.model, first[vs], first[vs] + per_vs[vs]));
      c.push_back(x.kinds[i].back().layers);
      x.dense_chunks[i].push_back(x.kinds[i].back().dense_layers(moe));
      x.stage_layers[i] += c.back();
    }
    x.uneven_chunks = x.uneven_chunks || differ(c) || differ(x.dense_chunks[i]);
  }
  x.mix = stage_layer_mix(base_.model, x.kinds);
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
  const auto i = static_cast<std::size_t>(st);
  StageUnitParams units = stage_unit_params(base_.model, l.tp, l.pp, l.schedule, stage,
                                            split.mix[i], vocab_, layer_params_, dense_params_);
  units.chunk_layers = split.chunks[i];
  if (units.dense_layers > 0) units.chunk_dense_layers = split.dense_chunks[i];
  // The stage's first layer (fine-tuning's frozen_layers, which needs virtual_stages = 1).
  if (l.virtual_stages == 1) {
    for (Count i = 0; i < st; ++i)
      units.first_layer += split.stage_layers[static_cast<std::size_t>(i)];
  }
  const int sp = l.sequence_parallel ? 1 : 0;
  const int r = static_cast<int>(l.recompute);
  StageMemory sm;
  try {
    stage_memory(base_, ml, units, act_[sp][r], dense_act_[sp][r], stage, vocab_, sm);
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
    // Chunks of unequal layers or kinds: which stage peaks depends on the schedule's order;
    // every stage.
    for (Count st = 1; st < l.pp; ++st) peak = std::max(peak, stage_total(l, st, split));
    return peak;
  }
  if (mixed_) {
    // Layers of two kinds: a middle stage may hold more MoE layers than stage 1. Each middle
    // stage whose chunks differ from the ones before it is evaluated (a run of equal stages
    // peaks at its first, which holds the most micro-batches in flight).
    if (l.pp > 1) peak = std::max(peak, stage_total(l, l.pp - 1, split));
    for (Count st = 1; st < l.pp - 1; ++st) {
      const auto i = static_cast<std::size_t>(st);
      if (st == 1 || split.chunks[i] != split.chunks[i - 1] ||
          split.dense_chunks[i] != split.dense_chunks[i - 1])
        peak = std::max(peak, stage_total(l, st, split));
    }
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
  const PassCosts& d = dense_layer_[sp];  // a MoE model's dense-MLP layers
  double per_dense = d.forward + d.backward_input + d.backward_weight;
  if (l.recompute == Recompute::full) per_dense += d.forward;
  if (l.recompute == Recompute::selective) per_dense += d.selective_recompute;
  if (l.recompute == Recompute::selective_op) per_dense += d.selective_op_recompute;
  const PassCosts& w = window_delta_[sp];  // a windowed layer less a full-attention one
  double per_window = w.forward + w.backward_input + w.backward_weight;
  if (l.recompute == Recompute::full) per_window += w.forward;
  if (l.recompute == Recompute::selective) per_window += w.selective_recompute;
  if (l.recompute == Recompute::selective_op) per_window += w.selective_op_recompute;
  const bool moe = base_.model.moe.enabled();
  // One chunk's layers, by kind (estimate.cpp's chunk costs): all passes, and the forward.
  auto chunk_all = [&](const LayerKinds& k) {
    return static_cast<double>(k.main_layers(moe)) * per_layer +
           static_cast<double>(k.dense_layers(moe)) * per_dense +
           static_cast<double>(k.windowed_layers) * per_window;
  };
  auto chunk_forward = [&](const LayerKinds& k) {
    return static_cast<double>(k.main_layers(moe)) * forward_per_layer +
           static_cast<double>(k.dense_layers(moe)) * d.forward +
           static_cast<double>(k.windowed_layers) * w.forward;
  };
  const double head = head_[sp].forward + head_[sp].backward_input + head_[sp].backward_weight;
  // Every stage of the layout's split: its chunks' layers, and the LM head where it sits (both
  // ends under DualPipe, stage 0 under a V), m whole-stage passes (m/2 under DualPipe, layout.h).
  const Split& split = split_of(l);
  const double m = static_cast<double>(stage_passes(l.schedule, num_microbatches_));
  const bool fill = l.pp > 1 && !steps_overlap(l.schedule) && !bidirectional(l.schedule);
  // Where a stage's last pass is a whole backward of its first chunk, that gradient goes back
  // through every stage before it (GPipe, 1F1B, interleaved 1F1B; estimate.cpp, time()).
  const bool drain = l.schedule == Schedule::gpipe || l.schedule == Schedule::one_f_one_b ||
                     l.schedule == Schedule::interleaved_1f1b;
  // The first chunks of the stages before st: their forward, and the rest of their passes.
  double bound = 0, before_forward = 0, before_backward = 0;
  for (Count st = 0; st < l.pp; ++st) {
    const auto i = static_cast<std::size_t>(st);
    double busy = holds_head(l.schedule, l.pp, st) ? head : 0.0;
    for (const LayerKinds& k : split.kinds[i]) busy += chunk_all(k);
    const double around = (fill ? before_forward : 0.0) + (fill && drain ? before_backward : 0.0);
    bound = std::max(bound, around + m * busy);
    const LayerKinds& first = split.kinds[i].front();
    before_forward += chunk_forward(first);
    before_backward += chunk_all(first) - chunk_forward(first);
  }
  return bound;
}

}  // namespace distplan::search
