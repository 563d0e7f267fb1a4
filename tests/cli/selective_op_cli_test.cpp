// Per-op selective checkpointing (parallel.recompute "selective_op") through the CLI: plan and
// simulate take it; validate refuses it at /parallel/recompute because the training backend
// saves Megatron-style tensors, not torchtitan's op outputs.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

json tiny_op_sac() {
  return {{"model", "tiny-gpt"},
          {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 2}}},
          {"training",
           {{"framework", "generic"},
            {"seq_length", 32},
            {"global_batch_size", 8},
            {"micro_batch_size", 2},
            {"precision", "fp32"}}},
          {"parallel", {{"tp", 1}, {"pp", 2}, {"dp", 1}, {"recompute", "selective_op"}}}};
}

TEST(SelectiveOpCli, PlanAndSimulateTakeItValidateRefusesIt) {
  const TempDir dir;
  const auto in = dir.write("s.json", tiny_op_sac().dump());
  for (const char* cmd : {"plan", "simulate"}) {
    const CliResult r = run_cli({cmd, in.string()});
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
  }
  const CliResult r = run_cli({"validate", in.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json e = json::parse(r.err, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << r.err;
  EXPECT_EQ(e["error"].value("path", ""), "/parallel/recompute");
}

TEST(SelectiveOpCli, AnUnknownRecomputeNameIsRefusedAtItsPath) {
  json doc = tiny_op_sac();
  doc["parallel"]["recompute"] = "op";
  const TempDir dir;
  const auto in = dir.write("s.json", doc.dump());
  const CliResult r = run_cli({"plan", in.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json e = json::parse(r.err, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << r.err;
  EXPECT_EQ(e["error"].value("path", ""), "/parallel/recompute");
}

}  // namespace
}  // namespace distplan::testing
