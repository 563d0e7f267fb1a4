// Reading and writing schedule programs: JSON and CSV (one row per stage). Kept apart from
// schedule.h so the core header never includes JSON. Format: docs/simulator.md, "Schedule files".
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "distplan/simulator/schedule.h"

namespace distplan::sim {

/// Parses one action token: "F3", "B3", "BI3", "W3", optionally ".c" for chunk c ("F3.1").
/// Throws InputError at `path`.
[[nodiscard]] Action parse_action(std::string_view token, const std::string& path);

/// {"stages": [["F0", "F1", "B0", ...], ...], "microbatches": m, "virtual_stages": v}; actions may
/// also be objects {"op": "forward", "microbatch": 0, "chunk": 0}. m and v default to the largest
/// micro-batch / chunk seen plus one. Unknown fields are an error. Does not run check_program.
[[nodiscard]] SchedulePrograms schedule_from_json(const nlohmann::json& doc);
/// Row s = the program of stage s, actions separated by commas; blank lines and lines starting
/// with '#' are skipped. Error paths are "/stages/<row>/<column>".
[[nodiscard]] SchedulePrograms schedule_from_csv(std::string_view text);
/// JSON when the text starts with '{', CSV otherwise.
[[nodiscard]] SchedulePrograms schedule_from_text(std::string_view text);

[[nodiscard]] nlohmann::json schedule_to_json(const SchedulePrograms& prog);
[[nodiscard]] std::string schedule_to_csv(const SchedulePrograms& prog);

}  // namespace distplan::sim
