// Memory per GPU of one pipeline stage (docs/memory.md gives each term's derivation and source).
#include "distplan/planner/memory_terms.h"

#include <algorithm>

#include "distplan/planner/layout.h"

namespace distplan {
namespace {

Count ceil_div(Count a, Count b) noexcept {
  return (a + b - 1) / b;
}

// The largest sum of `k` consecutive units in the order [first] mid x n [last], where first and
// last are present only when their flag is set: the ZeRO-3 units gathered at once in one pass.
Count max_window(bool has_first, Count first, Count n, Count mid, bool has_last, Count last,
                 Count k) noexcept {
  const Count total = (has_first ? 1 : 0) + n + (has_last ? 1 : 0);
  k = std::min(k, total);
  if (k <= 0) return 0;
  // A window holds the first unit, the last unit, or only middle units (all of one size).
  auto from_start = [&] {
    Count left = k, sum = 0;
    if (has_first) sum += first, --left;
    const Count mids = std::min(left, n);
    sum += mids * mid, left -= mids;
    if (left > 0 && has_last) sum += last;
    return sum;
  };
  auto to_end = [&] {
    Count left = k, sum = 0;
    if (has_last) sum += last, --left;
    const Count mids = std::min(left, n);
    sum += mids * mid, left -= mids;
    if (left > 0 && has_first) sum += first;
    return sum;
  };
  Count best = std::max(from_start(), to_end());
  if (n >= k) best = std::max(best, k * mid);
  return best;
}

}  // namespace

MemoryLayout memory_layout(const Scenario& s) noexcept {
  const ParallelSpec& p = s.parallel;
  MemoryLayout l;
  l.tp = p.tp;
  l.pp = p.pp;
  l.virtual_stages = p.virtual_stages;
  l.micro_batch_size = s.training.micro_batch_size;
  l.num_microbatches = s.num_microbatches();
  l.zero_stage = p.zero_stage;
  l.shard = p.zero_stage == 0 ? 1 : s.shard_size();
  l.sequence_parallel = p.sequence_parallel;
  l.recompute = p.recompute;
  l.schedule = p.schedule;
  return l;
}

Bytes optimizer_bytes_per_param(const TrainingSpec& t) noexcept {
  // fp32 master weights (mixed precision only) plus Adam's m and v, or SGD's momentum.
  const Bytes master = t.precision == DType::fp32 ? 0 : 4;
  const Bytes states = t.optimizer == Optimizer::sgd ? 4 : 8;
  return master + states;
}

StageUnitParams stage_unit_params(const ModelSpec& m, Count tp, Count pp, int stage, Count layers,
                                  Count padded_vocab, Count layer_params) noexcept {
  const Count h = m.hidden_size;
  StageUnitParams u;
  u.layer = layer_params;
  u.layers = layers;
  if (stage == 0) {
    Count emb = padded_vocab * h / tp;  // vocab-parallel embedding (Shoeybi et al. 2019, sec. 3)
    if (m.position_embedding == PositionEmbedding::learned) emb += m.max_position_embeddings * h;
    u.embedding = emb;
    u.embeddings = 1;
  }
  if (stage == pp - 1) {
    Count head = m.norm == Norm::layernorm ? 2 * h : h;  // final norm
    // Untied: the LM head's own weight. Tied across stages: Megatron-LM keeps a copy of the word
    // embedding on the last stage and all-reduces its gradient with the first.
    if (!m.tied_embeddings || pp > 1) head += padded_vocab * h / tp;
    u.head = head;
    u.heads = 1;
  }
  return u;
}

StageMemory stage_memory(const Scenario& base, const MemoryLayout& l, const StageUnitParams& u,
                         const LayerActivation& act, int st, Count vocab) noexcept {
  const ModelSpec& m = base.model;
  const TrainingSpec& t = base.training;
  const Count pp = l.pp;
  const Count v = l.virtual_stages;
  const Count tp = l.tp;
  const Count h = m.hidden_size;
  const bool sp = l.sequence_parallel;
  const Bytes cb = bytes_of(t.precision);
  const Bytes gb = bytes_of(t.grad_accumulation_dtype);
  const Count S = l.shard;
  const bool zero = l.zero_stage > 0;
  auto padded = [&](Count x) { return zero ? ceil_div(x, S) * S : x; };
  const Count act_tokens = l.micro_batch_size * t.seq_length;

  StageMemory sm;
  sm.stage = st;
  sm.num_layers = u.layers;
  sm.parameters = u.total();

  // Model states (Rajbhandari et al. 2020, Figure 1), unit by unit with padding.
  const Count full =
      padded(u.layer) * u.layers + padded(u.embedding) * u.embeddings + padded(u.head) * u.heads;
  const Count sharded = ceil_div(u.layer, S) * u.layers + ceil_div(u.embedding, S) * u.embeddings +
                        ceil_div(u.head, S) * u.heads;
  const Bytes opt_k = optimizer_bytes_per_param(t);
  sm.weights_bytes = (l.zero_stage >= 3 ? sharded : full) * cb;
  sm.gradients_bytes = (l.zero_stage >= 2 ? sharded : full) * gb;
  sm.optimizer_bytes = (l.zero_stage >= 1 ? sharded : full) * opt_k;

  // Activations: per micro-batch through this GPU's layers, times what is in flight.
  const Bytes token_h = act_tokens * h;
  Bytes extra = 0;
  if (st == 0 && t.dropout > 0) extra += sp ? token_h / tp : token_h;  // embedding dropout mask
  if (st == pp - 1)
    extra += 2 * (sp ? token_h * cb / tp : token_h * cb);  // final norm and LM head inputs
  sm.activation_bytes_per_microbatch = u.layers * act.kept + extra;
  sm.inflight_chunks = inflight_chunks(l.schedule, pp, v, st, l.num_microbatches);
  sm.inflight_microbatches = static_cast<double>(sm.inflight_chunks) / static_cast<double>(v);
  // The embedding's and LM head's tensors belong to the first and last chunk only; under
  // interleaving those chunks are in flight once at a time on their stages (Megatron-LM's order
  // runs the last chunk's backward right after its forward on the last stage).
  const Count extra_live = v == 1 ? sm.inflight_chunks : 1;
  sm.activations_bytes = sm.inflight_chunks * (u.layers / v) * act.kept + extra_live * extra;
  // The layer whose backward runs rebuilds what recomputation dropped: one layer's working set,
  // counted on top of everything else in flight (docs/memory.md).
  if (u.layers > 0) sm.activations_bytes += act.working;

  // Buffers: the logits workspace lives from the last stage's forward to the loss gradient;
  // ZeRO-2/3 unit buffers live while a unit's gradient is reduced or its parameters are gathered.
  // The two are never alive together, so the category's peak is the larger.
  Bytes logits_ws = 0;
  if (st == pp - 1) {
    // Logits in the compute dtype plus their fp32 softmax for the vocab-parallel loss.
    const Bytes logits = act_tokens * (vocab / tp) * (cb + 4);
    const Count live = l.schedule == Schedule::gpipe ? l.num_microbatches : 1;
    logits_ws = logits * live;
  }
  Bytes zero_ws = 0;
  if (S > 1 && l.zero_stage >= 2) {
    Count largest = padded(u.layer) * (u.layers > 0 ? 1 : 0);
    if (u.embeddings > 0) largest = std::max(largest, padded(u.embedding));
    if (u.heads > 0) largest = std::max(largest, padded(u.head));
    zero_ws = largest * gb;  // one unit's full gradient before its reduce-scatter
    if (l.zero_stage == 3) {
      // Gathered parameters: each pass over a chunk's units (embedding, layers, LM head) keeps
      // the current unit and the next zero3_prefetch_layers gathered, so the peak is the largest
      // run of that many consecutive units of one chunk.
      const Count k = 1 + base.assumptions.zero3_prefetch_layers;
      const Count per_chunk = u.layers / v;
      const bool emb = u.embeddings > 0, head = u.heads > 0;
      Count gathered = 0;
      if (v == 1) {
        gathered = max_window(emb, padded(u.embedding), per_chunk, padded(u.layer), head,
                              padded(u.head), k);
      } else {
        // The embedding opens the first chunk and the LM head closes the last.
        gathered =
            std::max(max_window(emb, padded(u.embedding), per_chunk, padded(u.layer), false, 0, k),
                     max_window(false, 0, per_chunk, padded(u.layer), head, padded(u.head), k));
      }
      zero_ws += gathered * cb;
    }
  }
  sm.buffers_bytes = std::max(logits_ws, zero_ws);
  sm.runtime_bytes = base.cluster.runtime_reserve_bytes;
  sm.total_bytes = sm.weights_bytes + sm.gradients_bytes + sm.optimizer_bytes +
                   sm.activations_bytes + sm.buffers_bytes + sm.runtime_bytes;
  return sm;
}

}  // namespace distplan
