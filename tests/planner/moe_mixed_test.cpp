// MoE models whose layers are of two kinds, dense-MLP and MoE (docs/moe.md, "Layer placement"):
// DeepSeek's first dense layers, Llama 4 Maverick's MoE every other layer, Qwen's
// mlp_only_layers. The plan's model states against hand counts, its activations, FLOPs and stage
// times against the two single-kind twins of the same model (a stage of k dense and n MoE layers
// is k layers of the all-dense twin and n of the all-MoE twin), and the layer placement of every
// schedule.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/validate.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// Mixtral-8x7B's shape with a dense MLP of 28672 (twice an expert's width, so that swapping the
// two kinds changes every count) on the layers `moe` leaves dense.
json mixed_doc(json moe, json parallel, int gpus = 32, int batch = 32) {
  json m = {{"preset", "mixtral-8x7b"}, {"ffn_hidden_size", 28672}, {"moe", std::move(moe)}};
  return {{"model", m},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
          {"training",
           {{"seq_length", 4096},
            {"global_batch_size", batch},
            {"micro_batch_size", 1},
            {"precision", "bf16"},
            {"grad_accumulation_dtype", "fp32"},
            {"optimizer", "adam"},
            {"framework", "megatron"}}},
          {"parallel", std::move(parallel)}};
}

Scenario planned(const json& doc) {
  Scenario s = testing::scenario(doc);
  validate_scenario(s);
  return s;
}

// By hand (Mixtral-8x7B: hidden 4096, 32 heads, 8 KV heads of 128, experts of 14336, vocab
// 32000): attention q, o 4096² and k, v 4096·1024 = 41,943,040; two RMSNorms 8,192; a dense
// layer's SwiGLU MLP 3·4096·28672 = 352,321,536; a MoE layer's router 8·4096 = 32,768; one
// expert 3·4096·14336 = 176,160,768; the word embedding and the LM head 131,072,000 each.
constexpr Count kDenseLayer = 41943040 + 8192 + 352321536;  // 394,272,768
constexpr Count kMoeDense = 41943040 + 8192 + 32768;        // 41,984,000
constexpr Count kExpert = 176160768;
constexpr Count kEmbedding = 131072000;

// DeepSeek-style first dense layers on a 4-stage pipeline: stage 0 holds layers 0-7, of which
// 0-2 dense; ep = 8 leaves one expert per layer on each GPU (edp = 1).
TEST(MoeMixed, FirstDenseLayersModelStatesByHand) {
  const json doc = mixed_doc({{"first_dense_layers", 3}},
                             {{"tp", 1}, {"pp", 4}, {"dp", 8}, {"ep", 8}, {"zero_stage", 1}});
  const Scenario s = planned(doc);
  const std::vector<StageLayerMix> mix = stage_layer_mix(s);
  EXPECT_EQ(mix[0].layers, 8);
  EXPECT_EQ(mix[0].moe_layers, 5);
  EXPECT_EQ(mix[1].moe_layers, 8);
  const Estimate e = estimate(s);
  const StageMemory& s0 = e.memory.stages[0];
  const StageMemory& s1 = e.memory.stages[1];
  const Count dense0 = kEmbedding + 3 * kDenseLayer + 5 * kMoeDense;
  EXPECT_EQ(s0.num_layers, 8);
  EXPECT_EQ(s0.parameters, dense0 + 5 * kExpert);
  EXPECT_EQ(s0.weights_bytes, 2 * (dense0 + 5 * kExpert));
  EXPECT_EQ(s0.gradients_bytes, 4 * (dense0 + 5 * kExpert));
  // Adam's 12 bytes: the dense units sharded over dp = 8 (each divides by 8), the experts over
  // edp = 1.
  EXPECT_EQ(s0.optimizer_bytes, 12 * dense0 / 8 + 12 * 5 * kExpert);
  EXPECT_EQ(s1.parameters, 8 * (kMoeDense + kExpert));
  EXPECT_EQ(s1.optimizer_bytes, 12 * 8 * kMoeDense / 8 + 12 * 8 * kExpert);
  // The dense layers' gradients are reduced over dp like the MoE layers' dense parts: one
  // entry per layer kind under the one name, calls per layer.
  Count dp_bytes = 0, dp_calls = 0;
  for (const Collective& c : stage_communication(s, 0)) {
    if (c.group == Group::dp &&
        c.purpose == unit_traffic(UnitTraffic::gradients, ParamUnit::layers)) {
      dp_bytes += c.bytes_per_call * c.calls_per_step;
      dp_calls += c.calls_per_step;
    }
  }
  EXPECT_EQ(dp_calls, 8);
  EXPECT_EQ(dp_bytes, 4 * (3 * kDenseLayer + 5 * kMoeDense));
}

// With ep = tp = 1 every parameter is on some stage once: the stages' sum is moe.cpp's count,
// which data/reference/moe_parameter_counts.json holds to released checkpoints.
TEST(MoeMixed, StagesHoldTheWholeModelOnce) {
  for (const json& moe : {json{{"first_dense_layers", 3}}, json{{"layer_frequency", 2}},
                          json{{"first_dense_layers", 1}, {"layer_frequency", 2}},
                          json{{"layers", {0, 5, 6, 7, 20, 31}}}}) {
    const json doc = mixed_doc(moe, {{"tp", 1}, {"pp", 4}, {"dp", 8}}, 32);
    const Scenario s = planned(doc);
    const Estimate e = estimate(s);
    Count sum = 0;
    for (const StageMemory& st : e.memory.stages) sum += st.parameters;
    EXPECT_EQ(sum, count_parameters(s.model).total) << moe.dump();
    EXPECT_EQ(e.parameters, count_parameters(s.model).total) << moe.dump();
  }
}

// A stage of k dense and n MoE layers is the all-dense twin's k layers and the all-MoE twin's n
// layers: activations per micro-batch, forward and backward time, exactly (tp = 1: no
// tensor-parallel collective; the stages compared hold the embedding, so the twins' own
// embedding share cancels in the weighted sum: k/8 + n/8 = 1).
TEST(MoeMixed, StageIsTheSumOfItsLayerKinds) {
  const json par = {{"tp", 1}, {"pp", 4}, {"dp", 8}, {"ep", 8}, {"recompute", "selective"}};
  const Scenario mixed = planned(mixed_doc({{"first_dense_layers", 3}}, par));
  json dense_doc = mixed_doc({{"first_dense_layers", 3}}, par);
  dense_doc["model"].erase("moe");
  dense_doc["model"]["moe"] = nullptr;
  dense_doc["parallel"].erase("ep");
  const Scenario dense = planned(dense_doc);
  const Scenario moe = planned(mixed_doc({{"first_dense_layers", 0}}, par));
  const Estimate em = estimate(mixed), ed = estimate(dense), ee = estimate(moe);
  const double k = 3.0 / 8.0, n = 5.0 / 8.0;
  auto weighted = [&](double d, double x) { return k * d + n * x; };
  const StageMemory& m0 = em.memory.stages[0];
  EXPECT_NEAR(static_cast<double>(m0.activation_bytes_per_microbatch),
              weighted(static_cast<double>(ed.memory.stages[0].activation_bytes_per_microbatch),
                       static_cast<double>(ee.memory.stages[0].activation_bytes_per_microbatch)),
              1.0);
  const StageCosts& c0 = em.stage_costs[0];
  EXPECT_NEAR(c0.forward / weighted(ed.stage_costs[0].forward, ee.stage_costs[0].forward), 1.0,
              1e-12);
  EXPECT_NEAR(c0.backward_input /
                  weighted(ed.stage_costs[0].backward_input, ee.stage_costs[0].backward_input),
              1.0, 1e-12);
  EXPECT_NEAR(c0.backward_weight /
                  weighted(ed.stage_costs[0].backward_weight, ee.stage_costs[0].backward_weight),
              1.0, 1e-12);
  // The later stages are the all-MoE twin's.
  EXPECT_EQ(em.stage_costs[1], ee.stage_costs[1]);
  EXPECT_EQ(em.memory.stages[1].activations_bytes, ee.memory.stages[1].activations_bytes);
  // The dense stage is lighter: pipeline balance sees it.
  EXPECT_LT(c0.forward, em.stage_costs[1].forward);
}

// Model FLOPs from moe.cpp's active parameters (held to released checkpoints): 6 per GEMM
// parameter per token, plus causal attention, 6·h·s per token per layer (the square's half,
// forward and backward; docs/flops.md).
TEST(MoeMixed, ModelFlopsAreSixTimesTheActiveParameters) {
  for (const json& moe : {json{{"first_dense_layers", 3}}, json{{"layer_frequency", 2}},
                          json{{"layers", {1, 2, 30}}}}) {
    const Scenario s = planned(mixed_doc(moe, {{"tp", 1}, {"pp", 1}, {"dp", 32}, {"ep", 8}}));
    const Estimate e = estimate(s);
    const ParameterCount c = count_parameters(s.model);
    const double s_len = 4096, h = 4096, layers = 32;
    const double gemm = static_cast<double>(c.active) - 32000.0 * h - (2 * layers + 1) * h;
    const double per_token = 6.0 * gemm + layers * 6.0 * h * s_len;
    EXPECT_NEAR(e.compute.model_flops_per_step / (32.0 * s_len * per_token), 1.0, 1e-12)
        << moe.dump();
  }
}

// Which layers each chunk runs: Megatron's interleaved placement (virtual stage c·p + s), the V
// (s and 2p - 1 - s) and DualPipe's model stages s and p - 1 - s; the stage's MoE layers follow.
TEST(MoeMixed, ChunksOfEverySchedule) {
  json doc = mixed_doc(
      {{"layer_frequency", 2}, {"first_dense_layers", 1}},
      {{"tp", 1}, {"pp", 4}, {"dp", 8}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}},
      32, 64);
  doc["training"]["framework"] = "generic";  // Megatron-LM runs neither the V nor DualPipe
  Scenario s = planned(doc);
  auto ranges = [&](int st) {
    std::vector<Count> out;
    for (const LayerRange& r : stage_chunk_layers(s, st)) out.insert(out.end(), {r.first, r.end});
    return out;
  };
  EXPECT_EQ(ranges(1), (std::vector<Count>{4, 8, 20, 24}));
  // Layers 1, 3, 5, ... are MoE layers: 2 in each chunk of 4.
  EXPECT_EQ(stage_layer_mix(s)[1], (StageLayerMix{8, 4, 2, 2}));
  doc["parallel"]["schedule"] = "zb_v";
  s = planned(doc);
  EXPECT_EQ(ranges(1), (std::vector<Count>{4, 8, 24, 28}));
  doc["parallel"]["schedule"] = "dualpipe";
  doc["model"]["moe"] = {{"first_dense_layers", 3}};
  s = planned(doc);
  EXPECT_EQ(ranges(0), (std::vector<Count>{0, 8, 24, 32}));
  EXPECT_EQ(ranges(3), (std::vector<Count>{24, 32, 0, 8}));
  // Stages 0 and 3 hold model stage 0 (layers 0-2 dense) and stage 3.
  EXPECT_EQ(stage_layer_mix(s)[0], (StageLayerMix{16, 13, 8, 5}));
  EXPECT_EQ(stage_layer_mix(s)[1], (StageLayerMix{16, 16, 8, 8}));
}

// Chunks of unequal kinds: each chunk saves its own layers' bytes (docs/moe.md). Stage 0 under
// DualPipe holds model stage 0 (3 dense layers, 5 MoE) and the all-MoE model stage 3; stage 1
// two all-MoE model stages.
TEST(MoeMixed, ChunksOfDifferentKindsSaveTheirOwnBytes) {
  json doc = mixed_doc(
      {{"first_dense_layers", 3}},
      {{"tp", 1}, {"pp", 4}, {"dp", 8}, {"ep", 8}, {"schedule", "dualpipe"}, {"virtual_stages", 2}},
      32, 64);
  doc["training"]["framework"] = "generic";  // Megatron-LM does not run DualPipe
  const Scenario s = planned(doc);
  const Estimate e = estimate(s);
  const StageMemory& s0 = e.memory.stages[0];
  const StageMemory& s1 = e.memory.stages[1];
  ASSERT_EQ(s0.chunk_activation_bytes.size(), 2u);
  ASSERT_EQ(s1.chunk_activation_bytes.size(), 2u);
  const Bytes mixed = s0.chunk_activation_bytes[0] - s0.embedding_activation_bytes;
  const Bytes all_moe = s0.chunk_activation_bytes[1] - s0.head_activation_bytes;
  EXPECT_EQ(all_moe, s1.chunk_activation_bytes[0]);
  EXPECT_EQ(s1.chunk_activation_bytes[0], s1.chunk_activation_bytes[1]);
  // A dense-MLP layer keeps less than a MoE layer here: the mixed chunk is the lighter one.
  EXPECT_LT(mixed, all_moe);
  EXPECT_EQ(mixed + all_moe + s0.embedding_activation_bytes + s0.head_activation_bytes,
            s0.activation_bytes_per_microbatch);
}

TEST(MoeMixed, ExplicitLayerListIsCheckedAtItsPath) {
  auto path_of = [](const json& doc) {
    try {
      validate_scenario(testing::scenario(doc));
    } catch (const InputError& e) {
      return e.path();
    }
    return std::string("accepted");
  };
  const json par = {{"tp", 1}, {"pp", 1}, {"dp", 8}};
  EXPECT_EQ(path_of(mixed_doc({{"layers", {1, 3}}}, par, 8, 8)), "accepted");
  EXPECT_EQ(path_of(mixed_doc({{"layers", {3, 1}}}, par, 8, 8)), "/model/moe/layers/1");
  EXPECT_EQ(path_of(mixed_doc({{"layers", {1, 1}}}, par, 8, 8)), "/model/moe/layers/1");
  EXPECT_EQ(path_of(mixed_doc({{"layers", {1, 32}}}, par, 8, 8)), "/model/moe/layers");
  EXPECT_EQ(path_of(mixed_doc({{"layers", {-1}}}, par, 8, 8)), "/model/moe/layers/0");
  EXPECT_EQ(path_of(mixed_doc({{"layers", "1,3"}}, par, 8, 8)), "/model/moe/layers");
  EXPECT_EQ(path_of(mixed_doc({{"layers", {1}}, {"layer_frequency", 2}}, par, 8, 8)),
            "/model/moe/layers");
  const Scenario s = planned(mixed_doc({{"layers", {1, 3, 31}}}, par, 8, 8));
  EXPECT_EQ(moe_layer_count(s.model), 3);
  EXPECT_EQ(moe_layers_in(s.model, 2, 31), 1);
  EXPECT_TRUE(is_moe_layer(s.model, 31));
  EXPECT_FALSE(is_moe_layer(s.model, 2));
}

}  // namespace
}  // namespace distplan
