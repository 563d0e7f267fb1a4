// What the CLI tells a user who got something wrong or asked for something that cannot work:
// exports of layouts that do not fit, typos with did-you-mean, lists in `plan`.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

json default_doc() {
  return json::parse(read_source_file("data/scenarios/default.json"));
}

// Llama 2 70B replicated on 8 GPUs without ZeRO: 140 GB of bf16 weights alone, on 80 GB GPUs.
json not_fitting() {
  return json::parse(R"({"model": "llama2-70b",
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
    "training": {"seq_length": 4096, "global_batch_size": 32},
    "parallel": {"tp": 1, "dp": 8}})");
}

// The error object of a run that must fail with exit 2 and nothing on stdout.
json error_of(const CliResult& r) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  try {
    return json::parse(r.err).at("error");
  } catch (const json::exception& e) {
    ADD_FAILURE() << "stderr is not one JSON error: " << r.err;
    return {};
  }
}

// --- export of a layout that does not fit (exit 2 unless --force) ---------------------------

TEST(Guidance, ExportRefusesALayoutThatDoesNotFit) {
  TempDir dir;
  const auto file = dir.write("big.json", not_fitting().dump());
  for (const char* to : {"megatron", "deepspeed", "torchtitan"}) {
    const json e = error_of(run_cli({"export", file.string(), "--to", to}));
    EXPECT_EQ(e.value("path", ""), "/parallel");
    const std::string m = e.value("message", "");
    EXPECT_NE(m.find("does not fit"), std::string::npos) << m;
    EXPECT_NE(m.find("GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("--force"), std::string::npos) << m;
  }
}

TEST(Guidance, ExportForcedCarriesTheWarning) {
  TempDir dir;
  const auto file = dir.write("big.json", not_fitting().dump());
  const CliResult r = run_cli({"export", file.string(), "--to", "megatron", "--force"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("# WARNING: this layout does not fit", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("warning: the layout does not fit"), std::string::npos) << r.err;
  const CliResult d = run_cli({"export", file.string(), "--to", "deepspeed", "--force"});
  EXPECT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NO_THROW((void)json::parse(d.out));  // still a DeepSpeed config; the warning is on stderr
  EXPECT_NE(d.err.find("warning: the layout does not fit"), std::string::npos) << d.err;
}

TEST(Guidance, ExportOfAFittingLayoutExitsZeroWithoutWarning) {
  const CliResult r = run_cli({"export", "--to", "torchtitan"});  // the embedded default fits
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("WARNING"), std::string::npos);
  EXPECT_NE(r.out.find("[model]"), std::string::npos);
  EXPECT_NE(r.out.find("# you still add:"), std::string::npos);
}

}  // namespace
}  // namespace distplan::testing
