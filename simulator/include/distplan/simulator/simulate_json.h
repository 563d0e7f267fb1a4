// JSON of the simulator: the `costs` input object, the `distplan.simulate/v1` document, the
// Chrome / Perfetto trace, and the human table. Kept apart from simulate.h so the core header
// never includes JSON.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/spec.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {

/// Parses API.md's `costs` object strictly: unknown fields, wrong types, negative or non-finite
/// numbers throw InputError naming the field ("/costs/forward_sec"). `path` is the object's own.
[[nodiscard]] CostOverride cost_override_from_json(const nlohmann::json& j,
                                                   std::string_view path = "/costs");

/// The `distplan.simulate/v1` document (API.md).
[[nodiscard]] nlohmann::json simulate_to_json(const Scenario& s, const SimResult& r);

/// Chrome trace-event JSON ({"traceEvents": [...]}) of a run made with record_trace: one process
/// per stage, one thread per stream, "X" slices in microseconds, and an activation-memory counter.
/// Opens in ui.perfetto.dev and chrome://tracing.
[[nodiscard]] std::string trace_to_json(const SimResult& r);

/// `--format table`: step time and bubbles, and per stage busy time, idle time, peak in-flight
/// micro-batches and activation memory (ms and GiB, labelled).
[[nodiscard]] std::string format_simulate_table(const Scenario& s, const SimResult& r);

}  // namespace distplan::sim
