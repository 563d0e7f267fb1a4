// The path both fuzz targets drive: scenario_from_json → estimate → plan_to_json and the table view
// → simulate (when built) → simulate_to_json. Invalid input must end in InputError; anything else
// that escapes (another exception, a sanitizer report, a DISTPLAN_CHECK abort, a hang) is a
// finding, and so is a negative byte count or time.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"

#if DISTPLAN_FUZZ_SIMULATOR
#include "distplan/simulator/plan.h"
#include "distplan/simulator/simulate.h"
#include "distplan/simulator/simulate_json.h"
#endif

namespace distplan::fuzz {

/// simulate() has no bound on its work yet: a valid scenario with millions of micro-batches per
/// step (global_batch_size up to 2^32) runs for minutes and tens of GB (docs/trust.md, finding 2).
/// Until simulate() rejects such steps itself, the fuzzers simulate only steps of at most this
/// many passes (micro-batches × pipeline stages × virtual stages).
inline constexpr double kMaxSimulatedPasses = double(1 << 20);

inline void check(bool ok) {
  if (!ok) __builtin_trap();
}

inline void run_pipeline(const nlohmann::json& doc) {
  using nlohmann::json;
  try {
    const Scenario s = scenario_from_json(doc, {"costs"});
    const Estimate e = estimate(s);
    // The CLI writes with error_handler_t::replace (input strings may hold invalid UTF-8).
    const std::string out = plan_to_json(s, e).dump(2, ' ', false, json::error_handler_t::replace);
    check(!out.empty());
    check(e.memory.peak_bytes >= 0);
    for (const StageMemory& st : e.memory.stages) {
      check(st.weights_bytes >= 0 && st.gradients_bytes >= 0 && st.optimizer_bytes >= 0 &&
            st.activations_bytes >= 0 && st.buffers_bytes >= 0 && st.total_bytes >= 0);
    }
    check(e.time.step_seconds >= 0);
    // The planner alone (the simulator may not be built): its closed forms stand in for the plan.
    check(!format_plan_table(s, e, [](const Scenario& x) { return estimate(x); }).empty());
#if DISTPLAN_FUZZ_SIMULATOR
    const double passes =
        double(s.num_microbatches()) * double(s.parallel.pp) * double(s.parallel.virtual_stages);
    if (passes > kMaxSimulatedPasses) return;
    sim::SimOptions opts;
    if (const auto it = doc.find("costs"); it != doc.end()) {
      opts.costs = sim::cost_override_from_json(*it);
    }
    const sim::SimResult r = sim::simulate(s, e, opts);
    check(r.step_seconds >= 0);
    if (!opts.costs) {
      // The plan: the walk written into the estimate; its bubble is never negative.
      Estimate p = e;
      sim::apply_walk(s, r, p);
      check(p.time.bubble_seconds >= 0 && p.memory.peak_bytes >= 0);
    }
    check(!sim::simulate_to_json(s, r).dump(2, ' ', false, json::error_handler_t::replace).empty());
#endif
  } catch (const InputError&) {
    // Rejected with a path and a message: the intended outcome for bad input.
  }
}

}  // namespace distplan::fuzz
