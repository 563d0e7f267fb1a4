#include "distplan/search/space.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/validate.h"
#include "distplan/search/search_json.h"

namespace distplan::search {
namespace {

Space space_of(const char* model, int gpus, int batch, int seq, nlohmann::json parallel = nullptr) {
  nlohmann::json doc = {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", seq}, {"global_batch_size", batch}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return request_from_json(doc).space;
}

TEST(Space, EveryEnumeratedLayoutIsAValidScenario) {
  for (const Space& sp :
       {space_of("llama2-70b", 64, 512, 4096), space_of("gpt3-1.3b", 24, 96, 2048),
        space_of("llama3.1-8b", 16, 64, 8192)}) {
    RejectCounts rejected{};
    const std::vector<Layout> all = enumerate_layouts(sp, rejected);
    ASSERT_GT(all.size(), 100u);
    for (const Layout& l : all) {
      const Scenario s = make_scenario(sp.base, l);
      EXPECT_NO_THROW(validate_scenario(s)) << "tp=" << l.tp << " pp=" << l.pp << " dp=" << l.dp;
      EXPECT_EQ(l.num_gpus(), sp.base.cluster.num_gpus);
    }
  }
}

TEST(Space, LayoutsAreDistinct) {
  const Space sp = space_of("llama2-70b", 64, 512, 4096);
  RejectCounts rejected{};
  std::vector<Layout> all = enumerate_layouts(sp, rejected);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
}

TEST(Space, DefaultConstraintsKeepTpInsideANode) {
  const Space sp = space_of("llama2-70b", 64, 512, 4096);
  RejectCounts rejected{};
  const std::vector<Layout> all = enumerate_layouts(sp, rejected);
  for (const Layout& l : all) EXPECT_LE(l.tp, 8);
  EXPECT_GT(rejected[static_cast<int>(Reject::tp_within_node)], 0u);  // tp = 16, 32, 64 cut
}

TEST(Space, LiftingTpWithinNodeAddsWiderTensorParallelism) {
  Space sp = space_of("llama2-70b", 64, 512, 4096);
  sp.constraints.tp_within_node = false;
  RejectCounts rejected{};
  const std::vector<Layout> all = enumerate_layouts(sp, rejected);
  // Llama-2-70B has 64 heads but 8 kv heads: tp = 16 would not divide the kv heads, so the
  // planner's rule still cuts it; lifting the node constraint must not lift that rule.
  EXPECT_TRUE(std::none_of(all.begin(), all.end(), [](const Layout& l) { return l.tp > 8; }));
  EXPECT_GT(rejected[static_cast<int>(Reject::tp_divides_heads)], 0u);
  Space gpt = space_of("gpt3-175b", 64, 512, 2048);  // 96 heads, MHA
  gpt.constraints.tp_within_node = false;
  RejectCounts r2{};
  const std::vector<Layout> wide = enumerate_layouts(gpt, r2);
  EXPECT_TRUE(std::any_of(wide.begin(), wide.end(), [](const Layout& l) { return l.tp > 8; }));
}

TEST(Space, PinnedDimensionsAreHonoured) {
  const Space sp = space_of("llama2-70b", 64, 512, 4096,
                            {{"tp", {4, 8}},
                             {"zero_stage", 1},
                             {"recompute", "selective"},
                             {"schedule", {"1f1b", "interleaved_1f1b"}}});
  RejectCounts rejected{};
  const std::vector<Layout> all = enumerate_layouts(sp, rejected);
  ASSERT_FALSE(all.empty());
  std::set<Count> tps;
  for (const Layout& l : all) {
    tps.insert(l.tp);
    EXPECT_EQ(l.zero_stage, 1);
    EXPECT_EQ(l.recompute, Recompute::selective);
    EXPECT_TRUE(l.schedule == Schedule::one_f_one_b || l.schedule == Schedule::interleaved_1f1b);
  }
  EXPECT_EQ(tps, (std::set<Count>{4, 8}));
}

TEST(Space, PinnedMicroBatchAndShardSizes) {
  nlohmann::json doc = {
      {"model", "llama3.1-8b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 32}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 4096}, {"global_batch_size", 256}}},
      {"parallel", {{"tp", 1}, {"pp", 1}, {"zero_stage", 3}, {"fsdp_shard_size", {8, 32}}}}};
  doc["training"]["micro_batch_size"] = {2};
  const Space sp = request_from_json(doc).space;
  RejectCounts rejected{};
  const std::vector<Layout> all = enumerate_layouts(sp, rejected);
  ASSERT_FALSE(all.empty());
  std::set<Count> shards;
  for (const Layout& l : all) {
    EXPECT_EQ(l.micro_batch_size, 2);
    EXPECT_EQ(l.dp, 32);
    shards.insert(l.fsdp_shard_size);
  }
  EXPECT_EQ(shards, (std::set<Count>{0, 8}));  // 32 = the whole dp group, stored as 0
}

TEST(Space, InterleavingOnlyWhereMegatronAllowsIt) {
  const Space sp = space_of("llama2-70b", 64, 512, 4096);
  RejectCounts rejected{};
  for (const Layout& l : enumerate_layouts(sp, rejected)) {
    if (l.schedule != Schedule::interleaved_1f1b) {
      EXPECT_EQ(l.virtual_stages, v_shape(l.schedule) ? 2 : 1);  // a V has two chunks
      continue;
    }
    const Count m = 512 / (l.dp * l.micro_batch_size);
    EXPECT_GE(l.virtual_stages, 2);
    EXPECT_GT(l.pp, 1);
    // Any layer count: a split fills the pp·v virtual stages (80 + 2 with the light ends).
    EXPECT_LE(l.pp * l.virtual_stages, l.split == SplitChoice::even ? 80 : 82);
    EXPECT_EQ(m % l.pp, 0);
  }
}

TEST(Space, FewerGpusSpansSmallerClusters) {
  Space sp = space_of("llama3.1-8b", 64, 256, 4096);
  sp.fewer_gpus = true;
  RejectCounts rejected{};
  std::set<Count> counts;
  for (const Layout& l : enumerate_layouts(sp, rejected)) {
    counts.insert(l.num_gpus());
    EXPECT_TRUE(l.num_gpus() <= 8 || l.num_gpus() % 8 == 0) << l.num_gpus();
  }
  EXPECT_TRUE(counts.count(1));
  EXPECT_TRUE(counts.count(64));
  EXPECT_TRUE(counts.count(16));
}

TEST(Space, VSchedulesWhereTheVFits) {
  // zb_v, v_half, v_min: two chunks per stage of any layer counts (a layer on every virtual stage
  // for the even split, L + 2 >= 2 pp for the light ends) and at least 2 pp micro-batches.
  const Space sp = space_of("gpt3-1.3b", 24, 96, 2048);  // 24 layers
  RejectCounts rejected{};
  const std::vector<Layout> all = enumerate_layouts(sp, rejected);
  std::size_t found = 0;
  for (const Layout& l : all) {
    if (!v_shape(l.schedule)) continue;
    ++found;
    EXPECT_EQ(l.virtual_stages, 2);
    EXPECT_GT(l.pp, 1);  // one stage: the same work as the flat schedules
    EXPECT_LE(2 * l.pp, l.split == SplitChoice::even ? 24 : 26) << l.pp;
    EXPECT_GE(96 / (l.dp * l.micro_batch_size), 2 * l.pp) << l.pp;
  }
  EXPECT_GT(found, 0u);
  EXPECT_GT(rejected[static_cast<int>(Reject::v_shape_microbatches)], 0u);
}

}  // namespace
}  // namespace distplan::search
