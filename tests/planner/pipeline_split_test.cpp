// Pipeline splits (pipeline_split.h): the frameworks' rules against the splits their own code and
// documentation give, and what an uneven split changes in the plan.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "test_util.h"

namespace distplan {
namespace {

using J = nlohmann::json;

// A model of `layers` layers (Llama-3.1-405B's shape otherwise) on `parallel`: Megatron-LM's
// framework for the schedules it runs (interleaving with its default overlapped sends, which it
// needs at pp 2), distplan's textbook model for the V and DualPipe schedules.
J doc_with(Count layers, const J& parallel, Count gbs = 64) {
  const Count gpus = parallel.value("tp", 1) * parallel.value("pp", 1) * parallel.value("dp", 1) *
                     parallel.value("cp", 1);
  const std::string schedule = parallel.value("schedule", "1f1b");
  const bool megatron = schedule == "1f1b" || schedule == "interleaved_1f1b";
  return {{"model", {{"preset", "llama3.1-405b"}, {"num_layers", layers}}},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}}},
          {"training",
           {{"seq_length", 4096},
            {"global_batch_size", gbs},
            {"micro_batch_size", 1},
            {"framework", megatron ? "megatron" : "generic"}}},
          {"parallel", parallel},
          {"assumptions", {{"overlap_p2p", schedule == "interleaved_1f1b"}}}};
}

PipelineSplit split_of(const J& doc) {
  return pipeline_split(scenario_from_json(doc));
}

std::string refusal_path(const J& doc) {
  try {
    const Scenario s = scenario_from_json(doc);
    validate_scenario(s);
  } catch (const InputError& e) {
    return e.path();
  }
  return "";
}

// Megatron-LM's own comment in get_num_layers_to_build (transformer_block.py): "With 8 layers, 2
// stages, and 2 virtual stages ... Stage 0: [0, 1] [4, 5]  Stage 1: [2, 3] [6, 7]", and with 4
// model chunks "Stage 0: [0] [2] [4] [6]  Stage 1: [1] [3] [5] [7]".
TEST(PipelineSplit, MegatronPlacesChunksAsItsCommentDraws) {
  const PipelineSplit two = split_of(doc_with(8, {{"pp", 2},
                                                  {"schedule", "interleaved_1f1b"},
                                                  {"virtual_stages", 2},
                                                  {"pipeline_split", {{"rule", "megatron"}}}}));
  EXPECT_EQ(two.chunk_first_layer(0, 0), 0);
  EXPECT_EQ(two.chunk_first_layer(0, 1), 4);
  EXPECT_EQ(two.chunk_first_layer(1, 0), 2);
  EXPECT_EQ(two.chunk_first_layer(1, 1), 6);
  EXPECT_EQ(two.chunk_layers(1, 1), 2);
  const PipelineSplit four = split_of(doc_with(8, {{"pp", 2},
                                                   {"schedule", "interleaved_1f1b"},
                                                   {"virtual_stages", 4},
                                                   {"pipeline_split", {{"rule", "megatron"}}}}));
  for (Count c = 0; c < 4; ++c) {
    EXPECT_EQ(four.chunk_first_layer(0, c), 2 * c);
    EXPECT_EQ(four.chunk_first_layer(1, c), 2 * c + 1);
    EXPECT_EQ(four.chunk_layers(0, c), 1);
  }
}

// Megatron-Bridge's Llama-3.1-405B pretraining recipe (recipes/llama/h100/llama3.py,
// llama31_405b_pretrain_256gpu_h100_bf16_config: TP 8, PP 8, VPP 2, CP 4,
// account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split): 126 + 2 = 128
// slots, 16 per rank, 8 per chunk; the first chunk holds the embedding and 7 layers, the last the
// loss and 7.
TEST(PipelineSplit, MegatronCountsEmbeddingAndLossAsLayers) {
  const PipelineSplit s = split_of(doc_with(
      126,
      {{"tp", 8},
       {"pp", 8},
       {"cp", 4},
       {"schedule", "interleaved_1f1b"},
       {"virtual_stages", 2},
       {"pipeline_split",
        {{"rule", "megatron"}, {"account_for_embedding", true}, {"account_for_loss", true}}}}));
  ASSERT_EQ(s.path(), 16);
  EXPECT_EQ(s.layers.front(), 7);
  EXPECT_EQ(s.layers.back(), 7);
  for (Count i = 1; i < 15; ++i) EXPECT_EQ(s.layers[static_cast<std::size_t>(i)], 8) << i;
  EXPECT_EQ(s.stage_layers(0), 15);  // chunk 0 (7) and chunk 1 (8)
  EXPECT_EQ(s.stage_layers(7), 15);  // chunk 0 (8) and chunk 1 (7)
  EXPECT_EQ(s.stage_layers(3), 16);
  EXPECT_EQ(s.chunk_first_layer(7, 1), 119);  // the last 7 layers
}

// The Llama 3 paper (Grattafiori et al. 2024, sec. 3.3.2) runs 405B's 126 layers on 16 stages and
// removes "one Transformer layer each from the first and the last stages ... the first model chunk
// on the first stage has only the embedding, and the last model chunk on the last stage has only
// output projection and loss calculation": one layer per chunk, 8 chunks per stage.
TEST(PipelineSplit, Llama3PaperChunksHoldOnlyTheEmbeddingAndTheLoss) {
  const J doc = doc_with(
      126,
      {{"tp", 8},
       {"pp", 16},
       {"dp", 1},
       {"schedule", "interleaved_1f1b"},
       {"virtual_stages", 8},
       {"pipeline_split",
        {{"rule", "megatron"}, {"account_for_embedding", true}, {"account_for_loss", true}}}},
      32);
  const PipelineSplit s = split_of(doc);
  EXPECT_EQ(s.chunk_layers(0, 0), 0);
  EXPECT_EQ(s.chunk_layers(15, 7), 0);
  EXPECT_EQ(s.chunk_layers(0, 1), 1);
  EXPECT_EQ(s.stage_layers(0), 7);
  EXPECT_EQ(s.stage_layers(15), 7);
  EXPECT_EQ(s.stage_layers(8), 8);
  // It plans: the first stage's first chunk saves the embedding's tensors only.
  const Scenario sc = scenario_from_json(doc);
  validate_scenario(sc);
  const Estimate e = estimate(sc);
  const StageMemory& first = e.memory.stages.front();
  EXPECT_EQ(first.chunk_layers.front(), 0);
  EXPECT_EQ(first.chunk_activation_bytes.front(), first.embedding_activation_bytes);
  EXPECT_EQ(first.num_layers, 7);
}

// Megatron's uneven first and last stages (--decoder-first/last-pipeline-num-layers): the middle
// stages share the rest; with VPP each count divides into the rank's chunks.
TEST(PipelineSplit, MegatronFirstAndLastStageLayers) {
  const PipelineSplit s = split_of(doc_with(
      61, {{"pp", 4},
           {"pipeline_split",
            {{"rule", "megatron"}, {"first_stage_layers", 13}, {"last_stage_layers", 12}}}}));
  EXPECT_EQ(s.layers, (std::vector<Count>{13, 18, 18, 12}));
  // 61 - 13 - 12 = 36 over 2 middle stages with 4 chunks each: 18 is not a multiple of 4.
  EXPECT_EQ(
      refusal_path(doc_with(
          61, {{"pp", 4},
               {"schedule", "interleaved_1f1b"},
               {"virtual_stages", 4},
               {"pipeline_split",
                {{"rule", "megatron"}, {"first_stage_layers", 12}, {"last_stage_layers", 12}}}})),
      "/parallel/pipeline_split");
  EXPECT_EQ(refusal_path(doc_with(
                61, {{"pp", 4},
                     {"schedule", "interleaved_1f1b"},
                     {"virtual_stages", 4},
                     {"pipeline_split", {{"rule", "megatron"}, {"first_stage_layers", 13}}}})),
            "/parallel/pipeline_split/first_stage_layers");
  // Megatron refuses the two kinds of flag together.
  EXPECT_EQ(
      refusal_path(doc_with(
          61, {{"pp", 4},
               {"pipeline_split",
                {{"rule", "megatron"}, {"first_stage_layers", 13}, {"account_for_loss", true}}}})),
      "/parallel/pipeline_split/account_for_embedding");
  // Without flags Megatron needs num_layers divisible by pp.
  EXPECT_EQ(refusal_path(doc_with(61, {{"pp", 4}, {"pipeline_split", {{"rule", "megatron"}}}})),
            "/parallel/pipeline_split");
}

// Megatron-LM's documented layout for a DeepSeek-V3-style stack (docs/user-guide/features/
// pipeline_parallel_layout.md: 61 decoder layers and one MTP layer, PP16 VPP2,
// "Et*3|(tt|)*29,m|L"): rank 0 chunk 0 holds the embedding and 3 layers, ranks 1-13 and rank 14's
// and 15's chunk 0 hold 2, rank 14's chunk 1 the MTP layer, rank 15's chunk 1 only the loss.
TEST(PipelineSplit, MegatronLayoutStringAsDocumented) {
  const MegatronLayout l =
      parse_megatron_layout("Et*3|(tt|)*29,m|L", 16, 61, 1, "/parallel/pipeline_split/layout");
  ASSERT_EQ(l.decoder.size(), 32u);
  EXPECT_EQ(l.decoder[0], 3);
  for (std::size_t i = 1; i < 30; ++i) EXPECT_EQ(l.decoder[i], 2) << i;
  EXPECT_EQ(l.decoder[30], 0);
  EXPECT_EQ(l.decoder[31], 0);
  EXPECT_EQ(l.mtp_virtual_stage, 30);  // virtual stage 16 + 14: rank 14, chunk 1
  // The same split written back.
  PipelineSplit s;
  s.pp = 16;
  s.chunks = 2;
  s.layers = l.decoder;
  s.mtp_virtual_stage = l.mtp_virtual_stage;
  EXPECT_EQ(megatron_layout_string(s, 1), "Et*3|(tt|)*29,m|L");
  EXPECT_EQ(parse_megatron_layout(megatron_layout_string(s, 1), 16, 61, 1, "").decoder, l.decoder);
  // Megatron's own checks: the loss last, decoder layers before MTP layers, counts that match.
  EXPECT_THROW((void)parse_megatron_layout("Et*3|(tt|)*29,L|m", 16, 61, 1, ""), InputError);
  EXPECT_THROW((void)parse_megatron_layout("Et*3|(tt|)*29,m|L", 16, 60, 1, ""), InputError);
  EXPECT_THROW((void)parse_megatron_layout("Et*3|(tt|)*28,m|tt|L", 16, 61, 1, ""), InputError);
  EXPECT_THROW((void)parse_megatron_layout("Ex|L", 2, 0, 0, ""), InputError);
}

// torchtitan's _generate_llm_fqn_per_model_part, its docstring's example (2 stages, 3 layers,
// input_weight = output_weight = 2: 7 effective layers, 4 and 3) and its default on Llama-3.1-405B
// (weights 1 and 1; 16 stages for pp 8 under an interleaved schedule: 128 / 16 = 8, the ends 7).
TEST(PipelineSplit, TorchtitanWeighsEmbeddingAndHeadAsLayers) {
  EXPECT_EQ(torchtitan_split(3, 2, 2, 2, ""), (std::vector<Count>{2, 1}));
  std::vector<Count> want(16, 8);
  want.front() = want.back() = 7;
  EXPECT_EQ(torchtitan_split(126, 16, 1, 1, ""), want);
  // The remainder goes to the first stages: 10 + 1 + 1 = 12 over 5 stages, 3 3 2 2 2.
  EXPECT_EQ(torchtitan_split(10, 5, 1, 1, ""), (std::vector<Count>{2, 3, 2, 2, 1}));
  EXPECT_THROW((void)torchtitan_split(2, 5, 1, 1, ""), InputError);
  EXPECT_THROW((void)torchtitan_split(4, 3, 3, 1, ""), InputError);
  const PipelineSplit v = split_of(doc_with(
      126, {{"pp", 8}, {"schedule", "zb_v"}, {"pipeline_split", {{"rule", "torchtitan"}}}}, 64));
  EXPECT_EQ(v.layers, want);
  EXPECT_EQ(v.chunk_layers(0, 1), 7);  // stage 0 holds both ends of the V
  EXPECT_EQ(v.stage_layers(0), 14);
}

// The even rule: any layer count on any pipeline, interleaved, V and DualPipe alike.
TEST(PipelineSplit, EvenSplitTakesAnyLayerCount) {
  EXPECT_EQ(even_split(7, 4), (std::vector<Count>{2, 2, 2, 1}));
  EXPECT_EQ(even_split(94, 32).front(), 2);
  const PipelineSplit d = split_of(doc_with(61, {{"pp", 16}, {"schedule", "dualpipe"}}, 64));
  EXPECT_EQ(d.path(), 16);
  EXPECT_EQ(std::accumulate(d.layers.begin(), d.layers.end(), Count{0}), 61);
  // Stage s holds model stages s and 15 - s.
  EXPECT_EQ(d.stage_layers(0), d.layers[0] + d.layers[15]);
  EXPECT_EQ(d.chunk_layers(15, 1), d.layers[0]);
  // More virtual stages than layers: refused with the way out named.
  EXPECT_EQ(refusal_path(doc_with(
                7, {{"pp", 4}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}, 64)),
            "/parallel/virtual_stages");
}

TEST(PipelineSplit, ExplicitSplitsPerStageAndPerChunk) {
  const PipelineSplit s = split_of(doc_with(
      10, {{"pp", 2}, {"schedule", "zb_v"}, {"layers_per_virtual_stage", {2, 3, 4, 1}}}, 64));
  EXPECT_EQ(s.chunk_layers(0, 0), 2);
  EXPECT_EQ(s.chunk_layers(0, 1), 1);  // virtual stage 3
  EXPECT_EQ(s.chunk_layers(1, 1), 4);  // virtual stage 2
  EXPECT_EQ(refusal_path(doc_with(10, {{"pp", 2}, {"layers_per_virtual_stage", {2, 3, 4, 1}}})),
            "/parallel/layers_per_virtual_stage");
  EXPECT_EQ(refusal_path(doc_with(10, {{"pp", 2}, {"layers_per_virtual_stage", {2, 9}}})),
            "/parallel/layers_per_virtual_stage");
  // layers_per_stage with chunks: each stage's count must split evenly, else per chunk.
  EXPECT_EQ(refusal_path(doc_with(10, {{"pp", 2},
                                       {"schedule", "interleaved_1f1b"},
                                       {"virtual_stages", 2},
                                       {"layers_per_stage", {5, 5}}})),
            "/parallel/layers_per_stage/0");
  // A rule and an explicit split at once: refused, not guessed.
  EXPECT_EQ(refusal_path(doc_with(10, {{"pp", 2},
                                       {"layers_per_stage", {5, 5}},
                                       {"pipeline_split", {{"rule", "torchtitan"}}}})),
            "/parallel/layers_per_stage");
  // A rule's flag under another rule.
  EXPECT_EQ(refusal_path(doc_with(
                10, {{"pp", 2},
                     {"pipeline_split", {{"rule", "torchtitan"}, {"account_for_loss", true}}}})),
            "/parallel/pipeline_split/account_for_loss");
}

// An uneven interleaved split changes each chunk's costs, not the model: the chunks' parameters
// add up to the model's (embedding and head counted once; no tied copy), the FLOPs are the same
// as an even split's, and each chunk's pass time grows with its layers.
TEST(PipelineSplit, ChunkCostsFollowTheirLayers) {
  const J uneven = doc_with(10, {{"pp", 2},
                                 {"schedule", "interleaved_1f1b"},
                                 {"virtual_stages", 2},
                                 {"layers_per_virtual_stage", {1, 4, 4, 1}}});
  const J even = doc_with(10, {{"pp", 2},
                               {"schedule", "interleaved_1f1b"},
                               {"virtual_stages", 2},
                               {"layers_per_virtual_stage", {3, 2, 2, 3}}});
  const Scenario su = scenario_from_json(uneven);
  const Estimate eu = estimate(su);
  const Estimate ee = estimate(scenario_from_json(even));
  EXPECT_EQ(eu.compute.model_flops_per_step, ee.compute.model_flops_per_step);
  Count params = 0;
  for (const StageMemory& sm : eu.memory.stages) params += sm.parameters;
  EXPECT_EQ(params, eu.parameters +
                        (eu.padded_vocab_size - su.model.vocab_size) * su.model.hidden_size * 2);
  // Stage 1: chunk 0 is virtual stage 1 (4 layers), chunk 1 is virtual stage 3 (1 layer and the
  // LM head).
  const StageCosts& k = eu.stage_costs[1];
  ASSERT_EQ(k.chunks.size(), 2u);
  EXPECT_EQ(k.chunks[0].layers, 4);
  EXPECT_EQ(k.chunks[1].layers, 1);
  EXPECT_GT(k.chunks[0].backward_weight, k.chunks[1].backward_weight);
  EXPECT_NEAR(k.forward, k.chunks[0].forward + k.chunks[1].forward, 1e-12 * k.forward);
  // Stage 0's chunk 0 (1 layer + embedding) saves less than its chunk 1 (4 layers).
  const StageMemory& m0 = eu.memory.stages[0];
  EXPECT_LT(m0.chunk_activation_bytes[0], m0.chunk_activation_bytes[1]);
  EXPECT_EQ(m0.chunk_layers, (std::vector<Count>{1, 4}));
}

}  // namespace
}  // namespace distplan
