#include "distplan/planner/report.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

json too_big() {
  return {{"model", "llama2-70b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 8}}},
          {"training", {{"seq_length", 4096}, {"global_batch_size", 64}}},
          {"parallel", {{"tp", 8}}}};
}

TEST(FitSuggestions, EachSuggestionIsReEstimatedAndLowersThePeak) {
  const Scenario s = testing::scenario(too_big());
  const Estimate e = sim::plan(s);
  ASSERT_FALSE(e.memory.fits);
  const auto fixes = fit_suggestions(s, e, testing::planner());
  ASSERT_FALSE(fixes.empty());
  bool some_fit = false;
  for (const auto& f : fixes) {
    const Estimate again = sim::plan(f.scenario);
    EXPECT_EQ(again.memory.peak_bytes, f.peak_bytes) << f.change;
    EXPECT_EQ(f.saving_bytes, e.memory.peak_bytes - f.peak_bytes) << f.change;
    EXPECT_GT(f.saving_bytes, 0) << f.change;
    EXPECT_EQ(again.memory.fits, f.fits) << f.change;
    some_fit |= f.fits;
  }
  EXPECT_TRUE(some_fit);  // 16 GPUs with ZeRO-3 or pp=2 hold Llama-2-70B
}

// Issue 17: what works on the user's GPUs comes before "more GPUs", and each suggestion carries
// its time cost (its own estimate's step time minus the scenario's).
TEST(FitSuggestions, SameGpusFirstEachWithItsTimeCost) {
  for (const json& doc :
       {too_big(), json{{"model", "llama2-70b"},
                        {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}}},
                        {"training", {{"seq_length", 4096}, {"global_batch_size", 64}}},
                        {"parallel", {{"tp", 8}}}}}) {
    const Scenario s = testing::scenario(doc);
    const Estimate e = sim::plan(s);
    const auto fixes = fit_suggestions(s, e, testing::planner());
    ASSERT_FALSE(fixes.empty());
    int rank = 0;  // 0: fits here, 1: other changes here, 2: more GPUs; never decreasing
    for (std::size_t i = 0; i < fixes.size(); ++i) {
      const FitSuggestion& f = fixes[i];
      EXPECT_EQ(f.more_gpus, f.scenario.cluster.num_gpus > s.cluster.num_gpus) << f.change;
      const int r = f.more_gpus ? 2 : f.fits ? 0 : 1;
      EXPECT_GE(r, rank) << f.change << " listed after a worse group";
      if (i > 0 && r == rank && r == 0) {
        EXPECT_LE(fixes[i - 1].step_seconds, f.step_seconds) << f.change;
      } else if (i > 0 && r == rank) {
        EXPECT_LE(fixes[i - 1].peak_bytes, f.peak_bytes) << f.change;
      }
      rank = r;
      const Estimate again = sim::plan(f.scenario);
      EXPECT_DOUBLE_EQ(f.step_seconds, again.time.step_seconds) << f.change;
      EXPECT_DOUBLE_EQ(f.time_cost_seconds, again.time.step_seconds - e.time.step_seconds)
          << f.change;
    }
  }
  // Full recompute on the same GPUs costs time (the forward runs twice): its cost is positive.
  const Scenario s = testing::scenario(too_big());
  for (const auto& f : fit_suggestions(s, sim::plan(s), testing::planner())) {
    if (f.change == "full recompute") {
      EXPECT_GT(f.time_cost_seconds, 0);
    }
  }
  const std::string t = testing::plan_table(s);
  EXPECT_NE(t.find("ms/step"), std::string::npos);
}

TEST(PlanTable, SaysWhatDoesNotFitAndBy) {
  const Scenario s = testing::scenario(too_big());
  const std::string t = testing::plan_table(s);
  EXPECT_NE(t.find("DOES NOT FIT"), std::string::npos);
  EXPECT_NE(t.find("What would help"), std::string::npos);
  EXPECT_NE(t.find("GiB"), std::string::npos);
}

TEST(PlanTable, ShowsEveryStageAndTheTime) {
  const Scenario s = testing::scenario(testing::default_doc());
  const std::string t = testing::plan_table(s);
  EXPECT_NE(t.find("<- peak"), std::string::npos);
  EXPECT_NE(t.find("fits"), std::string::npos);
  EXPECT_NE(t.find("MFU"), std::string::npos);
  EXPECT_NE(t.find("tokens/s"), std::string::npos);
}

}  // namespace
}  // namespace distplan
