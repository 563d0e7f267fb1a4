// Prediction intervals for throughput from the public corpus of measured runs
// (data/reference/runs_*.json; docs/fidelity.md, "Prediction intervals"): the planner's own
// errors on published runs of the same kind, as a range the measured value is expected in.
#pragma once

#include <string_view>

#include "distplan/planner/report.h"
#include "distplan/planner/spec.h"

namespace distplan {

/// The kind a scenario is judged by: its runs' residuals set the interval.
enum class RunKind { dense, fp8, cp, moe };
[[nodiscard]] std::string_view to_string(RunKind v) noexcept;
/// MoE over CP over FP8 over dense (the first that applies).
[[nodiscard]] RunKind run_kind(const Scenario& s) noexcept;

struct ThroughputInterval {
  double low = 0;           // tokens per second (the job's), lower end
  double high = 0;          // upper end
  double confidence = 0.9;  // two-sided
  RunKind kind = RunKind::dense;
  bool pooled = false;        // too few runs of the kind: all planned corpus runs
  int runs = 0;               // corpus runs behind it
  double mean_log_error = 0;  // mean of ln(measured / predicted) over those runs
};

/// The 90 % prediction interval of a scenario's measured tokens/s, given the planner's
/// prediction: the corpus residuals r = ln(measured / predicted) of the planned runs of the
/// scenario's kind (all planned runs when fewer than 5), read as a normal sample:
/// predicted · exp(mean ± t(0.95, n−1) · sd · sqrt(1 + 1/n)). The corpus is planned with `plan`
/// (the schedule walk, sim::plan, as every face plans) once per process, thread-safe: the first
/// call's function sets the residuals.
[[nodiscard]] ThroughputInterval throughput_interval(const Scenario& s,
                                                     double predicted_tokens_per_second,
                                                     const PlanFunction& plan);

}  // namespace distplan
