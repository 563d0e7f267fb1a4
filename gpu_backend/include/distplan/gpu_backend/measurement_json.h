// JSON form of a backend measurement (`distplan.measurement/v1`), kept apart from run.h so the
// core headers never include nlohmann/json.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "distplan/gpu_backend/run.h"

namespace distplan::backend {

[[nodiscard]] nlohmann::json to_json(const RankMeasurement& r);
[[nodiscard]] RankMeasurement rank_measurement_from_json(const nlohmann::json& j);
[[nodiscard]] nlohmann::json to_json(const Measurement& m);
[[nodiscard]] Measurement measurement_from_json(const nlohmann::json& j);

/// The executed timeline of the measured step as a Chrome / Perfetto trace, in the simulator's
/// format (sim::trace_to_json: one process per stage, one thread per stream, slices named by
/// micro-batch and chunk): one rank per stage, the first of each stage in rank order (tp = 0,
/// dp = 0 in a full run). Times are from each rank's step start.
[[nodiscard]] std::string timeline_trace_json(const Measurement& m);

}  // namespace distplan::backend
