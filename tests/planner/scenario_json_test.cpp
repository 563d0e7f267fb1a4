#include "distplan/planner/scenario_json.h"

#include <gtest/gtest.h>

#include <numeric>

#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/presets.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// Expects an InputError at `path` whose message contains `needle`.
void expect_error(const json& doc, const std::string& path, const std::string& needle) {
  try {
    (void)scenario_from_json(doc);
    ADD_FAILURE() << "accepted: " << doc.dump();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), path) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

TEST(ScenarioJson, DefaultScenarioIsLlama2On64H100) {
  const Scenario s = testing::scenario(testing::default_doc());
  EXPECT_EQ(s.model.name, "llama2-70b");
  EXPECT_EQ(s.cluster.num_gpus, 64);
  EXPECT_EQ(s.cluster.gpu.name, "h100-sxm-80gb");
  EXPECT_EQ(s.parallel.tp * s.parallel.pp * s.parallel.dp, 64);
}

TEST(ScenarioJson, RoundTripsThroughItsEcho) {
  json doc = testing::default_doc();
  doc["parallel"]["zero_stage"] = 3;
  doc["parallel"]["fsdp_shard_size"] = 1;
  doc["training"]["dropout"] = 0.1;
  const Scenario a = testing::scenario(doc);
  const Scenario b = scenario_from_json(to_json(a));
  EXPECT_EQ(a, b);
}

TEST(ScenarioJson, DpDefaultsToGpusOverTpTimesPp) {
  json doc = testing::default_doc();
  doc["parallel"].erase("dp");
  EXPECT_EQ(testing::scenario(doc).parallel.dp, 2);
}

TEST(ScenarioJson, PresetOverridesAreApplied) {
  json doc = testing::default_doc();
  doc["model"] = {{"preset", "llama2-70b"}, {"num_layers", 40}};
  const Scenario s = testing::scenario(doc);
  EXPECT_EQ(s.model.num_layers, 40);
  EXPECT_EQ(s.model.hidden_size, 8192);
  EXPECT_EQ(s.model.name, "llama2-70b (modified)");
}

TEST(ScenarioJson, RejectsEveryKindOfBadInput) {
  const json base = testing::default_doc();
  auto with = [&](const std::string& ptr, const json& v) {
    json d = base;
    d[json::json_pointer(ptr)] = v;
    return d;
  };
  expect_error(with("/parallel/tpp", 2), "/parallel/tpp", "unknown field");
  expect_error(with("/parallel/tpp", 2), "/parallel/tpp", "did you mean 'tp'");
  expect_error(with("/extra", 1), "/extra", "unknown field");
  expect_error(with("/parallel/tp", "8"), "/parallel/tp", "must be an integer");
  expect_error(with("/parallel/tp", 0), "/parallel/tp", "at least 1");
  expect_error(with("/training/seq_length", -4), "/training/seq_length", "at least 1");
  expect_error(with("/training/dropout", 1.5), "/training/dropout", "at most");
  expect_error(with("/training/precision", "fp4"), "/training/precision", "not one of");
  expect_error(with("/model", "llama9-1t"), "/model", "unknown model preset");
  expect_error(with("/cluster/gpu", "h900"), "/cluster/gpu", "unknown GPU preset");
  // Rates where 0 means none: anything else must make a finite time (issue 29, item 15: 1e-300
  // gave null step times).
  json nvme = with("/parallel/offload_optimizer", "nvme");
  nvme["parallel"]["zero_stage"] = 3;
  nvme["cluster"]["nvme_bandwidth"] = 1e-300;
  expect_error(nvme, "/cluster/nvme_bandwidth", "must be 0 (no NVMe offload) or at least 1000");
  json pcie = with("/cluster/gpu", json{{"preset", "h100-sxm-80gb"}, {"pcie_bandwidth", 1e-300}});
  expect_error(pcie, "/cluster/gpu/pcie_bandwidth", "or at least 1000");
  json fp8 =
      with("/cluster/gpu", json{{"preset", "h100-sxm-80gb"}, {"peak_flops", {{"fp8", 1e-300}}}});
  expect_error(fp8, "/cluster/gpu/peak_flops/fp8", "must be 0 (no FP8 tensor cores)");
  json mx = with("/cluster/gpu", json{{"preset", "h100-sxm-80gb"}, {"peak_flops", {{"mxfp8", 5}}}});
  expect_error(mx, "/cluster/gpu/peak_flops/mxfp8", "or at least 1e+06");
  json tp3 = with("/parallel/tp", 3);
  tp3["parallel"].erase("dp");
  tp3["cluster"]["num_gpus"] = 24;
  tp3["parallel"]["pp"] = 1;
  tp3["parallel"]["dp"] = 8;
  expect_error(tp3, "/parallel/tp", "does not divide num_attention_heads=64");
  json tp16 = with("/parallel/tp", 16);
  tp16["parallel"]["dp"] = 1;
  expect_error(tp16, "/parallel/tp", "does not divide num_kv_heads=8");
  expect_error(with("/parallel/dp", 4), "/parallel", "does not equal num_gpus=64");
  expect_error(with("/training/global_batch_size", 511), "/training/global_batch_size",
               "not divisible");
  json pp = base;
  pp["model"] = {{"preset", "llama2-70b"}, {"num_layers", 2}};
  expect_error(pp, "/parallel/pp", "exceeds num_layers=2");
  json v = with("/parallel/schedule", "interleaved_1f1b");
  // 80 layers fill any pp 4 x v up to 20 virtual stages each (pipeline_split.h), not 25.
  v["parallel"]["virtual_stages"] = 25;
  expect_error(v, "/parallel/virtual_stages", "cannot fill");
  expect_error(with("/parallel/virtual_stages", 2), "/parallel/virtual_stages", "interleaved_1f1b");
  json ffn = base;
  ffn["model"] = {{"preset", "llama2-70b"}, {"ffn_hidden_size", 28676}};
  expect_error(ffn, "/parallel/tp", "ffn_hidden_size");
  expect_error(with("/parallel/layers_per_stage", json::array({20, 20, 20})),
               "/parallel/layers_per_stage", "one per stage");
  expect_error(with("/parallel/layers_per_stage", json::array({20, 20, 20, 19})),
               "/parallel/layers_per_stage", "sums to 79");
  expect_error(with("/cluster/num_gpus", 1000000000), "/cluster/num_gpus", "too large");
  json big = base;
  big["model"] = {{"preset", "llama2-70b"},
                  {"num_layers", 100000},
                  {"hidden_size", 1 << 22},
                  {"num_attention_heads", 1 << 12},
                  {"ffn_hidden_size", 1 << 22}};
  expect_error(big, "/model", "parameters");
}

TEST(ScenarioJson, MalformedTextNamesTheDocument) {
  try {
    (void)parse_json_text("{\"model\": ");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "");
    EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos);
  }
}

TEST(ScenarioJson, AcceptsExplicitUnevenSplit) {
  json doc = testing::default_doc();
  doc["parallel"]["layers_per_stage"] = {19, 21, 21, 19};
  const Scenario s = testing::scenario(doc);
  EXPECT_EQ(stage_layer_counts(s), (std::vector<Count>{19, 21, 21, 19}));
  // 80 layers over pp 4 x v 3: 12 virtual stages of 6 or 7 layers (the even rule), echoed back.
  json v = testing::default_doc();
  v["parallel"]["schedule"] = "interleaved_1f1b";
  v["parallel"]["virtual_stages"] = 3;
  const Scenario sv = testing::scenario(v);
  const std::vector<Count> layers = stage_layer_counts(sv);
  EXPECT_EQ(std::accumulate(layers.begin(), layers.end(), Count{0}), 80);
  v["parallel"]["pipeline_split"] = {{"rule", "torchtitan"}, {"first_stage_less_layers", 2}};
  const json echoed = to_json(testing::scenario(v)).at("parallel").at("pipeline_split");
  EXPECT_EQ(echoed, json({{"rule", "torchtitan"},
                          {"first_stage_less_layers", 2},
                          {"last_stage_less_layers", 1}}));
}

TEST(HfConfig, MapsLlamaMistralQwenGpt2AndNeox) {
  const json llama = {{"model_type", "llama"},    {"num_hidden_layers", 80},
                      {"hidden_size", 8192},      {"num_attention_heads", 64},
                      {"num_key_value_heads", 8}, {"intermediate_size", 28672},
                      {"vocab_size", 32000},      {"max_position_embeddings", 4096},
                      {"hidden_act", "silu"},     {"tie_word_embeddings", false}};
  const ModelSpec m = model_from_hf_config(llama, "/model/hf_config");
  EXPECT_EQ(model_parameters(m), 68976648192);
  EXPECT_EQ(m.mlp, Mlp::swiglu);
  EXPECT_EQ(m.norm, Norm::rmsnorm);

  const json gpt2 = {{"model_type", "gpt2"}, {"n_layer", 48},       {"n_embd", 1600},
                     {"n_head", 25},         {"vocab_size", 50257}, {"n_positions", 1024}};
  const ModelSpec g = model_from_hf_config(gpt2, "/model/hf_config");
  EXPECT_EQ(g.ffn_hidden_size, 6400);
  EXPECT_TRUE(g.tied_embeddings);
  EXPECT_EQ(g.position_embedding, PositionEmbedding::learned);
  EXPECT_EQ(model_parameters(g), 1557611200);  // GPT-2 XL, the released checkpoint

  const json neox = {
      {"model_type", "gpt_neox"},       {"num_hidden_layers", 44},    {"hidden_size", 6144},
      {"num_attention_heads", 64},      {"intermediate_size", 24576}, {"vocab_size", 50432},
      {"max_position_embeddings", 2048}};
  const ModelSpec n = model_from_hf_config(neox, "/model/hf_config");
  EXPECT_EQ(n.mlp, Mlp::gelu);
  EXPECT_FALSE(n.tied_embeddings);
  EXPECT_EQ(model_parameters(n), 20554567680);  // GPT-NeoX-20B

  const json qwen = {{"model_type", "qwen2"},    {"num_hidden_layers", 28},
                     {"hidden_size", 3584},      {"num_attention_heads", 28},
                     {"num_key_value_heads", 4}, {"intermediate_size", 18944},
                     {"vocab_size", 152064},     {"tie_word_embeddings", false}};
  EXPECT_EQ(model_from_hf_config(qwen, "/m").num_kv_heads, 4);

  json doc = testing::default_doc();
  doc["model"] = {{"hf_config", llama}};
  EXPECT_EQ(testing::scenario(doc).model.hidden_size, 8192);
  doc["model"] = {{"hf_config", {{"model_type", "llama"}}}};
  try {
    (void)testing::scenario(doc);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/model/hf_config");
  }
}

// Issue 12 item 1: a config.json that declares structure distplan does not model is refused at
// that field, never planned as a dense model. Field names and values from the released configs
// (mistralai/Mixtral-8x7B-v0.1, deepseek-ai/DeepSeek-V3, Qwen/Qwen1.5-MoE-A2.7B).
TEST(HfConfig, RefusesWhatItDoesNotModelAtTheField) {
  const json dense = {{"num_hidden_layers", 32},    {"hidden_size", 4096},
                      {"num_attention_heads", 32},  {"num_key_value_heads", 8},
                      {"intermediate_size", 14336}, {"vocab_size", 32000}};
  auto expect_refused = [&](json cfg, const std::string& field, const std::string& needle) {
    json doc = testing::default_doc();
    doc["model"] = {{"hf_config", cfg}};
    expect_error(doc, "/model/hf_config/" + field, needle);
  };
  // The MoE and MLA families import (tests/planner/moe_test.cpp); Mixtral plans
  // (moe_plan_test.cpp), DeepSeek's latent attention is refused at plan time at its field; MoE
  // fields in a family that has none are refused at the field.
  json mixtral = dense;
  mixtral["model_type"] = "mixtral";
  mixtral["num_local_experts"] = 8;
  mixtral["num_experts_per_tok"] = 2;
  {
    json doc = testing::default_doc();
    doc["model"] = {{"hf_config", mixtral}};
    EXPECT_TRUE(scenario_from_json(doc).model.moe.enabled());
  }
  mixtral["model_type"] = "mistral";
  expect_refused(mixtral, "num_local_experts", "Mixture-of-Experts");
  json deepseek = dense;
  deepseek.update({{"model_type", "llama"},
                   {"n_routed_experts", 256},
                   {"n_shared_experts", 1},
                   {"moe_intermediate_size", 2048},
                   {"q_lora_rank", 1536},
                   {"kv_lora_rank", 512},
                   {"qk_rope_head_dim", 64},
                   {"num_nextn_predict_layers", 1}});
  expect_refused(deepseek, "n_routed_experts", "Mixture-of-Experts");
  deepseek.erase("n_routed_experts");
  deepseek.erase("n_shared_experts");
  deepseek.erase("moe_intermediate_size");
  expect_refused(deepseek, "q_lora_rank", "latent attention");
  json qwen_moe = dense;
  qwen_moe.update({{"model_type", "qwen2"}, {"num_experts", 60}});
  expect_refused(qwen_moe, "num_experts", "Mixture-of-Experts");
  json unknown = dense;
  unknown["model_type"] = "falcon";
  expect_refused(unknown, "model_type", "not mapped");
  json llama = dense;
  llama["model_type"] = "llama";
  llama["attention_bias"] = true;
  expect_refused(llama, "attention_bias", "not modelled");
  llama.erase("attention_bias");
  llama["head_dim"] = 64;  // 4096 / 32 = 128: an explicit head width (model.head_dim)
  json doc = testing::default_doc();
  doc["model"] = {{"hf_config", llama}};
  EXPECT_EQ(testing::scenario(doc).model.q_hidden(), 32 * 64);
  llama["head_dim"] = 128;  // the implied one
  doc["model"] = {{"hf_config", llama}};
  EXPECT_EQ(testing::scenario(doc).model.hidden_size, 4096);
  EXPECT_EQ(testing::scenario(doc).model.explicit_head_dim, 0);
  // Disabled features are not refused: DeepSeek-V2-Lite's q_lora_rank null, Qwen2's
  // use_sliding_window false, Mistral v0.2's sliding_window null.
  llama["q_lora_rank"] = nullptr;
  llama["sliding_window"] = nullptr;
  doc["model"] = {{"hf_config", llama}};
  EXPECT_NO_THROW((void)testing::scenario(doc));
}

// Qwen2 / Qwen2.5 (model_type qwen2) have q, k and v biases that config.json does not announce.
// Qwen/Qwen2.5-7B's config.json; its safetensors index totals 15,231,233,024 bf16 bytes, i.e.
// 7,615,616,512 parameters.
TEST(HfConfig, CountsQwen2QkvBiases) {
  const json qwen = {{"model_type", "qwen2"},        {"num_hidden_layers", 28},
                     {"hidden_size", 3584},          {"num_attention_heads", 28},
                     {"num_key_value_heads", 4},     {"intermediate_size", 18944},
                     {"vocab_size", 152064},         {"max_position_embeddings", 131072},
                     {"tie_word_embeddings", false}, {"use_sliding_window", false},
                     {"sliding_window", 131072},     {"hidden_act", "silu"},
                     {"rope_theta", 1000000.0}};
  const ModelSpec m = model_from_hf_config(qwen, "/m");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_FALSE(m.bias);
  EXPECT_EQ(model_parameters(m), 7615616512);
  // The same shapes without the biases: 28 layers x (3584 + 2 x 512) short.
  ModelSpec no_bias = m;
  no_bias.qkv_bias = false;
  EXPECT_EQ(model_parameters(m) - model_parameters(no_bias), 28 * (3584 + 2 * 512));
  EXPECT_EQ(m, [] {
    ModelSpec p = *find_model_preset("qwen2.5-7b");
    p.name = "hf:qwen2";
    return p;
  }());
}

TEST(Presets, AllRequiredPresetsLoadWithSources) {
  for (const char* name : {"gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "llama2-7b",
                           "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b",
                           "llama3.1-405b", "mistral-7b", "qwen2.5-7b", "qwen2.5-72b"}) {
    EXPECT_TRUE(find_model_preset(name).has_value()) << name;
  }
  for (const char* name : {"a100-40gb", "a100-80gb", "h100-sxm-80gb", "h100-pcie-80gb",
                           "h200-141gb", "b200-192gb", "mi300x-192gb", "l40s-48gb"}) {
    const auto g = find_gpu_preset(name);
    ASSERT_TRUE(g.has_value()) << name;
    EXPECT_GT(g->peak_flops.bf16, 1e14) << name;
    EXPECT_GE(g->memory_bytes, Bytes{40} << 30) << name;
  }
  for (const auto& p : model_presets()) EXPECT_FALSE(p.source.empty()) << p.name;
  for (const auto& p : gpu_presets()) EXPECT_FALSE(p.source.empty()) << p.name;
}

}  // namespace
}  // namespace distplan
