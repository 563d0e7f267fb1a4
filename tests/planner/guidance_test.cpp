// Input guidance: rotary settings read from Hugging Face configs, did-you-mean for misspelt keys
// and presets, lists where a plan wants one value.
#include <gtest/gtest.h>

#include <string>

#include "distplan/planner/error.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/suggest.h"
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

// --- did you mean ------------------------------------------------------------------------------

TEST(DidYouMean, FindsTheIntendedNameAndNothingFarOff) {
  const std::vector<std::string> models = [] {
    std::vector<std::string> out;
    for (const PresetInfo& p : model_presets()) out.push_back(p.name);
    return out;
  }();
  EXPECT_EQ(closest_name("llama-3.1-8b", models), "llama3.1-8b");
  EXPECT_EQ(closest_name("Llama-2-70B", models), "llama2-70b");
  EXPECT_EQ(closest_name("global_batch", {"global_batch_size", "micro_batch_size"}),
            "global_batch_size");
  EXPECT_EQ(closest_name("seq_len", {"seq_length"}), "seq_length");
  EXPECT_EQ(closest_name("microbatch", {"global_batch_size", "micro_batch_size"}),
            "micro_batch_size");
  EXPECT_FALSE(closest_name("micro_batch_size", {"global_batch_size"}));
  EXPECT_FALSE(closest_name("bert-large", models));
  EXPECT_TRUE(iequals("A100-80GB", "a100-80gb"));
  EXPECT_FALSE(iequals("a100-80gb", "a100-40gb"));
}

TEST(DidYouMean, MissingRequiredFieldReportsTheLookAlikeFirst) {
  json doc = testing::default_doc();
  doc["training"].erase("seq_length");
  doc["training"]["seqlength"] = 4096;
  InputError e = error_of(doc);
  EXPECT_EQ(e.path(), "/training/seqlength");
  EXPECT_NE(std::string(e.what()).find("did you mean 'seq_length'?"), std::string::npos);
  // micro_batch_size is a known field, not a misspelling of the missing global_batch_size.
  doc = testing::default_doc();
  doc["training"].erase("global_batch_size");
  doc["training"]["micro_batch_size"] = 1;
  e = error_of(doc);
  EXPECT_EQ(e.path(), "/training/global_batch_size");
  // A misspelt section name.
  doc = testing::default_doc();
  doc["clutser"] = doc["cluster"];
  doc.erase("cluster");
  e = error_of(doc);
  EXPECT_EQ(e.path(), "/clutser");
  EXPECT_NE(std::string(e.what()).find("did you mean 'cluster'?"), std::string::npos);
  // The GPU preset looked up without case.
  doc = testing::default_doc();
  doc["cluster"]["gpu"] = "A100-80GB";
  EXPECT_EQ(scenario_from_json(doc).cluster.gpu.name, "a100-80gb");
}

}  // namespace
}  // namespace distplan
