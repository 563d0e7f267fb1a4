// Plan and simulation agree with the memory levers on: offload's copies and CPU optimizer are
// stage costs the simulator schedules like any other (docs/time.md, "Offload").
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {
namespace {

TEST(LeversSimulate, OffloadCostsSitInTheWalkAboveTheBound) {
  struct Case {
    int zero;
    const char* opt;
    const char* params;
    const char* schedule;
    int pp;
  };
  for (const Case c : {Case{1, "cpu", "none", "1f1b", 2}, Case{2, "cpu", "none", "1f1b", 2},
                       Case{3, "cpu", "none", "1f1b", 1}, Case{3, "cpu", "cpu", "1f1b", 1},
                       Case{3, "nvme", "nvme", "1f1b", 1}, Case{2, "cpu", "none", "zb_h1", 2}}) {
    nlohmann::json j = nlohmann::json::parse(R"({
      "model": "llama2-7b",
      "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nvme_bandwidth": 2.5e10},
      "training": {"seq_length": 4096, "global_batch_size": 64, "framework": "generic"},
      "parallel": {"tp": 1, "sequence_parallel": false},
      "assumptions": {"overlap_compute_slowdown": 0}})");
    j["parallel"]["pp"] = c.pp;
    j["cluster"]["num_gpus"] = 8 * c.pp;
    j["parallel"]["zero_stage"] = c.zero;
    j["parallel"]["offload_optimizer"] = c.opt;
    j["parallel"]["offload_params"] = c.params;
    j["parallel"]["schedule"] = c.schedule;
    const Scenario s = scenario_from_json(j);
    const Estimate e = estimate(s);
    const SimResult r = simulate(s, e);
    EXPECT_GT(e.time.optimizer_seconds, e.offload.cpu_optimizer_seconds * 0.999) << j.dump();
    // The offload's host step runs in the stage's optimizer, on the walk's critical path; the
    // closed form bounds the walk from below.
    EXPECT_GE(r.step_seconds, e.offload.cpu_optimizer_seconds) << j.dump();
    EXPECT_LE(e.time.step_seconds, r.step_seconds * (1 + 1e-12)) << j.dump();
  }
}

TEST(LeversSimulate, ContextParallelStepIsBoundedByTheClosedForm) {
  // The exchanges sit inside the passes the walk schedules: the closed form still bounds it.
  for (const char* comm : {"p2p", "all_gather", "a2a"}) {
    for (int pp : {1, 2}) {
      nlohmann::json j = nlohmann::json::parse(R"({
        "model": "llama3.1-8b",
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
        "training": {"seq_length": 65536, "global_batch_size": 16},
        "parallel": {"tp": 2, "cp": 4, "zero_stage": 1, "sequence_parallel": true,
                     "recompute": "full"},
        "assumptions": {"overlap_compute_slowdown": 0}})");
      j["parallel"]["cp_comm"] = comm;
      j["parallel"]["pp"] = pp;
      j["cluster"]["num_gpus"] = 16 * pp;
      const Scenario s = scenario_from_json(j);
      const Estimate e = estimate(s);
      const SimResult r = simulate(s, e);
      // The ring hides behind the attention at 64K tokens; the others are exposed.
      if (std::string(comm) != "p2p") {
        EXPECT_GT(e.stage_costs[0].cp_communication, 0) << comm;
      }
      EXPECT_LE(e.time.step_seconds, r.step_seconds * (1 + 1e-12)) << comm << " pp " << pp;
    }
  }
}

}  // namespace
}  // namespace distplan::sim
