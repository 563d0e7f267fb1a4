// distplan: plans, simulates and validates distributed training layouts. JSON in, JSON out.
// Exit codes: 0 success, 2 invalid input (JSON error object on stderr, a line of text under
// --format table), 1 internal failure.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command.h"
#include "distplan/planner/error.h"
#include "distplan/planner/input_file.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

void add_common_options(CLI::App& cmd, CommonOptions& opts, bool input_optional) {
  auto* in = cmd.add_option("input", opts.input,
                            input_optional ? "Scenario JSON file, or - for stdin (default: the "
                                             "embedded Llama-2-70B on 64 x H100 scenario)"
                                           : "Scenario JSON file, or - for stdin");
  if (!input_optional) in->required();
  // An empty name was silently ignored (issue 29, item 15): the run went on without the file.
  cmd.add_option("--hf-config", opts.hf_config,
                 "Hugging Face config.json whose model replaces the scenario's model")
      ->check(non_empty_path());
  cmd.add_option("--format", opts.format, "Output: json (default) or table")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Format>{{"json", Format::json}, {"table", Format::table}},
          CLI::ignore_case));
}

nlohmann::json read_document(const CommonOptions& opts) {
  if (opts.input.empty()) return parse_json_text(default_scenario_text());
  return parse_json_text(read_input_file(opts.input, "input file"));
}

Scenario read_scenario(const CommonOptions& opts, const nlohmann::json& doc,
                       std::initializer_list<std::string_view> extra_keys) {
  if (!opts.calibration.empty()) {
    // The calibration's assumptions win over the scenario's (docs/calibration.md).
    nlohmann::json patched = doc;
    apply_calibration_file(opts.calibration, patched);
    CommonOptions rest = opts;
    rest.calibration.clear();
    return read_scenario(rest, patched, extra_keys);
  }
  if (opts.hf_config.empty()) return scenario_from_json(doc, extra_keys);
  nlohmann::json hf;
  try {
    hf = parse_json_text(read_input_file(opts.hf_config, "--hf-config file"));
  } catch (const InputError& e) {
    throw InputError("/model/hf_config", std::string("--hf-config: ") + e.what());
  }
  nlohmann::json patched = doc;
  if (!patched.is_object()) throw InputError("", "the scenario must be a JSON object");
  patched["model"] = nlohmann::json{{"hf_config", hf}};
  return scenario_from_json(patched, extra_keys);
}

void write_json(const nlohmann::json& doc) {
  std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
}

CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](const std::string& v) {
        return v.empty() ? std::string("an empty path is not a file; give a path") : std::string();
      },
      "PATH");
}

void remove_partial_output(std::ofstream& out, const std::string& path) noexcept {
  try {
    out.close();
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
  } catch (...) {  // best effort: the original error is the one to report
  }
}

}  // namespace distplan::cli

namespace {

// `--format table` asks for output for people, errors included. Read from argv rather than from
// the parsed options: an option error happens before (or instead of) parsing --format.
bool table_format(int argc, char** argv) {
  auto is_table = [](std::string v) {
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
    return v == "table";
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--format" && i + 1 < argc && is_table(argv[i + 1])) return true;
    if (a.rfind("--format=", 0) == 0 && is_table(a.substr(9))) return true;
  }
  return false;
}

bool g_table_errors = false;

// The error object on stderr (docs/api.md, "Errors"); under --format table the same fields as a
// line of text: "distplan: invalid input at /parallel/tp: tp=3 does not divide ...".
void print_error(const char* code, const std::string& path, const std::string& message) {
  if (g_table_errors) {
    const bool input = std::string_view(code) == "invalid_input";
    std::cerr << "distplan: " << (input ? "invalid input" : "internal error")
              << (path.empty() ? std::string() : " at " + path) << ": " << message << '\n';
    return;
  }
  nlohmann::json err = {{"code", code}, {"message", message}};
  if (std::string_view(code) == "invalid_input") err["path"] = path;
  std::cerr << nlohmann::json{{"error", err}}.dump(-1, ' ', false,
                                                   nlohmann::json::error_handler_t::replace)
            << '\n';
}

void print_input_error(const distplan::InputError& e) {
  print_error("invalid_input", e.path(), e.what());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distplan: plan, simulate and validate distributed training layouts"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "distplan 0.1.0");
  auto& registry = distplan::cli::command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  for (const auto& c : registry) c.install(app);
  g_table_errors = table_format(argc, argv);
  try {
    app.parse(argc, argv);
    // Every write is checked: output that did not reach stdout is a failure, not a success.
    std::cout.flush();
    if (!std::cout) {
      print_error("internal", "", "cannot write to standard output");
      return 1;
    }
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Option errors are bad input too: the same JSON error object, exit 2.
    print_input_error(distplan::InputError("", e.what()));
    return 2;
  } catch (const distplan::InputError& e) {
    print_input_error(e);
    return 2;
  } catch (const std::bad_alloc&) {
    print_error("internal", "", "out of memory");
    return 1;
  } catch (const std::exception& e) {
    print_error("internal", "", e.what());
    return 1;
  }
  return 0;
}
