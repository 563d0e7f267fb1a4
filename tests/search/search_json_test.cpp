#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::search {
namespace {

nlohmann::json base_doc() {
  return {
      {"model", "llama2-70b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
      {"training", {{"framework", "generic"}, {"seq_length", 4096}, {"global_batch_size", 512}}}};
}

std::string error_path(const nlohmann::json& doc) {
  try {
    (void)request_from_json(doc);
  } catch (const InputError& e) {
    return e.path();
  }
  return "<no error>";
}

TEST(SearchJson, ReadsCandidateListsAndOptions) {
  nlohmann::json doc = base_doc();
  doc["parallel"] = {{"tp", {8, 4, 8}}, {"zero_stage", 1}, {"schedule", {"1f1b"}}};
  doc["training"]["micro_batch_size"] = {1, 2};
  doc["search"] = {{"top_k", 3},
                   {"memory_margin", 0.05},
                   {"objective", "memory"},
                   {"constraints", {{"tp_within_node", false}, {"max_micro_batch_size", 4}}}};
  const Request r = request_from_json(doc);
  EXPECT_EQ(r.space.candidates.tp, (std::vector<Count>{4, 8}));
  EXPECT_EQ(r.space.candidates.zero_stage, (std::vector<int>{1}));
  EXPECT_EQ(r.space.candidates.micro_batch_size, (std::vector<Count>{1, 2}));
  EXPECT_EQ(r.space.candidates.schedule, (std::vector<Schedule>{Schedule::one_f_one_b}));
  EXPECT_EQ(r.options.top_k, 3);
  EXPECT_DOUBLE_EQ(r.options.memory_margin, 0.05);
  EXPECT_EQ(r.options.objective, Objective::memory);
  EXPECT_FALSE(r.space.constraints.tp_within_node);
  EXPECT_EQ(r.space.constraints.max_micro_batch_size, 4);
  EXPECT_EQ(r.space.base.training.global_batch_size, 512);
  EXPECT_EQ(r.space.base.cluster.num_gpus, 64);
  EXPECT_EQ(r.space.base.model.num_layers, 80);
}

TEST(SearchJson, ErrorsNameTheJsonPointer) {
  auto with = [](auto patch) {
    nlohmann::json d = base_doc();
    patch(d);
    return error_path(d);
  };
  EXPECT_EQ(with([](auto& d) { d["parallel"] = {{"tp", {8, "4"}}}; }), "/parallel/tp/1");
  EXPECT_EQ(with([](auto& d) { d["parallel"] = {{"tpp", 8}}; }), "/parallel/tpp");
  EXPECT_EQ(with([](auto& d) {
              d["parallel"] = {{"tp", nlohmann::json::array()}};
            }),
            "/parallel/tp");
  EXPECT_EQ(with([](auto& d) { d["parallel"] = {{"zero_stage", 4}}; }), "/parallel/zero_stage");
  EXPECT_EQ(with([](auto& d) {
              d["parallel"] = {{"schedule", {"1f1b", "2f2b"}}};
            }),
            "/parallel/schedule/1");
  EXPECT_EQ(with([](auto& d) { d["training"]["micro_batch_size"] = {0}; }),
            "/training/micro_batch_size/0");
  EXPECT_EQ(with([](auto& d) { d["search"] = {{"top_kk", 1}}; }), "/search/top_kk");
  EXPECT_EQ(with([](auto& d) { d["search"] = {{"memory_margin", 1.5}}; }), "/search/memory_margin");
  EXPECT_EQ(with([](auto& d) {
              d["search"] = {{"constraints", {{"tp_in_node", false}}}};
            }),
            "/search/constraints/tp_in_node");
  EXPECT_EQ(with([](auto& d) {
              d["search"] = {{"objective", "gpus"}};
            }),
            "/search/target_tokens_per_second");
  EXPECT_EQ(with([](auto& d) { d["cluster"].erase("num_gpus"); }), "/cluster/num_gpus");
  // Fields outside the searched ones still go through the planner's strict reader.
  EXPECT_EQ(with([](auto& d) { d["training"]["seq_lenght"] = 1; }), "/training/seq_lenght");
  EXPECT_EQ(with([](auto& d) { d["extra"] = 1; }), "/extra");
}

TEST(SearchJson, ResultDocumentCarriesTheContractFields) {
  nlohmann::json doc = base_doc();
  doc["search"] = {{"top_k", 2}};
  const Request req = request_from_json(doc);
  const Result r = run(req.space, req.options);
  const nlohmann::json j = result_to_json(req, r);
  EXPECT_EQ(j.at("schema"), "distplan.search/v1");
  EXPECT_EQ(j.at("evaluated").get<std::uint64_t>(), r.evaluated);
  EXPECT_EQ(j.at("feasible").get<std::uint64_t>(), r.feasible);
  EXPECT_GE(j.at("seconds").get<double>(), 0.0);
  ASSERT_EQ(j.at("plans").size(), 2u);
  const nlohmann::json& p = j.at("plans").at(0);
  for (const char* key :
       {"parallel", "micro_batch_size", "peak_bytes", "step_seconds", "tokens_per_second", "mfu"}) {
    EXPECT_TRUE(p.contains(key)) << key;
  }
  EXPECT_EQ(p.at("parallel").at("tp").get<Count>(), r.plans[0].layout.tp);
  EXPECT_EQ(p.at("peak_bytes").get<Bytes>(), r.plans[0].figures.peak_bytes);
  EXPECT_TRUE(j.at("rejected").contains("out_of_memory"));
  const std::string table = format_result_table(req, r);
  EXPECT_NE(table.find("tokens/s"), std::string::npos);
}

// The options of the analytic re-rank are gone: every plan is the walk's. Giving them says so.
TEST(SearchJson, RefusesTheRemovedSimulationOptions) {
  for (const char* key : {"simulate_top", "simulate_within"}) {
    nlohmann::json doc = base_doc();
    doc["search"] = {{key, 4}};
    try {
      (void)request_from_json(doc);
      ADD_FAILURE() << key << " accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), std::string("/search/") + key);
      EXPECT_NE(std::string(e.what()).find("schedule walk"), std::string::npos) << e.what();
    }
  }
}

TEST(SearchJson, BestPlanFedBackAsAScenarioGivesTheSameFigures) {
  // The JSON round trip a user makes: copy the best plan's parallel and micro-batch into the
  // scenario and run `distplan plan` on it.
  nlohmann::json doc = base_doc();
  doc["search"] = {{"top_k", 3}};
  const Request req = request_from_json(doc);
  const nlohmann::json out = result_to_json(req, run(req.space, req.options));
  for (const nlohmann::json& plan : out.at("plans")) {
    nlohmann::json scenario = base_doc();
    scenario["parallel"] = plan.at("parallel");
    scenario["training"]["micro_batch_size"] = plan.at("micro_batch_size");
    const Estimate e = sim::plan(scenario_from_json(scenario));
    EXPECT_EQ(plan.at("peak_bytes").get<Bytes>(), e.memory.peak_reserved_bytes);
    EXPECT_EQ(plan.at("step_seconds").get<double>(), e.time.step_seconds);
    EXPECT_EQ(plan.at("tokens_per_second").get<double>(), e.time.tokens_per_second);
    EXPECT_EQ(plan.at("mfu").get<double>(), e.time.mfu);
    // The plan's own scenario member is the same layout, whole: planned as it is, it gives the
    // same figures with no merging by hand.
    const Estimate own = sim::plan(scenario_from_json(plan.at("scenario")));
    EXPECT_EQ(plan.at("peak_bytes").get<Bytes>(), own.memory.peak_reserved_bytes);
    EXPECT_EQ(plan.at("step_seconds").get<double>(), own.time.step_seconds);
    EXPECT_EQ(plan.at("scenario").at("parallel"), plan.at("parallel"));
  }
}

}  // namespace
}  // namespace distplan::search
