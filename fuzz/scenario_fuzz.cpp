// libFuzzer target: arbitrary bytes through the whole scenario path of `distplan plan` (and of
// `distplan simulate` when the simulator is built). Invalid input must end in InputError; anything
// else that escapes (another exception, a sanitizer report, a DISTPLAN_CHECK abort, a hang) is a
// finding. docs/trust.md describes how to run it and what it has found.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"

#if DISTPLAN_FUZZ_SIMULATOR
#include "distplan/simulator/simulate.h"
#include "distplan/simulator/simulate_json.h"
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json doc = distplan::parse_json_text(text);
    const distplan::Scenario s = distplan::scenario_from_json(doc, {"costs"});
    const distplan::Estimate e = distplan::estimate(s);
    // The CLI writes with error_handler_t::replace (input strings may hold invalid UTF-8).
    const std::string out =
        distplan::plan_to_json(s, e).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    if (out.empty()) __builtin_trap();
    // The `--format table` view reads every figure too.
    if (distplan::format_plan_table(s, e).empty()) __builtin_trap();
#if DISTPLAN_FUZZ_SIMULATOR
    distplan::sim::SimOptions opts;
    if (const auto it = doc.find("costs"); it != doc.end()) {
      opts.costs = distplan::sim::cost_override_from_json(*it);
    }
    const distplan::sim::SimResult r = distplan::sim::simulate(s, e, opts);
    const std::string sim_out = distplan::sim::simulate_to_json(s, r).dump(
        2, ' ', false, nlohmann::json::error_handler_t::replace);
    if (sim_out.empty()) __builtin_trap();
#endif
  } catch (const distplan::InputError&) {
    // Rejected with a path and a message: the intended outcome for bad input.
  }
  return 0;
}
