// Runs the simulator on a scenario and turns its result into what the GUI draws (built only when
// distplan::simulator is).
#pragma once

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"
#include "plansession.h"

namespace distplan::gui {

/// Simulates one step with the trace recorded. Tokens/s and MFU rescale the planner's analytic
/// figures by the ratio of step times (both are per-step quantities over the step time).
[[nodiscard]] SimulationSummary simulateScenario(const Scenario& s, const Estimate& e);

}  // namespace distplan::gui
