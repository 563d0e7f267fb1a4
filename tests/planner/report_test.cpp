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
  const Estimate e = estimate(s);
  ASSERT_FALSE(e.memory.fits);
  const auto fixes = fit_suggestions(s, e);
  ASSERT_FALSE(fixes.empty());
  bool some_fit = false;
  for (const auto& f : fixes) {
    const Estimate again = estimate(f.scenario);
    EXPECT_EQ(again.memory.peak_bytes, f.peak_bytes) << f.change;
    EXPECT_EQ(f.saving_bytes, e.memory.peak_bytes - f.peak_bytes) << f.change;
    EXPECT_GT(f.saving_bytes, 0) << f.change;
    EXPECT_EQ(again.memory.fits, f.fits) << f.change;
    some_fit |= f.fits;
  }
  EXPECT_TRUE(some_fit);  // 16 GPUs with ZeRO-3 or pp=2 hold Llama-2-70B
  for (std::size_t i = 1; i < fixes.size(); ++i)
    EXPECT_LE(fixes[i - 1].peak_bytes, fixes[i].peak_bytes);
}

TEST(PlanTable, SaysWhatDoesNotFitAndBy) {
  const Scenario s = testing::scenario(too_big());
  const std::string t = format_plan_table(s, estimate(s));
  EXPECT_NE(t.find("DOES NOT FIT"), std::string::npos);
  EXPECT_NE(t.find("What would help"), std::string::npos);
  EXPECT_NE(t.find("GiB"), std::string::npos);
}

TEST(PlanTable, ShowsEveryStageAndTheTime) {
  const Scenario s = testing::scenario(testing::default_doc());
  const std::string t = format_plan_table(s, estimate(s));
  EXPECT_NE(t.find("<- peak"), std::string::npos);
  EXPECT_NE(t.find("fits"), std::string::npos);
  EXPECT_NE(t.find("MFU"), std::string::npos);
  EXPECT_NE(t.find("tokens/s"), std::string::npos);
}

}  // namespace
}  // namespace distplan
