// Mirrors Estimator::memory() in planner/src/estimate.cpp term by term (docs/memory.md for the
// derivations); only the stage loop is cut to the stages that can hold the peak.
#include "distplan/search/fast_memory.h"

#include <algorithm>

#include "distplan/planner/layout.h"

namespace distplan::search {
namespace {

Count ceil_div(Count a, Count b) noexcept {
  return (a + b - 1) / b;
}

// The ZeRO paper's K (Rajbhandari et al. 2020, sec. 3.1), as in estimate.cpp.
Bytes optimizer_bytes_per_param(const TrainingSpec& t) noexcept {
  const Bytes master = t.precision == DType::fp32 ? 0 : 4;
  const Bytes states = t.optimizer == Optimizer::sgd ? 4 : 8;
  return master + states;
}

}  // namespace

FastMemory::FastMemory(const Scenario& base)
    : base_(base), table_(build_layer_table(base.model, base.training)) {}

void FastMemory::set_outer(const Outer& o) {
  outer_ = o;
  Scenario s = base_;
  Layout l;
  l.tp = o.tp;
  l.pp = o.pp;
  l.dp = o.dp;
  l.micro_batch_size = o.micro_batch_size;
  apply_layout(s, l);
  vocab_ = padded_vocab(s);
  layer_params_ = layer_parameters_per_tp_rank(table_, o.tp);
  num_microbatches_ = s.num_microbatches();
  const std::vector<Count> layers = stage_layer_counts(s);
  layers_first_ = layers.front();
  layers_second_ = layers.size() > 1 ? layers[1] : layers.front();
  layers_last_ = layers.back();
  // The planner's op costs, as estimate.cpp computes them for this (tp, micro-batch).
  const DeviceRates rates = device_rates(s);
  for (int sp = 0; sp < 2; ++sp) {
    layer_[sp] = layer_pass_costs(table_, s.model, s.training, o.tp, sp == 1, rates);
    head_[sp] = head_pass_costs(s.model, s.training, vocab_, o.tp, sp == 1, rates);
  }
  for (int sp = 0; sp < 2; ++sp) {
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
      act_[sp][static_cast<int>(r)] =
          layer_activation_bytes(table_, s.model, s.training, o.tp, sp == 1, r);
    }
  }
}

Bytes FastMemory::stage_total(const Layout& l, Count st, Count layer_count) const noexcept {
  const ModelSpec& m = base_.model;
  const TrainingSpec& t = base_.training;
  const Count pp = l.pp;
  const Count v = l.virtual_stages;
  const Count tp = l.tp;
  const Count h = m.hidden_size;
  const bool sp = l.sequence_parallel;
  const Bytes cb = bytes_of(t.precision);
  const Bytes gb = bytes_of(t.grad_accumulation_dtype);
  const Count S = l.zero_stage == 0 ? 1 : (l.fsdp_shard_size > 0 ? l.fsdp_shard_size : l.dp);
  auto padded = [&](Count u) { return l.zero_stage == 0 ? u : ceil_div(u, S) * S; };
  const Count nmb = num_microbatches_;
  const Count act_tokens = l.micro_batch_size * t.seq_length;

  // Units: layers, embedding on the first stage, final norm and LM head on the last.
  Count unit_params[3] = {layer_params_, 0, 0};
  Count unit_count[3] = {layer_count, 0, 0};
  if (st == 0) {
    Count emb = vocab_ * h / tp;
    if (m.position_embedding == PositionEmbedding::learned) emb += m.max_position_embeddings * h;
    unit_params[1] = emb;
    unit_count[1] = 1;
  }
  if (st == pp - 1) {
    Count head = m.norm == Norm::layernorm ? 2 * h : h;
    if (!m.tied_embeddings || pp > 1) head += vocab_ * h / tp;
    unit_params[2] = head;
    unit_count[2] = 1;
  }
  Count full = 0, sharded = 0, largest_unit = 0;
  for (int i = 0; i < 3; ++i) {
    if (unit_count[i] == 0) continue;
    full += padded(unit_params[i]) * unit_count[i];
    sharded += ceil_div(unit_params[i], S) * unit_count[i];
    largest_unit = std::max(largest_unit, padded(unit_params[i]));
  }
  const Bytes opt_k = optimizer_bytes_per_param(t);
  Bytes weights = 0, grads = 0, opt = 0;
  switch (l.zero_stage) {
    case 0:
      weights = full * cb, grads = full * gb, opt = full * opt_k;
      break;
    case 1:
      weights = full * cb, grads = full * gb, opt = sharded * opt_k;
      break;
    case 2:
      weights = full * cb, grads = sharded * gb, opt = sharded * opt_k;
      break;
    default:
      weights = sharded * cb, grads = sharded * gb, opt = sharded * opt_k;
      break;
  }

  const Bytes act_layer = act_[sp ? 1 : 0][static_cast<int>(l.recompute)];
  Bytes extra = 0;
  const Bytes token_h = act_tokens * h;
  if (st == 0 && t.dropout > 0) extra += sp ? token_h / tp : token_h;
  if (st == pp - 1) extra += 2 * (sp ? token_h * cb / tp : token_h * cb);
  const Count chunks = inflight_chunks(l.schedule, pp, v, st, nmb);
  // The embedding's and LM head's tensors: once per chunk in flight without interleaving, once
  // with it (they belong to the first and last chunk only).
  const Count extra_live = v == 1 ? chunks : 1;
  Bytes activations = chunks * (layer_count / v) * act_layer + extra_live * extra;
  if (l.recompute == Recompute::full && layer_count > 0) {
    // The layer being recomputed: its full activations, less the kept input counted above.
    activations += act_[sp ? 1 : 0][static_cast<int>(Recompute::none)] - act_layer;
  }

  // Buffers: the logits workspace and the ZeRO-2/3 unit buffers are never alive together.
  Bytes logits_ws = 0;
  if (st == pp - 1) {
    const Bytes logits = act_tokens * (vocab_ / tp) * (cb + 4);
    const Count live = l.schedule == Schedule::gpipe ? nmb : 1;
    logits_ws = logits * live;
  }
  Bytes zero_ws = 0;
  if (S > 1 && l.zero_stage == 2) zero_ws = largest_unit * gb;
  if (S > 1 && l.zero_stage == 3) {
    const Count units_held = unit_count[0] + unit_count[1] + unit_count[2];
    const Count live = std::min(units_held, 1 + base_.assumptions.zero3_prefetch_layers);
    zero_ws = live * largest_unit * cb + largest_unit * gb;
  }
  const Bytes buffers = std::max(logits_ws, zero_ws);
  return weights + grads + opt + activations + buffers + base_.cluster.runtime_reserve_bytes;
}

Bytes FastMemory::peak_bytes(const Layout& l) const noexcept {
  // Middle stages differ from stage 1 only by fewer or equal layers (stage_layer_counts gives
  // the extra layers to the middle stages in order) and fewer or equal micro-batches in flight
  // (every schedule's count falls with the stage index), and every term grows with both: the
  // peak is on stage 0, 1 or pp - 1.
  Bytes peak = std::max<Bytes>(0, stage_total(l, 0, layers_first_));
  if (l.pp > 1) {
    peak = std::max(peak, stage_total(l, l.pp - 1, layers_last_));
    if (l.pp > 2) peak = std::max(peak, stage_total(l, 1, layers_second_));
  }
  return peak;
}

Seconds FastMemory::step_lower_bound(const Layout& l) const noexcept {
  // Per micro-batch on one GPU of a stage: its layers' forward, backward and recomputation
  // op costs (the planner's own), plus the norm, LM head and loss on the last stage. estimate()'s
  // stage time adds TP communication and blocking sends to these; its step is at least m times the
  // slowest stage (every schedule's pipeline term is m * t_max plus non-negative bubble, p2p,
  // exposed-communication and optimizer terms).
  const int sp = l.sequence_parallel ? 1 : 0;
  const PassCosts& c = layer_[sp];
  double per_layer = c.forward + c.backward_input + c.backward_weight;
  if (l.recompute == Recompute::full) per_layer += c.forward;
  if (l.recompute == Recompute::selective) per_layer += c.selective_recompute;
  const double head = head_[sp].forward + head_[sp].backward_input + head_[sp].backward_weight;
  auto stage = [&](Count layers, bool last) {
    return static_cast<double>(layers) * per_layer + (last ? head : 0.0);
  };
  double busiest = stage(layers_first_, l.pp == 1);
  if (l.pp > 1) {
    busiest = std::max(busiest, stage(layers_last_, true));
    busiest = std::max(busiest, stage(layers_second_, l.pp == 2));
  }
  // The pipeline term's bubble where its closed form bounds it by compute alone: GPipe and 1F1B
  // (m - 1) t_max + sum_s t_s >= (m - 1) busiest + all stages' compute; interleaved
  // m t_max + (p - 1) t_max / v. ZB-H1/H2's bubble depends on F + B - W of the slowest stage:
  // left out (m t_max only).
  const double m = static_cast<double>(num_microbatches_);
  const double p = static_cast<double>(l.pp);
  double pipe = m * busiest;
  switch (l.schedule) {
    case Schedule::gpipe:
    case Schedule::one_f_one_b: {
      const double all_stages = static_cast<double>(base_.model.num_layers) * per_layer + head;
      pipe = (m - 1) * busiest + all_stages;
      break;
    }
    case Schedule::interleaved_1f1b:
      pipe = m * busiest + (p - 1) * busiest / static_cast<double>(l.virtual_stages);
      break;
    case Schedule::zb_h1:
    case Schedule::zb_h2:
      break;
  }
  return pipe;
}

}  // namespace distplan::search
