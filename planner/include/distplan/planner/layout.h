// How a layout places work: layers per pipeline stage, micro-batches in flight per stage, and
// which link each parallel group's collectives cross (Megatron-LM rank order,
// rank = tp + TP*(dp + DP*pp); docs/layout.md).
#pragma once

#include <array>

#include <vector>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"

namespace distplan {

/// Transformer layers on each pipeline stage (all chunks of a stage together), length pp: the
/// sums of pipeline_split()'s chunks (pipeline_split.h). Throws InputError as pipeline_split.
[[nodiscard]] std::vector<Count> stage_layer_counts(const Scenario& s);

/// The model layers [first, end) one chunk of a stage runs.
struct LayerRange {
  Count first = 0;
  Count end = 0;
};
/// The layer ranges of each chunk of `stage`, chunk 0 first: pipeline_split()'s chunks at their
/// virtual stages (DualPipe: model stages s and pp - 1 - s).
[[nodiscard]] std::vector<LayerRange> stage_chunk_layers(const Scenario& s, int stage);

/// The layer kinds among some layers (docs/moe.md, "Layer placement"): for a MoE model the MoE
/// layers among them (0 for a dense model; the others have the dense MLP), and the layers whose
/// attention is windowed (is_windowed_layer).
struct LayerKinds {
  Count layers = 0;
  Count moe_layers = 0;
  Count windowed_layers = 0;
  /// Layers of the `layer` kind of StageUnitParams (memory_terms.h): a MoE model's MoE layers,
  /// every layer of a dense model; and the others (a MoE model's dense-MLP layers).
  [[nodiscard]] Count main_layers(bool moe) const noexcept { return moe ? moe_layers : layers; }
  [[nodiscard]] Count dense_layers(bool moe) const noexcept {
    return moe ? layers - moe_layers : 0;
  }
  bool operator==(const LayerKinds&) const = default;
};
/// The kinds of model layers [first, end); a range ending at num_layers includes the MTP modules'
/// layers (model.mtp_layers), which follow the last layer on its chunk.
[[nodiscard]] LayerKinds layer_kinds(const ModelSpec& m, Count first, Count end) noexcept;
struct PipelineSplit;
/// The kinds of each chunk's layers under a split: [stage][chunk] (pipeline_split.h).
[[nodiscard]] std::vector<std::vector<LayerKinds>> chunk_layer_kinds(const ModelSpec& m,
                                                                     const PipelineSplit& split);

/// How a stage's layers divide into layer kinds (docs/moe.md, "Layer placement"): for a MoE
/// model, the MoE layers among them and the most and fewest MoE layers of one chunk, zero for a
/// dense model; and the layers whose attention is windowed (is_windowed_layer). The sums of
/// chunk_layer_kinds(); the planner and the search cost each chunk from those.
struct StageLayerMix {
  Count layers = 0;
  Count moe_layers = 0;
  Count chunk_moe_most = 0;
  Count chunk_moe_fewest = 0;
  Count windowed_layers = 0;  // layers attending within model.attention_window
  bool operator==(const StageLayerMix&) const = default;
};
[[nodiscard]] std::vector<StageLayerMix> stage_layer_mix(const Scenario& s);
/// The same from chunk_layer_kinds().
[[nodiscard]] std::vector<StageLayerMix> stage_layer_mix(
    const ModelSpec& m, const std::vector<std::vector<LayerKinds>>& chunks);

/// Whether layer i attends within model.attention_window (AttentionWindowSpec's rule).
[[nodiscard]] bool is_windowed_layer(const ModelSpec& m, Count i) noexcept;

/// Where virtual stages sit. Megatron-LM's interleaved placement puts chunk c of stage s at
/// virtual stage c*p + s; a V-shape schedule (v_shape(), two chunks) puts chunk 0 of stage s at
/// virtual stage s and chunk 1 at 2p - 1 - s (Qi et al. 2024, Sec. 3; torchtitan's
/// generate_stage_to_rank_mapping(style="v") in pytorch/pytorch
/// torch/distributed/pipelining/_utils.py). Activations and gradients flow between consecutive
/// virtual stages; under the V the turn at stage p - 1 (virtual stage p - 1 to p) stays on the GPU.
struct StageChunk {
  Count stage = 0;
  Count chunk = 0;
};
[[nodiscard]] constexpr Count virtual_stage_of(bool v_placement, Count pp, Count stage,
                                               Count chunk) noexcept {
  if (v_placement) return chunk == 0 ? stage : 2 * pp - 1 - stage;
  return chunk * pp + stage;
}
[[nodiscard]] constexpr StageChunk locate_virtual_stage(bool v_placement, Count pp,
                                                        Count vs) noexcept {
  if (v_placement) return vs < pp ? StageChunk{vs, 0} : StageChunk{2 * pp - 1 - vs, 1};
  return StageChunk{vs % pp, vs / pp};
}
/// DualPipe's bidirectional placement (deepseek-ai/DualPipe dualpipe.py: rank r holds
/// modules (stage r, stage p - 1 - r)): chunk 0 of stage s is model stage s of the forward
/// direction, chunk 1 is model stage p - 1 - s of the reverse direction. A micro-batch runs in one
/// direction only, through p model stages: the first m/2 in chunk 0 from stage 0, the others in
/// chunk 1 from stage p - 1 (dualpipe_direction).
[[nodiscard]] constexpr Count dualpipe_model_stage(Count pp, Count stage, Count chunk) noexcept {
  return chunk == 0 ? stage : pp - 1 - stage;
}
[[nodiscard]] constexpr StageChunk dualpipe_locate(Count pp, Count model_stage,
                                                   Count chunk) noexcept {
  return StageChunk{chunk == 0 ? model_stage : pp - 1 - model_stage, chunk};
}
[[nodiscard]] constexpr Count dualpipe_direction(Count microbatches, Count microbatch) noexcept {
  return microbatch < microbatches / 2 ? 0 : 1;
}
/// A chunk's place on a micro-batch's path under `schedule`: its virtual stage (interleaved or V),
/// or its model stage under DualPipe; and the path's length (pp·v, or pp under DualPipe).
[[nodiscard]] constexpr Count chunk_virtual_stage(Schedule schedule, Count pp, Count stage,
                                                  Count chunk) noexcept {
  if (bidirectional(schedule)) return dualpipe_model_stage(pp, stage, chunk);
  return virtual_stage_of(v_shape(schedule), pp, stage, chunk);
}
[[nodiscard]] constexpr Count path_length(Schedule schedule, Count pp, Count chunks) noexcept {
  return bidirectional(schedule) ? pp : pp * chunks;
}

/// The stage holding the first virtual stage (embedding) is always 0; the one holding the last
/// (final norm, LM head, loss) is p - 1, or 0 under a V.
[[nodiscard]] constexpr Count head_stage(Schedule schedule, Count pp) noexcept {
  return v_shape(schedule) ? 0 : pp - 1;
}

/// Whether `stage` holds the embedding (the first model stage): stage 0, and under DualPipe also
/// stage p - 1 (its reverse direction's first stage).
[[nodiscard]] constexpr bool holds_embedding(Schedule schedule, Count pp, Count stage) noexcept {
  return stage == 0 || (bidirectional(schedule) && stage == pp - 1);
}
/// Whether `stage` holds the final norm and LM head: head_stage(), and under DualPipe both ends.
[[nodiscard]] constexpr bool holds_head(Schedule schedule, Count pp, Count stage) noexcept {
  return stage == head_stage(schedule, pp) || (bidirectional(schedule) && stage == 0);
}
/// Whether consecutive steps overlap, so that a step lasts its longest stage span rather than until
/// its last stage ends: the schedules whose published bubbles assume the optimizer's
/// post-validation (Qi et al. 2023, Sec. 4): ZB-H2, zb_auto (Table 5 counts the longest span) and
/// the V schedules but DualPipeV (the V-Half / V-Min authors measure the longest span,
/// zbv_greedy.py eager_execution_time; DeepSeek-AI's DualPipeV waits for its sends before it
/// returns, as DualPipe does).
[[nodiscard]] constexpr bool steps_overlap(Schedule s) noexcept {
  return s == Schedule::zb_h2 || s == Schedule::zb_auto ||
         (v_shape(s) && s != Schedule::dualpipe_v);
}
/// Full passes through a stage per step, in micro-batches of the whole stage: m, but under
/// DualPipe each micro-batch passes one of the stage's two model stages, m/2 of its whole.
[[nodiscard]] constexpr Count stage_passes(Schedule schedule, Count num_microbatches) noexcept {
  return bidirectional(schedule) ? num_microbatches / 2 : num_microbatches;
}

/// Peak (micro-batch, chunk) activation sets alive on `stage` for a schedule with closed form:
/// GPipe m; 1F1B min(p - stage, m); ZB-H1 min(p, m); ZB-H2 min(2p - 1, m) (activations live
/// until the weight pass);
/// interleaved 1F1B min(2(p - stage - 1) + (v - 1)p + 1, m*v) (Megatron-LM's warm-up count + 1);
/// the V schedules (m >= 2p) ZB-V 2p, V-Half 2 floor(p/2) + 2, V-Min 2 floor((p + 1)/3) + 2 (one
/// fewer on stage 0 when p = 2 mod 3), DualPipeV 2p + 1;
/// zb_auto: min(memory_limit, m), its per-stage limit (ParallelSpec::zb_memory_limit()).
[[nodiscard]] Count inflight_chunks(Schedule schedule, Count pp, Count virtual_stages, Count stage,
                                    Count num_microbatches, Count memory_limit = 0) noexcept;

/// The live (chunk 0, chunk 1) activation sets of one stage of a two-chunk schedule's order (the
/// V schedules, DualPipeV, DualPipe) at the start of each forward, those no other dominates: the
/// stage's peak for per-set bytes b0, b1 is the largest n0 b0 + n1 b1 over them (a set lives from
/// its forward to its whole backward or its weight pass, the simulator's accounting). Built once
/// per (schedule, pp, m) from the order and kept: a search asks for the same few orders for
/// thousands of layouts, and V-Half's and V-Min's orders take long to build.
[[nodiscard]] std::vector<std::array<Count, 2>> two_chunk_live_sets(Schedule schedule, Count pp,
                                                                    Count m, Count stage);

/// Peak bytes of saved activations on `stage`: every in-flight (micro-batch, chunk) pair holds
/// `chunk_bytes` (its layers), pairs of the first virtual stage also `first_bytes` (embedding
/// output masks) and pairs of the last virtual stage `last_bytes` (final norm, LM head inputs).
/// Equals the simulator's peak for the schedule's program (docs/simulator.md, "Memory").
[[nodiscard]] Bytes activation_peak_bytes(Schedule schedule, Count pp, Count virtual_stages,
                                          Count stage, Count num_microbatches, Bytes chunk_bytes,
                                          Bytes first_bytes, Bytes last_bytes,
                                          Count memory_limit = 0) noexcept;

/// The same for chunks that save different bytes: `chunk_bytes[c]` per (micro-batch, chunk c) set,
/// the embedding's and the LM head's tensors included on the chunks that hold them (uneven
/// splits, pipeline_split.h). One chunk: the in-flight count times its bytes; interleaved 1F1B:
/// the largest sum over Megatron-LM's steady state; the V schedules and DualPipe: the largest sum
/// along the stage's own order (v_schedule.h, dualpipe_order.h), as the simulator counts it.
[[nodiscard]] Bytes activation_peak_bytes(Schedule schedule, Count pp, Count virtual_stages,
                                          Count stage, Count num_microbatches,
                                          const std::vector<Bytes>& chunk_bytes,
                                          Count memory_limit = 0);

/// Ranks spanned by a group and the link its collectives cross.
[[nodiscard]] Count group_size(const Scenario& s, Group g) noexcept;
[[nodiscard]] Link group_link(const Scenario& s, Group g) noexcept;

/// Vocab size after padding for the vocab-parallel embedding (Megatron's
/// make-vocab-size-divisible-by): a multiple of vocab_pad_multiple * tp.
[[nodiscard]] Count padded_vocab(const Scenario& s) noexcept;

/// Parameter count of the whole model (unpadded vocab, tp = 1).
[[nodiscard]] Count model_parameters(const ModelSpec& m);
struct LayerTable;
/// The same, from an already built layer table of that model.
[[nodiscard]] Count model_parameters(const ModelSpec& m, const LayerTable& table) noexcept;

}  // namespace distplan
