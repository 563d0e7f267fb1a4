// JSON of calibration: the runs document read by `distplan calibrate`, the
// `distplan.calibration/v1` document it writes, and reading that document back for
// `--calibration FILE` (docs/calibration.md, docs/api.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/calibrate.h"

namespace distplan {

/// Runs from `{"runs": [run, ...]}` or from one `distplan.validate/v1` document. A run is
/// `{"scenario": {...}, "measured": {"step_seconds": s}}` (or `"tokens_per_second"`; optional
/// `"name"`), or a `distplan.validate/v1` document measured on device "cuda". Errors name the
/// JSON pointer inside `doc`.
[[nodiscard]] std::vector<CalibrationRun> calibration_runs_from_json(const nlohmann::json& doc);

/// The `distplan.calibration/v1` document.
[[nodiscard]] nlohmann::json calibration_to_json(const CalibrationResult& r,
                                                 const std::vector<CalibrationRun>& runs);

/// The fitted values of a `distplan.calibration/v1` document: each key of its "assumptions" must
/// be a fittable assumption and lie inside the table's bounds.
[[nodiscard]] std::vector<std::pair<const FitParameter*, double>> calibration_from_json(
    const nlohmann::json& doc);

/// A scenario document with a calibration's values written over its "assumptions" (the
/// calibration wins over the scenario; fields it does not name keep the scenario's values).
void apply_calibration(nlohmann::json& scenario_doc,
                       const std::vector<std::pair<const FitParameter*, double>>& values);

/// The human view (`--format table`): fitted values, errors before and after, per-run table.
[[nodiscard]] std::string format_calibration_table(const CalibrationResult& r,
                                                   const std::vector<CalibrationRun>& runs);

}  // namespace distplan
