// The search over expert parallelism (docs/search.md, docs/moe.md): MoE layouts with ep > 1,
// the lean memory path equal to estimate() on them, and no layout the planner refuses.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/validate.h"
#include "distplan/search/fast_memory.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {
namespace {

nlohmann::json request(const char* model, int gpus, int batch) {
  return {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 4096}, {"global_batch_size", batch}}},
      {"search", {{"top_k", 50}}}};
}

TEST(MoeSearch, MixtralOn32GpusReturnsExpertParallelLayouts) {
  const Request req = request_from_json(request("mixtral-8x7b", 32, 256));
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  int with_ep = 0;
  for (const Plan& p : r.plans) {
    if (p.layout.ep > 1) ++with_ep;
    // Every returned layout is one the planner plans (validation's MoE rules hold).
    EXPECT_NO_THROW(validate_scenario(make_scenario(req.space.base, p.layout)));
  }
  EXPECT_GT(with_ep, 0);
}

// ep > 1 pinned for a dense model is counted under its own reason, not as an expert count that
// ep does not divide (issue 29, item 15).
TEST(MoeSearch, DenseModelsEpLayoutsHaveTheirOwnReason) {
  nlohmann::json doc = request("llama2-7b", 8, 64);
  doc["training"]["framework"] = "megatron";
  doc["parallel"] = {{"ep", {1, 2}}};
  const Request req = request_from_json(doc);
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_GT(r.rejected[static_cast<int>(Reject::ep_needs_moe)], 0u);
  EXPECT_EQ(r.rejected[static_cast<int>(Reject::ep_divides_experts)], 0u);
  for (const Plan& p : r.plans) EXPECT_EQ(p.layout.ep, 1);
}

// The lean path's peak equals estimate()'s on every layout of a MoE space, and its step bound
// stays below the walk's step.
TEST(MoeSearch, LeanMemoryPathAgreesWithEstimate) {
  const Request req = request_from_json(request("qwen3-30b-a3b", 16, 64));
  const Space& sp = req.space;
  RejectCounts rejected{};
  FastMemory fast(sp.base);
  std::size_t checked = 0, ep_layouts = 0;
  for (const Outer& o : enumerate_outer(sp, rejected)) {
    fast.set_outer(o);
    for_each_inner(sp, o, rejected, [&](const Layout& l) {
      const Estimate e = estimate(make_scenario(sp.base, l));
      ASSERT_EQ(fast.peak_bytes(l), e.memory.peak_reserved_bytes)
          << "tp=" << l.tp << " pp=" << l.pp << " dp=" << l.dp << " ep=" << l.ep
          << " zero=" << l.zero_stage << " rc=" << to_string(l.recompute);
      // Below the walk's step (every 37th layout: a walk costs about a hundred estimates).
      if (checked % 37 == 0) {
        EXPECT_LE(fast.step_lower_bound(l),
                  sim::plan_step_seconds(make_scenario(sp.base, l)) * (1 + 1e-12));
      }
      ++checked;
      if (l.ep > 1) ++ep_layouts;
    });
  }
  EXPECT_GT(checked, 200u);
  EXPECT_GT(ep_layouts, 100u);
}

// The same for a model whose layers are of two kinds (Qwen3-30B-A3B with its first 5 layers
// dense, DeepSeek-style), with etp pinned to 1 and 2, FP8, every schedule the search walks
// (interleaved, V and DualPipe chunks mix the kinds differently) and ZeRO-3 of the experts.
TEST(MoeSearch, LeanMemoryPathAgreesWithEstimateMixed) {
  nlohmann::json doc = request("qwen3-30b-a3b", 16, 64);
  doc["model"] = {{"preset", "qwen3-30b-a3b"}, {"moe", {{"first_dense_layers", 5}}}};
  doc["training"]["precision"] = "fp8";
  doc["training"]["fp8_recipe"] = "blockwise";
  doc["training"]["framework"] = "megatron";
  doc["parallel"] = {{"etp", {1, 2}}, {"tp", {1, 2}}, {"pp", {1, 2, 4}}};
  const Request req = request_from_json(doc);
  const Space& sp = req.space;
  RejectCounts rejected{};
  FastMemory fast(sp.base);
  std::size_t checked = 0, etp_layouts = 0, zero3 = 0;
  for (const Outer& o : enumerate_outer(sp, rejected)) {
    fast.set_outer(o);
    for_each_inner(sp, o, rejected, [&](const Layout& l) {
      const Scenario s = make_scenario(sp.base, l);
      const Estimate e = estimate(s);
      ASSERT_EQ(fast.peak_bytes(l), e.memory.peak_reserved_bytes)
          << "tp=" << l.tp << " pp=" << l.pp << " dp=" << l.dp << " ep=" << l.ep << " etp=" << l.etp
          << " zero=" << l.zero_stage << " " << to_string(l.schedule) << " v=" << l.virtual_stages;
      EXPECT_LE(fast.step_lower_bound(l), e.time.step_seconds);
      ++checked;
      if (l.etp > 1) ++etp_layouts;
      if (l.zero_stage == 3) ++zero3;
    });
  }
  EXPECT_GT(checked, 200u);
  EXPECT_GT(etp_layouts, 20u);
  EXPECT_GT(zero3, 20u);
}

}  // namespace
}  // namespace distplan::search
