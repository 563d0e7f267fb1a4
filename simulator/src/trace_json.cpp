// Chrome / Perfetto trace of a simulated step (docs/simulator.md, "Trace").
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

std::string trace_to_json(const SimResult& r) {
  nlohmann::json events = nlohmann::json::array();
  constexpr Track kTracks[] = {Track::compute, Track::send_next, Track::send_prev, Track::dp,
                               Track::zero3};
  for (const StageResult& st : r.stages) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", st.stage},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("stage {}", st.stage)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", st.stage},
                      {"tid", 0},
                      {"args", {{"sort_index", st.stage}}}});
    for (Track t : kTracks) {
      const int tid = static_cast<int>(t);
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", st.stage},
                        {"tid", tid},
                        {"args", {{"name", std::string(to_string(t))}}}});
      events.push_back({{"ph", "M"},
                        {"name", "thread_sort_index"},
                        {"pid", st.stage},
                        {"tid", tid},
                        {"args", {{"sort_index", tid}}}});
    }
  }
  for (const TraceEvent& e : r.trace) {
    nlohmann::json args = {{"kind", std::string(to_string(e.kind))}};
    if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
    if (e.chunk >= 0) args["chunk"] = e.chunk;
    events.push_back({{"name", slice_name(e)},
                      {"cat", std::string(category(e.kind))},
                      {"ph", "X"},
                      {"pid", e.stage},
                      {"tid", static_cast<int>(e.track)},
                      {"ts", e.start * kMicros},
                      {"dur", e.duration * kMicros},
                      {"args", std::move(args)}});
  }
  for (const MemorySample& m : r.memory) {
    events.push_back({{"name", "activation bytes"},
                      {"ph", "C"},
                      {"pid", m.stage},
                      {"ts", m.time * kMicros},
                      {"args", {{"bytes", m.activation_bytes}}}});
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"generator", "distplan simulate"},
                          {"step_seconds", r.step_seconds},
                          {"bubble_fraction", r.bubble_fraction}}}};
  return doc.dump(1) + "\n";
}

}  // namespace distplan::sim
