#include "distplan/planner/layer_ops.h"

#include <gtest/gtest.h>

#include "distplan/planner/layout.h"
#include "distplan/planner/presets.h"
#include "test_util.h"

namespace distplan {
namespace {

TEST(LayerOps, GptLayerHasTwelveHSquaredParameters) {
  const ModelSpec m = *find_model_preset("gpt3-175b");
  const LayerTable t = build_layer_table(m, TrainingSpec{});
  const Count h = m.hidden_size;
  // 12h^2 weights + 13h biases and norm parameters (Narayanan et al. 2021, sec. 5.1).
  EXPECT_EQ(layer_parameters(t), 12 * h * h + 13 * h);
}

TEST(LayerOps, TensorParallelSplitsWeightsButNotNormsOrRowBiases) {
  const ModelSpec m = *find_model_preset("gpt3-175b");
  const LayerTable t = build_layer_table(m, TrainingSpec{});
  const Count h = m.hidden_size;
  // Column/row weights and column biases split 8 ways; two LayerNorms (4h) and the two
  // row-parallel biases (2h) stay whole.
  EXPECT_EQ(layer_parameters_per_tp_rank(t, 8), (12 * h * h + 7 * h) / 8 + 6 * h);
}

// Korthikanti et al. 2022, Table 2, every row, for the paper's GPT-3 175B shapes.
TEST(LayerOps, ActivationsReproduceKorthikantiTable2) {
  const auto ref = testing::reference("korthikanti2022_table2.json");
  ModelSpec m = *find_model_preset("gpt3-175b");
  TrainingSpec tr;
  tr.seq_length = ref["model"]["seq_length"];
  tr.micro_batch_size = ref["model"]["micro_batch_size"];
  tr.precision = DType::bf16;
  tr.attention = Attention::standard;
  tr.dropout = 0.1;
  const LayerTable table = build_layer_table(m, tr);
  const Count s = tr.seq_length, b = tr.micro_batch_size, h = m.hidden_size,
              a = m.num_attention_heads;
  const Count sbh = s * b * h;
  const Count as2b = a * s * s * b;
  int checked = 0;
  for (const auto& c : ref["cases"]) {
    const Count t = c["tp"];
    const bool sp = c["sequence_parallel"];
    const std::string rc = c["recompute"];
    const Recompute r = rc == "none"        ? Recompute::none
                        : rc == "selective" ? Recompute::selective
                                            : Recompute::full;
    Bytes expected = 0;
    const std::string name = c["name"];
    if (name == "no parallelism")
      expected = 34 * sbh + 5 * as2b;
    else if (name == "tensor parallel (baseline)")
      expected = 10 * sbh + 24 * sbh / t + 5 * as2b / t;
    else if (name == "tensor + sequence parallel")
      expected = (34 * sbh + 5 * as2b) / t;
    else if (name == "tensor parallel + selective recompute")
      expected = 10 * sbh + 24 * sbh / t;
    else if (name == "tensor + sequence parallel + selective recompute")
      expected = 34 * sbh / t;
    else if (name == "full recompute")
      expected = 2 * sbh;
    ASSERT_GT(expected, 0) << name;
    EXPECT_EQ(layer_activation_bytes(table, m, tr, t, sp, r), expected) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

TEST(LayerOps, FlashAttentionDropsTheScoresAndKeepsLogSumExp) {
  ModelSpec m = *find_model_preset("gpt3-175b");
  TrainingSpec tr;
  tr.seq_length = 2048;
  tr.micro_batch_size = 1;
  tr.attention = Attention::flash;
  const LayerTable table = build_layer_table(m, tr);
  const Count sbh = 2048 * m.hidden_size;
  // No dropout: 34 - 2 masks = 32 sbh, plus the fp32 log-sum-exp (4 bytes per head per token).
  EXPECT_EQ(layer_activation_bytes(table, m, tr, 1, false, Recompute::none),
            32 * sbh + 4 * m.num_attention_heads * 2048);
}

TEST(LayerOps, SwiGluAndGqaSaveWhatTheirBackwardNeeds) {
  const ModelSpec m = *find_model_preset("llama2-70b");
  TrainingSpec tr;
  tr.seq_length = 4096;
  tr.micro_batch_size = 1;
  const LayerTable table = build_layer_table(m, tr);
  const Count s = 4096, h = m.hidden_size, kv = m.kv_hidden(), f = m.ffn_hidden_size,
              a = m.num_attention_heads;
  // norms 2*2h, qkv input 2h, q 2h, k and v 2*2kv, out-proj input 2h, mlp_in input 2h,
  // gate+up 2*2f, down input 2f, log-sum-exp 4a.
  const Bytes expected = s * (2 * (2 * h) + 2 * h + 2 * h + 2 * (2 * kv) + 2 * h + 2 * h +
                              2 * (2 * f) + 2 * f + 4 * a);
  EXPECT_EQ(layer_activation_bytes(table, m, tr, 1, false, Recompute::none), expected);
}

TEST(LayerOps, LayerFlopsMatchNarayananCounting) {
  const ModelSpec m = *find_model_preset("gpt3-175b");
  const LayerTable table = build_layer_table(m, TrainingSpec{});
  const double b = 2, s = 2048, h = static_cast<double>(m.hidden_size);
  const LayerFlops f = layer_flops(table, 2, 2048);
  // Forward 24bsh^2 + 4bs^2h; backward twice the forward.
  EXPECT_DOUBLE_EQ(f.forward, 24 * b * s * h * h + 4 * b * s * s * h);
  EXPECT_DOUBLE_EQ(f.backward_input + f.backward_weight, 2 * f.forward);
}

TEST(LayerOps, ParameterCountsMatchReleasedCheckpoints) {
  const auto ref = testing::reference("parameter_counts.json");
  int checked = 0;
  for (const auto& [name, count] : ref["models"].items()) {
    const auto m = find_model_preset(name);
    ASSERT_TRUE(m.has_value()) << name;
    EXPECT_EQ(model_parameters(*m), count.get<Count>()) << name;
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

}  // namespace
}  // namespace distplan
