// A MoE layout through the planner's estimate() into the simulator: the all-to-alls ride inside
// the stage costs the simulator schedules, so the planner's closed forms and the event
// simulation agree as they do for dense layouts (estimate_sim_test.cpp).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {
namespace {

// Mixtral-8x7B on 32 GPUs: tp 2, pp 4, dp 4, ep 8, ZeRO-1, sequence parallel, 16 micro-batches.
TEST(SimulateMoe, ClosedFormBoundsTheWalk) {
  for (const char* sched : {"1f1b", "interleaved_1f1b", "zb_h1"}) {
    nlohmann::json j = nlohmann::json::parse(R"({
      "model": "mixtral-8x7b",
      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32, "gpus_per_node": 8},
      "training": {"seq_length": 4096, "global_batch_size": 64, "framework": "generic"},
      "parallel": {"tp": 2, "pp": 4, "dp": 4, "ep": 8, "zero_stage": 1,
                   "sequence_parallel": true}})");
    j["parallel"]["schedule"] = sched;
    j["parallel"]["virtual_stages"] = std::string(sched) == "interleaved_1f1b" ? 2 : 1;
    const Scenario s = scenario_from_json(j);
    validate_scenario(s);
    const Estimate e = estimate(s);
    ASSERT_GT(e.stage_costs[0].ep_communication, 0);
    const SimResult r = simulate(s, e);
    EXPECT_LE(e.time.step_seconds, r.step_seconds * (1 + 1e-12)) << sched;
  }
}

}  // namespace
}  // namespace distplan::sim
