// The V-shape schedules through the CLI: plan and simulate accept them; validate refuses zb_v at
// /parallel/schedule, because the training backend places chunks Megatron-LM's way and would run
// a V program with the wrong layers and neighbours.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

json tiny_v() {
  return {{"model", "tiny-gpt"},  // 4 layers: two chunks of one layer on each of 2 stages
          {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 2}}},
          {"training",
           {{"seq_length", 32},
            {"global_batch_size", 16},
            {"micro_batch_size", 2},
            {"precision", "fp32"}}},
          {"parallel", {{"tp", 1}, {"pp", 2}, {"dp", 1}, {"schedule", "zb_v"}}}};
}

TEST(VScheduleCli, PlanAndSimulateAcceptTheVSchedules) {
  for (const char* sched : {"zb_v", "v_half", "v_min", "dualpipe_v"}) {
    json doc = tiny_v();
    doc["parallel"]["schedule"] = sched;
    const TempDir dir;
    const auto in = dir.write("s.json", doc.dump());
    for (const char* cmd : {"plan", "simulate"}) {
      const CliResult r = run_cli({cmd, in.string()});
      EXPECT_EQ(r.exit_code, 0) << sched << " " << cmd << ": " << r.err;
    }
  }
}

TEST(VScheduleCli, ValidateRefusesZbVAtTheSchedule) {
  const TempDir dir;
  const auto in = dir.write("s.json", tiny_v().dump());
  const CliResult r = run_cli({"validate", in.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json e = json::parse(r.err, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << r.err;
  EXPECT_EQ(e["error"].value("path", ""), "/parallel/schedule");
  EXPECT_NE(e["error"].value("message", "").find("V-shape"), std::string::npos) << r.err;
}

TEST(VScheduleCli, ValidateRefusesZbAutoAtTheSchedule) {
  json doc = tiny_v();
  doc["parallel"]["schedule"] = "zb_auto";
  const TempDir dir;
  const auto in = dir.write("s.json", doc.dump());
  const CliResult r = run_cli({"validate", in.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json e = json::parse(r.err, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << r.err;
  EXPECT_EQ(e["error"].value("path", ""), "/parallel/schedule");
  // plan and simulate take it.
  for (const char* cmd : {"plan", "simulate"}) EXPECT_EQ(run_cli({cmd, in.string()}).exit_code, 0);
}

TEST(VScheduleCli, TooFewMicrobatchesForTheVAreRefused) {
  json doc = tiny_v();
  doc["training"]["global_batch_size"] = 6;  // m = 3 < 2 pp
  const TempDir dir;
  const auto in = dir.write("s.json", doc.dump());
  const CliResult r = run_cli({"plan", in.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json e = json::parse(r.err, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << r.err;
  EXPECT_EQ(e["error"].value("path", ""), "/parallel/schedule");
}

}  // namespace
}  // namespace distplan::testing
