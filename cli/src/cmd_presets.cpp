// distplan presets: the model and GPU presets compiled in from data/.
#include <iostream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::cli {
namespace {

void install_presets(CLI::App& app) {
  auto format = std::make_shared<Format>(Format::table);
  auto* cmd = app.add_subcommand("presets", "List the model and GPU presets");
  cmd->add_option("--format", *format, "Output: table (default) or json")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Format>{{"json", Format::json}, {"table", Format::table}},
          CLI::ignore_case));
  cmd->callback([format] {
    if (*format == Format::json) {
      write_json(presets_to_json());
      return;
    }
    std::cout << "Models\n";
    for (const auto& p : model_presets()) {
      std::cout << fmt::format("  {:<16} {}\n", p.name, p.description);
    }
    std::cout << "\nGPUs\n";
    for (const auto& p : gpu_presets()) {
      std::cout << fmt::format("  {:<16} {}\n", p.name, p.description);
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(presets, 5, install_presets);

}  // namespace distplan::cli
