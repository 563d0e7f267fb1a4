// Calibration documents: the runs read by `distplan calibrate`, distplan.calibration/v1 written by
// it and read back by --calibration (docs/calibration.md).
#include "distplan/planner/calibrate_json.h"

#include <cmath>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"
#include "json_reader.h"

namespace distplan {

using detail::ObjectReader;
using nlohmann::json;

namespace {

constexpr std::string_view kValidateSchema = "distplan.validate/v1";
constexpr std::string_view kCalibrationSchema = "distplan.calibration/v1";
constexpr double kMaxSeconds = 1e9;
constexpr double kMaxTokensPerSecond = 1e15;
// Each fit iteration estimates every run a few times; this bounds a fit to seconds.
constexpr std::size_t kMaxRuns = 10000;

Scenario scenario_at(const json& doc, const std::string& path) {
  try {
    return scenario_from_json(doc);
  } catch (const InputError& e) {
    throw InputError(path + e.path(), e.what());
  }
}

bool is_validate_document(const json& j) {
  return j.is_object() && j.contains("schema") && j.at("schema").is_string() &&
         j.at("schema").get<std::string>() == kValidateSchema;
}

// A distplan.validate/v1 result: its echoed scenario and measured.time.step_seconds. Other fields
// are validate's own and are not read.
CalibrationRun run_from_validate(const json& doc, const std::string& path) {
  CalibrationRun run;
  run.path = path;
  if (!doc.contains("scenario"))
    throw InputError(path + "/scenario", "a validate result must carry its scenario");
  run.scenario = scenario_at(doc.at("scenario"), path + "/scenario");
  // The planner's time is for the scenario's GPU: a run on the CPU backend (or one emulated rank,
  // whose collectives move no data) measures something else.
  const json* device = doc.contains("device") ? &doc.at("device") : nullptr;
  if (device == nullptr || !device->is_string() || device->get<std::string>() != "cuda") {
    throw InputError(path + "/device",
                     fmt::format("a validate result measured on {} does not time the scenario's "
                                 "GPU; calibrate takes validate results run with --device cuda",
                                 device && device->is_string()
                                     ? "device '" + device->get<std::string>().substr(0, 32) + "'"
                                     : std::string("an unknown device")));
  }
  if (doc.contains("emulate_rank") && !doc.at("emulate_rank").is_null()) {
    throw InputError(path + "/emulate_rank",
                     "a validate result of one emulated rank (collectives move no data) does not "
                     "time the step; calibrate takes runs of every rank");
  }
  const json* measured = doc.contains("measured") ? &doc.at("measured") : nullptr;
  if (measured == nullptr || !measured->is_object())
    throw InputError(path + "/measured", "a validate result must carry measured figures");
  if (measured->contains("memory") && measured->at("memory").is_object() &&
      measured->at("memory").value("fits", true) == false) {
    throw InputError(path + "/measured/memory/fits",
                     "the run did not fit in memory, so it measured no step time");
  }
  if (!measured->contains("time") || !measured->at("time").is_object())
    throw InputError(path + "/measured/time", "a validate result must carry measured time");
  ObjectReader t(measured->at("time"), path + "/measured/time");
  run.measured_path = t.child("step_seconds");
  const auto s = t.number("step_seconds", 0, kMaxSeconds, true);
  if (!s) throw InputError(run.measured_path, "step_seconds is required");
  run.measured_step_seconds = *s;
  run.name =
      fmt::format("{} tp{} pp{} dp{} (validate)", run.scenario.model.name, run.scenario.parallel.tp,
                  run.scenario.parallel.pp, run.scenario.parallel.dp);
  return run;
}

CalibrationRun run_from_json(const json& doc, const std::string& path) {
  if (is_validate_document(doc)) return run_from_validate(doc, path);
  ObjectReader r(doc, path);
  CalibrationRun run;
  run.path = path;
  const json* scenario = r.take("scenario");
  if (!scenario) throw InputError(path + "/scenario", "each run needs its scenario");
  run.scenario = scenario_at(*scenario, path + "/scenario");
  if (auto n = r.string("name")) run.name = n->substr(0, 128);
  const json* measured = r.take("measured");
  if (!measured) {
    throw InputError(path + "/measured",
                     "each run needs measured: {\"step_seconds\": ...} or {\"tokens_per_second\": "
                     "...}");
  }
  r.finish();
  ObjectReader m(*measured, path + "/measured");
  const auto step = m.number("step_seconds", 0, kMaxSeconds, true);
  const auto tps = m.number("tokens_per_second", 0, kMaxTokensPerSecond, true);
  m.finish();
  if (step && tps) {
    throw InputError(m.child("tokens_per_second"),
                     "give step_seconds or tokens_per_second, not both");
  }
  if (step) {
    run.measured_step_seconds = *step;
    run.measured_path = m.child("step_seconds");
  } else if (tps) {
    // Tokens per step = global_batch_size x seq_length (the planner's tokens_per_second).
    const double tokens = static_cast<double>(run.scenario.training.global_batch_size) *
                          static_cast<double>(run.scenario.training.seq_length);
    run.measured_step_seconds = tokens / *tps;
    run.measured_path = m.child("tokens_per_second");
  } else {
    throw InputError(path + "/measured", "measured needs step_seconds or tokens_per_second");
  }
  if (run.name.empty()) {
    run.name = fmt::format("{} tp{} pp{} dp{}", run.scenario.model.name, run.scenario.parallel.tp,
                           run.scenario.parallel.pp, run.scenario.parallel.dp);
  }
  return run;
}

json optional_number(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

}  // namespace

std::vector<CalibrationRun> calibration_runs_from_json(const json& doc) {
  if (is_validate_document(doc)) return {run_from_validate(doc, "")};
  ObjectReader top(doc, "");
  const json* runs = top.take("runs");
  top.take("schema");
  top.finish();
  if (!runs)
    throw InputError("/runs",
                     "runs is required: {\"runs\": [{\"scenario\": ..., "
                     "\"measured\": {\"step_seconds\": ...}}, ...]}");
  if (!runs->is_array()) throw InputError("/runs", "runs must be an array");
  if (runs->empty()) throw InputError("/runs", "there are no runs to fit");
  if (runs->size() > kMaxRuns) {
    throw InputError(fmt::format("/runs/{}", kMaxRuns),
                     fmt::format("at most {} runs per file", kMaxRuns));
  }
  std::vector<CalibrationRun> out;
  for (std::size_t i = 0; i < runs->size(); ++i)
    out.push_back(run_from_json((*runs)[i], fmt::format("/runs/{}", i)));
  return out;
}

json calibration_to_json(const CalibrationResult& r, const std::vector<CalibrationRun>& runs) {
  json assumptions = json::object();
  for (std::size_t j = 0; j < r.parameters.size(); ++j) assumptions[r.parameters[j]] = r.values[j];
  json not_fitted = json::array();
  for (const NotFitted& n : r.not_fitted)
    not_fitted.push_back({{"name", n.name}, {"reason", n.reason}});
  json fit = {{"runs", r.runs},
              {"parameters", r.parameters},
              {"mape_before", r.mape_before},
              {"mape_after", r.mape_after},
              {"leave_one_out_mape", optional_number(r.leave_one_out_mape)},
              {"iterations", r.iterations},
              {"condition_number", r.condition_number},
              {"at_bound", r.at_bound},
              {"not_fitted", not_fitted},
              {"exact_by_construction", r.exact_by_construction()}};
  if (!r.leave_one_out_note.empty()) fit["leave_one_out_note"] = r.leave_one_out_note;
  json per_run = json::array();
  for (std::size_t i = 0; i < r.run_fits.size() && i < runs.size(); ++i) {
    const RunFit& f = r.run_fits[i];
    per_run.push_back(
        {{"path", runs[i].path},
         {"name", runs[i].name},
         {"measured_step_seconds", f.measured},
         {"predicted_step_seconds_before", f.predicted_before},
         {"predicted_step_seconds_after", f.predicted_after},
         {"predicted_step_seconds_leave_one_out", optional_number(f.predicted_leave_one_out)}});
  }
  return {{"schema", kCalibrationSchema},
          {"assumptions", assumptions},
          {"fit", fit},
          {"predictions", per_run}};
}

std::vector<std::pair<const FitParameter*, double>> calibration_from_json(const json& doc) {
  ObjectReader top(doc, "");
  const auto schema = top.string("schema");
  if (!schema || *schema != kCalibrationSchema) {
    throw InputError("/schema", fmt::format("a calibration file has schema \"{}\" (written by "
                                            "`distplan calibrate`)",
                                            kCalibrationSchema));
  }
  const json* a = top.take("assumptions");
  top.take("fit");
  top.take("predictions");
  top.finish();
  if (!a) throw InputError("/assumptions", "a calibration file needs its fitted assumptions");
  if (!a->is_object()) throw InputError("/assumptions", "assumptions must be an object");
  ObjectReader r(*a, "/assumptions");
  std::vector<std::pair<const FitParameter*, double>> out;
  for (const FitParameter& f : fit_parameters()) {
    if (auto v = r.number(f.name, f.lower, f.upper, false)) out.emplace_back(&f, *v);
  }
  r.finish();
  return out;
}

void apply_calibration(json& scenario_doc,
                       const std::vector<std::pair<const FitParameter*, double>>& values) {
  // A document that is not an object, or whose assumptions are not one, is left for the
  // scenario parser to refuse with its own message.
  if (!scenario_doc.is_object()) return;
  json& a = scenario_doc["assumptions"];
  if (a.is_null()) a = json::object();
  if (!a.is_object()) return;
  for (const auto& [f, v] : values) a[std::string(f->name)] = v;
}

std::string format_calibration_table(const CalibrationResult& r,
                                     const std::vector<CalibrationRun>& runs) {
  std::string out =
      fmt::format("distplan calibrate: {} run{}, {} parameter{} fitted\n\n", r.runs,
                  r.runs == 1 ? "" : "s", r.parameters.size(), r.parameters.size() == 1 ? "" : "s");
  out += fmt::format("{:<28}{:>10}  {}\n", "assumption", "fitted", "meaning");
  for (std::size_t j = 0; j < r.parameters.size(); ++j) {
    const FitParameter* f = find_fit_parameter(r.parameters[j]);
    out += fmt::format("{:<28}{:>10.4f}  {}\n", r.parameters[j], r.values[j],
                       f ? f->meaning : std::string_view{});
  }
  for (const NotFitted& n : r.not_fitted)
    out += fmt::format("{:<28}{:>10}  not fitted: {}\n", n.name, "-", n.reason);
  for (const std::string& b : r.at_bound)
    out += fmt::format("note: {} ended on a bound of its range\n", b);
  out += fmt::format("\nMAPE before {:.2f} %, after {:.2f} %, leave-one-out {}\n",
                     100 * r.mape_before, 100 * r.mape_after,
                     r.leave_one_out_mape ? fmt::format("{:.2f} %", 100 * *r.leave_one_out_mape)
                                          : "n/a (" + r.leave_one_out_note + ")");
  if (r.exact_by_construction()) {
    out += fmt::format(
        "note: exact by construction: {} parameter{} fitted to {} run{} can match every run "
        "whatever the model, so the MAPE after says nothing of its accuracy; calibrate on more "
        "runs than parameters for a leave-one-out error\n",
        r.parameters.size(), r.parameters.size() == 1 ? "" : "s", r.runs, r.runs == 1 ? "" : "s");
  }
  out += fmt::format("\n{:<40}{:>12}{:>12}{:>12}{:>12}\n", "run (step time, ms)", "measured",
                     "before", "after", "left out");
  for (std::size_t i = 0; i < r.run_fits.size() && i < runs.size(); ++i) {
    const RunFit& f = r.run_fits[i];
    out += fmt::format("{:<40}{:>12.3f}{:>12.3f}{:>12.3f}{:>12}\n", runs[i].name.substr(0, 39),
                       f.measured * 1e3, f.predicted_before * 1e3, f.predicted_after * 1e3,
                       f.predicted_leave_one_out
                           ? fmt::format("{:.3f}", *f.predicted_leave_one_out * 1e3)
                           : std::string("-"));
  }
  return out;
}

}  // namespace distplan
