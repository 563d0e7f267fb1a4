// Semantic validation of a scenario whose fields parsed: layout arithmetic, divisibility, limits.
#pragma once

#include "distplan/planner/spec.h"

namespace distplan {

/// Throws InputError naming the JSON path of the first field that makes the scenario invalid.
/// Fills nothing: defaults are filled by the JSON reader before this runs.
/// `refuse_unplanned`: also refuse a model whose parameters are counted but whose memory,
/// communication and time are not yet planned (MoE, MLA, MTP; moe_json.h); the training backend
/// passes false (scenario_for_training).
void validate_scenario(const Scenario& s, bool refuse_unplanned = true);

}  // namespace distplan
