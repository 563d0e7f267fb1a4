// Helpers shared by the planner tests.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::testing {

/// A reference case from data/reference/ (compiled into the planner).
inline nlohmann::json reference(const std::string& name) {
  return nlohmann::json::parse(*embedded_data_file("reference/" + name));
}

/// The embedded default scenario as JSON, to be modified by a test.
inline nlohmann::json default_doc() {
  return parse_json_text(default_scenario_text());
}

inline Scenario scenario(const nlohmann::json& doc) {
  return scenario_from_json(doc);
}

}  // namespace distplan::testing
