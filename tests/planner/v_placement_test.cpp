// Under a V-shape schedule (zb_v) stage 0 holds virtual stages 0 and 2p - 1: the embedding and
// the final norm + LM head (Qi et al. 2024, Sec. 3; the chunk map in layout.h). The oracle is the
// same model planned with 1F1B, where the head sits on stage p - 1: the head's parameters, its
// saved activations and its FLOPs move from stage p - 1 to stage 0, and nothing else changes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"

namespace distplan {
namespace {

nlohmann::json doc(const std::string& schedule, int pp, bool tied) {
  return {{"model", {{"preset", "llama2-7b"}, {"num_layers", 4 * pp}, {"tied_embeddings", tied}}},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", pp}}},
          {"training",
           {{"framework", "generic"},
            {"seq_length", 512},
            {"global_batch_size", 4 * pp},
            {"micro_batch_size", 1}}},
          {"parallel", {{"pp", pp}, {"schedule", schedule}}},
          // Sends overlapped, so a stage's pass costs are its compute alone: a V stage sends a
          // different number of times than a 1F1B stage, and blocking sends would add that here.
          {"assumptions", {{"overlap_p2p", true}}}};
}

TEST(VPlacement, HeadMovesToStageZero) {
  for (int pp : {3, 4, 6}) {
    const Estimate one = estimate(scenario_from_json(doc("zb_h1", pp, false)));
    const Scenario vs = scenario_from_json(doc("zb_v", pp, false));
    EXPECT_EQ(vs.parallel.virtual_stages, 2);  // implied by the V
    const Estimate vee = estimate(vs);
    const auto& a = one.memory.stages;
    const auto& b = vee.memory.stages;
    const auto last = static_cast<std::size_t>(pp - 1);
    const Count head = a[last].parameters - a[1].parameters;
    ASSERT_GT(head, 0);
    EXPECT_EQ(b[0].parameters, a[0].parameters + head) << pp;
    EXPECT_EQ(b[last].parameters, a[last].parameters - head) << pp;
    EXPECT_EQ(b[0].head_activation_bytes, a[last].head_activation_bytes) << pp;
    EXPECT_EQ(b[last].head_activation_bytes, 0) << pp;
    // ZB-H1 and ZB-V split B and W alike; the head's F, B and W move with it.
    const double dh = one.stage_costs[last].forward - one.stage_costs[1].forward;
    EXPECT_NEAR(vee.stage_costs[0].forward, one.stage_costs[0].forward + dh, 1e-12) << pp;
    EXPECT_NEAR(vee.stage_costs[last].forward, one.stage_costs[1].forward, 1e-12) << pp;
  }
}

TEST(VPlacement, TiedEmbeddingNeedsNoCopyUnderTheV) {
  // Megatron-LM keeps a copy of a tied word embedding on the last stage; under the V the head
  // is on the embedding's stage and uses the one matrix.
  const int pp = 4;
  const Estimate one = estimate(scenario_from_json(doc("1f1b", pp, true)));
  const Estimate vee = estimate(scenario_from_json(doc("zb_v", pp, true)));
  Count total_one = 0, total_v = 0;
  for (const auto& st : one.memory.stages) total_one += st.parameters;
  for (const auto& st : vee.memory.stages) total_v += st.parameters;
  const Count copy = one.memory.stages[3].parameters - one.memory.stages[1].parameters -
                     (vee.memory.stages[0].parameters - one.memory.stages[0].parameters);
  EXPECT_GT(copy, 0);
  EXPECT_EQ(total_one - total_v, copy);
}

TEST(VPlacement, VirtualStagesMustBeTwo) {
  nlohmann::json j = doc("zb_v", 2, false);
  j["parallel"]["virtual_stages"] = 3;
  try {
    (void)scenario_from_json(j);
    FAIL() << "virtual_stages 3 accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/virtual_stages");
  }
  j["parallel"]["virtual_stages"] = 2;
  EXPECT_NO_THROW((void)scenario_from_json(j));
}

}  // namespace
}  // namespace distplan
