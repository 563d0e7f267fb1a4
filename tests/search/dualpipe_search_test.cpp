// DualPipeV in the search space and in the exports: torch.distributed.pipelining names it
// "DualPipeV" (get_schedule_class, pytorch/pytorch torch/distributed/pipelining/schedules.py,
// ScheduleDualPipeV); Megatron-LM has no DualPipe, so its export notes the default it runs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "distplan/search/export.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/search/space.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {
namespace {

nlohmann::json doc(const char* schedule) {
  return {
      {"model", "llama2-70b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 4096}, {"global_batch_size", 512}}},
      {"parallel", {{"tp", 8}, {"pp", 4}, {"dp", 2}, {"schedule", schedule}}}};
}

TEST(DualPipeVExport, TorchtitanNamesDualPipeV) {
  // Planned under torchtitan, which runs DualPipeV: FSDP2 (ZeRO-3) beside the pipeline, tensor
  // parallelism with sequence parallelism.
  nlohmann::json d = doc("dualpipe_v");
  d["training"]["framework"] = "torchtitan";
  d["parallel"]["zero_stage"] = 3;
  d["parallel"]["sequence_parallel"] = true;
  const Exported x = export_scenario(scenario_from_json(d), ExportFormat::torchtitan);
  EXPECT_NE(x.text.find("pipeline_parallel_schedule = \"DualPipeV\""), std::string::npos) << x.text;
  // Two stages per rank in a V (torchtitan's default for a multi-stage schedule), 80 layers /
  // (2 * 4) = 10 each: torchtitan's split rule without weights.
  EXPECT_NE(x.text.find("pipeline_parallel_first_stage_less_layers = 0"), std::string::npos)
      << x.text;
  EXPECT_EQ(x.text.find("pipeline_parallel_layers_per_stage"), std::string::npos) << x.text;
}

TEST(DualPipeVExport, MegatronRefusesItInsteadOfRunningItsDefaultSchedule) {
  // Megatron-LM runs 1F1B and interleaving only: a DualPipeV plan is refused at its schedule
  // (it used to be exported with a note that 1F1B would run instead).
  nlohmann::json d = doc("dualpipe_v");
  d["training"]["framework"] = "megatron";
  try {
    (void)scenario_from_json(d);
    FAIL() << "planned";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/schedule");
    EXPECT_NE(std::string(e.what()).find("dualpipe_v"), std::string::npos) << e.what();
  }
}

TEST(DualPipeVSearch, TheSpaceProposesDualPipeVWhereTheVFits) {
  const nlohmann::json d = {
      {"model", "gpt3-1.3b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 24}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 2048}, {"global_batch_size", 96}}}};
  const Space sp = request_from_json(d).space;
  RejectCounts rejected{};
  std::size_t found = 0;
  for (const Layout& l : enumerate_layouts(sp, rejected)) {
    if (l.schedule != Schedule::dualpipe_v) continue;
    ++found;
    EXPECT_EQ(l.virtual_stages, 2);
    EXPECT_LE(2 * l.pp, 24 + 2) << l.pp;  // 24 layers fill the 2 pp virtual stages
  }
  EXPECT_GT(found, 0u);
}

// Bidirectional DualPipe is searched when parallel.schedule names it. Oracle: the rules of
// validate_scenario (deepseek-ai/DualPipe dualpipe.py: num_ranks % 2 == 0, num_chunks % 2 == 0,
// num_chunks >= 2 num_ranks; stage s holds model stages s and pp - 1 - s; ZeRO 0/1; untied
// embeddings; any layer count) applied by hand to the 1f1b layouts of the same space: the
// dualpipe layouts are exactly those, with two chunks per stage.
nlohmann::json dualpipe_doc(nlohmann::json schedules) {
  // llama2-7b: 32 layers, untied embeddings.
  return {{"model", "llama2-7b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}, {"gpus_per_node", 8}}},
          {"training", {{"framework", "generic"}, {"seq_length", 2048}, {"global_batch_size", 64}}},
          {"parallel", {{"schedule", std::move(schedules)}}}};
}

TEST(DualPipeSearch, NamedItIsProposedExactlyWhereItsRulesHold) {
  const Space sp = request_from_json(dualpipe_doc({"1f1b", "dualpipe"})).space;
  RejectCounts rejected{};
  const std::vector<Layout> all = enumerate_layouts(sp, rejected);
  std::vector<Layout> dual;
  std::vector<Layout> expected;
  for (const Layout& l : all) {
    if (l.schedule == Schedule::dualpipe) {
      dual.push_back(l);
      continue;
    }
    ASSERT_EQ(l.schedule, Schedule::one_f_one_b);
    const Count m = 64 / (l.dp * l.micro_batch_size);
    // Any layer count: the pp model stages take the 1f1b layout's split (even or light ends).
    if (l.pp >= 2 && l.pp % 2 == 0 && m % 2 == 0 && m >= 2 * l.pp && l.zero_stage <= 1) {
      Layout d = l;
      d.schedule = Schedule::dualpipe;
      d.virtual_stages = 2;
      expected.push_back(d);
    }
  }
  ASSERT_FALSE(expected.empty());
  std::sort(dual.begin(), dual.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(dual, expected);
  // The others are counted under their reasons: pp = 1 (odd), m < 2 pp at pp = 16 with large
  // micro-batches, ZeRO-2/3.
  EXPECT_GT(rejected[static_cast<int>(Reject::dualpipe_pp)], 0u);
  EXPECT_GT(rejected[static_cast<int>(Reject::dualpipe_microbatches)], 0u);
  EXPECT_GT(rejected[static_cast<int>(Reject::dualpipe_not_planned)], 0u);
  // count_layouts walks the same space by multiplication.
  EXPECT_EQ(count_layouts(sp), all.size());
}

TEST(DualPipeSearch, ItsPlansPassValidationAndEqualThePlan) {
  const Space sp = request_from_json(dualpipe_doc({"dualpipe"})).space;
  Options opt;
  opt.top_k = kMaxTopK;
  opt.suggest = false;
  const Result r = run(sp, opt);
  ASSERT_FALSE(r.plans.empty());
  // Every feasible layout is walked (top_k above their number), none pruned by a bound; the
  // closed-form peak bounds the walk's, so every one fits by the walk too.
  EXPECT_EQ(r.pruned, 0u);
  EXPECT_EQ(r.plans.size(), r.feasible);
  for (const Plan& p : r.plans) {
    EXPECT_EQ(p.layout.schedule, Schedule::dualpipe);
    const Scenario s = make_scenario(sp.base, p.layout);
    ASSERT_NO_THROW(validate_scenario(s));
    const Estimate e = sim::plan(s);
    EXPECT_EQ(p.figures.step_seconds, e.time.step_seconds);
    EXPECT_EQ(p.figures.peak_bytes, e.memory.peak_reserved_bytes);
    EXPECT_LE(p.bound.step_seconds, p.figures.step_seconds);
    EXPECT_GE(p.bound.peak_bytes, p.figures.peak_bytes);
  }
}

TEST(DualPipeSearch, TiedEmbeddingsAreNotProposed) {
  nlohmann::json d = dualpipe_doc({"1f1b", "dualpipe"});
  d["model"] = {{"preset", "llama2-7b"}, {"tied_embeddings", true}};
  RejectCounts rejected{};
  std::size_t n = 0;
  for (const Layout& l : enumerate_layouts(request_from_json(d).space, rejected)) {
    EXPECT_NE(l.schedule, Schedule::dualpipe);
    ++n;
  }
  EXPECT_GT(n, 0u);
  EXPECT_GT(rejected[static_cast<int>(Reject::dualpipe_not_planned)], 0u);
}

TEST(DualPipeSearch, NotNamedItIsNeverProposed) {
  nlohmann::json d = dualpipe_doc({"1f1b"});
  d.erase("parallel");
  RejectCounts rejected{};
  for (const Layout& l : enumerate_layouts(request_from_json(d).space, rejected))
    EXPECT_NE(l.schedule, Schedule::dualpipe);
  EXPECT_EQ(rejected[static_cast<int>(Reject::dualpipe_pp)], 0u);
  EXPECT_EQ(rejected[static_cast<int>(Reject::dualpipe_microbatches)], 0u);
  EXPECT_EQ(rejected[static_cast<int>(Reject::dualpipe_not_planned)], 0u);
}

}  // namespace
}  // namespace distplan::search
