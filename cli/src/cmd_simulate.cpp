// distplan simulate: discrete-event simulation of one training step (distplan.simulate/v1).
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/input_file.h"
#include "distplan/simulator/schedule_io.h"
#include "distplan/simulator/simulate.h"
#include "distplan/simulator/simulate_json.h"

namespace distplan::cli {
namespace {

struct SimulateOptions {
  CommonOptions common;
  std::string trace_file;
  double trace_limit_gib = 4.0;
  std::string schedule_file;
};

constexpr double kGiB = 1073741824.0;

sim::SchedulePrograms read_schedule_file(const std::string& path) {
  // The scenario's bounded reader: the same size limit, directory and open errors.
  const std::string text = read_input_file(path, "schedule file");
  try {
    return sim::schedule_from_text(text);
  } catch (const InputError& e) {
    throw InputError(e.path(), "schedule file '" + path + "': " + e.what());
  }
}

void install_simulate(CLI::App& app) {
  auto opts = std::make_shared<SimulateOptions>();
  auto* cmd = app.add_subcommand(
      "simulate", "Discrete-event simulation of one step: pipeline bubbles, overlap, memory");
  add_common_options(*cmd, opts->common, /*input_optional=*/true);
  add_calibration_option(*cmd, opts->common);
  cmd->add_option("--trace", opts->trace_file,
                  "Write a Chrome/Perfetto trace (open in ui.perfetto.dev) to this file")
      ->check(non_empty_path());
  cmd->add_option("--trace-limit-gib", opts->trace_limit_gib,
                  "Largest trace to write, GiB (default 4): a step whose trace would be larger "
                  "is refused before it is simulated, and a trace that grows past it is removed")
      ->check(CLI::Range(1e-6, 1e6));
  cmd->add_option("--schedule-file", opts->schedule_file,
                  "Custom schedule program (JSON or CSV, one row per stage) instead of the "
                  "scenario's schedule")
      ->check(non_empty_path());
  cmd->callback([opts] {
    const nlohmann::json doc = read_document(opts->common);
    const Scenario s = read_scenario(opts->common, doc, {"costs"});
    sim::SimOptions so;
    if (doc.is_object() && doc.contains("costs"))
      so.costs = sim::cost_override_from_json(doc.at("costs"), "/costs");
    sim::SchedulePrograms custom;
    if (!opts->schedule_file.empty()) {
      custom = read_schedule_file(opts->schedule_file);
      so.program = &custom;
    }
    so.record_trace = !opts->trace_file.empty();
    const Estimate e = estimate(s);
    // The trace is streamed to its file while the simulation runs: memory stays bounded at any
    // accepted size (docs/trust.md). A run that fails leaves no partial trace behind.
    std::ofstream trace;
    std::unique_ptr<sim::TraceWriter> writer;
    if (so.record_trace) {
      // Bound the file before any work (about kTraceBytesPerPass a pass); the writer holds the
      // exact limit while it streams.
      const double passes = static_cast<double>(s.num_microbatches()) *
                            static_cast<double>(s.parallel.pp) *
                            static_cast<double>(s.parallel.virtual_stages);
      const double expected = sim::expected_trace_bytes(passes);
      if (expected > opts->trace_limit_gib * kGiB) {
        throw InputError(
            "",
            fmt::format("--trace: the trace of this step would be about {:.1f} GiB ({:.0f} "
                        "passes, about {:.0f} bytes each), over --trace-limit-gib {:g}; "
                        "raise the limit, or trace a step of fewer micro-batches "
                        "(/training/global_batch_size)",
                        expected / kGiB, passes, sim::kTraceBytesPerPass, opts->trace_limit_gib));
      }
      if (expected > kGiB) {
        std::cerr << fmt::format(
            "distplan simulate: writing a trace of about {:.1f} GiB ({:.0f} passes) to {}\n",
            expected / kGiB, passes, opts->trace_file);
      }
      trace.open(opts->trace_file, std::ios::binary | std::ios::trunc);
      if (!trace)
        throw InputError("", "--trace: cannot open '" + opts->trace_file + "' for writing");
      writer = std::make_unique<sim::TraceWriter>(
          trace, opts->trace_file, s.parallel.pp,
          static_cast<std::uint64_t>(opts->trace_limit_gib * kGiB));
      so.trace_sink = writer.get();
    }
    sim::SimResult r;
    try {
      try {
        r = sim::simulate(s, e, so);
      } catch (const sim::TraceTooLarge& err) {
        throw InputError("", fmt::format("--trace: {} (--trace-limit-gib {:g}); the partial "
                                         "trace was removed",
                                         err.what(), opts->trace_limit_gib));
      } catch (const InputError& err) {
        if (so.program == nullptr) throw;
        throw InputError(err.path(), "schedule file '" + opts->schedule_file + "': " + err.what());
      }
      if (writer) {
        writer->finish(r);
        trace.close();
        if (trace.fail())
          throw std::runtime_error("cannot write trace file '" + opts->trace_file + "'");
      }
    } catch (...) {
      if (writer) remove_partial_output(trace, opts->trace_file);
      throw;
    }
    if (opts->common.format == Format::table) {
      std::cout << calibration_line(opts->common) << sim::format_simulate_table(s, r);
    } else {
      nlohmann::json out = sim::simulate_to_json(s, r);
      note_calibration(opts->common, out);
      write_json(out);
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(simulate, 20, install_simulate);

}  // namespace distplan::cli
