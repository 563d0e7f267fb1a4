// Megatron-LM's MoE arguments (megatron_moe_args, docs/exports.md): every flag exists in the
// named version with a valid value, and the values are the released configs' numbers.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/export.h"

namespace distplan::search {
namespace {

std::map<std::string, std::string> moe_args(const std::string& preset, Count ep, Count etp,
                                            std::vector<std::string>* notes = nullptr) {
  Scenario s;
  s.model = *find_model_preset(preset);
  s.parallel.ep = ep;
  s.parallel.etp = etp;
  std::vector<std::string> args, n;
  megatron_moe_args(s, args, n);
  if (notes) *notes = n;
  std::map<std::string, std::string> out;
  for (const std::string& a : args) {
    const auto space = a.find(' ');
    out[a.substr(0, space)] = space == std::string::npos ? "" : a.substr(space + 1);
  }
  return out;
}

void expect_known_flags(const std::map<std::string, std::string>& args) {
  const nlohmann::json flags = nlohmann::json::parse(
      *embedded_data_file("reference/megatron_core_v0.15.3_arguments.json"))["flags"];
  for (const auto& [flag, value] : args) {
    ASSERT_TRUE(flags.contains(flag)) << flag << " is not a Megatron-LM core_v0.15.3 argument";
    const nlohmann::json& f = flags.at(flag);
    EXPECT_EQ(f.value("takes_value", true), !value.empty()) << flag;
    if (f.contains("choices")) {
      const auto& c = f.at("choices");
      EXPECT_NE(std::find(c.begin(), c.end(), value), c.end()) << flag << " " << value;
    }
  }
}

// Mixtral-8x7B config.json: num_local_experts 8, num_experts_per_tok 2, intermediate_size 14336,
// every layer sparse, softmax router.
TEST(ExportMoe, MixtralMegatronArguments) {
  const auto a = moe_args("mixtral-8x7b", 8, 1);
  expect_known_flags(a);
  EXPECT_EQ(a.at("--num-experts"), "8");
  EXPECT_EQ(a.at("--moe-router-topk"), "2");
  EXPECT_EQ(a.at("--moe-ffn-hidden-size"), "14336");
  EXPECT_EQ(a.at("--moe-layer-freq"), "1");
  EXPECT_EQ(a.at("--moe-router-score-function"), "softmax");
  EXPECT_EQ(a.at("--moe-token-dispatcher-type"), "alltoall");
  EXPECT_EQ(a.at("--expert-model-parallel-size"), "8");
  EXPECT_EQ(a.at("--expert-tensor-parallel-size"), "1");
  EXPECT_FALSE(a.contains("--moe-shared-expert-intermediate-size"));
  EXPECT_FALSE(a.contains("--moe-router-enable-expert-bias"));
  EXPECT_FALSE(a.contains("--moe-expert-capacity-factor"));
  // The plan's objective and kernels: the config's router_aux_loss_coef 0.02 (Megatron-LM's own
  // default 0.0 would drop the loss), and grouped expert GEMMs.
  EXPECT_EQ(a.at("--moe-aux-loss-coeff"), "0.02");
  EXPECT_TRUE(a.contains("--moe-grouped-gemm"));
}

// The DeepSpeed and torchtitan exports of a MoE layout carry its experts, never a dense model of
// the same width: Mixtral-8x7B (8 experts, top-2, width 14336) on 32 GPUs with ep = 8.
nlohmann::json mixtral_on_32_doc(const char* framework) {
  nlohmann::json d = nlohmann::json::parse(R"({
    "model": "mixtral-8x7b",
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32, "gpus_per_node": 8},
    "training": {"seq_length": 4096, "global_batch_size": 256, "micro_batch_size": 1},
    "parallel": {"tp": 1, "pp": 4, "dp": 8, "ep": 8, "zero_stage": 1}})");
  d["training"]["framework"] = framework;
  return d;
}
Scenario mixtral_on_32(const char* framework = "deepspeed") {
  return scenario_from_json(mixtral_on_32_doc(framework));
}

TEST(ExportMoe, DeepSpeedNamesTheExpertsTheModelCodeHolds) {
  const Exported e = export_scenario(mixtral_on_32(), ExportFormat::deepspeed);
  const auto it = std::find_if(e.to_add.begin(), e.to_add.end(), [](const std::string& a) {
    return a.find("deepspeed.moe.layer.MoE(") != std::string::npos;
  });
  ASSERT_NE(it, e.to_add.end());
  for (const char* part : {"hidden_size=4096", "width 14336", "num_experts=8", "ep_size=8", "k=2",
                           "drop_tokens=False"})
    EXPECT_NE(it->find(part), std::string::npos) << part << " in " << *it;
}

TEST(ExportMoe, TorchtitanSetsExpertParallelAndNoDenseLlama) {
  // torchtitan has no ZeRO-1 (FSDP2 shards everything), so the 32-GPU ZeRO-1 layout is refused;
  // its experts fold into the FSDP mesh, which the planner does not plan for MoE yet
  // (docs/moe.md). One layout it runs: plain data parallelism over 32 GPUs (DDP, 1-D).
  try {
    (void)mixtral_on_32("torchtitan");
    ADD_FAILURE() << "planned ZeRO-1 under torchtitan";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/zero_stage");
  }
  nlohmann::json doc = mixtral_on_32_doc("torchtitan");
  doc["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 32}, {"ep", 1}, {"zero_stage", 0}};
  const Scenario moe = scenario_from_json(doc);
  const Exported e = export_scenario(moe, ExportFormat::torchtitan);
  // The MoE model section names the experts (no dense llama3 of the same width).
  EXPECT_NE(e.text.find("expert_parallel_degree = 1\n"), std::string::npos) << e.text;
  EXPECT_EQ(e.text.find("name = \"llama3\""), std::string::npos) << e.text;
  bool says_moe = false;
  for (const std::string& n : e.notes)
    says_moe |= n.find("8 routed experts of width 14336") != std::string::npos;
  EXPECT_TRUE(says_moe);
  // A dense model keeps llama3 and gets no expert degree.
  Scenario dense = moe;
  dense.model = *find_model_preset("llama2-7b");
  dense.parallel.ep = 1;
  const Exported d = export_scenario(dense, ExportFormat::torchtitan);
  EXPECT_EQ(d.text.find("expert_parallel_degree"), std::string::npos);
  EXPECT_NE(d.text.find("name = \"llama3\""), std::string::npos);
}

// DeepSeek-V3 config.json: n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size
// 2048, n_shared_experts 1, first_k_dense_replace 3 of 61 layers, scoring_func sigmoid with the
// noaux_tc expert bias.
TEST(ExportMoe, DeepSeekV3MegatronArguments) {
  const auto a = moe_args("deepseek-v3", 64, 1);
  expect_known_flags(a);
  EXPECT_EQ(a.at("--num-experts"), "256");
  EXPECT_EQ(a.at("--moe-router-topk"), "8");
  EXPECT_EQ(a.at("--moe-ffn-hidden-size"), "2048");
  EXPECT_EQ(a.at("--moe-shared-expert-intermediate-size"), "2048");
  EXPECT_EQ(a.at("--moe-router-score-function"), "sigmoid");
  EXPECT_TRUE(a.contains("--moe-router-enable-expert-bias"));
  EXPECT_EQ(a.at("--expert-model-parallel-size"), "64");
  std::string pattern = "[0,0,0";
  for (int i = 3; i < 61; ++i) pattern += ",1";
  EXPECT_EQ(a.at("--moe-layer-freq"), pattern + "]");
}

// DeepSeek-V3's latent attention in Megatron-LM's terms (config.json: q_lora_rank 1536,
// kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128): every flag a
// core_v0.15.3 argument, no grouped-query flags (MLA's heads each have their own key and value).
TEST(ExportMoe, DeepSeekV3LatentAttentionArguments) {
  const nlohmann::json doc = {
      {"model", {{"preset", "deepseek-v3"}}},
      {"cluster", {{"gpu", "h800-sxm-80gb"}, {"num_gpus", 256}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 256}, {"micro_batch_size", 1}}},
      {"parallel",
       {{"tp", 1}, {"pp", 1}, {"dp", 256}, {"ep", 32}, {"zero_stage", 1}, {"recompute", "full"}}}};
  const Scenario s = scenario_from_json(doc);
  const Exported e = export_scenario(s, ExportFormat::megatron);
  // Each flag and its value as the export writes them: "--flag value" or "--flag".
  std::map<std::string, std::string> a;
  for (const char* f :
       {"--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
        "--qk-pos-emb-head-dim", "--v-head-dim", "--group-query-attention", "--mtp-num-layers"}) {
    const std::string flag = f;
    const auto at = e.text.find(flag + " ");
    if (at == std::string::npos) continue;
    const auto from = at + flag.size() + 1;
    const auto end = e.text.find_first_of(" \\\n", from);
    std::string value = e.text.substr(from, end - from);
    if (value.rfind("--", 0) == 0) value.clear();
    a[flag] = value;
  }
  EXPECT_TRUE(a.contains("--multi-latent-attention"));
  EXPECT_EQ(a.at("--q-lora-rank"), "1536");
  EXPECT_EQ(a.at("--kv-lora-rank"), "512");
  EXPECT_EQ(a.at("--qk-head-dim"), "128");
  EXPECT_EQ(a.at("--qk-pos-emb-head-dim"), "64");
  EXPECT_EQ(a.at("--v-head-dim"), "128");
  EXPECT_FALSE(a.contains("--group-query-attention"));
  EXPECT_EQ(a.at("--mtp-num-layers"), "1");  // num_nextn_predict_layers
  expect_known_flags(a);
}

TEST(ExportMoe, DenseModelsGetNoMoeArguments) {
  EXPECT_TRUE(moe_args("llama2-70b", 1, 1).empty());
}

}  // namespace
}  // namespace distplan::search
