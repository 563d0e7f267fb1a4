// The human view of a plan (`--format table`): memory per stage in GiB, what dominates,
// communication per group, time and MFU, and what would make a layout fit.
#pragma once

#include <string>
#include <vector>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"

namespace distplan {

/// A single change to the layout and the peak memory it saves, for "what would make it fit".
struct FitSuggestion {
  std::string change;    // "ZeRO-2", "selective recompute", "tp=8", ...
  Scenario scenario;     // the changed scenario
  Bytes peak_bytes = 0;  // its peak
  Bytes saving_bytes = 0;
  bool fits = false;
};

/// Single-step changes of the layout that lower the peak, best first.
[[nodiscard]] std::vector<FitSuggestion> fit_suggestions(const Scenario& s, const Estimate& e);

[[nodiscard]] std::string format_plan_table(const Scenario& s, const Estimate& e);

}  // namespace distplan
