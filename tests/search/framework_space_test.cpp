// The search walks only what the framework runs (docs/frameworks.md): its enumerator
// (space.cpp, cutting by the capability rows as it goes) and framework_refusal() (the same rows
// applied to one finished scenario) are two algorithms over one table, and must agree on every
// layout of the space.
#include <set>

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/capabilities.h"
#include "distplan/planner/error.h"
#include "distplan/planner/validate.h"
#include "distplan/search/search_json.h"
#include "distplan/search/space.h"

namespace distplan::search {
namespace {

using nlohmann::json;

json base_doc(const char* model, int gpus, int batch, int seq) {
  return {{"model", model},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
          {"training", {{"seq_length", seq}, {"global_batch_size", batch}}}};
}

Space space_of(json doc, const char* framework) {
  doc["training"]["framework"] = framework;
  return request_from_json(doc).space;
}

std::string describe(const Layout& l) {
  return fmt::format("tp={} cp={} pp={} dp={} ep={} mb={} {} v={} zero={} shard={} {} sp={}", l.tp,
                     l.cp, l.pp, l.dp, l.ep, l.micro_batch_size, to_string(l.schedule),
                     l.virtual_stages, l.zero_stage, l.fsdp_shard_size, to_string(l.recompute),
                     l.sequence_parallel);
}

// Under `framework`, every enumerated layout runs (and is a valid scenario), and every layout of
// the generic space the framework runs is enumerated.
void expect_agreement(const json& doc) {
  RejectCounts scratch{};
  const Space generic = space_of(doc, "generic");
  const std::vector<Layout> everything = enumerate_layouts(generic, scratch);
  ASSERT_GT(everything.size(), 50u);
  for (const char* f : {"megatron", "torchtitan", "deepspeed"}) {
    const Space sp = space_of(doc, f);
    RejectCounts rejected{};
    const std::vector<Layout> runs = enumerate_layouts(sp, rejected);
    EXPECT_EQ(count_layouts(sp), runs.size()) << f;
    const std::set<Layout> enumerated(runs.begin(), runs.end());
    for (const Layout& l : runs) {
      const Scenario s = make_scenario(sp.base, l);
      const auto refusal = framework_refusal(s);
      EXPECT_FALSE(refusal) << f << ": " << describe(l) << ": " << refusal->message;
      EXPECT_NO_THROW(validate_scenario(s)) << f << ": " << describe(l);
    }
    std::size_t cut = 0;
    for (const Layout& l : everything) {
      const bool runnable = !framework_refusal(make_scenario(sp.base, l));
      EXPECT_EQ(runnable, enumerated.count(l) == 1) << f << ": " << describe(l);
      cut += runnable ? 0 : 1;
    }
    // What the framework cannot run is cut, under reasons that say so.
    std::uint64_t counted = 0;
    for (Reject r :
         {Reject::framework_schedule, Reject::framework_sharding, Reject::framework_parallel,
          Reject::framework_recompute, Reject::framework_split})
      counted += rejected[static_cast<int>(r)];
    if (cut > 0) {
      EXPECT_GT(counted, 0u) << f;
    }
  }
}

TEST(FrameworkSpace, EnumeratorAndRefusalAgreeOnADenseModel) {
  expect_agreement(base_doc("llama3.1-8b", 16, 32, 8192));
}

TEST(FrameworkSpace, EnumeratorAndRefusalAgreeOnUnevenPipelines) {
  // 30 layers: pp = 4 splits unevenly (DeepSpeed cannot be told it), pp = 3, 5, 6 evenly.
  json d = base_doc("gpt3-1.3b", 24, 48, 2048);
  d["model"] = {{"preset", "gpt3-1.3b"}, {"num_layers", 30}};
  expect_agreement(d);
}

TEST(FrameworkSpace, EnumeratorAndRefusalAgreeOnExperts) {
  expect_agreement(base_doc("mixtral-8x7b", 32, 64, 4096));
}

// DeepSeek-V3 with its MTP module: the enumerator leaves out what validate_scenario() refuses
// with MLA and MTP (tp or cp above 1), so every layout it walks plans.
TEST(FrameworkSpace, EnumeratorAndRefusalAgreeOnLatentAttentionAndMtp) {
  expect_agreement(base_doc("deepseek-v3", 64, 64, 4096));
}

TEST(FrameworkSpace, EnumeratorAndRefusalAgreeUnderAssumedOverlaps) {
  json d = base_doc("llama3.1-8b", 16, 32, 8192);
  d["assumptions"] = {{"tp_comm_overlap", true}, {"overlap_p2p", true}};
  expect_agreement(d);
}

TEST(FrameworkSpace, TorchtitanSearchesItsPerOpCheckpointingAndDeepSpeedNoContextParallel) {
  const json d = base_doc("llama3.1-8b", 16, 32, 8192);
  RejectCounts rejected{};
  bool op = false;
  for (const Layout& l : enumerate_layouts(space_of(d, "torchtitan"), rejected))
    op = op || l.recompute == Recompute::selective_op;
  EXPECT_TRUE(op);
  for (const Layout& l : enumerate_layouts(space_of(d, "deepspeed"), rejected)) {
    EXPECT_EQ(l.cp, 1);
    EXPECT_TRUE(l.pp == 1 || l.schedule == Schedule::one_f_one_b);  // TrainSchedule only
    EXPECT_FALSE(l.sequence_parallel);
  }
}

}  // namespace
}  // namespace distplan::search
