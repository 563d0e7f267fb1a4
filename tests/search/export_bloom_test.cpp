// Exports of a BLOOM model (ALiBi, embedding LayerNorm), which Megatron-LM cannot build as it is:
// the arguments stay valid Megatron-LM arguments (no positions of its own), and what the user
// must add names both features; torchtitan's llama3 model is not offered.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/export.h"

namespace distplan::search {
namespace {

// bigscience/bloom-560m's config.json fields (data/reference/bloom_parameter_counts.json).
Scenario bloom560m(const char* framework = "megatron") {
  const nlohmann::json ref = nlohmann::json::parse(
      *embedded_data_file("reference/bloom_parameter_counts.json"))["models"]["bloom-560m"];
  return scenario_from_json(
      {{"model", {{"hf_config", ref["config"]}}},
       {"training",
        {{"seq_length", 2048},
         {"global_batch_size", 64},
         {"micro_batch_size", 4},
         {"precision", "bf16"},
         {"framework", framework}}},
       {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 8}}},
       {"parallel", {{"tp", 2}, {"dp", 4}, {"sequence_parallel", true}, {"zero_stage", 3}}}});
}

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

TEST(ExportBloom, MegatronAddsNoPositionsAndAsksForAlibiAndTheEmbeddingNorm) {
  const Exported e = export_scenario(bloom560m(), ExportFormat::megatron);
  // Megatron-LM core_v0.15.3 accepts "none" (data/reference/megatron_core_v0.15.3_arguments.json).
  EXPECT_NE(e.text.find("--position-embedding-type none"), std::string::npos) << e.text;
  EXPECT_EQ(e.text.find("--position-embedding-type rope"), std::string::npos);
  EXPECT_TRUE(mentions(e.to_add, "ALiBi"));
  EXPECT_TRUE(mentions(e.to_add, "--embed-layernorm"));
}

TEST(ExportBloom, TorchtitanOffersNoLlamaFlavor) {
  const Exported e = export_scenario(bloom560m("torchtitan"), ExportFormat::torchtitan);
  EXPECT_EQ(e.text.find("flavor = \"8B\""), std::string::npos) << e.text;
  EXPECT_EQ(e.text.find("flavor = \"70B\""), std::string::npos);
  EXPECT_TRUE(mentions(e.notes, "needs its own model code"));
}

}  // namespace
}  // namespace distplan::search
