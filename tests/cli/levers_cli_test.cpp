// The memory levers at the CLI: bad values end with exit 2 and the field's pointer, and
// `distplan validate` refuses what the backend does not train with instead of validating a
// different run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

json tiny(const json& parallel, const json& training = json::object()) {
  json doc = {
      {"model", "tiny-llama"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2}}},
      {"training", {{"framework", "generic"}, {"seq_length", 64}, {"global_batch_size", 2}}},
      {"parallel", parallel}};
  for (const auto& [k, v] : training.items()) doc["training"][k] = v;
  return doc;
}

// Runs `distplan <command> FILE` and returns the error's path (exit 2 expected).
std::string error_path(const std::string& command, const json& doc,
                       const std::vector<std::string>& extra = {}) {
  TempDir dir;
  const auto file = dir.write("scenario.json", doc.dump());
  std::vector<std::string> args = {command, file.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  EXPECT_EQ(r.out, "");
  try {
    return json::parse(r.err).at("error").at("path").get<std::string>();
  } catch (const json::exception&) {
    ADD_FAILURE() << r.err;
    return "";
  }
}

TEST(LeversCli, BadValuesNameTheirField) {
  EXPECT_EQ(error_path("plan", tiny({{"tp", 1}, {"cp", 2}, {"cp_comm", "ring"}})),
            "/parallel/cp_comm");
  EXPECT_EQ(error_path("plan", tiny({{"dp", 2}, {"offload_params", "cpu"}})),
            "/parallel/offload_params");
  EXPECT_EQ(error_path("plan", tiny({{"dp", 2}}, {{"precision", "fp8"}, {"fp8_recipe", "x"}})),
            "/training/fp8_recipe");
}

TEST(LeversCli, ValidateRefusesWhatTheBackendDoesNotTrainWith) {
  // Context parallelism trains on the CPU only.
  EXPECT_EQ(error_path("validate", tiny({{"tp", 1}, {"cp", 2}, {"dp", 1}}), {"--device", "cuda"}),
            "/parallel/cp");
  EXPECT_EQ(
      error_path("validate", tiny({{"dp", 2}, {"zero_stage", 1}, {"offload_optimizer", "cpu"}})),
      "/parallel/offload_optimizer");
  EXPECT_EQ(error_path("validate", tiny({{"dp", 2}}, {{"precision", "fp8"}})),
            "/training/precision");
  // Frameworks whose copies and buckets the backend does not keep (issue 29, item 8): their
  // differences would read as prediction error.
  for (const char* framework : {"deepspeed", "fsdp2"})
    EXPECT_EQ(error_path("validate", tiny({{"dp", 2}}, {{"framework", framework}})),
              "/training/framework")
        << framework;
}

}  // namespace
}  // namespace distplan::testing
