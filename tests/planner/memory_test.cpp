#include <gtest/gtest.h>

#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

Bytes model_state(const StageMemory& s) {
  return s.weights_bytes + s.gradients_bytes + s.optimizer_bytes;
}

// A 7.5B-parameter-class model on 64 data-parallel GPUs, one stage, no TP: the setting of the
// ZeRO paper's Figure 1. Model-state bytes per parameter are compared, scaled to Psi = 7.5e9.
TEST(MemoryModel, ReproducesZeroPaperFigure1) {
  const auto ref = testing::reference("zero_figure1.json");
  const double psi = ref["parameters"];
  const double tol = ref["tolerance_gb"];
  const char* names[] = {"baseline", "p_os", "p_os_g", "p_os_g_p"};
  for (int z = 0; z <= 3; ++z) {
    json doc = {
        {"model", "llama2-7b"},
        {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", ref["data_parallel"]}}},
        {"training", {{"seq_length", 1024}, {"global_batch_size", 64}, {"framework", "generic"}}},
        {"parallel", {{"zero_stage", z}}}};
    const Scenario s = testing::scenario(doc);
    const Estimate e = estimate(s);
    const StageMemory& st = e.memory.stages[0];
    const double per_param =
        static_cast<double>(model_state(st)) / static_cast<double>(st.parameters);
    const double gb = per_param * psi / 1e9;
    EXPECT_NEAR(gb, ref["expected_gb"][names[z]].get<double>(), tol) << names[z];
  }
}

TEST(MemoryModel, Zero3ShardsWeightsAcrossDp) {
  json doc = testing::default_doc();
  doc["parallel"]["zero_stage"] = 3;
  const Estimate e3 = estimate(testing::scenario(doc));
  doc["parallel"]["zero_stage"] = 2;
  const Estimate e2 = estimate(testing::scenario(doc));
  for (std::size_t i = 0; i < e3.memory.stages.size(); ++i) {
    // dp = 2: the ZeRO-3 weight shard is half of the full weights (units padded to 2).
    EXPECT_EQ(e3.memory.stages[i].weights_bytes * 2, e2.memory.stages[i].weights_bytes);
  }
}

TEST(MemoryModel, NeverGrowsWithAHigherZeroStage) {
  for (const char* model : {"llama2-70b", "llama3.1-70b", "qwen2.5-72b"}) {
    json doc = testing::default_doc();
    doc["model"] = model;
    doc["parallel"] = {{"tp", 8}, {"pp", 2}, {"sequence_parallel", true}};
    Bytes previous = INT64_MAX;
    for (int z = 0; z <= 3; ++z) {
      doc["parallel"]["zero_stage"] = z;
      const Estimate e = estimate(testing::scenario(doc));
      EXPECT_LE(e.memory.peak_bytes, previous) << model << " zero " << z;
      previous = e.memory.peak_bytes;
    }
  }
}

TEST(MemoryModel, NeverGrowsWithLargerDpUnderZero) {
  for (int z = 1; z <= 3; ++z) {
    Bytes previous = INT64_MAX;
    for (int dp : {1, 2, 4, 8, 16, 32}) {
      json doc = {{"model", "llama2-13b"},
                  {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 8 * dp}}},
                  {"training",
                   {{"seq_length", 4096}, {"global_batch_size", 512}, {"framework", "generic"}}},
                  {"parallel", {{"tp", 4}, {"pp", 2}, {"zero_stage", z}}}};
      const Estimate e = estimate(testing::scenario(doc));
      EXPECT_LE(e.memory.peak_bytes, previous) << "zero " << z << " dp " << dp;
      previous = e.memory.peak_bytes;
    }
  }
}

TEST(MemoryModel, StageParametersSumToTheModel) {
  for (int pp : {1, 2, 4, 5, 8, 10}) {
    for (int tp : {1, 2, 8}) {
      json doc = {
          {"model", "llama2-70b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", tp * pp}}},
          {"training", {{"seq_length", 4096}, {"global_batch_size", 64}, {"framework", "generic"}}},
          {"parallel", {{"tp", tp}, {"pp", pp}}}};
      const Estimate e = estimate(testing::scenario(doc));
      // Replicated per TP rank: each norm (h per RMSNorm, two per layer and the final one).
      const Count h = 8192;
      const Count replicated = (2 * 80 + 1) * h;
      Count sum = 0;
      for (const auto& st : e.memory.stages) sum += st.parameters;
      EXPECT_EQ(sum * tp - replicated * (tp - 1), e.parameters) << "tp " << tp << " pp " << pp;
    }
  }
}

TEST(MemoryModel, PipelineSplitConservesModelState) {
  Bytes expected = -1;
  for (int pp : {1, 2, 4, 8, 16}) {
    json doc = {
        {"model", "llama2-70b"},
        {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", pp}}},
        {"training", {{"seq_length", 4096}, {"global_batch_size", 64}, {"framework", "generic"}}},
        {"parallel", {{"pp", pp}}}};
    const Estimate e = estimate(testing::scenario(doc));
    Bytes total = 0;
    for (const auto& st : e.memory.stages) total += model_state(st);
    if (expected < 0) expected = total;
    EXPECT_EQ(total, expected) << "pp " << pp;
    EXPECT_EQ(total, e.parameters * 16);  // 2 + 2 + 12 bytes per parameter
  }
}

TEST(MemoryModel, OneFOneBHoldsPMinusStageMicrobatches) {
  json doc = testing::default_doc();
  const Estimate e = estimate(testing::scenario(doc));
  for (const auto& st : e.memory.stages) {
    EXPECT_EQ(st.inflight_chunks, 4 - st.stage);
    // Activations are per-micro-batch bytes times what is in flight (no embedding dropout here;
    // the last stage's extra tensors are included in the per-micro-batch figure).
    EXPECT_EQ(st.activations_bytes, st.activation_bytes_per_microbatch * st.inflight_chunks);
  }
  doc["parallel"]["schedule"] = "gpipe";
  const Estimate g = estimate(testing::scenario(doc));
  for (const auto& st : g.memory.stages) EXPECT_EQ(st.inflight_chunks, g.num_microbatches);
}

TEST(MemoryModel, InterleavedStageZeroHoldsMegatronsWarmup) {
  for (int p : {2, 4, 8}) {
    for (int v : {2, 4, 5}) {
      const Count chunks = inflight_chunks(Schedule::interleaved_1f1b, p, v, 0, 1000 * p);
      const double stage_equivalents = static_cast<double>(chunks) / v;
      EXPECT_DOUBLE_EQ(stage_equivalents, p * (1.0 + (p - 1.0) / (p * v))) << p << " " << v;
    }
  }
}

TEST(MemoryModel, FullRecomputeKeepsLayerInputsAndOneLayersWorkingSet) {
  json doc = testing::default_doc();
  doc["parallel"]["recompute"] = "full";
  const Estimate full = estimate(testing::scenario(doc));
  doc["parallel"]["recompute"] = "selective";
  const Estimate sel = estimate(testing::scenario(doc));
  EXPECT_LT(full.memory.stages[0].activations_bytes, sel.memory.stages[0].activations_bytes);
  EXPECT_GT(full.compute.hardware_flops_per_step, sel.compute.hardware_flops_per_step);
  EXPECT_DOUBLE_EQ(full.compute.model_flops_per_step, sel.compute.model_flops_per_step);
}

TEST(MemoryModel, LastStageHoldsTheLogitsWorkspace) {
  const Estimate e = estimate(testing::scenario(testing::default_doc()));
  const auto& last = e.memory.stages.back();
  // s * b * V/t * (2 bytes bf16 logits + 4 bytes fp32 softmax), one micro-batch under 1F1B.
  EXPECT_EQ(last.buffers_bytes, Bytes{4096} * 1 * (32000 / 8) * 6);
  EXPECT_EQ(e.memory.stages[0].buffers_bytes, 0);
}

TEST(MemoryModel, FitsComparesPeakWithCapacity) {
  json doc = testing::default_doc();
  doc["parallel"] = {{"tp", 8}, {"pp", 1}, {"zero_stage", 0}};
  const Estimate e = estimate(testing::scenario(doc));
  EXPECT_EQ(e.memory.fits, e.memory.peak_bytes <= e.memory.capacity_bytes);
  EXPECT_FALSE(e.memory.fits);  // 70B with 16 bytes/parameter over 8 GPUs is 138 GB each
}

}  // namespace
}  // namespace distplan
