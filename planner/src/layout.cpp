// Layer placement, in-flight micro-batches and group links (docs/layout.md).
#include "distplan/planner/layout.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "distplan/planner/dualpipe_order.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/moe_memory.h"
#include "distplan/planner/pipeline_split.h"
#include "distplan/planner/v_schedule.h"

namespace distplan {

std::vector<Count> stage_layer_counts(const Scenario& s) {
  const PipelineSplit split = pipeline_split(s);
  std::vector<Count> layers(static_cast<std::size_t>(s.parallel.pp));
  for (Count st = 0; st < s.parallel.pp; ++st)
    layers[static_cast<std::size_t>(st)] = split.stage_layers(st);
  return layers;
}

std::vector<LayerRange> stage_chunk_layers(const Scenario& s, int stage) {
  const PipelineSplit split = pipeline_split(s);
  std::vector<LayerRange> out;
  for (Count c = 0; c < split.chunks; ++c) {
    const Count first = split.chunk_first_layer(stage, c);
    out.push_back({first, first + split.chunk_layers(stage, c)});
  }
  return out;
}

bool is_windowed_layer(const ModelSpec& m, Count i) noexcept {
  const AttentionWindowSpec& w = m.attention_window;
  if (!w.enabled()) return false;
  if (!w.layers.empty()) return std::binary_search(w.layers.begin(), w.layers.end(), i);
  return w.full_every <= 0 || (i + 1) % w.full_every != 0;
}

LayerKinds layer_kinds(const ModelSpec& m, Count first, Count end) noexcept {
  // The MTP modules' transformer layers (ids num_layers + k) follow the main model's last layer
  // on its chunk, as Megatron-Core places them without a layout (multi_token_prediction.py,
  // mtp_on_this_rank: the last pipeline stage); their kinds by the main model's rule.
  if (end == m.num_layers) end += m.mtp_layers;
  LayerKinds k;
  k.layers = end - first;
  if (m.moe.enabled()) k.moe_layers = moe_layers_in(m, first, end);
  for (Count i = first; m.attention_window.enabled() && i < end; ++i)
    k.windowed_layers += is_windowed_layer(m, i);
  return k;
}

std::vector<std::vector<LayerKinds>> chunk_layer_kinds(const ModelSpec& m,
                                                       const PipelineSplit& split) {
  std::vector<std::vector<LayerKinds>> out(static_cast<std::size_t>(split.pp));
  for (Count st = 0; st < split.pp; ++st) {
    for (Count c = 0; c < split.chunks; ++c) {
      const Count first = split.chunk_first_layer(st, c);
      out[static_cast<std::size_t>(st)].push_back(
          layer_kinds(m, first, first + split.chunk_layers(st, c)));
    }
  }
  return out;
}

std::vector<StageLayerMix> stage_layer_mix(const ModelSpec& m,
                                           const std::vector<std::vector<LayerKinds>>& chunks) {
  std::vector<StageLayerMix> out(chunks.size());
  for (std::size_t st = 0; st < chunks.size(); ++st) {
    StageLayerMix& x = out[st];
    bool first = true;
    for (const LayerKinds& k : chunks[st]) {
      x.layers += k.layers;
      x.windowed_layers += k.windowed_layers;
      if (!m.moe.enabled()) continue;
      x.moe_layers += k.moe_layers;
      x.chunk_moe_most = first ? k.moe_layers : std::max(x.chunk_moe_most, k.moe_layers);
      x.chunk_moe_fewest = first ? k.moe_layers : std::min(x.chunk_moe_fewest, k.moe_layers);
      first = false;
    }
  }
  return out;
}

std::vector<StageLayerMix> stage_layer_mix(const Scenario& s) {
  return stage_layer_mix(s.model, chunk_layer_kinds(s.model, pipeline_split(s)));
}

Count inflight_chunks(Schedule schedule, Count pp, Count v, Count stage, Count m,
                      Count memory_limit) noexcept {
  switch (schedule) {
    case Schedule::gpipe:
      return m;  // every forward runs before the first backward
    case Schedule::one_f_one_b:
      // PipeDream-Flush warm-up: p - stage - 1 forwards, then one more before the first backward.
      return std::min(pp - stage, m);
    case Schedule::zb_h1:
      // Activations live until the weight pass W. Stage s runs p - s - 1 warm-up forwards and
      // defers each W by s input-gradient passes: p in flight on every stage (Qi et al. 2023,
      // Table 2: peak memory p M_B).
      return std::min(pp, m);
    case Schedule::zb_h2:
      // ZB-H2 warms up with 2(p - s) - 1 forwards and defers W by 2s: 2p - 1 in flight
      // (Qi et al. 2023, Table 2: (2p - 1) M_B).
      return std::min(2 * pp - 1, m);
    case Schedule::zb_v:
      // PyTorch's ScheduleZBVZeroBubble order (make_zb_v): stage s runs 2p - s - 1 chunk-0 and
      // s chunk-1 forwards before its first chunk-1 forward of the (F, B, W) warm-up, so 2p
      // chunks are alive at every stage's peak, p micro-batches of a whole stage: 1F1B's peak of
      // stage 0 (Qi et al. 2023, Sec. 6). Needs m >= 2p - 1 (validate).
      return 2 * pp;
    case Schedule::v_half:
      // The authors' V-Half building block (make_v_half): 2 floor(p/2) + 2 chunks on every stage
      // once m >= 2p, about half of 1F1B's 2p (Qi et al. 2024; sail-sg README table "1/2x").
      return 2 * (pp / 2) + 2;
    case Schedule::zb_auto:
      // The heuristic fills the memory limit it is given (the planner passes
      // ParallelSpec::zb_memory_limit() as `memory_limit`); at most m micro-batches exist.
      return std::min(memory_limit, m);
    case Schedule::dualpipe_v:
      // DualPipeV (make_dualpipe_v): 2p chunks alive after the warm-up on every stage, one more
      // while an F&B pair runs: the README's "PP + 1" activations per device (PP = 2p stages of
      // one chunk each; deepseek-ai/DualPipe README.md). Needs m >= 2p (validate).
      return 2 * pp + 1;
    case Schedule::dualpipe:
      // DualPipe (make_dualpipe): p chunks of one model stage alive after the warm-up on every
      // stage, one more while an F&B pair runs: the README's "PP + 1" activations per device
      // (deepseek-ai/DualPipe README.md; PP = p). Needs m >= 2p (validate).
      return pp + 1;
    case Schedule::v_min: {
      // V-Min's block after the authors' reordering (make_v_min): 2 floor((p + 1)/3) + 2 chunks,
      // about a third of 1F1B's (README table "1/3x"); when p mod 3 = 2 stage 0 holds one fewer.
      const Count k = 2 * ((pp + 1) / 3) + 2;
      return pp % 3 == 2 && stage == 0 ? k - 1 : k;
    }
    case Schedule::interleaved_1f1b: {
      // Megatron-LM get_pp_rank_microbatches (NVIDIA/Megatron-LM
      // megatron/core/pipeline_parallel/schedules.py, commit 00611e6e): num_warmup =
      // (p - stage - 1) * 2 + (v - 1) * p, capped at m * v; the steady state adds one. With one
      // chunk the schedule is plain 1F1B (make_interleaved_1f1b runs make_1f1b).
      if (v == 1) return std::min(pp - stage, m);
      const Count total = m * v;
      const Count warmup = std::min((pp - stage - 1) * 2 + (v - 1) * pp, total);
      return std::min(warmup + 1, total);
    }
  }
  return m;
}

namespace {

// Megatron-LM's interleaved order (get_schedule_table with groups of p micro-batches): among the
// first k forward virtual micro-batches, how many run chunk c. Backward k runs chunk v - 1 - c of
// the same table, so the backward count of chunk c is forward_chunk_count(v - 1 - c, ...).
Count forward_chunk_count(Count c, Count k, Count pp, Count v) noexcept {
  const Count group = pp * v;
  return (k / group) * pp + std::clamp(k % group - c * pp, Count{0}, pp);
}

}  // namespace

namespace {

using LiveSets = std::vector<std::array<Count, 2>>;

// Adds `x` unless a kept state dominates it, dropping those it dominates.
void keep_maximal(LiveSets& kept, const std::array<Count, 2>& x) {
  for (const auto& k : kept)
    if (k[0] >= x[0] && k[1] >= x[1]) return;
  std::erase_if(kept, [&x](const auto& k) { return x[0] >= k[0] && x[1] >= k[1]; });
  kept.push_back(x);
}

// One stage's live sets along its passes: +1 of the chunk at a forward, -1 at a whole backward or
// a weight pass.
template <typename Pass, typename IsForward, typename Frees>
LiveSets live_sets_along(const std::vector<Pass>& passes, IsForward is_forward, Frees frees) {
  LiveSets kept;
  std::array<Count, 2> live{0, 0};
  for (const Pass& x : passes) {
    const auto c = static_cast<std::size_t>(x.chunk);
    if (is_forward(x)) {
      ++live[c];
      keep_maximal(kept, live);
    } else if (frees(x)) {
      --live[c];
    }
  }
  return kept;
}

std::vector<LiveSets> build_live_sets(Schedule schedule, Count pp, Count m) {
  std::vector<LiveSets> out(static_cast<std::size_t>(pp));
  if (schedule == Schedule::dualpipe || schedule == Schedule::dualpipe_v) {
    using Op = DualPipePass::Op;
    const DualPipeOrder order =
        schedule == Schedule::dualpipe ? dualpipe_order(pp, m) : dualpipe_v_order(pp, m);
    for (std::size_t st = 0; st < out.size(); ++st) {
      out[st] = live_sets_along(
          order[st], [](const DualPipePass& x) { return x.op == Op::forward; },
          [](const DualPipePass& x) {
            return x.op == Op::backward || x.op == Op::backward_weight;
          });
    }
    return out;
  }
  const VOrder order = v_schedule_order(schedule, pp, m);
  for (std::size_t st = 0; st < out.size(); ++st) {
    out[st] = live_sets_along(
        order[st], [](const VPass& x) { return x.pass == ZbPass::forward; },
        [](const VPass& x) { return x.pass == ZbPass::backward_weight; });
  }
  return out;
}

}  // namespace

std::vector<std::array<Count, 2>> two_chunk_live_sets(Schedule schedule, Count pp, Count m,
                                                      Count stage) {
  static std::mutex mutex;
  static std::map<std::tuple<Schedule, Count, Count>, std::vector<LiveSets>> cache;
  // Each entry is a few pairs per stage; the bound only keeps a pathological caller (millions of
  // (pp, m) pairs) from growing without end.
  constexpr std::size_t kMaxCached = 4096;
  const auto key = std::make_tuple(schedule, pp, m);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end())
      return it->second[static_cast<std::size_t>(stage)];
  }
  std::vector<LiveSets> built = build_live_sets(schedule, pp, m);
  LiveSets mine = built[static_cast<std::size_t>(stage)];
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxCached) cache.clear();
  cache.emplace(key, std::move(built));
  return mine;
}

Bytes activation_peak_bytes(Schedule schedule, Count pp, Count v, Count stage, Count m,
                            Bytes chunk_bytes, Bytes first_bytes, Bytes last_bytes,
                            Count memory_limit) noexcept {
  if (bidirectional(schedule)) {
    // DualPipe's own order (dualpipe_order.h): both end stages hold a first and a last model
    // stage; the callers pass their bytes for the stages that hold them.
    return dualpipe_activation_peak(pp, m, stage, chunk_bytes, first_bytes, last_bytes).peak_bytes;
  }
  // The first virtual stage is chunk 0 of stage 0 and the last is chunk v - 1 of stage pp - 1
  // (Megatron-LM's placement, virtual stage c * pp + s).
  const Bytes first = stage == 0 ? first_bytes : 0;
  const Bytes last = stage == head_stage(schedule, pp) ? last_bytes : 0;
  const Count chunks = inflight_chunks(schedule, pp, v, stage, m, memory_limit);
  if (v_shape(schedule)) {
    // Stage 0 holds both ends of the V. At its peak it holds one chunk-1 pass and the rest of
    // chunk 0 (every V order, m >= 2p); ZB-V's first stable forward also reaches the peak with
    // chunk 0 only.
    if (first == 0 && last == 0) return chunks * chunk_bytes;
    const Bytes one_of_chunk_1 = schedule == Schedule::zb_v ? std::max(first, last) : last;
    return chunks * chunk_bytes + (chunks - 1) * first + one_of_chunk_1;
  }
  if (v == 1) return chunks * (chunk_bytes + first + last);
  // Interleaved: the stage holds W + 1 chunks at every steady-state forward (W warm-up forwards,
  // then F, B pairs), fewer before and after; a forward only ever adds. When the warm-up is
  // everything, all m v chunks are alive at the last forward.
  const Count total = m * v;
  const Count warmup = chunks - (chunks < total ? 1 : 0);
  if (chunks == total) return total * chunk_bytes + m * (first + last);
  if (first == 0 && last == 0) return chunks * chunk_bytes;
  // At steady step j the stage has started forwards [0, W + j] and finished backwards [0, j).
  // Chunk counts repeat with period p v in j, so one period holds the peak.
  Bytes peak = 0;
  const Count steps = std::min(total - warmup, pp * v);
  for (Count j = 0; j < steps; ++j) {
    const Count k = warmup + j + 1;
    const Count n_first = forward_chunk_count(0, k, pp, v) - forward_chunk_count(v - 1, j, pp, v);
    const Count n_last = forward_chunk_count(v - 1, k, pp, v) - forward_chunk_count(0, j, pp, v);
    peak = std::max(peak, n_first * first + n_last * last);
  }
  return chunks * chunk_bytes + peak;
}

Bytes activation_peak_bytes(Schedule schedule, Count pp, Count v, Count stage, Count m,
                            const std::vector<Bytes>& chunk_bytes, Count memory_limit) {
  const Count chunks = inflight_chunks(schedule, pp, v, stage, m, memory_limit);
  if (v == 1) return chunks * chunk_bytes.front();
  auto bytes = [&](Count c) { return chunk_bytes[static_cast<std::size_t>(c)]; };
  switch (schedule) {
    case Schedule::interleaved_1f1b: {
      // As the uniform case above: at steady step j the stage has started forwards [0, W + j] and
      // finished backwards [0, j) of Megatron-LM's order, whose chunk counts repeat with period
      // p v; before the steady state forwards only add, after it backwards only free.
      const Count total = m * v;
      if (chunks == total) {
        Bytes all = 0;
        for (Count c = 0; c < v; ++c) all += m * bytes(c);
        return all;
      }
      const Count warmup = chunks - 1;
      Bytes peak = 0;
      const Count steps = std::min(total - warmup, pp * v);
      for (Count j = 0; j < steps; ++j) {
        Bytes alive = 0;
        for (Count c = 0; c < v; ++c) {
          const Count n = forward_chunk_count(c, warmup + j + 1, pp, v) -
                          forward_chunk_count(v - 1 - c, j, pp, v);
          alive += n * bytes(c);
        }
        peak = std::max(peak, alive);
      }
      return peak;
    }
    case Schedule::zb_v:
    case Schedule::v_half:
    case Schedule::v_min:
    case Schedule::dualpipe_v:
    case Schedule::dualpipe: {
      // Along the schedule's own order (two_chunk_live_sets).
      Bytes peak = 0;
      for (const auto& n : two_chunk_live_sets(schedule, pp, m, stage))
        peak = std::max(peak, n[0] * bytes(0) + n[1] * bytes(1));
      return peak;
    }
    case Schedule::gpipe:
    case Schedule::one_f_one_b:
    case Schedule::zb_h1:
    case Schedule::zb_h2:
    case Schedule::zb_auto:
      break;  // one chunk per stage (validate)
  }
  return chunks * *std::max_element(chunk_bytes.begin(), chunk_bytes.end());
}

namespace {

// Does a group of `span` consecutive ranks, aligned to its own size, stay inside one node?
bool inside_node(Count span, Count gpus_per_node) noexcept {
  return span <= gpus_per_node && gpus_per_node % span == 0;
}

}  // namespace

Count group_size(const Scenario& s, Group g) noexcept {
  switch (g) {
    case Group::tp:
      return s.parallel.tp;
    case Group::dp:
      // Gradients are reduced, and ZeRO shards, over the data- and context-parallel ranks.
      return s.parallel.zero_stage == 0 ? s.parallel.dp * s.parallel.cp : s.zero_shard();
    case Group::dp_replicate:
      return s.parallel.dp / s.shard_size();
    case Group::pp:
      return s.parallel.pp;
    case Group::embedding:
      return 2;
    case Group::cp:
      return s.parallel.cp;
    case Group::ep:
      return s.parallel.ep;
    case Group::edp:
      return s.expert_data_parallel();
    case Group::etp:
      return s.parallel.etp;
  }
  return 1;
}

Link group_link(const Scenario& s, Group g) noexcept {
  const Count tp = s.parallel.tp;
  // A group inside one NVLink fabric uses NVLink: the node, or the larger domain a system's
  // NVLink switches join (GB200 NVL72: 72 GPUs over 18 trays of 4; docs/layout.md).
  const Count gpn = std::max(s.cluster.gpus_per_node, s.cluster.nvlink_domain_size);
  // A job inside one NVLink fabric crosses no slower link (a 64-GPU job on an NVL72 rack).
  if (s.cluster.num_gpus <= gpn) return Link::intra_node;
  // Rank order (Megatron-Core, order "tp-cp-ep-dp-pp" without experts):
  // rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP * pp_rank)). A group whose members lie
  // within `span` consecutive ranks stays in a node when that span does.
  Count span = 1;
  switch (g) {
    case Group::tp:
      span = tp;
      break;
    case Group::cp:
      span = tp * s.parallel.cp;
      break;
    case Group::dp:
      span = tp * group_size(s, Group::dp);  // the cp ranks and the shard's dp ranks
      break;
    case Group::dp_replicate:
      span = tp * s.parallel.cp * s.parallel.dp;
      break;
    case Group::pp:
    case Group::embedding:
      // Neighbouring stages are TP*DP ranks apart: unless the whole job is one node, some stage
      // boundary crosses nodes, and the pipeline runs at the pace of its slowest boundary.
      return s.cluster.num_gpus <= gpn ? Link::intra_node : Link::inter_node;
    case Group::ep:
      // Expert rank order etp-ep-edp-pp (moe_memory.h, Megatron-Core's MoE parallel folding).
      return ep_group_intra_node(s.parallel.ep, s.parallel.etp, gpn) ? Link::intra_node
                                                                     : Link::inter_node;
    case Group::edp:
      return edp_group_intra_node(expert_layout(s.parallel), gpn) ? Link::intra_node
                                                                  : Link::inter_node;
    case Group::etp:
      // etp consecutive ranks in the expert order (etp fastest).
      span = s.parallel.etp;
      break;
  }
  return inside_node(span, gpn) ? Link::intra_node : Link::inter_node;
}

Count padded_vocab(const Scenario& s) noexcept {
  const Count mult = std::max<Count>(1, s.assumptions.vocab_pad_multiple) * s.parallel.tp;
  return (s.model.vocab_size + mult - 1) / mult * mult;
}

Count model_parameters(const ModelSpec& m) {
  return model_parameters(m, build_layer_table(m, TrainingSpec{}));
}

Count model_parameters(const ModelSpec& m, const LayerTable& table) noexcept {
  // Experts and MLA: layers differ from the table's dense layer (moe.cpp counts them).
  if (m.moe.enabled() || m.mla.enabled()) return count_parameters(m).total;
  const Count h = m.hidden_size;
  Count n = m.num_layers * layer_parameters(table);
  n += m.vocab_size * h;  // token embedding
  n += m.embedding_extra_parameters();
  n += m.norm_parameters();                       // final norm
  if (!m.tied_embeddings) n += m.vocab_size * h;  // LM head
  return n;
}

}  // namespace distplan
