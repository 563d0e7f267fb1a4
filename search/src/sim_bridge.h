// The seam between the search and the simulator: the search re-ranks its best plans by simulated
// step time when the simulator is linked (DISTPLAN_SEARCH_HAVE_SIMULATOR), and by the planner's
// analytic time otherwise.
#pragma once

#include <optional>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"

namespace distplan::search::detail {

struct SimFigures {
  Seconds step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  double bubble_fraction = 0;
};

[[nodiscard]] bool simulator_available() noexcept;
/// Simulated figures of one layout; nullopt when the simulator is not linked or refuses it.
[[nodiscard]] std::optional<SimFigures> simulate_figures(const Scenario& s, const Estimate& e);

}  // namespace distplan::search::detail
