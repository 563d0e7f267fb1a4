// The search with the memory levers: context parallelism is a searched dimension, offload and the
// cp exchange stay the base's; the lean memory path agrees with estimate() byte for byte.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/export.h"
#include "distplan/search/fast_memory.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {
namespace {

nlohmann::json long_context(const char* comm) {
  return {
      {"model", "llama3.1-8b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 65536}, {"global_batch_size", 16}}},
      {"parallel", {{"cp_comm", comm}}}};
}

void expect_agreement(const Space& sp) {
  RejectCounts rejected{};
  FastMemory fast(sp.base);
  std::size_t checked = 0, with_cp = 0;
  for (const Outer& o : enumerate_outer(sp, rejected)) {
    fast.set_outer(o);
    for_each_inner(sp, o, rejected, [&](const Layout& l) {
      const Estimate e = estimate(make_scenario(sp.base, l));
      ASSERT_EQ(fast.peak_bytes(l), e.memory.peak_reserved_bytes)  // what fits compares
          << "tp=" << l.tp << " cp=" << l.cp << " pp=" << l.pp << " dp=" << l.dp
          << " zero=" << l.zero_stage << " sp=" << l.sequence_parallel;
      // Below the walk's step (every 37th layout: a walk costs about a hundred estimates).
      if (checked % 37 == 0) {
        EXPECT_LE(fast.step_lower_bound(l),
                  sim::plan_step_seconds(make_scenario(sp.base, l)) * (1 + 1e-12));
      }
      ++checked;
      with_cp += l.cp > 1 ? 1 : 0;
    });
  }
  EXPECT_GT(checked, 500u);
  EXPECT_GT(with_cp, checked / 2);
}

TEST(LeversSearch, FastMemoryAgreesWithContextParallel) {
  for (const char* comm : {"p2p", "all_gather", "a2a"}) {
    expect_agreement(request_from_json(long_context(comm)).space);
  }
}

TEST(LeversSearch, FastMemoryAgreesWithOffload) {
  nlohmann::json doc = long_context("p2p");
  doc["parallel"]["offload_optimizer"] = "cpu";
  const Space sp = request_from_json(doc).space;
  EXPECT_EQ(sp.base.parallel.offload_optimizer, Offload::cpu);
  expect_agreement(sp);
  RejectCounts rejected{};
  for (const Layout& l : enumerate_layouts(sp, rejected)) EXPECT_GE(l.zero_stage, 1);
}

TEST(LeversSearch, SearchFindsContextParallelForLongSequences) {
  // 131,072 tokens of Llama-3.1-8B on 8 H100s: the fastest layout splits the sequence.
  nlohmann::json doc = long_context("p2p");
  doc["cluster"]["num_gpus"] = 8;
  doc["training"] = {{"framework", "generic"}, {"seq_length", 131072}, {"global_batch_size", 8}};
  Request req = request_from_json(doc);
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_GT(r.plans.front().layout.cp, 1);
  const nlohmann::json j = result_to_json(req, r);
  EXPECT_EQ(j["plans"][0]["parallel"]["cp"], r.plans.front().layout.cp);
  EXPECT_EQ(j["plans"][0]["parallel"]["cp_comm"], "p2p");
}

// Megatron-LM core_v0.15.3's arguments (data/reference): every exported flag exists and takes a
// value its parser (or, for --cp-comm-type, its help) names.
TEST(LeversExport, MegatronContextParallelAndOffloadFlags) {
  const nlohmann::json ref =
      nlohmann::json::parse(*embedded_data_file("reference/megatron_core_v0.15.3_arguments.json"));
  const nlohmann::json& flags = ref.at("flags");
  for (const char* comm : {"p2p", "all_gather", "a2a"}) {
    nlohmann::json doc = long_context(comm);
    doc["training"]["framework"] = "megatron";  // an export needs a plan under its framework
    doc["parallel"] = {
        {"tp", 2}, {"cp", 4}, {"cp_comm", comm}, {"zero_stage", 1}, {"offload_optimizer", "cpu"}};
    const Scenario s = scenario_from_json(doc);
    const std::string text = export_scenario(s, ExportFormat::megatron).text;
    std::istringstream in(text);
    std::string line;
    int cp_flags = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream w(line);
      std::string flag, value;
      w >> flag;
      if (!(w >> value) || value == "\\") value.clear();
      ASSERT_TRUE(flags.contains(flag)) << flag;
      const nlohmann::json& f = flags.at(flag);
      EXPECT_EQ(f.value("takes_value", true), !value.empty()) << flag;
      for (const char* key : {"choices", "help_values"}) {
        if (!f.contains(key)) continue;
        const auto& c = f.at(key);
        EXPECT_NE(std::find(c.begin(), c.end(), value), c.end()) << flag << " " << value;
      }
      if (flag == "--context-parallel-size") {
        EXPECT_EQ(value, "4");
        ++cp_flags;
      }
      if (flag == "--cp-comm-type") {
        EXPECT_EQ(value, std::string(comm) == "all_gather" ? "allgather" : comm);
        ++cp_flags;
      }
    }
    EXPECT_EQ(cp_flags, 2);
    EXPECT_NE(text.find("--optimizer-cpu-offload"), std::string::npos);
  }
}

TEST(LeversExport, TorchtitanAndDeepSpeed) {
  // Each export of a plan made under its framework: torchtitan with context parallelism (FSDP2
  // over dp x cp, tensor parallelism with sequence parallelism), DeepSpeed without (it has none).
  nlohmann::json doc = long_context("p2p");
  doc["training"]["framework"] = "torchtitan";
  doc["parallel"] = {{"tp", 2},
                     {"cp", 4},
                     {"sequence_parallel", true},
                     {"zero_stage", 3},
                     {"offload_optimizer", "cpu"},
                     {"offload_params", "cpu"}};
  const std::string tt = export_scenario(scenario_from_json(doc), ExportFormat::torchtitan).text;
  EXPECT_NE(tt.find("context_parallel_degree = 4\n"), std::string::npos) << tt;
  EXPECT_NE(tt.find("context_parallel_rotate_method = \"alltoall\"\n"), std::string::npos);
  EXPECT_NE(tt.find("enable_cpu_offload = true\n"), std::string::npos);
  doc["training"]["framework"] = "deepspeed";
  doc["training"]["seq_length"] = 8192;
  doc["parallel"] = {{"tp", 1},
                     {"dp", 16},
                     {"zero_stage", 3},
                     {"offload_optimizer", "cpu"},
                     {"offload_params", "cpu"}};
  const nlohmann::json ds = nlohmann::json::parse(
      export_scenario(scenario_from_json(doc), ExportFormat::deepspeed).text);
  EXPECT_EQ(ds["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(ds["zero_optimization"]["offload_param"]["device"], "cpu");
}

}  // namespace
}  // namespace distplan::search
