// JSON of the simulator: the `costs` input object, the `distplan.simulate/v1` document, the
// Chrome / Perfetto trace, and the human table. Kept apart from simulate.h so the core header
// never includes JSON.
#pragma once

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/spec.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {

/// Parses API.md's `costs` object strictly: unknown fields, wrong types, negative or non-finite
/// numbers throw InputError naming the field ("/costs/forward_sec"). `path` is the object's own.
[[nodiscard]] CostOverride cost_override_from_json(const nlohmann::json& j,
                                                   std::string_view path = "/costs");

/// The `distplan.simulate/v1` document (API.md).
[[nodiscard]] nlohmann::json simulate_to_json(const Scenario& s, const SimResult& r);

/// Chrome trace-event JSON ({"traceEvents": [...]}) of a run made with record_trace: one process
/// per stage, one thread per stream, "X" slices in microseconds, and an activation-memory counter.
/// Opens in ui.perfetto.dev and chrome://tracing.
[[nodiscard]] std::string trace_to_json(const SimResult& r);

/// The same trace streamed while the simulation runs (SimOptions::trace_sink): the header and the
/// stages' track names at construction, each slice and counter as it arrives, the closing fields
/// in finish(). Holds at most kBufferBytes of text; every write is checked and a failed one throws
/// std::runtime_error naming `name` (the file) and the reason. The destructor never throws.
/// `max_bytes` > 0 bounds the document: the event that would take it past throws TraceTooLarge
/// (what was written stays; the caller removes the partial file).
class TraceWriter final : public TraceSink {
 public:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 20;
  TraceWriter(std::ostream& out, std::string name, Count stages, std::uint64_t max_bytes = 0);
  /// Bytes of the document so far (written and buffered).
  [[nodiscard]] std::uint64_t bytes() const noexcept { return written_ + buf_.size(); }
  void slice(const TraceEvent& e) override;
  void memory(const MemorySample& m) override;
  /// Writes the step's summary, closes the document and flushes the stream.
  void finish(const SimResult& r);

 private:
  void event(const std::string& text);
  void flush();
  std::ostream& out_;
  std::string name_;
  std::string buf_;
  std::uint64_t written_ = 0;
  std::uint64_t max_bytes_ = 0;
  bool first_ = true;
};

/// A streamed trace reached its writer's max_bytes.
class TraceTooLarge : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bytes one pass adds to a trace, about: a 64-stage 1F1B step of 4,096 micro-batches (2^18
/// passes: the slices, the sends and the activation counter) wrote 245,438,528 bytes, 936 a pass.
/// Other schedules write within a few tens of percent of it (more sends per pass under
/// interleaving, fewer under zero bubble's split backward).
inline constexpr double kTraceBytesPerPass = 936.0;
/// The trace size of a step of `passes` passes, about (kTraceBytesPerPass).
[[nodiscard]] inline double expected_trace_bytes(double passes) noexcept {
  return passes * kTraceBytesPerPass;
}

/// `--format table`: step time and bubbles, and per stage busy time, idle time, peak in-flight
/// micro-batches and activation memory (ms and GiB, labelled).
[[nodiscard]] std::string format_simulate_table(const Scenario& s, const SimResult& r);

}  // namespace distplan::sim
