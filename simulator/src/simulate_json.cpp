// JSON and text views of a simulation (API.md, `distplan simulate`; docs/simulator.md, "Trace").
#include "distplan/simulator/simulate_json.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::sim {

namespace {

// A pass of at most 1e6 s (11.6 days): with at most 2^24 passes a step stays far below overflow
// (costs of 1e308 gave an infinite step).
constexpr double kMaxCostSeconds = 1e6;

Seconds cost_field(const nlohmann::json& x, const std::string& path) {
  if (!x.is_number()) throw InputError(path, "must be a number of seconds");
  const double v = x.get<double>();
  if (!std::isfinite(v) || v < 0 || v > kMaxCostSeconds)
    throw InputError(
        path, fmt::format("must be a number of seconds between 0 and {:g}", kMaxCostSeconds));
  return v;
}

constexpr double kMillis = 1e3;

}  // namespace

CostOverride cost_override_from_json(const nlohmann::json& j, std::string_view path) {
  const std::string base(path);
  if (!j.is_object()) throw InputError(base, "costs must be an object");
  CostOverride c;
  for (const auto& [key, value] : j.items()) {
    const std::string p = base + "/" + key;
    if (key == "forward_seconds")
      c.forward_seconds = cost_field(value, p);
    else if (key == "backward_seconds")
      c.backward_seconds = cost_field(value, p);
    else if (key == "backward_weight_seconds")
      c.backward_weight_seconds = cost_field(value, p);
    else if (key == "p2p_seconds")
      c.p2p_seconds = cost_field(value, p);
    else if (key == "forward_backward_seconds")
      c.forward_backward_seconds = cost_field(value, p);
    else
      throw InputError(p, fmt::format("unknown field '{}' (costs takes forward_seconds, "
                                      "backward_seconds, backward_weight_seconds, p2p_seconds, "
                                      "forward_backward_seconds)",
                                      key));
  }
  // Costs replace the whole cost model: without a forward or backward time (`{}`) the step would
  // silently take 0 s.
  if (!j.contains("forward_seconds") && !j.contains("backward_seconds"))
    throw InputError(base + "/forward_seconds",
                     "costs need forward_seconds or backward_seconds (they replace the whole cost "
                     "model; an empty costs object would give a step of 0 s)");
  return c;
}

nlohmann::json simulate_to_json(const Scenario& s, const SimResult& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageResult& st : r.stages) {
    stages.push_back({{"stage", st.stage},
                      {"busy_seconds", st.busy_seconds},
                      {"idle_seconds", r.step_seconds - st.busy_seconds},
                      {"span_idle_seconds", st.span_idle_seconds},
                      {"first_start_seconds", st.first_start_seconds},
                      {"compute_end_seconds", st.compute_end_seconds},
                      {"end_seconds", st.end_seconds},
                      {"peak_inflight_microbatches", st.peak_inflight_microbatches},
                      {"peak_inflight_chunks", st.peak_inflight_chunks},
                      {"peak_activation_bytes", st.peak_activation_bytes},
                      {"peak_allocated_bytes", st.peak_allocated_bytes},
                      {"send_seconds", st.send_seconds},
                      {"dp_communication_seconds", st.dp_communication_seconds},
                      {"optimizer_seconds", st.optimizer_seconds}});
  }
  return {{"schema", "distplan.simulate/v1"},
          {"scenario", to_json(s)},
          {"schedule", to_string(s.parallel.schedule)},
          {"num_microbatches", r.microbatches},
          {"virtual_stages", r.virtual_stages},
          {"step_seconds", r.step_seconds},
          {"bubble_fraction", r.bubble_fraction},
          {"exposed_communication_seconds", r.exposed_communication_seconds},
          {"events", r.events},
          {"stages", std::move(stages)}};
}

std::string format_simulate_table(const Scenario& s, const SimResult& r) {
  std::string out;
  out += fmt::format("framework {}\n", framework_title(s.training.framework));
  out +=
      fmt::format("schedule {}  pp={} virtual_stages={} micro-batches={}\n",
                  to_string(s.parallel.schedule), s.parallel.pp, r.virtual_stages, r.microbatches);
  out += fmt::format("step time            {:12.3f} ms\n", r.step_seconds * kMillis);
  out += fmt::format("bubble fraction      {:12.2f} %\n", r.bubble_fraction * 100.0);
  out +=
      fmt::format("exposed comm         {:12.3f} ms\n", r.exposed_communication_seconds * kMillis);
  out +=
      fmt::format("\n{:>5}  {:>12}  {:>12}  {:>12}  {:>9}  {:>14}  {:>14}\n", "stage", "busy (ms)",
                  "idle (ms)", "end (ms)", "in-flight", "act. (GiB)", "alloc. (GiB)");
  for (const StageResult& st : r.stages) {
    out += fmt::format("{:>5}  {:>12.3f}  {:>12.3f}  {:>12.3f}  {:>9}  {:>14.3f}  {:>14.3f}\n",
                       st.stage, st.busy_seconds * kMillis,
                       (r.step_seconds - st.busy_seconds) * kMillis, st.end_seconds * kMillis,
                       st.peak_inflight_microbatches, to_gib(st.peak_activation_bytes),
                       to_gib(st.peak_allocated_bytes));
  }
  return out;
}

}  // namespace distplan::sim
