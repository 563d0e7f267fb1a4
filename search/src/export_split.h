// The pipeline split in each framework's own flags (docs/exports.md, "Pipeline splits"): the
// plan's layers per virtual stage (pipeline_split.h) written as the framework's code reads them.
#pragma once

#include <string>
#include <vector>

#include "distplan/planner/spec.h"

namespace distplan::search::detail {

/// Megatron-LM arguments for the plan's split, in the order they are written: nothing for an
/// equal split without VPP; --num-layers-per-virtual-pipeline-stage for an equal split with VPP;
/// --account-for-embedding/loss-in-pipeline-split or --decoder-first/last-pipeline-num-layers
/// (with --num-virtual-stages-per-pipeline-rank under VPP) where the plan's split is what
/// get_num_layers_to_build computes from them; else --pipeline-model-parallel-layout, which
/// states every virtual stage. Empty `notes` unless Megatron-LM cannot run the split (a V or
/// DualPipe placement).
struct SplitArgs {
  std::vector<std::string> args;
  std::vector<std::string> notes;
};
[[nodiscard]] SplitArgs megatron_split_args(const Scenario& s);

/// torchtitan [parallelism] lines for the plan's split: pipeline_parallel_first_stage_less_layers
/// and pipeline_parallel_last_stage_less_layers (the plan's torchtitan weights, else 1 and 1,
/// else 0 and 0; with pipeline_parallel_layers_per_stage for more than two stages per rank) where
/// torchtitan's _generate_llm_fqn_per_model_part computes the plan's split from them, else
/// module_fqns_per_model_part, every stage's modules.
[[nodiscard]] std::vector<std::string> torchtitan_split_lines(const Scenario& s);

}  // namespace distplan::search::detail
