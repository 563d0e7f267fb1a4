// Private to distplan::validation: the JSON of one stage's collectives, written by to_json and
// held against the planned collectives when a document is read back.
#pragma once

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/validation_report.h"

namespace distplan::backend {

[[nodiscard]] nlohmann::json stage_collectives_json(const StageCollectives& c);

}  // namespace distplan::backend
