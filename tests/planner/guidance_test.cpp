// Input guidance: rotary settings read from Hugging Face configs, did-you-mean for misspelt keys
// and presets, lists where a plan wants one value.
#include <gtest/gtest.h>

#include <string>

#include "distplan/planner/error.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// The InputError `doc` raises (fails the test when it is accepted).
InputError error_of(const json& doc) {
  try {
    (void)scenario_from_json(doc);
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << doc.dump();
  return InputError("<accepted>", "");
}

// --- rotary settings ---------------------------------------------------------------------------

TEST(RopeSettings, HfConfigLlama3ScalingAndThetaAreRead) {
  // Meta's Llama-3.1-8B config.json: rope_theta 500000.0, rope_scaling {factor 8.0, rope_type
  // llama3, low_freq_factor 1.0, high_freq_factor 4.0, original_max_position_embeddings 8192}.
  const json cfg = {{"model_type", "llama"},
                    {"num_hidden_layers", 32},
                    {"hidden_size", 4096},
                    {"num_attention_heads", 32},
                    {"num_key_value_heads", 8},
                    {"intermediate_size", 14336},
                    {"vocab_size", 128256},
                    {"max_position_embeddings", 131072},
                    {"rope_theta", 500000.0},
                    {"rope_scaling",
                     {{"factor", 8.0},
                      {"low_freq_factor", 1.0},
                      {"high_freq_factor", 4.0},
                      {"original_max_position_embeddings", 8192},
                      {"rope_type", "llama3"}}}};
  const ModelSpec m = model_from_hf_config(cfg, "/model/hf_config");
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling_factor, 8.0);
  // The preset carries the same values (data/models/llama3.1-8b.json).
  const ModelSpec p = *find_model_preset("llama3.1-8b");
  EXPECT_EQ(p.rope_theta, m.rope_theta);
  EXPECT_EQ(p.rope_scaling_factor, m.rope_scaling_factor);
  // Without the keys: the RoFormer default base, no scaling.
  json plain = cfg;
  plain.erase("rope_theta");
  plain["rope_scaling"] = nullptr;
  const ModelSpec d = model_from_hf_config(plain, "/model/hf_config");
  EXPECT_EQ(d.rope_theta, 10000.0);
  EXPECT_EQ(d.rope_scaling_factor, 0.0);
  // Another scaling type is refused, naming the field.
  json yarn = cfg;
  yarn["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  try {
    (void)model_from_hf_config(yarn, "/model/hf_config");
    ADD_FAILURE() << "yarn scaling accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/model/hf_config/rope_scaling");
  }
}

TEST(RopeSettings, EchoedScenarioKeepsThem) {
  json doc = testing::default_doc();
  doc["model"] = "llama3.1-8b";
  doc["cluster"]["num_gpus"] = 8;
  doc["parallel"] = {{"tp", 8}};
  const Scenario s = scenario_from_json(doc);
  const Scenario back = scenario_from_json(to_json(s));
  EXPECT_EQ(back.model.rope_theta, 500000.0);
  EXPECT_EQ(back.model.rope_scaling_factor, 8.0);
}

}  // namespace
}  // namespace distplan
