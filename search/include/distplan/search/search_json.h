// JSON of the search: the input (a scenario whose `parallel` and `training.micro_batch_size` may be
// omitted or hold lists of candidates, plus a `search` object) and the `distplan.search/v1`
// answer. Parsing is strict: unknown fields and bad values throw InputError with their JSON path.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "distplan/search/search.h"

namespace distplan::search {

struct Request {
  Space space;
  Options options;
};

/// Parses a scenario document (as scenario_from_json does). The CLI passes one that applies
/// --hf-config; the default calls scenario_from_json(doc, {"search"}).
using ScenarioParser = std::function<Scenario(const nlohmann::json& doc)>;

/// Reads a search request. The parts of the scenario that are not searched (model, cluster,
/// training, assumptions) are read and validated by the planner's reader.
[[nodiscard]] Request request_from_json(const nlohmann::json& doc,
                                        const ScenarioParser& parse_scenario = {});

/// The `distplan.search/v1` document.
[[nodiscard]] nlohmann::json result_to_json(const Request& request, const Result& result);
[[nodiscard]] nlohmann::json layout_to_json(const Layout& layout);

/// The human view (`--format table`): plans in GiB and ms, rejections, suggestions.
[[nodiscard]] std::string format_result_table(const Request& request, const Result& result);

}  // namespace distplan::search
