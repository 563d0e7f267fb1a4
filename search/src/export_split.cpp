// The pipeline split in each framework's flags (export_split.h).
#include "export_split.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan::search::detail {

namespace {

// Megatron-LM get_num_layers_to_build (megatron/core/transformer/transformer_block.py) for its
// flags: the layers of virtual stage c·pp + r, or nullopt where its checks refuse them.
std::optional<std::vector<Count>> megatron_counts(Count layers, Count pp, Count v,
                                                  std::optional<Count> first,
                                                  std::optional<Count> last, bool emb, bool loss) {
  Scenario s;
  s.model.num_layers = layers;
  s.parallel.pp = pp;
  s.parallel.virtual_stages = v;
  s.parallel.schedule = v > 1 ? Schedule::interleaved_1f1b : Schedule::one_f_one_b;
  s.parallel.split.rule = SplitRule::megatron;
  s.parallel.split.first_stage_layers = first;
  s.parallel.split.last_stage_layers = last;
  s.parallel.split.account_for_embedding = emb;
  s.parallel.split.account_for_loss = loss;
  try {
    return pipeline_split(s).layers;
  } catch (const InputError&) {
    return std::nullopt;
  }
}

}  // namespace

SplitArgs megatron_split_args(const Scenario& s) {
  SplitArgs out;
  const ParallelSpec& p = s.parallel;
  const Count L = s.model.num_layers, v = p.virtual_stages;
  if (p.pp == 1) return out;
  if (two_chunks(p.schedule)) {
    // Megatron-LM runs neither a V nor DualPipe; its interleaved placement would put other layers
    // on each rank.
    out.notes.push_back(
        fmt::format("Megatron-LM has no {} placement; the plan's split of its "
                    "chunks is not expressed",
                    bidirectional(p.schedule) ? "DualPipe" : "V"));
    return out;
  }
  const PipelineSplit split = pipeline_split(s);
  auto matches = [&](std::optional<Count> first, std::optional<Count> last, bool emb, bool loss) {
    const auto c = megatron_counts(L, p.pp, v, first, last, emb, loss);
    return c && *c == split.layers;
  };
  auto vpp_rank_arg = [&] {
    if (v > 1) out.args.push_back(fmt::format("--num-virtual-stages-per-pipeline-rank {}", v));
  };
  if (matches(std::nullopt, std::nullopt, false, false)) {
    if (v > 1)
      out.args.push_back(fmt::format("--num-layers-per-virtual-pipeline-stage {}", L / (p.pp * v)));
    return out;
  }
  for (const auto& [emb, loss] :
       {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    if (matches(std::nullopt, std::nullopt, emb, loss)) {
      vpp_rank_arg();
      if (emb) out.args.emplace_back("--account-for-embedding-in-pipeline-split");
      if (loss) out.args.emplace_back("--account-for-loss-in-pipeline-split");
      return out;
    }
  }
  // First and last stage counts: the plan's own first and last stage layers.
  const Count first = split.stage_layers(0), last = split.stage_layers(p.pp - 1);
  for (const auto& [f, l] :
       {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    if (matches(f ? std::optional<Count>(first) : std::nullopt,
                l ? std::optional<Count>(last) : std::nullopt, false, false)) {
      vpp_rank_arg();
      if (f) out.args.push_back(fmt::format("--decoder-first-pipeline-num-layers {}", first));
      if (l) out.args.push_back(fmt::format("--decoder-last-pipeline-num-layers {}", last));
      return out;
    }
  }
  // Any other split: every virtual stage spelled out (PipelineParallelLayerLayout).
  out.args.push_back(fmt::format("--pipeline-model-parallel-layout \"{}\"",
                                 megatron_layout_string(split, s.model.mtp_layers)));
  return out;
}

std::vector<std::string> torchtitan_split_lines(const Scenario& s) {
  std::vector<std::string> out;
  const ParallelSpec& p = s.parallel;
  if (p.pp == 1) return out;
  const PipelineSplit split = pipeline_split(s);
  const Count L = s.model.num_layers, n = split.path();
  // torchtitan's stages per rank: 1 for single-stage schedules, 2 for multi-stage ones unless
  // pipeline_parallel_layers_per_stage gives ceil((L + iw + ow) / layers_per_stage) stages
  // (_get_pipeline_metadata, torchtitan/distributed/pipeline_parallel.py).
  const bool multi = v_shape(p.schedule) || p.schedule == Schedule::interleaved_1f1b;
  if (!bidirectional(p.schedule)) {
    // Weights: the plan's torchtitan rule's, else torchtitan's defaults (1, 1), else none (0, 0:
    // an equal split with the extra layers on the first stages).
    std::vector<std::pair<Count, Count>> weights;
    if (p.split.rule == SplitRule::torchtitan) {
      weights.emplace_back(p.split.first_stage_less_layers, p.split.last_stage_less_layers);
    } else {
      weights = {{1, 1}, {0, 0}};
    }
    for (const auto& [iw, ow] : weights) {
      bool rule_gives_it = false;
      try {
        rule_gives_it = torchtitan_split(L, n, iw, ow, "") == split.layers;
      } catch (const InputError&) {
      }
      if (!rule_gives_it) continue;
      std::optional<Count> per_stage;  // pipeline_parallel_layers_per_stage
      bool stages_ok = !multi ? p.virtual_stages == 1 : p.virtual_stages == 2;
      if (multi && p.virtual_stages != 2) {
        for (Count k = 1; k <= L + iw + ow && !stages_ok; ++k) {
          if ((L + iw + ow + k - 1) / k == n) per_stage = k, stages_ok = true;
        }
      }
      if (!stages_ok) continue;
      out.push_back(fmt::format("pipeline_parallel_first_stage_less_layers = {}", iw));
      out.push_back(fmt::format("pipeline_parallel_last_stage_less_layers = {}", ow));
      if (per_stage)
        out.push_back(fmt::format("pipeline_parallel_layers_per_stage = {}", *per_stage));
      return out;
    }
  }
  // Every stage's modules (torchtitan v0.2.2's names: tok_embeddings, layers.i, norm, output).
  std::string parts;
  for (Count i = 0; i < n; ++i) {
    std::string part;
    auto add = [&part](const std::string& name) {
      part += (part.empty() ? "\"" : ", \"") + name + "\"";
    };
    if (i == 0) add("tok_embeddings");
    const Count first = split.first[static_cast<std::size_t>(i)];
    for (Count k = 0; k < split.layers[static_cast<std::size_t>(i)]; ++k)
      add(fmt::format("layers.{}", first + k));
    if (i == n - 1) add("norm"), add("output");
    parts += (i == 0 ? "[" : ", [") + part + "]";
  }
  out.push_back("module_fqns_per_model_part = [" + parts + "]");
  return out;
}

}  // namespace distplan::search::detail
