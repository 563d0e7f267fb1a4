// The distplan.validate/v1 document (docs/api.md) of a validation report (validation_report.h).
#include "validation_report_json.h"

#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::backend {
namespace {

using nlohmann::json;

json to_json(const RelativeError& e) {
  return e ? json(*e) : json(nullptr);
}

}  // namespace

json stage_collectives_json(const StageCollectives& c) {
  json list = json::array();
  for (const CollectiveSum& x : c.collectives)
    list.push_back({{"group", x.group},
                    {"op", x.op},
                    {"what", x.what},
                    {"bytes_per_step", x.bytes_per_step},
                    {"calls_per_step", x.calls_per_step}});
  return {{"stage", c.stage},
          {"wire_bytes_per_gpu_per_step", c.wire_bytes_per_gpu_per_step},
          {"collectives", list}};
}

json to_json(const ValidationReport& r) {
  const json plan = plan_to_json(r.scenario, r.estimate);
  json predicted = {{"memory", plan.at("memory")},
                    {"communication", plan.at("communication")},
                    {"time", plan.at("time")}};
  const Scenario& s = r.scenario;
  if (!r.fits) {
    return {{"schema", "distplan.validate/v1"},
            {"scenario", to_json(s)},
            {"device", r.settings.device},
            {"steps", r.settings.steps},
            {"predicted", predicted},
            {"measured", {{"memory", {{"fits", false}, {"message", r.oom_message}}}}},
            {"relative_error", {{"memory", {{"fits", r.estimate.memory.fits ? 1.0 : 0.0}}}}},
            {"losses", json::array()}};
  }
  json measured, err;
  json mstages = json::array(), estages = json::array();
  for (const StageMemoryMeasured& ms : r.memory) {
    json j = {{"stage", ms.stage}};
    for (const auto& [k, v] : ms.bytes) j[k + "_bytes"] = v;
    mstages.push_back(j);
  }
  for (const StageMemoryError& es : r.memory_error) {
    json j = {{"stage", es.stage}};
    for (const auto& [k, v] : es.by_category) j[k + "_bytes"] = to_json(v);
    estages.push_back(j);
  }
  measured["memory"] = {{"capacity_bytes", r.estimate.memory.capacity_bytes},
                        {"peak_bytes", r.peak_bytes},
                        {"fits", true},
                        {"stages", mstages}};
  err["memory"] = {{"peak_bytes", to_json(r.peak_error)}, {"stages", estages}};

  json pcs = json::array(), mcs = json::array(), ecs = json::array();
  for (const StageCollectives& c : r.predicted_collectives)
    pcs.push_back(stage_collectives_json(c));
  for (const StageCollectives& c : r.measured_collectives) mcs.push_back(stage_collectives_json(c));
  for (const StageCollectivesError& c : r.collectives_error) {
    json eo = json::object();
    for (const auto& [k, v] : c.by_op) eo[k] = to_json(v);
    ecs.push_back({{"stage", c.stage},
                   {"wire_bytes_per_gpu_per_step", to_json(c.wire_bytes_per_gpu_per_step)},
                   {"collectives", eo}});
  }
  predicted["communication"]["stages"] = pcs;
  measured["communication"] = {{"wire_bytes_per_gpu_per_step", r.busiest_wire_bytes},
                               {"stages", mcs}};
  err["communication"] = {{"stages", ecs}};

  predicted["time"]["simulated_step_seconds"] = r.simulated_step_seconds;
  predicted["time"]["simulated_bubble_fraction"] = r.simulated_bubble_fraction;
  predicted["time"]["costs"] = {
      {"forward_seconds", r.costs.forward_seconds},
      {"backward_seconds", r.costs.backward_seconds},
      {"backward_weight_seconds",
       r.costs.backward_weight_seconds ? json(*r.costs.backward_weight_seconds) : json(nullptr)}};
  measured["time"] = {{"step_seconds", r.time.step_seconds},
                      {"compute_seconds", r.time.compute_seconds},
                      {"bubble_fraction", r.time.bubble_fraction},
                      {"optimizer_seconds", r.time.optimizer_seconds}};
  err["time"] = {{"simulated_step_seconds", to_json(r.simulated_step_error)}};
  if (r.bubble_error) err["time"]["bubble_fraction"] = to_json(*r.bubble_error);
  if (r.step_error) err["time"]["step_seconds"] = to_json(*r.step_error);

  return {{"schema", "distplan.validate/v1"},
          {"scenario", to_json(s)},
          {"device", r.settings.device},
          {"steps", r.settings.steps},
          {"ranks", r.ranks},
          {"emulate_rank",
           r.settings.emulate_rank >= 0 ? json(r.settings.emulate_rank) : json(nullptr)},
          {"predicted", predicted},
          {"measured", measured},
          {"relative_error", err},
          {"losses", r.losses},
          {"skipped_steps", r.skipped}};
}

}  // namespace distplan::backend
