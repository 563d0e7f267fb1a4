// distplan calibrate: fits the time assumptions to measured runs (distplan.calibration/v1), and
// the --calibration FILE option of plan, simulate and search that applies the result.
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command.h"
#include "distplan/planner/calibrate.h"
#include "distplan/planner/calibrate_json.h"
#include "distplan/planner/error.h"
#include "distplan/simulator/plan.h"

namespace distplan::cli {

void add_calibration_option(CLI::App& cmd, CommonOptions& opts) {
  // An empty name was silently ignored (issue 29, item 15).
  cmd.add_option("--calibration", opts.calibration,
                 "distplan.calibration/v1 file (from `distplan calibrate`) whose assumptions "
                 "replace the scenario's")
      ->check(non_empty_path());
}

void apply_calibration_file(const std::string& path, nlohmann::json& scenario_doc) {
  CommonOptions o;
  o.input = path;
  try {
    apply_calibration(scenario_doc, calibration_from_json(read_document(o)));
  } catch (const InputError& e) {
    throw InputError(e.path(), fmt::format("--calibration file '{}': {}", path, e.what()));
  }
}

namespace {

std::vector<std::pair<const FitParameter*, double>> calibration_values(const std::string& path) {
  CommonOptions o;
  o.input = path;
  try {
    return calibration_from_json(read_document(o));
  } catch (const InputError& e) {
    throw InputError(e.path(), fmt::format("--calibration file '{}': {}", path, e.what()));
  }
}

}  // namespace

void note_calibration(const CommonOptions& opts, nlohmann::json& out_doc) {
  if (opts.calibration.empty() || !out_doc.is_object()) return;
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [f, v] : calibration_values(opts.calibration)) values[std::string(f->name)] = v;
  out_doc["calibration"] = {{"file", opts.calibration}, {"assumptions", values}};
}

std::string calibration_line(const CommonOptions& opts) {
  if (opts.calibration.empty()) return {};
  std::string values;
  for (const auto& [f, v] : calibration_values(opts.calibration)) {
    values += fmt::format("{}{} {:.4g}", values.empty() ? "" : ", ", f->name, v);
  }
  return fmt::format("calibration: {} applied ({})\n", opts.calibration,
                     values.empty() ? "no assumptions" : values);
}

namespace {

struct CalibrateOptions {
  std::vector<std::string> inputs;
  std::vector<std::string> fit;
  std::vector<std::string> start;
  Format format = Format::json;
};

// --start NAME=VALUE, for a fittable assumption inside its bounds.
void apply_start(const std::string& arg, Assumptions& a) {
  const auto eq = arg.find('=');
  const std::string name = arg.substr(0, eq);
  const FitParameter* f = find_fit_parameter(name);
  if (eq == std::string::npos || f == nullptr) {
    throw InputError("", fmt::format("--start '{}': expected NAME=VALUE with NAME a fittable "
                                     "assumption (see docs/calibration.md)",
                                     arg.substr(0, 64)));
  }
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(arg.substr(eq + 1), &used);
    if (used != arg.size() - eq - 1) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    throw InputError("", fmt::format("--start '{}': the value is not a number", arg.substr(0, 64)));
  }
  if (!(v >= f->lower && v <= f->upper)) {
    throw InputError("",
                     fmt::format("--start {}={} is outside [{}, {}]", name, v, f->lower, f->upper));
  }
  f->set(a, v);
}

void install_calibrate(CLI::App& app) {
  auto opts = std::make_shared<CalibrateOptions>();
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Fit the time assumptions (compute, communication efficiency, ...) to measured step times");
  cmd->add_option("runs", opts->inputs,
                  "Runs JSON ({\"runs\": [{\"scenario\": ..., \"measured\": {\"step_seconds\": "
                  "...}}]}) or distplan validate results; several files are joined, - is stdin")
      ->required();
  cmd->add_option("--fit", opts->fit,
                  "Assumptions to fit, comma-separated (default: every one the runs constrain)")
      ->delimiter(',');
  cmd->add_option("--start", opts->start, "Starting value NAME=VALUE (repeatable)");
  cmd->add_option("--format", opts->format, "Output: json (default) or table")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Format>{{"json", Format::json}, {"table", Format::table}},
          CLI::ignore_case));
  cmd->callback([opts] {
    std::vector<CalibrationRun> runs;
    const bool several = opts->inputs.size() > 1;
    for (const std::string& file : opts->inputs) {
      CommonOptions o;
      o.input = file;
      std::vector<CalibrationRun> some;
      try {
        some = calibration_runs_from_json(read_document(o));
      } catch (const InputError& e) {
        if (!several) throw;
        throw InputError(e.path(), fmt::format("runs file '{}': {}", file, e.what()));
      }
      for (CalibrationRun& r : some) {
        // With several files a run is named by its file and its pointer in it (a URI fragment).
        if (several) {
          r.path = file + "#" + r.path;
          r.measured_path = file + "#" + r.measured_path;
        }
        runs.push_back(std::move(r));
      }
    }
    CalibrationOptions co;
    // Progress on stderr once a fit has run 5 s, then every 5 s: how many plans it has made.
    const auto t0 = std::chrono::steady_clock::now();
    auto next_report = t0 + std::chrono::seconds(5);
    std::size_t plans = 0;
    co.step_seconds = [&](const Scenario& s) {
      ++plans;
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_report) {
        std::cerr << fmt::format("distplan calibrate: {} plans of {} run{} so far ({:.0f} s)\n",
                                 plans, runs.size(), runs.size() == 1 ? "" : "s",
                                 std::chrono::duration<double>(now - t0).count());
        next_report = now + std::chrono::seconds(5);
      }
      return sim::plan_step_seconds(s);
    };
    co.parameters = opts->fit;
    for (const std::string& s : opts->start) apply_start(s, co.start);
    const CalibrationResult r = calibrate(runs, co);
    if (opts->format == Format::table) {
      std::cout << format_calibration_table(r, runs);
    } else {
      write_json(calibration_to_json(r, runs));
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(calibrate, 50, install_calibrate);

}  // namespace distplan::cli
