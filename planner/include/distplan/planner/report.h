// The human view of a plan (`--format table`): memory per stage in GiB, what dominates,
// communication per group, time and MFU, and what would make a layout fit.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"

namespace distplan {

/// Plans a changed scenario for "what would make it fit": sim::plan (the schedule walk) in every
/// front end, so a suggestion's peak and step time are the plan's own (docs/time.md).
using PlanFunction = std::function<Estimate(const Scenario&)>;

/// A single change to the layout and the peak memory it saves, for "what would make it fit".
struct FitSuggestion {
  std::string change;    // "ZeRO-2", "selective recompute", "tp=8", ...
  Scenario scenario;     // the changed scenario
  Bytes peak_bytes = 0;  // its peak
  Bytes saving_bytes = 0;
  bool fits = false;
  bool more_gpus = false;         // needs more GPUs than the scenario has
  Seconds step_seconds = 0;       // its step time
  Seconds time_cost_seconds = 0;  // its step time minus the scenario's (negative: faster)
};

/// Single-step changes of the layout that lower the peak (and, when no single one fits, the
/// greedy combination that does), ordered: first what fits on the scenario's GPUs, cheapest in
/// step time first; then the rest on the same GPUs, lowest peak first; then those needing more
/// GPUs, lowest peak first.
[[nodiscard]] std::vector<FitSuggestion> fit_suggestions(const Scenario& s, const Estimate& e,
                                                         const PlanFunction& plan);

/// The table of `e`, the plan of `s`; `plan` plans the changes that would make it fit.
[[nodiscard]] std::string format_plan_table(const Scenario& s, const Estimate& e,
                                            const PlanFunction& plan);

}  // namespace distplan
