#include "distplan/search/fast_memory.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {
namespace {

Space space_of(nlohmann::json model, int gpus, int batch, int seq, nlohmann::json training = {}) {
  nlohmann::json doc = {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", seq}, {"global_batch_size", batch}}}};
  for (auto& [k, v] : training.items()) doc["training"][k] = v;
  return request_from_json(doc).space;
}

/// Every layout of the space: FastMemory's peak equals estimate()'s, byte for byte, and its
/// step-time bound is below the walk's step.
void expect_agreement(Space sp, std::size_t min_checked = 1000) {
  sp.constraints.tp_within_node = false;
  sp.constraints.zero_needs_dp = false;
  sp.constraints.sequence_parallel_needs_tp = false;
  sp.constraints.single_schedule_without_pp = false;
  RejectCounts rejected{};
  FastMemory fast(sp.base);
  std::size_t checked = 0;
  for (const Outer& o : enumerate_outer(sp, rejected)) {
    fast.set_outer(o);
    for_each_inner(sp, o, rejected, [&](const Layout& l) {
      // zb_auto: the lean path has the limit's peak, an upper bound; the search estimates it in
      // full (search.cpp), and estimate() keeps its heuristic's per-stage count.
      if (l.schedule == Schedule::zb_auto) return;
      const Estimate e = estimate(make_scenario(sp.base, l));
      ASSERT_EQ(fast.peak_bytes(l), e.memory.peak_reserved_bytes)  // what fits compares
          << "tp=" << l.tp << " pp=" << l.pp << " dp=" << l.dp << " mb=" << l.micro_batch_size
          << " zero=" << l.zero_stage << "/" << l.fsdp_shard_size << " v=" << l.virtual_stages
          << " sched=" << to_string(l.schedule) << " rc=" << to_string(l.recompute)
          << " sp=" << l.sequence_parallel;
      // The step bound is below the walk's step (checked on every 37th layout: a walk costs
      // about a hundred estimates).
      if (checked % 37 == 0) {
        EXPECT_LE(fast.step_lower_bound(l),
                  sim::plan_step_seconds(make_scenario(sp.base, l)) * (1 + 1e-12));
      }
      EXPECT_GT(fast.step_lower_bound(l), 0.0);
      ++checked;
    });
  }
  EXPECT_GT(checked, min_checked);
}

TEST(FastMemory, AgreesWithEstimateOnLlama70B) {
  expect_agreement(space_of("llama2-70b", 64, 512, 4096));
}

TEST(FastMemory, AgreesWithEstimateOnDualPipe) {
  // Bidirectional DualPipe, searched when named: two model stages and two parameter copies per
  // stage, the embedding and LM head on both ends (layout.h, stage_unit_params).
  nlohmann::json doc = {
      {"model", "llama2-70b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 4096}, {"global_batch_size", 512}}},
      {"parallel", {{"schedule", nlohmann::json::array({"dualpipe"})}}}};
  expect_agreement(request_from_json(doc).space, 100);
}

TEST(FastMemory, AgreesWithEstimateOnUnevenStages) {
  // 126 layers: pp = 4, 8, 16 ... split unevenly.
  expect_agreement(space_of("llama3.1-405b", 256, 256, 8192));
}

TEST(FastMemory, AgreesWithEstimateOnGptWithDropoutAndLearnedPositions) {
  expect_agreement(space_of("gpt3-1.3b", 24, 96, 2048,
                            {{"dropout", 0.1}, {"attention", "standard"}, {"precision", "fp16"}}));
}

TEST(FastMemory, AgreesWithEstimateWithFp32Gradients) {
  expect_agreement(space_of("mistral-7b", 32, 128, 4096,
                            {{"grad_accumulation_dtype", "fp32"}, {"optimizer", "sgd"}}));
}

TEST(FastMemory, AgreesWithEstimateUnderEachFramework) {
  // Reserved bytes: NCCL buffers differ between end and middle stages, and the tied embedding
  // adds a peer on the first and last; the lean path's three stages still hold the peak.
  for (const char* f : {"megatron", "deepspeed", "torchtitan"}) {
    SCOPED_TRACE(f);
    // DeepSpeed runs 1F1B alone, without sequence or context parallelism: a smaller space.
    expect_agreement(space_of("gpt3-1.3b", 24, 96, 2048,
                              {{"framework", f}, {"dropout", 0.1}, {"attention", "standard"}}),
                     std::string(f) == "deepspeed" ? 300 : 1000);
  }
}

TEST(FastMemory, SearchWithAndWithoutTheLeanPathAgrees) {
  nlohmann::json doc = {
      {"model", "llama2-70b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 4096}, {"global_batch_size", 512}}},
      {"search", {{"top_k", 20}, {"memory_margin", 0.03}}}};
  Request req = request_from_json(doc);
  const Result fast = run(req.space, req.options);
  req.options.fast_memory = false;
  const Result slow = run(req.space, req.options);
  EXPECT_EQ(fast.evaluated, slow.evaluated);
  EXPECT_EQ(fast.feasible, slow.feasible);
  EXPECT_EQ(fast.rejected, slow.rejected);
  EXPECT_EQ(fast.plans, slow.plans);
  EXPECT_GT(fast.pruned, 0u);  // the bound kept layouts from being walked
  EXPECT_LT(fast.walked, fast.feasible);
  req.options.objective = Objective::memory;
  req.options.fast_memory = true;
  const Result fast_mem = run(req.space, req.options);
  req.options.fast_memory = false;
  const Result slow_mem = run(req.space, req.options);
  EXPECT_EQ(fast_mem.feasible, slow_mem.feasible);
  EXPECT_EQ(fast_mem.plans, slow_mem.plans);
}

}  // namespace
}  // namespace distplan::search
