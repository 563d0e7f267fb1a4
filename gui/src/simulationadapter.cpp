#include "simulationadapter.h"

#include <algorithm>
#include <map>
#include <utility>

#include "distplan/simulator/simulate.h"

namespace distplan::gui {

namespace {

BlockKind blockKind(const sim::TraceEvent& ev) {
  if (ev.track != sim::Track::compute) return BlockKind::communication;
  switch (ev.kind) {
    case sim::SliceKind::forward:
      return BlockKind::forward;
    case sim::SliceKind::backward:
    case sim::SliceKind::backward_input:
      return BlockKind::backward;
    case sim::SliceKind::backward_weight:
      return BlockKind::backward_weight;
    case sim::SliceKind::optimizer:
      return BlockKind::optimizer;
    default:
      return BlockKind::communication;
  }
}

QString qs(std::string_view v) {
  return QString::fromUtf8(v.data(), static_cast<int>(v.size()));
}

}  // namespace

SimulationSummary simulateScenario(const Scenario& s, const Estimate& e) {
  sim::SimOptions options;
  options.record_trace = true;
  const sim::SimResult r = sim::simulate(s, e, options);

  SimulationSummary out;
  out.step_seconds = r.step_seconds;
  out.bubble_fraction = r.bubble_fraction;
  if (r.step_seconds > 0 && e.time.step_seconds > 0) {
    const double ratio = e.time.step_seconds / r.step_seconds;
    out.tokens_per_second = e.time.tokens_per_second * ratio;
    out.mfu = e.time.mfu * ratio;
  }
  for (const sim::StageResult& st : r.stages) out.stage_busy_seconds.push_back(st.busy_seconds);

  TimelineData timeline;
  timeline.num_stages = static_cast<int>(s.parallel.pp);
  timeline.step_seconds = r.step_seconds;
  // Two chunks with a direction each: the V's down and up, DualPipe's forward and reverse.
  timeline.v_shape = two_chunks(s.parallel.schedule);
  timeline.blocks.reserve(r.trace.size());
  std::map<std::pair<int, int>, std::uint16_t> labelIndex;
  for (const sim::TraceEvent& ev : r.trace) {
    TimelineBlock b;
    b.stage = ev.stage;
    b.kind = blockKind(ev);
    b.microbatch = ev.microbatch;
    b.chunk = std::max(0, ev.chunk);
    // Under a V, chunk 1 (virtual stage 2p - 1 - s) carries the activations back up; under
    // DualPipe chunk 1 is the reverse direction, stage p - 1 to 0 (layout.h).
    b.upward = timeline.v_shape && ev.chunk == 1;
    b.start_seconds = ev.start;
    b.end_seconds = ev.start + ev.duration;
    // One label per (slice kind, track) pair, made once.
    const auto key = std::make_pair(static_cast<int>(ev.kind), static_cast<int>(ev.track));
    auto it = labelIndex.find(key);
    if (it == labelIndex.end()) {
      timeline.labels.push_back(
          QStringLiteral("%1 (%2)").arg(qs(to_string(ev.kind)), qs(to_string(ev.track))));
      it = labelIndex.emplace(key, static_cast<std::uint16_t>(timeline.labels.size() - 1)).first;
    }
    b.label = it->second;
    timeline.blocks.push_back(b);
  }
  // The MoE all-to-all share the planner put inside the passes (shown, never recomputed here).
  bool hasMoe = false;
  for (const StageCosts& c : e.stage_costs) hasMoe = hasMoe || c.ep_communication > 0;
  if (hasMoe) {
    for (const StageCosts& c : e.stage_costs) {
      timeline.moe_all_to_all_seconds.push_back(c.ep_communication);
    }
  }
  indexTimeline(timeline);  // here, on the worker: the UI thread only paints
  out.timeline = std::make_shared<const TimelineData>(std::move(timeline));
  return out;
}

}  // namespace distplan::gui
