// distplan search: the best layouts for a model, cluster and global batch (distplan.search/v1),
// and distplan export: a layout as Megatron-LM, DeepSpeed or torchtitan launch settings.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command.h"
#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/units.h"
#include "distplan/planner/validate.h"
#include "distplan/search/export.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"

namespace distplan::cli {
namespace {

const std::map<std::string, search::ExportFormat> kExportFormats{
    {"megatron", search::ExportFormat::megatron},
    {"deepspeed", search::ExportFormat::deepspeed},
    {"torchtitan", search::ExportFormat::torchtitan}};

// A layout that does not fit is refused (exit 2) unless `force`; forced, the export carries a
// warning (a comment, and a line on stderr). docs/exports.md.
void print_export(const Scenario& s, search::ExportFormat f, bool force) {
  const search::Exported out = search::export_scenario(s, f);
  const std::string fit = fmt::format(
      "the layout does not fit: the planner's peak is {:.2f} GiB "
      "per GPU, the GPU has {:.2f} GiB",
      to_gib(out.peak_bytes), to_gib(out.capacity_bytes));
  if (!out.fits && !force) {
    throw InputError("/parallel", fit +
                                      "; `distplan plan --format table` shows what would make "
                                      "it fit, --force exports it anyway");
  }
  std::cout << out.text;
  if (!out.fits) std::cerr << "warning: " << fit << '\n';
  // JSON has no comments: the notes of a DeepSpeed export go to stderr.
  if (f == search::ExportFormat::deepspeed) {
    for (const std::string& n : out.notes) std::cerr << "note: " << n << '\n';
    for (const std::string& a : out.to_add) std::cerr << "you still add: " << a << '\n';
  }
}

struct SearchOptions {
  CommonOptions common;
  int threads = -1;
  int top_k = -1;
  std::string export_format;
  int export_rank = 1;
  bool quiet = false;
};

void install_search(CLI::App& app) {
  auto opts = std::make_shared<SearchOptions>();
  auto* cmd = app.add_subcommand(
      "search", "Rank every layout of a model on a cluster: the fastest that fit, best first");
  add_common_options(*cmd, opts->common, /*input_optional=*/true);
  add_calibration_option(*cmd, opts->common);
  cmd->add_option("--threads", opts->threads, "Worker threads (default: search.threads, or all)")
      ->check(CLI::Range(0, search::kMaxThreads));
  cmd->add_option("--top", opts->top_k, "Plans to return (default: search.top_k, or 10)")
      ->check(CLI::Range(1, search::kMaxTopK));
  cmd->add_option("--export", opts->export_format,
                  "Print the chosen plan as launch settings instead: megatron | deepspeed | "
                  "torchtitan")
      ->check(CLI::IsMember({"megatron", "deepspeed", "torchtitan"}));
  cmd->add_option("--rank", opts->export_rank, "Which plan --export prints (1 = best)")
      ->check(CLI::Range(1, 10000));
  cmd->add_flag("--quiet", opts->quiet, "No progress on stderr");
  cmd->callback([opts] {
    nlohmann::json doc = read_document(opts->common);
    if (opts->common.input.empty()) {
      // Without input: the embedded example's model, cluster and batch, every layout searched.
      doc.erase("parallel");
      if (doc.contains("training")) doc["training"].erase("micro_batch_size");
    }
    search::Request req = search::request_from_json(
        doc, [&](const nlohmann::json& d) { return read_scenario(opts->common, d, {"search"}); });
    if (opts->threads >= 0) req.options.threads = opts->threads;
    if (opts->top_k > 0) req.options.top_k = opts->top_k;
    if (!opts->export_format.empty()) {
      req.options.top_k = std::max(req.options.top_k, opts->export_rank);
    }
    bool printed = false;
    if (!opts->quiet) {
      const auto start = std::chrono::steady_clock::now();
      req.options.progress = [&printed, start](double fraction, std::uint64_t evaluated) {
        // Only searches that take a while say how far they are.
        if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) return;
        std::fprintf(stderr, "\rsearch: %5.1f%% (%llu layouts)", fraction * 100.0,
                     static_cast<unsigned long long>(evaluated));
        printed = true;
      };
      // The walks of the candidates (after the bounding pass, on the same line).
      req.options.walk_progress = [&printed, start](std::uint64_t walked, std::uint64_t of) {
        if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) return;
        std::fprintf(stderr,
                     "\rsearch: planned %llu candidates with the schedule walk, %llu left "
                     "in view    ",
                     static_cast<unsigned long long>(walked),
                     static_cast<unsigned long long>(of - walked));
        printed = true;
      };
    }
    const search::Result r = search::run(req.space, req.options);
    if (printed) std::fprintf(stderr, "\n");
    if (!opts->export_format.empty()) {
      if (static_cast<int>(r.plans.size()) < opts->export_rank) {
        throw InputError("", r.plans.empty()
                                 ? "no layout fits, so there is nothing to export (run without "
                                   "--export for what is closest and what would make it fit)"
                                 : "fewer plans than --rank");
      }
      const Scenario s = search::make_scenario(
          req.space.base, r.plans[static_cast<std::size_t>(opts->export_rank - 1)].layout);
      print_export(s, kExportFormats.at(opts->export_format), /*force=*/false);
      return;
    }
    if (opts->common.format == Format::table) {
      std::cout << search::format_result_table(req, r);
    } else {
      write_json(search::result_to_json(req, r));
    }
  });
}

void install_export(CLI::App& app) {
  auto opts = std::make_shared<CommonOptions>();
  auto to = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "export", "A scenario's layout as Megatron-LM arguments, DeepSpeed JSON or torchtitan TOML");
  add_common_options(*cmd, *opts, /*input_optional=*/true);
  cmd->add_option("--to", *to, "megatron | deepspeed | torchtitan")
      ->required()
      ->check(CLI::IsMember({"megatron", "deepspeed", "torchtitan"}));
  cmd->add_flag("--force", *force,
                "Export a layout that does not fit (exit 0, with a warning) instead of refusing it "
                "(exit 2)");
  cmd->callback([opts, to, force] {
    const nlohmann::json doc = read_document(*opts);
    const Scenario s = read_scenario(*opts, doc);
    print_export(s, kExportFormats.at(*to), *force);
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(search, 40, install_search);
DISTPLAN_REGISTER_COMMAND(export, 45, install_export);

}  // namespace distplan::cli
