// The V-shape schedules and zb_auto through the CLI: plan, simulate and validate accept them.
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
           {{"framework", "generic"},
            {"seq_length", 32},
            {"global_batch_size", 16},
            {"micro_batch_size", 2},
            {"precision", "fp32"}}},
          {"parallel", {{"tp", 1}, {"pp", 2}, {"dp", 1}, {"schedule", "zb_v"}}}};
}

TEST(VScheduleCli, PlanAndSimulateAcceptTheVSchedules) {
  // dualpipe: m = 8 >= 2 pp, even; 4 layers, two model stages of 1 layer per stage.
  for (const char* sched : {"zb_v", "v_half", "v_min", "dualpipe_v", "dualpipe"}) {
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

TEST(VScheduleCli, ValidateRunsAZbVStage) {
  // One rank of the V emulated (no launcher): stage 0 holds the embedding and the LM head, its
  // bytes and its point-to-point traffic equal the planner's (the full MPI runs are in the
  // backend's layout matrix, training_test.cpp).
  const TempDir dir;
  const auto in = dir.write("s.json", tiny_v().dump());
  const CliResult r = run_cli({"validate", in.string(), "--steps", "1", "--emulate-rank", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  const json& ms = doc.at("measured").at("memory").at("stages");
  ASSERT_EQ(ms.size(), 1u);
  const json& ps = doc.at("predicted").at("memory").at("stages").at(0);
  for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
    EXPECT_EQ(ms[0].at(k).get<long long>(), ps.at(k).get<long long>()) << k;
  const json& ec = doc.at("relative_error").at("communication").at("stages");
  ASSERT_EQ(ec.size(), 1u);
  EXPECT_EQ(ec[0].at("collectives").at("pp/send_recv").get<double>(), 0.0);
}

TEST(VScheduleCli, ValidateRunsZbAuto) {
  // zb_auto's order comes from the planner's stage times; the backend builds the same one
  // (sim::scenario_program) and one emulated rank runs it with the planner's parameter bytes.
  json doc = tiny_v();
  doc["parallel"]["schedule"] = "zb_auto";
  const TempDir dir;
  const auto in = dir.write("s.json", doc.dump());
  const CliResult r = run_cli({"validate", in.string(), "--steps", "1", "--emulate-rank", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  const json& ms = out.at("measured").at("memory").at("stages");
  ASSERT_EQ(ms.size(), 1u);
  const json& ps = out.at("predicted").at("memory").at("stages").at(0);
  for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
    EXPECT_EQ(ms[0].at(k).get<long long>(), ps.at(k).get<long long>()) << k;
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
