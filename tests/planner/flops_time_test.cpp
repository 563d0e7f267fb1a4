#include <gtest/gtest.h>

#include "distplan/planner/estimate.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

json gpt3_doc(const json& ref, const char* recompute) {
  const json& m = ref["model"];
  return {{"model",
           {{"preset", "gpt3-175b"}, {"vocab_size", m["vocab_size"]}, {"tied_embeddings", false}}},
          {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 8}}},
          {"training",
           {{"seq_length", m["seq_length"]}, {"global_batch_size", m["global_batch_size"]}}},
          {"parallel", {{"tp", 8}, {"recompute", recompute}}}};
}

// Narayanan et al. 2021, eq. (3).
TEST(Flops, FullRecomputeMatchesMegatronFormula) {
  const auto ref = testing::reference("megatron_flops.json");
  const Estimate e = estimate(testing::scenario(gpt3_doc(ref, "full")));
  const double B = ref["model"]["global_batch_size"], s = ref["model"]["seq_length"],
               l = ref["model"]["num_layers"], h = ref["model"]["hidden_size"],
               V = ref["model"]["vocab_size"];
  const double expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(e.compute.hardware_flops_per_step / expected, 1.0, 1e-12);
  // Without recompute the model FLOPs are three forward passes: 72 B s l h^2 (1 + s/6h + V/12lh).
  const double model = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(e.compute.model_flops_per_step / model, 1.0, 1e-12);
}

TEST(Time, MfuIsModelFlopsOverPeakTime) {
  const Scenario s = testing::scenario(testing::default_doc());
  const Estimate e = estimate(s);
  const double expected =
      e.compute.model_flops_per_step / (e.time.step_seconds * 64 * s.cluster.gpu.peak_flops.bf16);
  EXPECT_NEAR(e.time.mfu, expected, 1e-12);
  EXPECT_GT(e.time.mfu, 0.0);
  EXPECT_LT(e.time.mfu, s.assumptions.compute_efficiency);
  EXPECT_NEAR(e.time.tokens_per_second, 512.0 * 4096 / e.time.step_seconds, 1e-6);
}

TEST(Time, OneFOneBBubbleIsClosedFormForEqualStages) {
  // Equal stages: no embedding or head imbalance matters when they are tiny; use a model whose
  // first and last stages differ little and check the closed form on the slowest stage.
  json doc = testing::default_doc();
  const Estimate e = estimate(testing::scenario(doc));
  const double m = static_cast<double>(e.num_microbatches);
  double t_max = 0, sum = 0;
  for (const auto& k : e.stage_costs) {
    const double t = k.forward + k.backward_input + k.backward_weight;
    t_max = std::max(t_max, t);
    sum += t;
  }
  const double pipe = (m - 1) * t_max + sum + 2 * 3 * e.stage_costs.back().p2p;
  EXPECT_NEAR(e.time.step_seconds,
              pipe + e.time.exposed_communication_seconds + e.time.optimizer_seconds, 1e-9);
}

TEST(Time, InterleavingShrinksTheBubbleByV) {
  json doc = testing::default_doc();
  doc["parallel"]["schedule"] = "1f1b";
  const Estimate a = estimate(testing::scenario(doc));
  doc["parallel"]["schedule"] = "interleaved_1f1b";
  doc["parallel"]["virtual_stages"] = 5;
  const Estimate b = estimate(testing::scenario(doc));
  EXPECT_LT(b.time.bubble_fraction, a.time.bubble_fraction);
  EXPECT_LT(b.time.step_seconds, a.time.step_seconds);
}

TEST(Time, ComputeEfficiencyIsANamedAssumption) {
  json doc = testing::default_doc();
  doc["assumptions"] = {{"compute_efficiency", 0.25}};
  const Estimate slow = estimate(testing::scenario(doc));
  doc["assumptions"] = {{"compute_efficiency", 0.5}};
  const Estimate fast = estimate(testing::scenario(doc));
  // Weight-gradient GEMMs carry no communication: their time scales exactly.
  EXPECT_NEAR(slow.stage_costs[1].backward_weight / fast.stage_costs[1].backward_weight, 2.0,
              1e-12);
  EXPECT_GT(slow.time.step_seconds, fast.time.step_seconds);
}

}  // namespace
}  // namespace distplan
