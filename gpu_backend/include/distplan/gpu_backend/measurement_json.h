// JSON form of a backend measurement (`distplan.measurement/v1`), kept apart from run.h so the
// core headers never include nlohmann/json.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "distplan/gpu_backend/run.h"

namespace distplan::backend {

[[nodiscard]] nlohmann::json to_json(const RankMeasurement& r);
[[nodiscard]] RankMeasurement rank_measurement_from_json(const nlohmann::json& j);
[[nodiscard]] nlohmann::json to_json(const Measurement& m);
[[nodiscard]] Measurement measurement_from_json(const nlohmann::json& j);

}  // namespace distplan::backend
