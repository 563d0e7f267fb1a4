// The plan of one scenario: the planner's estimate (memory by category, communication, FLOPs and
// the stage costs) with its step time and each stage's activations and allocated peak taken from
// the walk of the schedule program over those costs (simulate()). This is the one timing engine:
// plan, simulate, search and calibrate all report it, so they agree by construction; estimate()'s
// closed forms remain as lower bounds for the search's pruning (docs/time.md, "One timing
// engine").
#pragma once

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {

struct PlanOptions {
  /// Also walk the step with every communication at zero time, to report the exposed part (a
  /// second walk; the search, which needs the step time only, turns it off).
  bool exposed_communication = true;
};

/// Plans a validated scenario. Throws InputError where simulate() does (a step of more than
/// kMaxPasses passes).
[[nodiscard]] Estimate plan(const Scenario& s, const PlanOptions& opts = {});

/// The plan's step time alone (one walk, no exposed-communication walk): what calibrate fits
/// (CalibrationOptions::step_seconds) and the search ranks by.
[[nodiscard]] Seconds plan_step_seconds(const Scenario& s);

/// Writes a simulated step into the estimate it was simulated from: the time (step, bubble,
/// exposed communication, MFU) and, per stage, the in-flight activations, the activations and
/// transient at the stage's joint peak and the totals that follow from them (memory_terms.h,
/// stage_totals), and whether the largest stage fits.
void apply_walk(const Scenario& s, const SimResult& r, Estimate& e);

}  // namespace distplan::sim
