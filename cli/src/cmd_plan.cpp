// distplan plan: per-stage memory, communication, FLOPs and the step time of the schedule walk
// (distplan.plan/v1).
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "command.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/interval.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::cli {
namespace {

void install_plan(CLI::App& app) {
  auto opts = std::make_shared<CommonOptions>();
  auto* cmd =
      app.add_subcommand("plan", "Memory per stage, communication, FLOPs and time of a layout");
  add_common_options(*cmd, *opts, /*input_optional=*/true);
  add_calibration_option(*cmd, *opts);
  cmd->callback([opts] {
    const nlohmann::json doc = read_document(*opts);
    const Scenario s = read_scenario(*opts, doc);
    const Estimate e = sim::plan(s);
    const PlanFunction plan = [](const Scenario& x) { return sim::plan(x); };
    if (opts->format == Format::table) {
      std::cout << calibration_line(*opts) << format_plan_table(s, e, plan);
    } else {
      nlohmann::json out = plan_to_json(s, e);
      note_calibration(*opts, out);
      // The corpus residuals of this kind of run (docs/fidelity.md, "Prediction intervals").
      out["time"]["tokens_per_second_interval"] =
          interval_to_json(throughput_interval(s, e.time.tokens_per_second, plan));
      write_json(out);
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(plan, 10, install_plan);

}  // namespace distplan::cli
