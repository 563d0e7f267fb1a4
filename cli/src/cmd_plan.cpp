// distplan plan: per-stage memory, communication, FLOPs and the step time of the schedule walk
// (distplan.plan/v1).
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "command.h"
#include "distplan/planner/estimate.h"
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
    if (opts->format == Format::table) {
      std::cout << format_plan_table(s, e, [](const Scenario& x) { return sim::plan(x); });
    } else {
      write_json(plan_to_json(s, e));
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(plan, 10, install_plan);

}  // namespace distplan::cli
