// Subcommand registry of the `distplan` CLI. Each cmd_<name>.cpp registers one subcommand with
// DISTPLAN_REGISTER_COMMAND; main.cpp builds the CLI11 app from the registry, so adding a command
// touches no other file.
#pragma once

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/planner/spec.h"

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace distplan::cli {

enum class Format { json, table };

/// Options every scenario-reading command shares.
struct CommonOptions {
  std::string input;      // file path, "-" for stdin, empty for the embedded default (plan only)
  std::string hf_config;  // --hf-config FILE: replaces the model by a Hugging Face config.json
  // --calibration FILE: a distplan.calibration/v1 whose assumptions replace the scenario's.
  std::string calibration;
  Format format = Format::json;
};

/// Adds --format, --hf-config and the positional input to `cmd`.
void add_common_options(CLI::App& cmd, CommonOptions& opts, bool input_optional);

/// Adds --calibration FILE (cmd_calibrate.cpp); read_scenario applies it.
void add_calibration_option(CLI::App& cmd, CommonOptions& opts);
/// Writes the assumptions of the calibration file at `path` over those of `scenario_doc`.
void apply_calibration_file(const std::string& path, nlohmann::json& scenario_doc);
/// Names the applied --calibration (if any) in an output it changed: a JSON document gains
/// "calibration": {"file", "assumptions"}; a table gains a first line naming the file and the
/// values it set (docs/calibration.md).
void note_calibration(const CommonOptions& opts, nlohmann::json& out_doc);
[[nodiscard]] std::string calibration_line(const CommonOptions& opts);

/// Reads the input document (file, stdin or the embedded default). InputError on any failure.
[[nodiscard]] nlohmann::json read_document(const CommonOptions& opts);
/// Parses a scenario out of `doc` (applying --hf-config), leaving `extra_keys` to the caller.
[[nodiscard]] Scenario read_scenario(const CommonOptions& opts, const nlohmann::json& doc,
                                     std::initializer_list<std::string_view> extra_keys = {});
/// Writes a JSON document to stdout, indented, with a trailing newline.
void write_json(const nlohmann::json& doc);

/// CLI11 check for an output path option: an empty path is refused, not ignored.
[[nodiscard]] CLI::Validator non_empty_path();

/// Closes `out` and removes the file at `path` when it is a regular file (a failed run leaves no
/// partial output; a device such as /dev/null is left alone). Never throws.
void remove_partial_output(std::ofstream& out, const std::string& path) noexcept;

struct CommandSpec {
  int order;  // position in `distplan --help`
  std::function<void(CLI::App& app)> install;
};
std::vector<CommandSpec>& command_registry();

struct Registrar {
  Registrar(int order, std::function<void(CLI::App&)> install) {
    command_registry().push_back({order, std::move(install)});
  }
};

}  // namespace distplan::cli

#define DISTPLAN_REGISTER_COMMAND(name, order, fn)                   \
  static const ::distplan::cli::Registrar distplan_register_##name { \
    (order), (fn)                                                    \
  }
