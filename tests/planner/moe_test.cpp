// MoE and MLA models: config.json import with the released checkpoints' exact parameter counts,
// the model fields' JSON, and the refusal to plan what is not modelled yet (docs/moe.md).
#include <gtest/gtest.h>

#include <cmath>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

InputError error_of(const json& doc) {
  try {
    (void)testing::scenario(doc);
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << doc.dump();
  return InputError("", "");
}

// data/reference/moe_parameter_counts.json: each release's config.json fields and its checkpoint's
// parameter count (safetensors index total_size / 2 for bf16, or the publisher's exact figure).
TEST(MoeParameters, HfConfigsImportWithTheCheckpointsExactCounts) {
  const json ref = testing::reference("moe_parameter_counts.json");
  int exact = 0;
  for (const auto& [name, r] : ref["models"].items()) {
    const ModelSpec m = model_from_hf_config(r["config"], "/model/hf_config");
    const ParameterCount c = count_parameters(m);
    if (r.contains("parameters")) {
      EXPECT_EQ(c.total, r["parameters"].get<Count>()) << name;
      ++exact;
    } else {
      // DeepSeek-V2 publishes 236B, rounded to 1B.
      EXPECT_NEAR(static_cast<double>(c.total), r["parameters_published"].get<double>(), 0.5e9)
          << name;
    }
    // Active parameters: one token's forward pass, embedding and LM head included (the convention
    // of Mixtral's 12.9B). Publishers round (and some leave parts out), so within 3%.
    const double published = r["active_parameters_published"].get<double>();
    EXPECT_NEAR(static_cast<double>(c.active) / published, 1.0, 0.03) << name << " " << c.active;
    EXPECT_LT(c.active, c.total) << name;
  }
  EXPECT_GE(exact, 6);
}

TEST(MoeParameters, MixtralAndDeepSeekV3AreTheIssuesFigures) {
  EXPECT_EQ(count_parameters(*find_model_preset("mixtral-8x7b")).total, 46702792704);
  const ParameterCount v3 = count_parameters(*find_model_preset("deepseek-v3"));
  EXPECT_EQ(v3.total, 671026419200);
  // README_WEIGHTS.md: the MTP module has 11.5B unique parameters beyond the shared embedding and
  // output head (rounded; its layer alone is 11.507B, its projection and norms add 0.103B).
  EXPECT_NEAR(static_cast<double>(v3.mtp), 11.5e9, 0.12e9);
  // The MTP module is counted apart: the main model's count does not change with it.
  ModelSpec no_mtp = *find_model_preset("deepseek-v3");
  no_mtp.mtp_layers = 0;
  EXPECT_EQ(count_parameters(no_mtp).total, v3.total);
  EXPECT_EQ(count_parameters(no_mtp).mtp, 0);
}

// The presets are the released configs: importing each config.json gives the preset.
TEST(MoeParameters, PresetsEqualTheirConfigJson) {
  const json ref = testing::reference("moe_parameter_counts.json");
  for (const char* name :
       {"mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b"}) {
    ModelSpec hf = model_from_hf_config(ref["models"][name]["config"], "/m");
    hf.name = name;
    EXPECT_EQ(hf, *find_model_preset(name)) << name;
  }
}

// A dense model's count is the layer table's (one truth): MoE off, both counts agree for every
// dense preset, and total = active.
TEST(MoeParameters, DenseModelsCountAsTheLayerTable) {
  for (const PresetInfo& p : model_presets()) {
    const ModelSpec m = *find_model_preset(p.name);
    if (m.moe.enabled() || m.mla.enabled()) continue;
    const ParameterCount c = count_parameters(m);
    EXPECT_EQ(c.total, model_parameters(m, build_layer_table(m, TrainingSpec{}))) << p.name;
    EXPECT_EQ(c.active, c.total) << p.name;
  }
}

// Hand count of a small MoE model, independent of the code's structure: 4 layers, the first
// dense, then MoE every second layer (layers 1 and 3); h = 8, 2 heads, 1 KV head, SwiGLU.
TEST(MoeParameters, PlacementAndHandCount) {
  ModelSpec m;
  m.num_layers = 4;
  m.hidden_size = 8;
  m.num_attention_heads = 2;
  m.num_kv_heads = 1;
  m.ffn_hidden_size = 16;
  m.vocab_size = 10;
  m.mlp = Mlp::swiglu;
  m.norm = Norm::rmsnorm;
  m.position_embedding = PositionEmbedding::rotary;
  m.moe = {.num_experts = 4,
           .top_k = 2,
           .expert_ffn_hidden_size = 6,
           .num_shared_experts = 1,
           .shared_expert_ffn_hidden_size = 5,
           .first_dense_layers = 1,
           .layer_frequency = 2,
           .router_bias = true,
           .capacity_factor = std::nullopt};
  EXPECT_FALSE(is_moe_layer(m, 0));
  EXPECT_TRUE(is_moe_layer(m, 1));
  EXPECT_FALSE(is_moe_layer(m, 2));
  EXPECT_TRUE(is_moe_layer(m, 3));
  EXPECT_EQ(moe_layer_count(m), 2);
  // Attention: q 8x8, k and v 8x4 each, o 8x8 = 192; norms 2 x 8.
  const Count attention = 64 + 32 + 32 + 64, norms = 16;
  const Count dense_mlp = 3 * 8 * 16;
  const Count expert = 3 * 8 * 6, shared = 3 * 8 * 5, router = 4 * 8 + 4;
  const Count dense_layer = norms + attention + dense_mlp;
  const Count moe_layer = norms + attention + router + 4 * expert + shared;
  const Count moe_active = norms + attention + router + 2 * expert + shared;
  const Count outer = 10 * 8 * 2 + 8;  // embedding, LM head, final norm
  const ParameterCount c = count_parameters(m);
  EXPECT_EQ(c.total, outer + 2 * dense_layer + 2 * moe_layer);
  EXPECT_EQ(c.active, outer + 2 * dense_layer + 2 * moe_active);
}

// Qwen3 (dense): head_dim 128 independent of hidden / heads, and q/k RMSNorms of head_dim.
// Qwen/Qwen3-8B's checkpoint: 16,381,470,720 bf16 bytes, i.e. 8,190,735,360 parameters.
TEST(MoeParameters, Qwen3DenseImportsAndPlans) {
  const json cfg = {{"model_type", "qwen3"},
                    {"num_hidden_layers", 36},
                    {"hidden_size", 4096},
                    {"num_attention_heads", 32},
                    {"num_key_value_heads", 8},
                    {"head_dim", 128},
                    {"intermediate_size", 12288},
                    {"vocab_size", 151936},
                    {"max_position_embeddings", 40960},
                    {"rope_theta", 1000000},
                    {"tie_word_embeddings", false},
                    {"attention_bias", false},
                    {"use_sliding_window", false},
                    {"hidden_act", "silu"}};
  const ModelSpec m = model_from_hf_config(cfg, "/m");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.explicit_head_dim, 0);  // 4096 / 32 = 128 already
  EXPECT_EQ(model_parameters(m), 8190735360);
  // Qwen3-0.6B's shapes: head_dim 128 with hidden 1024 and 16 heads; q is 2048 wide.
  json small = cfg;
  small.update({{"num_hidden_layers", 28},
                {"hidden_size", 1024},
                {"num_attention_heads", 16},
                {"intermediate_size", 3072},
                {"tie_word_embeddings", true}});
  const ModelSpec s = model_from_hf_config(small, "/m");
  EXPECT_EQ(s.explicit_head_dim, 128);
  // Per layer: q 1024x2048, k and v 1024x1024, o 2048x1024, q/k norms 2x128, two norms,
  // SwiGLU 3x1024x3072; plus the tied embedding and the final norm.
  const Count layer =
      3 * 1024 * 2048 + 256 + 2 * 1024 + 2 * 1024 * 1024 - 1024 * 2048 + 3 * 1024 * 3072;
  EXPECT_EQ(model_parameters(s), 28 * layer + 151936 * 1024 + 1024);
  json doc = testing::default_doc();
  doc["model"] = {{"hf_config", small}};
  doc["training"]["seq_length"] = 4096;
  doc["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 4}};
  doc["cluster"]["num_gpus"] = 8;
  const Scenario sc = testing::scenario(doc);
  const Estimate e = estimate(sc);
  EXPECT_EQ(e.parameters, model_parameters(s));
  // The plan echoes the head width and the norms, and reads back to the same plan.
  const json plan = plan_to_json(sc, e);
  EXPECT_EQ(plan["scenario"]["model"]["head_dim"], 128);
  EXPECT_EQ(plan["scenario"]["model"]["qk_norm"], true);
  const Scenario again = scenario_from_json(plan["scenario"]);
  EXPECT_EQ(plan_to_json(again, estimate(again)), plan);
  // Narrower heads (hidden / heads = 64) and no q/k norms: fewer FLOPs, and a shorter step (the
  // op-cost memo must see the head width and the norms, not reuse the wider model's costs).
  Scenario narrow = sc;
  narrow.model.explicit_head_dim = 0;
  const Estimate n = estimate(narrow);
  EXPECT_LT(n.compute.model_flops_per_step, e.compute.model_flops_per_step);
  EXPECT_LT(sim::plan(narrow).time.step_seconds, sim::plan(sc).time.step_seconds);
  Scenario no_norm = sc;
  no_norm.model.qk_norm = false;
  EXPECT_LT(sim::plan(no_norm).time.step_seconds, sim::plan(sc).time.step_seconds);
  EXPECT_LT(estimate(no_norm).memory.peak_bytes, e.memory.peak_bytes);
}

// Zhao et al. 2025 (DeepSeek-AI, "Insights into DeepSeek-V3: Scaling Challenges and Reflections on
// Hardware for AI Architectures", ISCA 2025), Table 2: training cost per token at sequence length
// 4096 — DeepSeek-V2 155 GFLOPs, DeepSeek-V3 250 GFLOPs, LLaMA-405B (dense) 2448 GFLOPs. The
// convention (6 x active non-embedding parameters + causal attention) is stated in moe.h; the
// paper rounds and does not state it, so within 1.5%.
TEST(MoeFlops, TrainingCostPerTokenMatchesTheDeepSeekV3HardwarePaper) {
  const json ref = testing::reference("moe_parameter_counts.json");
  const ModelSpec v2 = model_from_hf_config(ref["models"]["deepseek-v2"]["config"], "/m");
  const ModelSpec v3 = *find_model_preset("deepseek-v3");
  const ModelSpec llama = *find_model_preset("llama3.1-405b");
  const json paper = testing::reference("deepseek_isca2025_table2.json");
  const Count s = paper["seq_length"].get<Count>();
  const json& g = paper["gflops_per_token"];
  EXPECT_NEAR(training_flops_per_token(v2, s) / (g["deepseek-v2"].get<double>() * 1e9), 1.0, 0.015);
  EXPECT_NEAR(training_flops_per_token(v3, s) / (g["deepseek-v3"].get<double>() * 1e9), 1.0, 0.015);
  EXPECT_NEAR(training_flops_per_token(llama, s) / (g["llama3.1-405b"].get<double>() * 1e9), 1.0,
              0.015);
  // Only the routed experts a token uses count: more experts at the same top_k cost only the
  // router's wider score matmul (and its bias), 6 x 58 MoE layers x 256 x (h + 1).
  ModelSpec wider = v3;
  wider.moe.num_experts *= 2;
  EXPECT_NEAR(training_flops_per_token(wider, 4096) - training_flops_per_token(v3, 4096),
              6.0 * 58 * 256 * (7168 + 1), 1.0);
  ModelSpec deeper = v3;
  deeper.moe.top_k += 1;  // one more routed expert: 6 x 3 h f_e per MoE layer
  EXPECT_NEAR(training_flops_per_token(deeper, 4096) - training_flops_per_token(v3, 4096),
              6.0 * 58 * 3 * 7168 * 2048, 1.0);
  // Tying the word table to the LM head drops a parameter copy, not the head's matmul (issue 29,
  // item 9): the same FLOPs per token tied or untied.
  ModelSpec tied = llama;
  tied.tied_embeddings = true;
  EXPECT_DOUBLE_EQ(training_flops_per_token(tied, 4096), training_flops_per_token(llama, 4096));
}

// MLA's latent norms (q_a_layernorm, kv_a_layernorm) are of the model's norm kind: a LayerNorm
// model has a bias beside every norm weight, latent ones too (issue 29, item 9). LayerNorm over
// RMSNorm adds one vector per norm: per layer the two of width h and the latent ones of widths
// q_lora_rank and kv_lora_rank, and the final norm.
TEST(MoeParameters, MlaLatentNormsFollowTheNormKind) {
  ModelSpec rms = *find_model_preset("deepseek-v3");
  ModelSpec ln = rms;
  ln.norm = Norm::layernorm;
  const Count extra =
      rms.num_layers * (2 * rms.hidden_size + rms.mla.q_lora_rank + rms.mla.kv_lora_rank) +
      rms.hidden_size;
  EXPECT_EQ(count_parameters(ln).total - count_parameters(rms).total, extra);
}

// Every preset's model, echoed, reads back to itself (MoE, MLA and MTP fields included).
TEST(MoeJson, EveryPresetModelRoundTrips) {
  for (const PresetInfo& p : model_presets()) {
    const ModelSpec m = *find_model_preset(p.name);
    ModelSpec back = model_from_json(to_json(m), "/model");
    back.name = m.name;
    EXPECT_EQ(back, m) << p.name;
  }
  const json j = to_json(*find_model_preset("deepseek-v3"));
  EXPECT_TRUE(j["moe"]["capacity_factor"].is_null());  // dropless
  EXPECT_EQ(j["moe"]["router"], "sigmoid");
  EXPECT_EQ(j["mla"]["kv_lora_rank"], 512);
  EXPECT_EQ(j["mtp_layers"], 1);
  EXPECT_FALSE(to_json(*find_model_preset("llama2-7b")).contains("moe"));
}

TEST(MoeJson, FieldsOverAPresetAndBadValuesAtTheirPath) {
  const ModelSpec m = model_from_json(
      {{"preset", "mixtral-8x7b"}, {"moe", {{"top_k", 1}, {"capacity_factor", 1.25}}}}, "/model");
  EXPECT_EQ(m.moe.top_k, 1);
  EXPECT_EQ(m.moe.num_experts, 8);
  ASSERT_TRUE(m.moe.capacity_factor.has_value());
  EXPECT_DOUBLE_EQ(*m.moe.capacity_factor, 1.25);
  EXPECT_EQ(m.name, "mixtral-8x7b (modified)");
  EXPECT_FALSE(
      model_from_json({{"preset", "mixtral-8x7b"}, {"moe", nullptr}}, "/model").moe.enabled());
  auto path_of = [](const json& doc) -> std::string {
    try {
      (void)model_from_json(doc, "/model");
    } catch (const InputError& e) {
      return e.path();
    }
    return "accepted";
  };
  EXPECT_EQ(path_of({{"preset", "mixtral-8x7b"}, {"moe", {{"top_k", 9}}}}), "/model/moe/top_k");
  EXPECT_EQ(path_of({{"preset", "mixtral-8x7b"}, {"moe", {{"router", "relu"}}}}),
            "/model/moe/router");
  EXPECT_EQ(path_of({{"preset", "mixtral-8x7b"}, {"moe", {{"capacity_factor", 0}}}}),
            "/model/moe/capacity_factor");
  EXPECT_EQ(path_of({{"preset", "mixtral-8x7b"}, {"moe", {{"num_shared_experts", 1}}}}),
            "/model/moe/shared_expert_ffn_hidden_size");
  EXPECT_EQ(path_of({{"preset", "mixtral-8x7b"}, {"moe", {{"first_dense_layers", 32}}}}),
            "/model/moe/first_dense_layers");
  EXPECT_EQ(path_of({{"preset", "llama2-7b"}, {"moe", {{"top_k", 2}}}}), "/model/moe/num_experts");
  EXPECT_EQ(path_of({{"preset", "llama2-7b"}, {"mla", {{"kv_lora_rank", 512}}}}),
            "/model/mla/qk_nope_head_dim");
  EXPECT_EQ(path_of({{"preset", "llama2-7b"}, {"moe", {{"num_expert", 8}}}}),
            "/model/moe/num_expert");
  // A model too large for int64 arithmetic is refused before any count is formed.
  EXPECT_EQ(path_of({{"preset", "mixtral-8x7b"},
                     {"moe", {{"num_experts", 65536}, {"expert_ffn_hidden_size", 4194304}}}}),
            "/model/moe");
}

// What the memory, communication and time models do not cover is refused at the model field,
// with the counts, never planned as a dense model. Dense-attention MoE models plan
// (moe_plan_test.cpp).
TEST(MoePlanning, RefusedAtTheFieldWithTheCounts) {
  json doc = testing::default_doc();
  doc["model"] = "mixtral-8x7b";
  EXPECT_NO_THROW(validate_scenario(testing::scenario(doc)));
  // MLA and MTP plan (mla_test.cpp); MTP's tensor-parallel exchanges are not modelled.
  doc["model"] = {{"preset", "deepseek-v3"}, {"moe", nullptr}};
  InputError e = error_of(doc);
  EXPECT_EQ(e.path(), "/parallel/tp");
  EXPECT_NE(std::string(e.what()).find("mtp_layers 0"), std::string::npos) << e.what();
  doc["model"] = {{"preset", "deepseek-v3"}, {"moe", nullptr}, {"mtp_layers", 0}};
  EXPECT_NO_THROW(validate_scenario(testing::scenario(doc)));
}

// Expert parallelism folds into a stage's tp·dp ranks (Megatron-Core's MoE parallel folding):
// ep divides the experts, ep·etp divides tp·dp, etp divides an expert's FFN; a well-formed layout
// plans (with sequence parallelism, which MoE at tp > 1 needs), a dense model takes no ep.
TEST(MoeLayout, ExpertParallelSizesAreCheckedAtTheirPath) {
  json doc = testing::default_doc();
  doc["cluster"]["num_gpus"] = 32;
  doc["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 16}, {"ep", 8}};
  doc["training"]["global_batch_size"] = 64;
  doc["model"] = "llama2-7b";
  EXPECT_EQ(error_of(doc).path(), "/parallel/ep");  // dense: no experts to split
  doc["model"] = "mixtral-8x7b";
  // ep = 8 of 8 experts, 8 | 32: well formed; MoE with tp = 2 needs sequence parallelism.
  EXPECT_EQ(error_of(doc).path(), "/parallel/sequence_parallel");
  doc["parallel"]["sequence_parallel"] = true;
  EXPECT_NO_THROW(validate_scenario(testing::scenario(doc)));
  doc["parallel"]["ep"] = 16;
  EXPECT_EQ(error_of(doc).path(), "/parallel/ep");  // 16 does not divide 8 experts
  doc["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 2}, {"ep", 8}};
  doc["cluster"]["num_gpus"] = 4;
  EXPECT_EQ(error_of(doc).path(), "/parallel/ep");  // ep = 8 > tp*cp*dp = 4
  doc["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 2}, {"ep", 2}, {"etp", 4}};
  EXPECT_EQ(error_of(doc).path(), "/parallel/ep");  // ep*etp = 8 does not divide 4
  doc["model"] = {{"preset", "mixtral-8x7b"}, {"moe", {{"expert_ffn_hidden_size", 14335}}}};
  doc["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 2}, {"ep", 2}, {"etp", 2}};
  EXPECT_EQ(error_of(doc).path(), "/parallel/etp");  // 2 does not divide 14335
  // Echoed when used; a dense layout echoes as before.
  ParallelSpec p;
  EXPECT_FALSE(to_json(p).contains("ep"));
  p.ep = 4;
  p.etp = 2;
  EXPECT_EQ(to_json(p)["ep"], 4);
  EXPECT_EQ(to_json(p)["etp"], 2);
  Scenario s;
  s.parallel = ParallelSpec{};
  s.parallel.tp = 4;
  s.parallel.dp = 8;
  s.parallel.ep = 8;
  s.parallel.etp = 2;
  EXPECT_EQ(s.expert_data_parallel(), 2);  // 4 x 8 ranks = etp 2 x ep 8 x edp 2
}

// config.json fields of the mapped families that distplan does not model are refused at the field.
TEST(MoeHfConfig, RefusesWhatTheFamiliesDoNotModel) {
  const json ref = testing::reference("moe_parameter_counts.json");
  auto path_of = [](const json& cfg) -> std::string {
    try {
      (void)model_from_hf_config(cfg, "/model/hf_config");
    } catch (const InputError& e) {
      return e.path();
    }
    return "accepted";
  };
  json q = ref["models"]["qwen3-30b-a3b"]["config"];
  // Placements transformers builds are mapped (hf_families_test.cpp); the Qwen sliding window
  // (max_window_layers' rule) is not.
  q["decoder_sparse_step"] = 2;
  EXPECT_EQ(path_of(q), "accepted");
  q["decoder_sparse_step"] = 1;
  q["mlp_only_layers"] = {0, 1};
  EXPECT_EQ(path_of(q), "accepted");
  q["mlp_only_layers"] = json::array();
  q["use_sliding_window"] = true;
  EXPECT_EQ(path_of(q), "/model/hf_config/use_sliding_window");
  json d = ref["models"]["deepseek-v3"]["config"];
  d["moe_layer_freq"] = 2;
  EXPECT_EQ(path_of(d), "accepted");
  d["moe_layer_freq"] = 1;
  d["scoring_func"] = "sparsemax";
  EXPECT_EQ(path_of(d), "/model/hf_config/scoring_func");
  json x = ref["models"]["mixtral-8x7b"]["config"];
  x["sliding_window"] = 4096;  // mapped: a window on every layer
  EXPECT_EQ(path_of(x), "accepted");
  x["sliding_window"] = "4096";
  EXPECT_EQ(path_of(x), "/model/hf_config/sliding_window");
  // A family's MoE fields are still refused in a family that does not have them.
  json llama = ref["models"]["mixtral-8x7b"]["config"];
  llama["model_type"] = "llama";
  EXPECT_EQ(path_of(llama), "/model/hf_config/num_local_experts");
  // YaRN is accepted only where it changes no shape the planner knows of (DeepSeek).
  llama.erase("num_local_experts");
  llama.erase("num_experts_per_tok");
  llama["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
  EXPECT_EQ(path_of(llama), "/model/hf_config/rope_scaling");
}

}  // namespace
}  // namespace distplan
