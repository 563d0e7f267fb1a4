#include "distplan/search/search.h"

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/validate.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {
namespace {

Request request_of(const char* model, int gpus, int batch, int seq, nlohmann::json extra = {}) {
  nlohmann::json doc = {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
      {"training", {{"seq_length", seq}, {"global_batch_size", batch}}}};
  for (auto& [k, v] : extra.items()) doc[k] = v;
  return request_from_json(doc);
}

TEST(Search, BestPlanReplannedAloneGivesTheSameFigures) {
  const Request req = request_of("llama2-70b", 64, 512, 4096);
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  for (const Plan& p : r.plans) {
    const Scenario s = make_scenario(req.space.base, p.layout);
    // The bound is estimate()'s; the figures are the plan's (the schedule walk).
    const Estimate e = estimate(s);
    EXPECT_EQ(p.bound.peak_bytes, e.memory.peak_reserved_bytes);
    EXPECT_EQ(p.bound.step_seconds, e.time.step_seconds);
    sim::PlanOptions po;
    po.exposed_communication = false;
    const Estimate plan = sim::plan(s, po);
    EXPECT_EQ(p.figures.peak_bytes, plan.memory.peak_reserved_bytes);
    EXPECT_EQ(p.figures.step_seconds, plan.time.step_seconds);
    EXPECT_EQ(p.figures.tokens_per_second, plan.time.tokens_per_second);
    EXPECT_EQ(p.figures.mfu, plan.time.mfu);
    EXPECT_EQ(p.figures.step_seconds, sim::plan(s).time.step_seconds);
  }
}

TEST(Search, EveryReturnedPlanFitsWithTheMargin) {
  Request req = request_of("llama2-70b", 64, 512, 4096);
  req.options.memory_margin = 0.1;
  req.options.top_k = 50;
  const Result r = run(req.space, req.options);
  ASSERT_EQ(r.plans.size(), 50u);
  for (const Plan& p : r.plans) {
    EXPECT_LE(static_cast<double>(p.figures.peak_bytes),
              0.9 * static_cast<double>(p.figures.capacity_bytes));
    EXPECT_NO_THROW(validate_scenario(make_scenario(req.space.base, p.layout)));
  }
  EXPECT_EQ(r.evaluated, r.feasible + r.rejected[static_cast<int>(Reject::out_of_memory)]);
}

TEST(Search, AMarginRejectsMoreLayouts) {
  Request req = request_of("llama2-70b", 64, 512, 4096);
  const Result loose = run(req.space, req.options);
  req.options.memory_margin = 0.2;
  const Result tight = run(req.space, req.options);
  EXPECT_EQ(loose.evaluated, tight.evaluated);
  EXPECT_LT(tight.feasible, loose.feasible);
}

TEST(Search, RankingIsBestFirst) {
  Request req = request_of("llama2-70b", 64, 512, 4096);
  req.options.top_k = 20;
  const Result r = run(req.space, req.options);
  ASSERT_EQ(r.plans.size(), 20u);
  for (std::size_t i = 1; i < r.plans.size(); ++i) {
    EXPECT_GE(r.plans[i - 1].figures.tokens_per_second, r.plans[i].figures.tokens_per_second);
  }
}

// Throughputs that differ by less than the tie tolerance rank by lower peak memory (issue 17:
// ZeRO-2 at 70 GiB ranked above ZeRO-3 at 57 GiB for 2e-14 s).
TEST(Search, NearTiesRankByLowerPeak) {
  Layout zero2, zero3;
  zero2.dp = zero3.dp = 8;
  zero2.zero_stage = 2;
  zero3.zero_stage = 3;
  Figures a, b;
  a.step_seconds = 1.0;
  a.tokens_per_second = 1e6;
  a.peak_bytes = Bytes{70} << 30;
  b = a;
  b.peak_bytes = Bytes{57} << 30;
  int checked = 0;
  // Differences far inside the tolerance, over many magnitudes: the lower peak ranks first,
  // whichever is a hair faster.
  for (double tps = 1e2; tps < 1e9; tps *= 3.7) {
    for (double rel : {2e-14, 1e-12, 1e-11}) {
      a.tokens_per_second = tps * (1 + rel);  // ZeRO-2 a hair faster
      b.tokens_per_second = tps;
      EXPECT_TRUE(ranks_before(Objective::throughput, zero3, b, zero2, a)) << tps << " " << rel;
      EXPECT_FALSE(ranks_before(Objective::throughput, zero2, a, zero3, b)) << tps << " " << rel;
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
  // Beyond the tolerance the faster wins regardless of memory.
  a.tokens_per_second = 1e6 * (1 + 1e-7);
  b.tokens_per_second = 1e6;
  EXPECT_TRUE(ranks_before(Objective::throughput, zero2, a, zero3, b));
  // The memory objective breaks its ties by throughput, with the same tolerance.
  a.peak_bytes = b.peak_bytes;
  a.tokens_per_second = 1e6 * (1 + 1e-7);
  EXPECT_TRUE(ranks_before(Objective::memory, zero3, a, zero2, b));
}

TEST(Search, ResultsDoNotDependOnTheThreadCount) {
  Request req = request_of("llama2-70b", 64, 512, 4096);
  req.options.top_k = 25;
  req.options.threads = 1;
  const Result one = run(req.space, req.options);
  for (int t : {2, 3, 8}) {
    req.options.threads = t;
    const Result many = run(req.space, req.options);
    EXPECT_EQ(many.evaluated, one.evaluated);
    EXPECT_EQ(many.feasible, one.feasible);
    EXPECT_EQ(many.rejected, one.rejected);
    EXPECT_EQ(many.plans, one.plans) << t << " threads";
  }
}

TEST(Search, PinnedDimensionIsHonouredInEveryPlan) {
  Request req = request_of("llama2-70b", 64, 512, 4096,
                           {{"parallel", {{"pp", 2}, {"recompute", {"none", "full"}}}}});
  req.options.top_k = 30;
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  for (const Plan& p : r.plans) {
    EXPECT_EQ(p.layout.pp, 2);
    EXPECT_NE(p.layout.recompute, Recompute::selective);
  }
}

TEST(Search, EmptySpaceIsAnAnswerNotAnError) {
  // tp = 3 divides neither 64 heads nor 64 GPUs.
  const Request req = request_of("llama2-70b", 64, 512, 4096, {{"parallel", {{"tp", 3}}}});
  Result r;
  ASSERT_NO_THROW(r = run(req.space, req.options));
  EXPECT_EQ(r.evaluated, 0u);
  EXPECT_TRUE(r.plans.empty());
  EXPECT_GT(r.rejected[static_cast<int>(Reject::gpus_not_divisible)] +
                r.rejected[static_cast<int>(Reject::tp_divides_heads)],
            0u);
  const nlohmann::json j = result_to_json(req, r);
  EXPECT_EQ(j.at("plans").size(), 0u);
  EXPECT_NE(j.at("answer").get<std::string>().find("constraints"), std::string::npos);
}

TEST(Search, NothingFitsGivesTheClosestAndWhatWouldFit) {
  // 405B on one node: ~6.5 TB of weights, gradients and optimizer state cannot fit in 640 GB.
  Request req = request_of("llama3.1-405b", 8, 64, 8192);
  const Result r = run(req.space, req.options);
  EXPECT_GT(r.evaluated, 0u);
  EXPECT_EQ(r.feasible, 0u);
  EXPECT_TRUE(r.plans.empty());
  ASSERT_TRUE(r.closest.has_value());
  EXPECT_GT(r.closest->figures.peak_bytes, r.closest->figures.capacity_bytes);
  bool more_gpus = false;
  for (const Suggestion& s : r.suggestions) {
    if (s.change == "more_gpus") {
      more_gpus = true;
      EXPECT_GT(s.value, 8.0);
      // The suggested cluster really fits: search it.
      Request bigger = req;
      bigger.space.base.cluster.num_gpus = static_cast<Count>(s.value);
      bigger.options.suggest = false;
      EXPECT_FALSE(run(bigger.space, bigger.options).plans.empty());
    }
  }
  EXPECT_TRUE(more_gpus);
}

TEST(Search, MemoryObjectiveRanksByPeak) {
  Request req = request_of("llama3.1-8b", 16, 64, 4096);
  req.options.objective = Objective::memory;
  req.options.top_k = 10;
  const Result r = run(req.space, req.options);
  ASSERT_EQ(r.plans.size(), 10u);
  for (std::size_t i = 1; i < r.plans.size(); ++i) {
    EXPECT_LE(r.plans[i - 1].bound.peak_bytes, r.plans[i].bound.peak_bytes);
  }
}

TEST(Search, GpusObjectiveFindsTheFewestGpusForATarget) {
  Request req = request_of("llama3.1-8b", 64, 256, 4096);
  // First: the best throughput on 16 GPUs, as a target a 64-GPU cluster must reach with fewest.
  Request sixteen = req;
  sixteen.space.base.cluster.num_gpus = 16;
  const Result r16 = run(sixteen.space, sixteen.options);
  ASSERT_FALSE(r16.plans.empty());
  req.options.objective = Objective::gpus;
  req.space.fewer_gpus = true;
  req.options.target_tokens_per_second = r16.plans.front().figures.tokens_per_second;
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_LE(r.plans.front().layout.num_gpus(), 16);
  for (const Plan& p : r.plans) {
    EXPECT_GE(p.figures.tokens_per_second, req.options.target_tokens_per_second);
    EXPECT_GE(p.layout.num_gpus(), r.plans.front().layout.num_gpus());
  }
}

TEST(Search, CancelStopsEarly) {
  Request req = request_of("llama2-70b", 64, 512, 4096);
  const Result full = run(req.space, req.options);
  std::atomic<bool> cancel{true};
  req.options.cancel = &cancel;
  const Result r = run(req.space, req.options);
  EXPECT_TRUE(r.cancelled);
  EXPECT_FALSE(full.cancelled);
  EXPECT_LT(r.evaluated, full.evaluated);
}

TEST(Search, ParallelOfSpellsTheWholeGroupShard) {
  Layout l;
  l.dp = 16;
  l.zero_stage = 3;
  EXPECT_EQ(parallel_of(l).fsdp_shard_size, 16);
  l.fsdp_shard_size = 4;
  EXPECT_EQ(parallel_of(l).fsdp_shard_size, 4);
}

TEST(Search, UnreachableTargetSaysHowManyGpusWouldReachIt) {
  Request req = request_of("llama3.1-8b", 8, 256, 4096);
  req.options.objective = Objective::gpus;
  req.space.fewer_gpus = true;
  // The best of 8 GPUs, doubled: 8 GPUs cannot reach it, some larger cluster can.
  Request eight = request_of("llama3.1-8b", 8, 256, 4096);
  req.options.target_tokens_per_second =
      2.0 * run(eight.space, eight.options).plans.front().figures.tokens_per_second;
  const Result r = run(req.space, req.options);
  EXPECT_TRUE(r.plans.empty());
  EXPECT_GT(r.rejected[static_cast<int>(Reject::below_target)], 0u);
  ASSERT_TRUE(r.closest.has_value());
  EXPECT_LT(r.closest->figures.tokens_per_second, req.options.target_tokens_per_second);
  bool more = false;
  for (const Suggestion& s : r.suggestions) more = more || s.change == "more_gpus";
  EXPECT_TRUE(more);
  EXPECT_NE(format_result_table(req, r).find("none reaches the target"), std::string::npos);
}

TEST(Search, ProgressIsReportedAsAFraction) {
  Request req = request_of("llama2-70b", 64, 512, 4096);
  double last = -1;
  bool monotonic = true;
  req.options.progress = [&](double f, std::uint64_t) {
    if (f < last || f > 1.0) monotonic = false;
    last = f;
  };
  const Result r = run(req.space, req.options);
  EXPECT_TRUE(monotonic);
  EXPECT_GT(r.evaluated, 0u);
}

// The space is counted before it is enumerated (issue 18): the count equals the enumeration (a
// second algorithm) over spaces of every kind, and a space past kMaxLayouts is refused at once.
TEST(SearchLimits, CountEqualsTheEnumeration) {
  const std::vector<Request> reqs = {
      request_of("llama2-70b", 64, 512, 4096), request_of("gpt3-1.3b", 8, 64, 2048),
      request_of(
          "llama2-7b", 48, 96, 4096,
          {{"search", {{"constraints", {{"tp_within_node", false}, {"hybrid_shard", true}}}}}}),
      request_of("llama2-13b", 16, 32, 4096,
                 {{"search", {{"objective", "gpus"}, {"target_tokens_per_second", 1e5}}}})};
  for (const Request& req : reqs) {
    RejectCounts rejected{};
    EXPECT_EQ(count_layouts(req.space), enumerate_layouts(req.space, rejected).size());
  }
}

TEST(SearchLimits, HugeSpaceIsRefusedBeforeEnumerating) {
  nlohmann::json model = {{"num_layers", 55440},       {"hidden_size", 1024},
                          {"num_attention_heads", 16}, {"ffn_hidden_size", 4096},
                          {"vocab_size", 32000},       {"position_embedding", "rotary"}};
  // The request: 720,720 GPUs, 55,440 layers, the fewest GPUs for a target (every GPU
  // count up to the cluster), which would have run for hours.
  Request req = request_of(
      "llama2-7b", 720720, 720720 * 4, 2048,
      {{"model", model}, {"search", {{"objective", "gpus"}, {"target_tokens_per_second", 1e9}}}});
  req.options.threads = 1;
  try {
    (void)run(req.space, req.options);
    ADD_FAILURE() << "a space past kMaxLayouts ran";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel");
    EXPECT_NE(std::string(e.what()).find("layouts"), std::string::npos) << e.what();
  }
  EXPECT_GT(count_layouts(req.space), kMaxLayouts);
}

TEST(SearchLimits, TopKOutsideTheJsonRangeIsRefusedWhoeverSetsIt) {
  Request req = request_of("gpt3-1.3b", 8, 64, 2048);
  for (int top : {0, -1, kMaxTopK + 1, 2147483647}) {
    req.options.top_k = top;
    try {
      (void)run(req.space, req.options);
      ADD_FAILURE() << "top_k " << top << " accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), "/search/top_k");
    }
  }
}

// The walks run in parallel waves and report progress: the plans are the same as with one
// thread, and so is the number of layouts walked.
TEST(SearchLimits, ParallelWalksMatchOneThreadAndReportProgress) {
  Request req = request_of("llama2-7b", 16, 64, 4096);
  req.options.threads = 1;
  const Result one = run(req.space, req.options);
  req.options.threads = 4;
  std::uint64_t last = 0;
  bool monotonic = true;
  req.options.walk_progress = [&](std::uint64_t walked, std::uint64_t candidates) {
    monotonic = monotonic && walked >= last && candidates >= walked;
    last = walked;
  };
  const Result many = run(req.space, req.options);
  EXPECT_EQ(many.plans, one.plans);
  EXPECT_EQ(many.walked, one.walked);
  EXPECT_TRUE(monotonic);
  EXPECT_EQ(last, many.walked);
  EXPECT_GT(one.walked, 0u);
}

}  // namespace
}  // namespace distplan::search
