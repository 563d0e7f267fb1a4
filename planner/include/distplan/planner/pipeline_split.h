// Layers per virtual stage of a pipeline: the frameworks' own split rules (docs/layout.md,
// "Pipeline splits"), resolved once per scenario. One split for every engine: the planner's memory,
// FLOPs and costs per chunk, the simulator's per-chunk pass times and activation bytes, the
// search, the exports and the training backend's layer placement.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// A micro-batch passes `path` virtual stages: pp·v (chunk c of stage s is virtual stage
/// c·pp + s, or s and 2pp - 1 - s under a V; layout.h), or the pp model stages of DualPipe (chunk
/// 0 of stage s is model stage s, chunk 1 model stage pp - 1 - s). `layers[i]` transformer layers
/// sit on virtual stage i, layers first[i] .. first[i] + layers[i] - 1 of the model.
struct PipelineSplit {
  Count pp = 1;
  Count chunks = 1;  // chunks per GPU stage: virtual_stages
  bool v_shape = false;
  bool bidirectional = false;
  std::vector<Count> layers;  // [virtual stage, path order]
  std::vector<Count> first;   // first layer of each virtual stage
  // megatron_layout: the virtual stage whose chunk holds the MTP layers ("m"), else -1: the MTP
  // module follows the last layer, on the last virtual stage (Megatron-LM's default placement).
  Count mtp_virtual_stage = -1;

  [[nodiscard]] Count path() const noexcept { return static_cast<Count>(layers.size()); }
  /// The virtual stage (model stage under DualPipe) of `chunk` on GPU stage `stage`.
  [[nodiscard]] Count virtual_stage(Count stage, Count chunk) const noexcept;
  [[nodiscard]] Count chunk_layers(Count stage, Count chunk) const noexcept {
    return layers[static_cast<std::size_t>(virtual_stage(stage, chunk))];
  }
  [[nodiscard]] Count chunk_first_layer(Count stage, Count chunk) const noexcept {
    return first[static_cast<std::size_t>(virtual_stage(stage, chunk))];
  }
  /// Transformer layers one GPU of `stage` holds (all its chunks).
  [[nodiscard]] Count stage_layers(Count stage) const noexcept;
  /// Whether every chunk of every stage holds the same number of layers.
  [[nodiscard]] bool uniform() const noexcept;
};

/// The scenario's split: parallel.layers_per_stage when given (one count per GPU stage, split
/// evenly over its chunks), else parallel.split's rule. Throws InputError at the field whose rule
/// cannot split the model (the framework's own assertion, in its words where it has one).
[[nodiscard]] PipelineSplit pipeline_split(const Scenario& s);

/// The rules on their own, as counts per virtual stage in path order (n of them).
/// even: floor(L / n) each, the remainder one by one to virtual stages 1, 2, ..., then to the
/// first and the last.
[[nodiscard]] std::vector<Count> even_split(Count num_layers, Count n);
/// torchtitan _generate_llm_fqn_per_model_part (torchtitan/distributed/pipeline_parallel.py,
/// pytorch/torchtitan b5bcd76): the embedding weighs `input_weight` layers and the norm plus LM
/// head `output_weight`; (L + iw + ow) / n effective layers per stage, the first (L + iw + ow) mod
/// n stages one more; the first stage holds iw fewer transformer layers, the last ow fewer.
/// Throws InputError at `path` where torchtitan raises ValueError.
[[nodiscard]] std::vector<Count> torchtitan_split(Count num_layers, Count n, Count input_weight,
                                                  Count output_weight, const std::string& path);

/// Megatron-LM's --pipeline-model-parallel-layout string parsed (parse_str_to_list and
/// validate_layer_layout, megatron/core/transformer/pipeline_parallel_layer_layout.py):
/// decoder layers ("t") and MTP layers ("m") per virtual stage, in Megatron's flat order
/// (virtual stage vpp·pp + pp_rank).
struct MegatronLayout {
  std::vector<Count> decoder;  // per virtual stage
  Count mtp_virtual_stage = -1;
  Count mtp_layers = 0;
};
[[nodiscard]] MegatronLayout parse_megatron_layout(std::string_view layout, Count pp,
                                                   Count num_layers, Count mtp_layers,
                                                   const std::string& path);
/// The layout string of a split (the export's --pipeline-model-parallel-layout): "E" on the
/// first virtual stage, "L" on the last, "t" per layer, "m" per MTP layer where they sit, with
/// runs of equal stages folded as Megatron's examples write them ("(tt|)*29").
[[nodiscard]] std::string megatron_layout_string(const PipelineSplit& split, Count mtp_layers);

}  // namespace distplan
