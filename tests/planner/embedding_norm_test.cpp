// The embedding norm (BLOOM's word_embeddings_layernorm; Megatron-DeepSpeed --embed-layernorm)
// and BLOOM's config.json import: parameters against BLOOM's published parameter counts, and the
// input the norm keeps per in-flight micro-batch on the embedding's stage against a hand count on
// BLOOM-176B's layout.
#include <gtest/gtest.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// BLOOM's architecture (transformers modeling_bloom.py; the BLOOM paper, sec. 3.2): GeLU MLP of
// 4h, LayerNorm, biases everywhere, tied embeddings, ALiBi, the tokenizer's 250,680 tokens padded
// to 250,880.
json bloom(Count layers, Count hidden, Count heads, bool embedding_norm) {
  return {{"model",
           {{"num_layers", layers},
            {"hidden_size", hidden},
            {"num_attention_heads", heads},
            {"ffn_hidden_size", 4 * hidden},
            {"vocab_size", 250880},
            {"mlp", "gelu"},
            {"norm", "layernorm"},
            {"position_embedding", "alibi"},
            {"tied_embeddings", true},
            {"bias", true},
            {"embedding_norm", embedding_norm}}},
          {"training", {{"seq_length", 2048}, {"global_batch_size", 8}, {"micro_batch_size", 1}}},
          {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 8}}},
          {"parallel", {{"tp", 8}}}};
}

// data/reference/bloom_parameter_counts.json: each release's config.json imported as it is, held
// against the model card's exact count (which includes the embedding LayerNorm).
TEST(EmbeddingNorm, BloomConfigsImportWithTheModelCardsExactCounts) {
  const json ref = testing::reference("bloom_parameter_counts.json");
  for (const auto& [name, r] : ref["models"].items()) {
    const ModelSpec m = model_from_hf_config(r["config"], "/model/hf_config");
    EXPECT_TRUE(m.embedding_norm) << name;
    EXPECT_EQ(m.position_embedding, PositionEmbedding::alibi) << name;
    json d = bloom(1, 64, 1, true);
    d["model"] = {{"hf_config", r["config"]}};
    EXPECT_EQ(estimate(testing::scenario(d)).parameters, r["parameters"].get<Count>()) << name;
  }
  // Without the embedding norm the same shape is 2h short.
  EXPECT_EQ(estimate(testing::scenario(bloom(24, 1024, 16, false))).parameters,
            559'214'592 - 2 * 1024);
  // A residual taken after the norm is another architecture: refused at its field.
  json post = ref["models"]["bloom-560m"]["config"];
  post["apply_residual_connection_post_layernorm"] = true;
  try {
    (void)model_from_hf_config(post, "/model/hf_config");
    ADD_FAILURE() << "a post-LayerNorm residual was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/model/hf_config/apply_residual_connection_post_layernorm");
  }
}

TEST(EmbeddingNorm, EmbeddingStageKeepsTheNormInputPerInflightMicrobatch) {
  // BLOOM-176B's run (data/reference/bloom176b_chronicle_memory.json): stage 0 of 12 under 1F1B
  // holds 12 micro-batches; the norm keeps its bf16 input of 2 x 2048 tokens x 14336, whole on
  // every TP rank (no sequence parallelism), outside the layers that full recompute checkpoints.
  json d = testing::reference("bloom176b_chronicle_memory.json")["scenario"];
  ASSERT_TRUE(d["model"]["embedding_norm"].get<bool>());
  const StageMemory on = estimate(testing::scenario(d)).memory.stages.at(0);
  // ALiBi (the run's) and rotary (a stand-in with no parameters either) plan the same memory.
  json rotary = d;
  rotary["model"]["position_embedding"] = "rotary";
  EXPECT_EQ(estimate(testing::scenario(rotary)).memory.stages.at(0).total_bytes, on.total_bytes);
  const StageMemory last_on = estimate(testing::scenario(d)).memory.stages.at(11);
  d["model"]["embedding_norm"] = false;
  const StageMemory off = estimate(testing::scenario(d)).memory.stages.at(0);
  const StageMemory last_off = estimate(testing::scenario(d)).memory.stages.at(11);
  const Bytes input = Bytes{2} * 2048 * 14336 * 2;
  EXPECT_EQ(on.activation_bytes_per_microbatch - off.activation_bytes_per_microbatch, input);
  EXPECT_EQ(on.activations_bytes - off.activations_bytes, 12 * input);
  // Its weight and bias, in bf16 on the embedding's stage only.
  EXPECT_EQ(on.weights_bytes - off.weights_bytes, 2 * 14336 * 2);
  EXPECT_EQ(last_on.activations_bytes, last_off.activations_bytes);
  EXPECT_EQ(last_on.weights_bytes, last_off.weights_bytes);

  // Under sequence parallelism the norm runs in the sequence-parallel region: 1/tp of the tokens
  // (Megatron-LM's; DeepSpeed's engine has no sequence parallelism of its own).
  d["training"]["framework"] = "megatron";
  d["parallel"]["sequence_parallel"] = true;
  const StageMemory sp_off = estimate(testing::scenario(d)).memory.stages.at(0);
  d["model"]["embedding_norm"] = true;
  const StageMemory sp_on = estimate(testing::scenario(d)).memory.stages.at(0);
  EXPECT_EQ(sp_on.activation_bytes_per_microbatch - sp_off.activation_bytes_per_microbatch,
            input / 8);
}

TEST(EmbeddingNorm, EchoesAndRefusesAWrongType) {
  const Scenario s = testing::scenario(bloom(24, 1024, 16, true));
  EXPECT_TRUE(s.model.embedding_norm);
  EXPECT_EQ(to_json(s.model).at("embedding_norm"), true);
  EXPECT_FALSE(
      to_json(testing::scenario(bloom(24, 1024, 16, false)).model).contains("embedding_norm"));
  json bad = bloom(24, 1024, 16, true);
  bad["model"]["embedding_norm"] = 1;
  try {
    (void)testing::scenario(bad);
    ADD_FAILURE() << "an integer embedding_norm was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/model/embedding_norm");
  }
}

}  // namespace
}  // namespace distplan
