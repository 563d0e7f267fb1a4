// A new user's path with a Mixture-of-Experts config.json: the CLI counts it exactly and plans its
// experts (docs/moe.md), validate refuses it at the model's moe field; Qwen3 (dense) plans.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

// mistralai/Mixtral-8x7B-v0.1 config.json (the fields that shape the model).
const json kMixtral = {{"architectures", {"MixtralForCausalLM"}},
                       {"model_type", "mixtral"},
                       {"hidden_act", "silu"},
                       {"hidden_size", 4096},
                       {"intermediate_size", 14336},
                       {"max_position_embeddings", 32768},
                       {"num_attention_heads", 32},
                       {"num_experts_per_tok", 2},
                       {"num_hidden_layers", 32},
                       {"num_key_value_heads", 8},
                       {"num_local_experts", 8},
                       {"rms_norm_eps", 1e-05},
                       {"rope_theta", 1e6},
                       {"router_aux_loss_coef", 0.02},
                       {"sliding_window", nullptr},
                       {"tie_word_embeddings", false},
                       {"vocab_size", 32000}};

TEST(MoeCli, MixtralConfigPlansWithItsExpertsAndValidateRefusesItsBf16) {
  TempDir dir;
  const auto cfg = dir.write("config.json", kMixtral.dump());
  const CliResult r = run_cli({"plan", "--hf-config", cfg.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = json::parse(r.out);
  // The published count (46,702,792,704; 12.9B active), not the 7.24B of a dense reading.
  EXPECT_EQ(plan["model_summary"]["parameters"], 46702792704);
  EXPECT_NEAR(plan["model_summary"]["active_parameters"].get<double>(), 12.9e9, 0.05e9);
  // The default layout (tp 8, dp 2, ep 1): the experts' gradients are reduced over the expert
  // data-parallel group, tp·dp/ep = 16 ranks, apart from the dense ones.
  bool edp = false;
  for (const json& c : plan["communication"]["collectives"]) {
    if (c["group"] == "edp") {
      edp = true;
      EXPECT_EQ(c["group_size"], 16);
    }
  }
  EXPECT_TRUE(edp) << plan["communication"].dump();
  // The CPU backend trains MoE layers in fp32 storage only: validate refuses Mixtral's bf16 at
  // its field, before any rank starts.
  const CliResult v = run_cli({"validate", "--hf-config", cfg.string()});
  EXPECT_EQ(v.exit_code, 2) << v.out;
  EXPECT_EQ(json::parse(v.err)["error"]["path"], "/training/precision") << v.err;
}

TEST(MoeCli, MixtralPresetPlansWithExpertParallelism) {
  TempDir dir;
  const json doc = {{"model", "mixtral-8x7b"},
                    {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 32}, {"gpus_per_node", 8}}},
                    {"training", {{"seq_length", 4096}, {"global_batch_size", 256}}},
                    {"parallel",
                     {{"tp", 2},
                      {"pp", 2},
                      {"dp", 8},
                      {"ep", 8},
                      {"zero_stage", 1},
                      {"sequence_parallel", true}}}};
  const auto file = dir.write("mixtral.json", doc.dump());
  const CliResult r = run_cli({"plan", file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = json::parse(r.out);
  bool a2a = false;
  for (const json& c : plan["communication"]["collectives"])
    a2a |= c["group"] == "ep" && c["op"] == "all_to_all";
  EXPECT_TRUE(a2a);
  EXPECT_GT(plan["stage_costs"][0]["ep_communication_seconds"].get<double>(), 0);
  const CliResult s = run_cli({"simulate", file.string()});
  EXPECT_EQ(s.exit_code, 0) << s.err;
}

TEST(MoeCli, PresetsListTotalAndActiveParameters) {
  const CliResult r = run_cli({"presets", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  int seen = 0;
  for (const json& m : doc["models"]) {
    if (m["name"] == "mixtral-8x7b") {
      EXPECT_EQ(m["parameters"], 46702792704);
      EXPECT_NEAR(m["active_parameters"].get<double>(), 12.9e9, 0.05e9);
      ++seen;
    }
    if (m["name"] == "deepseek-v3") {
      EXPECT_EQ(m["parameters"], 671026419200);
      EXPECT_TRUE(m.contains("mtp_parameters"));
      ++seen;
    }
    if (m["name"] == "llama2-70b") {
      EXPECT_EQ(m["parameters"], m["active_parameters"]);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 3);
}

TEST(MoeCli, Qwen3DenseConfigPlans) {
  // Qwen/Qwen3-8B config.json: head_dim 128 and q/k norms; 8,190,735,360 parameters (its
  // checkpoint's 16,381,470,720 bf16 bytes).
  const json qwen3 = {{"model_type", "qwen3"},
                      {"hidden_size", 4096},
                      {"num_hidden_layers", 36},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},
                      {"head_dim", 128},
                      {"intermediate_size", 12288},
                      {"vocab_size", 151936},
                      {"max_position_embeddings", 40960},
                      {"rope_theta", 1000000},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", false},
                      {"attention_bias", false},
                      {"use_sliding_window", false},
                      {"sliding_window", nullptr},
                      {"hidden_act", "silu"}};
  TempDir dir;
  const auto cfg = dir.write("config.json", qwen3.dump());
  const CliResult r = run_cli({"plan", "--hf-config", cfg.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = json::parse(r.out);
  EXPECT_EQ(plan["model_summary"]["parameters"], 8190735360);
  EXPECT_EQ(plan["model_summary"]["active_parameters"], 8190735360);
  EXPECT_EQ(plan["scenario"]["model"]["qk_norm"], true);
}

}  // namespace
}  // namespace distplan::testing
