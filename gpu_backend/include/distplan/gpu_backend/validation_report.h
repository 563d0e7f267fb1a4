// The validation comparison: a run's measurement held against the plan and the simulator with the
// measured costs (docs/gpu_backend.md "distplan validate"). One typed report that `distplan
// validate` prints (to_json: the distplan.validate/v1 document; to_table: the human table) and
// that other front ends read instead of re-deriving the figures.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/run.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"
#include "distplan/simulator/simulate.h"

namespace distplan::backend {

/// (measured − predicted) / predicted; empty ("n/a", JSON null) when the prediction is 0 and the
/// measurement is not.
using RelativeError = std::optional<double>;
[[nodiscard]] RelativeError relative_error(double predicted, double measured) noexcept;

/// How the run was made.
struct ValidationSettings {
  std::string device = "cpu";  // "cpu" or "cuda"
  Count steps = 1;
  int emulate_rank = -1;    // >= 0: one rank of the layout in process
  bool local_ranks = true;  // every rank on this host (for the oversubscription note)
  unsigned host_cores = 0;  // this host's hardware threads (0: unknown)
};

/// The categories of a measured stage (StageMemoryMeasured::bytes): the plan's less the runtime,
/// then temporaries (measured only), the tracked joint peak and the allocator's reserved bytes.
inline constexpr const char* kMeasuredCategories[] = {"weights",     "gradients", "optimizer",
                                                      "activations", "buffers",   "temporaries",
                                                      "total",       "reserved"};
/// The categories compared (StageMemoryError::by_category), in the order of the plan's stage
/// memory; total: tracked; reserved: the caching-allocator model's reserved bytes, less the
/// runtime.
inline constexpr const char* kComparedCategories[] = {
    "weights", "gradients", "optimizer", "activations", "buffers", "runtime", "total", "reserved"};

/// Peak bytes of one stage (the largest figure of its ranks) per category: weights, gradients,
/// optimizer, activations, buffers, temporaries, total (the tracked joint peak).
struct StageMemoryMeasured {
  int stage = 0;
  std::map<std::string, Bytes> bytes;
};
/// Per category of the plan (weights .. buffers, runtime, total): runtime is never measured
/// (empty); total is compared with the predicted total less the runtime reserve.
struct StageMemoryError {
  int stage = 0;
  std::map<std::string, RelativeError> by_category;
};

/// Bytes handed and calls of one (group, op, what) in a step.
struct CollectiveSum {
  std::string group, op, what;
  Bytes bytes_per_step = 0;
  Count calls_per_step = 0;
};
struct StageCollectives {
  int stage = 0;
  Bytes wire_bytes_per_gpu_per_step = 0;
  std::vector<CollectiveSum> collectives;  // sorted by (group, op, what)
  /// Summed per "group/op".
  std::map<std::string, CommTotals> by_op;
};
struct StageCollectivesError {
  int stage = 0;
  RelativeError wire_bytes_per_gpu_per_step;
  std::map<std::string, RelativeError> by_op;  // "group/op"
};

struct MeasuredTime {
  Seconds step_seconds = 0;       // the slowest rank
  Seconds compute_seconds = 0;    // the busiest stage's executed actions
  double bubble_fraction = 0;     // 1 − busy / (pp · step), when every stage was measured
  Seconds optimizer_seconds = 0;  // the slowest rank's
};

struct ValidationReport {
  Scenario scenario;
  Estimate estimate;
  ValidationSettings settings;
  Count ranks = 1;
  // Out of memory is a result: then only `oom_message` is measured.
  bool fits = true;
  std::string oom_message;
  // Memory
  Bytes peak_bytes = 0;
  bool in_gib = false;  // the table's unit: GiB for real models, MiB for small ones
  std::vector<StageMemoryMeasured> memory;
  std::vector<StageMemoryError> memory_error;
  RelativeError peak_error;
  // Collectives per measured stage: the planner's stage_communication and the stage's first rank
  std::vector<StageCollectives> predicted_collectives, measured_collectives;
  std::vector<StageCollectivesError> collectives_error;
  Bytes busiest_wire_bytes = 0;
  // Time: the simulator with the measured costs against the measured step less the optimizer
  sim::CostOverride costs;
  Seconds simulated_step_seconds = 0;
  double simulated_bubble_fraction = 0;
  MeasuredTime time;
  RelativeError simulated_step_error;
  std::optional<RelativeError> bubble_error;  // when every stage was measured
  std::optional<RelativeError> step_error;    // the planner's analytic step, CUDA only
  std::vector<double> losses;
  std::vector<bool> skipped;
};

/// The ranks of the layout: tp * cp * dp * pp.
[[nodiscard]] Count ranks_of(const Scenario& s) noexcept;
/// Fills `c.by_op` from `c.collectives` (bytes and calls summed per "group/op").
void sum_by_op(StageCollectives& c);
/// The planner's collectives of `stage` (stage_communication) summed per (group, op, what).
[[nodiscard]] StageCollectives planned_collectives(const Scenario& s, int stage);
/// The report's memory unit: GiB when the plan's peak less the runtime reserve reaches 1 GiB,
/// MiB (the small models a CPU runs) below.
[[nodiscard]] bool memory_in_gib(const Scenario& s, const Estimate& e) noexcept;
/// The simulator with the measured forward/backward costs and no exposed communication.
[[nodiscard]] sim::SimResult simulate_with_measured_costs(const Scenario& s, const Estimate& e,
                                                          const sim::CostOverride& costs);

/// Compares `m` (every rank that ran; null when the run did not fit, with `oom_message`) with
/// the plan `e` of `s` and the simulator run with the measured costs.
[[nodiscard]] ValidationReport compare(const Scenario& s, const Estimate& e, const Measurement* m,
                                       const std::string& oom_message,
                                       const ValidationSettings& settings);

/// The relative errors of a report from its predicted and measured figures (compare() and the
/// reader of a saved report both call it: an error is never taken from anywhere else).
void fill_errors(ValidationReport& r);

/// The distplan.validate/v1 document (docs/api.md).
[[nodiscard]] nlohmann::json to_json(const ValidationReport& r);
/// Reads a distplan.validate/v1 document (to_json's) back into the report: the inverse of to_json,
/// so to_json(validation_report_from_json(to_json(r))) == to_json(r). The plan is not read but
/// recomputed: the scenario is parsed as every command parses one, estimate() plans it, and the
/// planned collectives and the simulated step (with the document's measured costs) are computed
/// again; the document's predicted figures must equal those, so a file from another planner
/// version or an edited one is refused, not shown with other numbers. Every measured figure and
/// relative error is read with its type and range checked. Bad input throws InputError naming the
/// JSON pointer ("/measured/memory/stages/0/weights_bytes") and the reason.
[[nodiscard]] ValidationReport validation_report_from_json(const nlohmann::json& doc);

/// The human table of `distplan validate --format table`.
[[nodiscard]] std::string to_table(const ValidationReport& r);

}  // namespace distplan::backend
