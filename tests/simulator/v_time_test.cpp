// The V schedules' step is the walk of their order (the one timing engine, docs/time.md): over
// random layouts the planner's closed form stays a lower bound of it, and on hand-countable
// cases the walk reaches the published bubbles (Qi et al. 2024).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
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
            {"micro_batch_size", mbs},
            {"framework", "generic"}}},
          {"parallel",
           {{"tp", tp},
            {"pp", pp},
            {"zero_stage", 0},
            {"sequence_parallel", tp > 1 && pick(0, 1) == 1},
            {"recompute", kRecompute[pick(0, 2)]},
            {"schedule", kSchedules[pick(0, 2)]}}}};
}

TEST(VScheduleTime, ClosedFormBoundsTheWalkOverRandomLayouts) {
  std::mt19937_64 rng(20261201);
  for (int i = 0; i < 120; ++i) {
    const nlohmann::json j = random_v_layout(rng);
    const Scenario s = scenario_from_json(j);
    const Estimate e = estimate(s);
    const Estimate p = plan(s);
    EXPECT_LE(e.time.step_seconds, p.time.step_seconds * (1 + 1e-12)) << j.dump();
    // With nothing but the pipeline in the step, the busiest stage's work is the bound's and the
    // walk's floor, which ZB-V often reaches.
    EXPECT_GE(p.time.bubble_seconds, 0) << j.dump();
    EXPECT_GE(p.time.step_seconds, p.time.compute_seconds + p.time.optimizer_seconds) << j.dump();
  }
}

Scenario v_scenario(Count p, Count m) {
  return scenario_from_json(nlohmann::json{
      {"model", {{"preset", "llama2-7b"}, {"num_layers", 2 * p}}},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", p}}},
      {"training", {{"seq_length", 256}, {"global_batch_size", m}, {"framework", "generic"}}},
      {"parallel", {{"pp", p}, {"schedule", "zb_v"}}}});
}

TEST(VScheduleTime, ZbVHasNoBubbleWhenForwardBackwardAndWeightTakeTheSameTime) {
  // Qi et al. 2024, Sec. 3: with F = B = W and no communication, ZB-V's span is 6m passes of a
  // chunk on every stage for m >= 2p (the order's hand count: its bubble is zero).
  for (Count p : {2, 4, 8}) {
    for (Count m : {2 * p, 3 * p}) {
      const Scenario s = v_scenario(p, m);
      SimOptions o;
      o.costs = CostOverride{2.0, 2.0, 2.0, 0.0, std::nullopt};  // a chunk takes half: 1 s each
      EXPECT_DOUBLE_EQ(simulate(s, estimate(s), o).step_seconds, 6.0 * static_cast<double>(m))
          << "p " << p << " m " << m;
    }
  }
}

TEST(VScheduleTime, ASendOnTheCriticalPathAddsItsTime) {
  // Two stages, m = 4, every chunk pass 1 s: stage 1's first forward waits for stage 0's
  // activation, so with 0.25 s per send the warm-up alone puts at least one send on the path.
  const Scenario s = v_scenario(2, 4);
  SimOptions none, slow;
  none.costs = CostOverride{2.0, 2.0, 2.0, 0.0, std::nullopt};
  slow.costs = CostOverride{2.0, 2.0, 2.0, 0.25, std::nullopt};
  EXPECT_GE(simulate(s, estimate(s), slow).step_seconds,
            simulate(s, estimate(s), none).step_seconds + 0.25);
}

}  // namespace
}  // namespace distplan::sim
