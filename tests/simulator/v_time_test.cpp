// The planner's step for ZB-V, V-Half and V-Min is the simulated step: the planner times the
// schedule's order with its own critical-path walk (v_schedule.h, v_longest_span), the simulator
// runs the same order event by event (simulate.cpp). Over random layouts with nothing but the
// pipeline in the step (ZeRO-0, dp 1, no exposed communication) the two agree to rounding; with
// data parallelism the planner's exposed-communication term is its usual approximation.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/v_schedule.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {
namespace {

nlohmann::json random_v_layout(std::mt19937_64& rng) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  static const char* kSchedules[] = {"zb_v", "v_half", "v_min"};
  static const char* kRecompute[] = {"none", "selective", "full"};
  const int pp = pick(2, 6), tp = pick(1, 2), mbs = pick(1, 2);
  const int m = 2 * pp + pick(0, 12);
  return {{"model", {{"preset", "llama2-7b"}, {"num_layers", 2 * pp * pick(1, 3)}}},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"gpus_per_node", 8}, {"num_gpus", tp * pp}}},
          {"training",
           {{"seq_length", 256 * pick(1, 8)},
            {"global_batch_size", m * mbs},
            {"micro_batch_size", mbs}}},
          {"parallel",
           {{"tp", tp},
            {"pp", pp},
            {"zero_stage", 0},
            {"sequence_parallel", tp > 1 && pick(0, 1) == 1},
            {"recompute", kRecompute[pick(0, 2)]},
            {"schedule", kSchedules[pick(0, 2)]}}}};
}

TEST(VScheduleTime, PlannedStepEqualsTheSimulationOverRandomLayouts) {
  std::mt19937_64 rng(20261201);
  for (int i = 0; i < 120; ++i) {
    const nlohmann::json j = random_v_layout(rng);
    const Scenario s = scenario_from_json(j);
    const Estimate e = estimate(s);
    SimOptions o;
    o.exposed_communication = false;
    const SimResult r = simulate(s, e, o);
    // Same order, same pass times, same p2p path: they differ only by whose optimizer step ends
    // the step (the planner adds the largest; stages differ by the embedding and the head).
    EXPECT_NEAR(e.time.step_seconds, r.step_seconds, 1e-6 * r.step_seconds) << j.dump();
    // m t_max, the busiest stage's work, stays a lower bound (ZB-V often reaches it).
    EXPECT_GE(e.time.bubble_seconds, -1e-9 * r.step_seconds) << j.dump();
  }
}

TEST(VScheduleTime, ZbVHasNoBubbleWhenForwardBackwardAndWeightTakeTheSameTime) {
  // Qi et al. 2024, Sec. 3: with F = B = W and no communication, ZB-V's span is 6m passes of a
  // chunk on every stage for m >= 2p (the order's hand count: its bubble is zero).
  for (Count p : {2, 4, 8}) {
    for (Count m : {2 * p, 3 * p}) {
      const VOrder order = v_schedule_order(Schedule::zb_v, p, m);
      const std::vector<VStageTimes> t(static_cast<std::size_t>(p),
                                       VStageTimes{{1, 1}, {1, 1}, {1, 1}, 0});
      EXPECT_DOUBLE_EQ(v_longest_span(order, t), 6.0 * static_cast<double>(m))
          << "p " << p << " m " << m;
    }
  }
}

TEST(VScheduleTime, ASendOnTheCriticalPathAddsItsTime) {
  // Two stages, m = 4, every pass 1 s: stage 1's first forward waits for stage 0's activation,
  // so with 0.25 s per send the warm-up alone puts at least one send on the critical path.
  const VOrder order = v_schedule_order(Schedule::zb_v, 2, 4);
  const std::vector<VStageTimes> none(2, VStageTimes{{1, 1}, {1, 1}, {1, 1}, 0});
  const std::vector<VStageTimes> slow(2, VStageTimes{{1, 1}, {1, 1}, {1, 1}, 0.25});
  EXPECT_GE(v_longest_span(order, slow), v_longest_span(order, none) + 0.25);
}

}  // namespace
}  // namespace distplan::sim
