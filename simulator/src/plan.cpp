// The plan: estimate() with the schedule walk's step time and stage peaks (plan.h).
#include "distplan/simulator/plan.h"

#include <algorithm>

#include "distplan/planner/check.h"
#include "distplan/planner/memory_terms.h"

namespace distplan::sim {

void apply_walk(const Scenario& s, const SimResult& r, Estimate& e) {
  const std::size_t p = e.memory.stages.size();
  DISTPLAN_CHECK(r.stages.size() == p, "one simulated stage per planned stage");
  const MemoryLayout ml = memory_layout(s);
  const double v = static_cast<double>(s.parallel.virtual_stages);

  // Memory: each stage at its joint peak (docs/memory.md, "Joint peak"). The walk's peak is
  // either after a forward (the most activations live, no backward running) or at the start of a
  // backward (its live activations, the recompute working set and the transient).
  MemoryEstimate& mem = e.memory;
  mem.peak_bytes = mem.peak_allocated_bytes = mem.peak_reserved_bytes = 0;
  mem.peak_stage = 0;
  for (std::size_t i = 0; i < p; ++i) {
    StageMemory& sm = mem.stages[i];
    const StageResult& w = r.stages[i];
    sm.inflight_chunks = w.peak_inflight_chunks;
    sm.inflight_microbatches = static_cast<double>(w.peak_inflight_chunks) / v;
    if (w.peak_in_backward) {
      sm.activations_bytes = w.peak_moment_activation_bytes + sm.working_bytes;
    } else {
      sm.activations_bytes = w.peak_moment_activation_bytes;
      sm.working_bytes = 0;
      sm.transient_bytes = 0;
    }
    stage_totals(s, ml, static_cast<int>(i), sm);
    if (sm.total_bytes > mem.peak_bytes) {
      mem.peak_bytes = sm.total_bytes;
      mem.peak_stage = static_cast<int>(i);
    }
    mem.peak_allocated_bytes = std::max(mem.peak_allocated_bytes, sm.allocated_bytes);
    mem.peak_reserved_bytes = std::max(mem.peak_reserved_bytes, sm.reserved_bytes);
  }
  mem.fits = mem.peak_reserved_bytes <= mem.capacity_bytes;

  // Time. The stage whose compute stream is busiest (its passes and its optimizer step, less what
  // its passes lost to communication they hid) bounds the step from below; what the step takes
  // beyond it is exposed communication (the walk with every transfer at zero time is that much
  // shorter; it includes that slowdown) and, the rest, pipeline bubble. Both are >= 0: the walk
  // without communication still runs that stage's passes and optimizer back to back at best.
  TimeEstimate& t = e.time;
  t.engine = TimeEngine::schedule_walk;
  t.step_seconds = r.step_seconds;
  const auto own = [](const StageResult& st) {
    return st.busy_seconds - st.overlap_slowdown_seconds;
  };
  std::size_t busiest = 0;
  for (std::size_t i = 1; i < p; ++i)
    if (own(r.stages[i]) > own(r.stages[busiest])) busiest = i;
  const StageResult& b = r.stages[busiest];
  t.optimizer_seconds = b.optimizer_seconds;
  t.compute_seconds = own(b) - b.optimizer_seconds;
  t.exposed_communication_seconds = r.exposed_communication_seconds;
  t.bubble_seconds = std::max(0.0, r.step_seconds - t.exposed_communication_seconds -
                                       t.compute_seconds - t.optimizer_seconds);
  t.bubble_fraction = r.bubble_fraction;
  t.tokens_per_second = tokens_per_second(s, r.step_seconds);
  t.mfu = model_flops_utilization(s, e.compute.model_flops_per_step, r.step_seconds);
}

Estimate plan(const Scenario& s, const PlanOptions& opts) {
  Estimate e = estimate(s);
  SimOptions so;
  so.exposed_communication = opts.exposed_communication;
  const SimResult r = simulate(s, e, so);
  apply_walk(s, r, e);
  return e;
}

Seconds plan_step_seconds(const Scenario& s) {
  SimOptions so;
  so.exposed_communication = false;
  return simulate(s, estimate(s), so).step_seconds;
}

}  // namespace distplan::sim
