// Calibration: fits the planner's named time assumptions to measured step times of real runs by
// nonlinear least squares on the relative step-time error (docs/calibration.md). JSON lives in
// calibrate_json.h.
#pragma once

#include <functional>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// One fittable assumption: a continuous field of `Assumptions` that the analytic step time
/// depends on. The table of them is in calibrate.cpp (`kFitParameters`).
struct FitParameter {
  std::string_view name;  // key under "assumptions" in a scenario and a calibration file
  double (*get)(const Assumptions&);
  void (*set)(Assumptions&, double);
  double lower;  // the fit stays inside [lower, upper] (and the scenario parser's range)
  double upper;
  std::string_view meaning;  // one line, for tables and docs
  /// For a field whose 0 means "the GPU preset's figure": the value a run's scenario then uses.
  /// The fit starts from the runs' mean of it when the starting value is that 0.
  double (*preset)(const Scenario&) = nullptr;
  /// Fitted when no --fit list is given (and the runs constrain it); the others only when named.
  bool by_default = true;
};

/// Get/set of a plain `double` member, so a table entry reads
/// `fit_field<&Assumptions::x>("x", lo, hi, "meaning")`.
template <double Assumptions::*M>
constexpr FitParameter fit_field(std::string_view name, double lower, double upper,
                                 std::string_view meaning) {
  return {name,
          [](const Assumptions& a) { return a.*M; },
          [](Assumptions& a, double v) { a.*M = v; },
          lower,
          upper,
          meaning};
}

/// As fit_field, for a field whose 0 stands for the GPU preset's value `preset(scenario)`.
template <double Assumptions::*M>
constexpr FitParameter preset_field(std::string_view name, double lower, double upper,
                                    std::string_view meaning, double (*preset)(const Scenario&)) {
  FitParameter f = fit_field<M>(name, lower, upper, meaning);
  f.preset = preset;
  return f;
}

/// A table entry fitted only when named (--fit), e.g. one that most sets of runs cannot tell apart
/// from the efficiencies.
constexpr FitParameter when_named(FitParameter f) {
  f.by_default = false;
  return f;
}

/// Every fittable assumption, in table order.
[[nodiscard]] std::span<const FitParameter> fit_parameters() noexcept;
/// The entry named `name`, or nullptr.
[[nodiscard]] const FitParameter* find_fit_parameter(std::string_view name) noexcept;

/// One measured run: a validated scenario and the step time measured for it. The paths are JSON
/// pointers into the input, used in error messages.
struct CalibrationRun {
  Scenario scenario;
  Seconds measured_step_seconds = 0;
  std::string path;           // the run, e.g. "/runs/3"
  std::string measured_path;  // the measurement, e.g. "/runs/3/measured/step_seconds"
  std::string name;           // optional label
};

/// The step time a fit matches: sim::plan's (the schedule walk), which the CLI and Python pass.
/// The planner cannot call the simulator, so calibrate() takes it as a function.
using StepTimeFunction = std::function<Seconds(const Scenario&)>;

struct CalibrationOptions {
  /// Required: the predicted step time of a scenario (docs/calibration.md).
  StepTimeFunction step_seconds;
  /// Names of the parameters to fit. Empty: every table entry the runs constrain (the others are
  /// listed in CalibrationResult::not_fitted). Named ones that the runs do not constrain are
  /// refused.
  std::vector<std::string> parameters;
  /// Starting values of the fitted fields (default: the shipped defaults of `Assumptions`). The
  /// fields not fitted come from each run's own scenario.
  Assumptions start;
  int max_iterations = 200;
  bool leave_one_out = true;
  /// Leave-one-out refits every run on all the others: n fits of n - 1 runs. Above this many runs
  /// it is not computed (the note says so), so a large input cannot take minutes.
  std::size_t max_leave_one_out_runs = 200;
  /// A fit plans every run hundreds of times (each Jacobian, each trial step, both starts, the
  /// leave-one-out refits), and a plan walks every (micro-batch, stage, chunk) pass: runs whose
  /// steps have more than this many passes in all are refused before any planning. 2^22 passes
  /// plan in about 6 s on one core (sim::plan: about 1.5 us a pass), a few hundred such sweeps
  /// would take an hour.
  double max_total_passes = 4194304.0;
};

struct RunFit {
  Seconds measured = 0;
  Seconds predicted_before = 0;  // the run's scenario as given (its own assumptions)
  Seconds predicted_after = 0;   // with the fitted assumptions
  std::optional<Seconds> predicted_leave_one_out;  // fitted without this run
};

struct NotFitted {
  std::string name;
  std::string reason;
};

struct CalibrationResult {
  std::vector<std::string> parameters;  // fitted, in table order
  std::vector<double> values;           // fitted values, same order
  std::vector<NotFitted> not_fitted;    // table entries left out (default selection only)
  std::vector<std::string> at_bound;    // fitted values that ended on a bound of the table
  Count runs = 0;
  int iterations = 0;
  double condition_number = 0;  // of JᵀJ at the solution, columns scaled to unit length
  double mape_before = 0;       // mean |predicted - measured| / measured, a fraction
  double mape_after = 0;
  std::optional<double> leave_one_out_mape;  // absent when a fold cannot be fitted
  std::string leave_one_out_note;            // why it is absent
  std::vector<RunFit> run_fits;

  /// `base` with the fitted values written in.
  [[nodiscard]] Assumptions apply(Assumptions base) const;
  /// As many parameters as runs: the fit can match every run whatever the model, so mape_after
  /// (near 0) says nothing about its accuracy; only runs it was not fitted to do.
  [[nodiscard]] bool exact_by_construction() const noexcept {
    return runs > 0 && static_cast<Count>(parameters.size()) >= runs;
  }
};

/// Fits. Throws InputError (naming the JSON path) when the fit is under-determined or degenerate:
/// fewer runs than parameters, a parameter no run depends on, parameters the runs cannot tell
/// apart (JᵀJ singular or ill-conditioned), a non-positive measurement, an unknown parameter name.
[[nodiscard]] CalibrationResult calibrate(const std::vector<CalibrationRun>& runs,
                                          const CalibrationOptions& options = {});

/// The step time `step` predicts for `scenario` with `assumptions` in place of its own.
[[nodiscard]] Seconds predicted_step_seconds(const StepTimeFunction& step, const Scenario& scenario,
                                             const Assumptions& assumptions);

}  // namespace distplan
