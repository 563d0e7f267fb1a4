// Chrome / Perfetto trace of a simulated step (docs/simulator.md, "Trace").
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "distplan/simulator/simulate_json.h"

namespace distplan::sim {

namespace {

std::string slice_name(const TraceEvent& e) {
  std::string_view letter;
  switch (e.kind) {
    case SliceKind::forward:
      letter = "F";
      break;
    case SliceKind::backward:
      letter = "B";
      break;
    case SliceKind::backward_input:
      letter = "BI";
      break;
    case SliceKind::backward_weight:
      letter = "W";
      break;
    case SliceKind::optimizer:
      return "optimizer";
    case SliceKind::send_activation:
      letter = "send act ";
      break;
    case SliceKind::send_gradient:
      letter = "send grad ";
      break;
    case SliceKind::grad_reduce:
      return fmt::format("grad reduce c{}", e.chunk);
    case SliceKind::param_gather:
      return "param all-gather";
    case SliceKind::zero3_gather:
      letter = "gather ";
      break;
  }
  return fmt::format("{}mb{} c{}", letter, e.microbatch, e.chunk);
}

std::string_view category(SliceKind k) {
  switch (k) {
    case SliceKind::forward:
    case SliceKind::backward:
    case SliceKind::backward_input:
    case SliceKind::backward_weight:
    case SliceKind::optimizer:
      return "compute";
    default:
      return "communication";
  }
}

constexpr double kMicros = 1e6;

}  // namespace

// A number as JSON: non-finite values have no JSON form and become null (as nlohmann writes them).
std::string num(double x) {
  return std::isfinite(x) ? fmt::format("{}", x) : std::string("null");
}

TraceWriter::TraceWriter(std::ostream& out, std::string name, Count stages, std::uint64_t max_bytes)
    : out_(out), name_(std::move(name)), max_bytes_(max_bytes) {
  buf_.reserve(kBufferBytes + 4096);
  buf_ += "{\"traceEvents\": [\n";
  constexpr Track kTracks[] = {Track::compute, Track::send_next, Track::send_prev, Track::dp,
                               Track::zero3};
  for (Count st = 0; st < stages; ++st) {
    event(fmt::format(R"({{"ph": "M", "name": "process_name", "pid": {0}, "tid": 0, )"
                      R"("args": {{"name": "stage {0}"}}}})",
                      st));
    event(fmt::format(R"({{"ph": "M", "name": "process_sort_index", "pid": {0}, "tid": 0, )"
                      R"("args": {{"sort_index": {0}}}}})",
                      st));
    for (Track t : kTracks) {
      const int tid = static_cast<int>(t);
      event(fmt::format(R"({{"ph": "M", "name": "thread_name", "pid": {}, "tid": {}, )"
                        R"("args": {{"name": "{}"}}}})",
                        st, tid, to_string(t)));
      event(fmt::format(R"({{"ph": "M", "name": "thread_sort_index", "pid": {}, "tid": {}, )"
                        R"("args": {{"sort_index": {}}}}})",
                        st, tid, tid));
    }
  }
}

void TraceWriter::slice(const TraceEvent& e) {
  std::string args = fmt::format(R"("kind": "{}")", to_string(e.kind));
  if (e.microbatch >= 0) args += fmt::format(R"(, "microbatch": {})", e.microbatch);
  if (e.chunk >= 0) args += fmt::format(R"(, "chunk": {})", e.chunk);
  event(fmt::format(R"({{"name": "{}", "cat": "{}", "ph": "X", "pid": {}, "tid": {}, "ts": {}, )"
                    R"("dur": {}, "args": {{{}}}}})",
                    slice_name(e), category(e.kind), e.stage, static_cast<int>(e.track),
                    num(e.start * kMicros), num(e.duration * kMicros), args));
}

void TraceWriter::memory(const MemorySample& m) {
  event(fmt::format(R"({{"name": "activation bytes", "ph": "C", "pid": {}, "ts": {}, )"
                    R"("args": {{"bytes": {}}}}})",
                    m.stage, num(m.time * kMicros), m.activation_bytes));
}

void TraceWriter::finish(const SimResult& r) {
  buf_ += fmt::format(
      "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {{\"generator\": \"distplan simulate\", "
      "\"step_seconds\": {}, \"bubble_fraction\": {}}}}}\n",
      num(r.step_seconds), num(r.bubble_fraction));
  flush();
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write trace file '" + name_ + "'");
}

void TraceWriter::event(const std::string& text) {
  if (max_bytes_ > 0 && bytes() + text.size() + 2 > max_bytes_) {
    throw TraceTooLarge(fmt::format("trace file '{}' would pass its limit of {:.3g} GiB", name_,
                                    static_cast<double>(max_bytes_) / 1073741824.0));
  }
  if (!first_) buf_ += ",\n";
  first_ = false;
  buf_ += text;
  if (buf_.size() >= kBufferBytes) flush();
}

void TraceWriter::flush() {
  if (buf_.empty()) return;
  errno = 0;
  out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
  written_ += buf_.size();
  buf_.clear();
  if (!out_) {
    const int err = errno;
    throw std::runtime_error(fmt::format("cannot write trace file '{}'{}", name_,
                                         err != 0 ? std::string(": ") + std::strerror(err) : ""));
  }
}

std::string trace_to_json(const SimResult& r) {
  std::ostringstream out;
  TraceWriter w(out, "(memory)", static_cast<Count>(r.stages.size()));
  for (const TraceEvent& e : r.trace) w.slice(e);
  for (const MemorySample& m : r.memory) w.memory(m);
  w.finish(r);
  return out.str();
}

}  // namespace distplan::sim
