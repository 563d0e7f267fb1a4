// Semantic validation of a scenario whose fields parsed: layout arithmetic, divisibility, limits.
#pragma once

#include "distplan/planner/spec.h"

namespace distplan {

/// Throws InputError naming the JSON path of the first field that makes the scenario invalid.
/// Fills nothing: defaults are filled by the JSON reader before this runs.
void validate_scenario(const Scenario& s);

}  // namespace distplan
