// Uneven pipeline splits (pipeline_split.h) in the simulator: each chunk runs its own passes and
// saves its own bytes. Over random layouts of every multi-chunk schedule with layer counts that do
// not divide, the planner's activation peak (Megatron's steady state for interleaved 1F1B, the
// order walk for the V schedules and DualPipe) equals the peak the simulator observes running
// the program pass by pass, and every traced pass lasts its own chunk's time.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/pipeline_split.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {
namespace {

nlohmann::json draw(std::mt19937_64& rng) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  static const char* kSchedules[] = {"interleaved_1f1b", "zb_v",    "v_half", "v_min",
                                     "dualpipe_v",       "dualpipe"};
  const std::string sched = kSchedules[pick(0, 5)];
  const bool dual = sched == "dualpipe";
  const int pp = dual ? 2 * pick(1, 3) : pick(2, 5);
  const int v = sched == "interleaved_1f1b" ? pick(2, 4) : 2;
  const int path = dual ? pp : pp * v;
  const int layers = path + pick(1, 2 * path - 1);  // rarely a multiple of the path
  const int m = sched == "interleaved_1f1b" ? pp * pick(1, 4) : 2 * pp + 2 * pick(0, 4);
  nlohmann::json parallel = {{"pp", pp}, {"schedule", sched}, {"virtual_stages", v}};
  switch (pick(0, 2)) {
    case 0:
      break;  // the even rule
    case 1:
      if (!dual) parallel["pipeline_split"] = {{"rule", "torchtitan"}};
      break;
    default: {
      // An explicit split, zero-layer chunks included.
      std::vector<int> split(static_cast<std::size_t>(path), 0);
      for (int i = 0; i < layers; ++i) ++split[static_cast<std::size_t>(pick(0, path - 1))];
      parallel["layers_per_virtual_stage"] = split;
    }
  }
  return {{"model", {{"preset", "gpt3-1.3b"}, {"num_layers", layers}, {"tied_embeddings", false}}},
          {"cluster", {{"gpu", "a100-80gb"}, {"gpus_per_node", 8}, {"num_gpus", pp}}},
          {"training",
           {{"seq_length", 256 * pick(1, 4)},
            {"global_batch_size", m},
            {"micro_batch_size", 1},
            {"dropout", pick(0, 1) == 1 ? 0.1 : 0.0},
            // V and DualPipe schedules: distplan's textbook model runs them (Megatron-LM does not).
            {"framework", "generic"}}},
          {"parallel", parallel}};
}

TEST(UnevenSplit, PlannedActivationPeakIsTheSimulatedOne) {
  std::mt19937_64 rng(20261203);
  int uneven = 0;
  for (int i = 0; i < 300; ++i) {
    const nlohmann::json doc = draw(rng);
    const Scenario s = scenario_from_json(doc);
    validate_scenario(s);
    if (!pipeline_split(s).uniform()) ++uneven;
    const Estimate e = estimate(s);
    const SimResult r = simulate(s, e);
    for (std::size_t k = 0; k < r.stages.size(); ++k) {
      const StageMemory& plan = e.memory.stages[k];
      EXPECT_EQ(plan.activations_bytes - plan.working_bytes, r.stages[k].peak_activation_bytes)
          << "stage " << k << " of " << doc.dump();
    }
  }
  EXPECT_GT(uneven, 250);  // the draws exercise uneven chunks
}

TEST(UnevenSplit, EveryPassTakesItsOwnChunksTime) {
  // 7 layers on pp 2 x v 2, the Llama 3 paper's shape: chunk 0 of stage 0 holds only the
  // embedding, the last chunk only the LM head; the middle chunks 3 and 4 layers.
  const Scenario s = scenario_from_json(
      {{"model", {{"preset", "gpt3-1.3b"}, {"num_layers", 7}}},
       {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 2}}},
       // Megatron-LM runs interleaving at pp 2 only with overlapped sends; this test reads the
       // blocking ones, which distplan's textbook model runs.
       {"training", {{"seq_length", 1024}, {"global_batch_size", 4}, {"framework", "generic"}}},
       {"parallel",
        {{"pp", 2},
         {"schedule", "interleaved_1f1b"},
         {"virtual_stages", 2},
         {"layers_per_virtual_stage", {0, 3, 4, 0}}}},
       // The passes alone: no slowdown from the gradient reduction they hide.
       {"assumptions", {{"overlap_compute_slowdown", 0}}}});
  const Estimate e = estimate(s);
  SimOptions o;
  o.record_trace = true;
  const SimResult r = simulate(s, e, o);
  int passes = 0;
  for (const TraceEvent& t : r.trace) {
    if (t.track != Track::compute || t.chunk < 0) continue;
    const ChunkCosts& c =
        e.stage_costs[static_cast<std::size_t>(t.stage)].chunks[static_cast<std::size_t>(t.chunk)];
    const Seconds want =
        t.kind == SliceKind::forward ? c.forward : c.backward_input + c.backward_weight;
    EXPECT_NEAR(t.duration, want, 1e-12 * want) << "stage " << t.stage << " chunk " << t.chunk;
    ++passes;
  }
  EXPECT_EQ(passes, 2 * 2 * 2 * 4);  // F and B of 4 micro-batches, 2 chunks, 2 stages
  // The embedding-only chunk is far cheaper than the 3-layer one on the same stage.
  EXPECT_LT(e.stage_costs[0].chunks[0].forward, e.stage_costs[0].chunks[1].forward / 3);
}

}  // namespace
}  // namespace distplan::sim
