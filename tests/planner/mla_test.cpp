// Multi-head latent attention planned (docs/moe.md, "Multi-head latent attention"): the layer
// table's projections against the released checkpoint's tensors, the model FLOPs against the
// DeepSeek-V3 hardware paper, the tensor-parallel latents and context-parallel keys and values
// against Megatron-Core's shapes, the saved tensors against the list Megatron-Core's MLA keeps, and
// what stays refused.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/validate.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// DeepSeek-V3 without its MTP module (which is refused at /model/mtp_layers), on a cluster it
// can be planned on.
json v3_doc() {
  json d = testing::default_doc();
  d["model"] = {{"preset", "deepseek-v3"}, {"mtp_layers", 0}};
  d["cluster"] = {{"gpu", "h800-sxm-80gb"}, {"num_gpus", 2048}};
  d["training"]["seq_length"] = 4096;
  d["training"]["global_batch_size"] = 15360;
  d["training"]["micro_batch_size"] = 1;
  d["parallel"] = {{"tp", 1},
                   {"pp", 16},
                   {"dp", 128},
                   {"ep", 64},
                   {"zero_stage", 1},
                   {"schedule", "dualpipe"},
                   {"recompute", "none"}};
  return d;
}

std::map<std::string, const LayerOp*> ops_by_name(const LayerTable& t) {
  std::map<std::string, const LayerOp*> out;
  for (const LayerOp& op : t) out[std::string(op.name)] = &op;
  return out;
}

// The shapes of one attention block of the released checkpoint (deepseek-ai/DeepSeek-V3
// model.safetensors.index.json, layer 0): q_a_proj [1536, 7168], q_a_layernorm [1536],
// q_b_proj [24576, 1536], kv_a_proj_with_mqa [576, 7168], kv_a_layernorm [512],
// kv_b_proj [32768, 512], o_proj [7168, 16384]. Under tp 8 the down-projections and latent
// norms stay whole on every rank (Megatron-Core's duplicated TELinear), the rest is split.
TEST(Mla, TableProjectionsAreTheCheckpointTensors) {
  const ModelSpec m = *find_model_preset("deepseek-v3");
  const LayerTable t = build_layer_table(m, TrainingSpec{});
  auto op = ops_by_name(t);
  ASSERT_EQ(op.count("qkv"), 0u);
  EXPECT_EQ(op.at("q_down")->weight_params, 1536 * 7168);
  EXPECT_EQ(op.at("q_norm")->weight_params, 1536);
  EXPECT_EQ(op.at("q_up")->weight_params, 24576 * 1536);
  EXPECT_EQ(op.at("kv_down")->weight_params, 576 * 7168);
  EXPECT_EQ(op.at("kv_norm")->weight_params, 512);
  EXPECT_EQ(op.at("kv_up")->weight_params, 32768 * 512);
  EXPECT_EQ(op.at("attention_out")->weight_params, 7168 * 16384);
  const Count whole = 1536 * 7168 + 1536 + 576 * 7168 + 512 + 2 * 7168;  // and two layer norms
  const Count split = 24576 * 1536 + 32768 * 512 + 7168 * 16384;
  const Count dense_mlp = 3 * 7168 * 18432;
  EXPECT_EQ(layer_parameters_per_tp_rank(t, 8), whole + (split + dense_mlp) / 8);
  // The main model's attention: 61 such blocks within the checkpoint's 671,026,419,200.
  EXPECT_EQ(attention_parameters(m), whole - 2 * 7168 + split);
}

// Zhao et al. 2025 ("Insights into DeepSeek-V3", ISCA 2025, Table 2): 250 GFLOPs of training per
// token at 4,096 tokens. The planner's model FLOPs are a second count of the same work: the layer
// table's GEMMs and causal attention (d_qk 192 for QK^T, d_v 128 for PV, 128 heads) plus the
// routed experts, the LM head. Table 2 rounds and leaves the MTP module out, so within 2 %.
TEST(Mla, PlannedModelFlopsMatchTheDeepSeekV3HardwarePaper) {
  const Scenario s = testing::scenario(v3_doc());
  const Estimate e = estimate(s);
  const double tokens = 15360.0 * 4096.0;
  const json paper = testing::reference("deepseek_isca2025_table2.json");
  const double published = paper["gflops_per_token"]["deepseek-v3"].get<double>() * 1e9;
  EXPECT_NEAR(e.compute.model_flops_per_step / tokens / published, 1.0, 0.02);
  // And the parameter-based count of moe.h agrees with the table's to 0.5 %: both read the same
  // shapes, one as 6 N, the other op by op.
  EXPECT_NEAR(e.compute.model_flops_per_step / tokens / training_flops_per_token(s.model, 4096),
              1.0, 0.005);
}

// Under tensor and sequence parallelism the attention block's input side moves the latents
// Megatron-Core gathers (multi_latent_attention.py: q_compressed [s/TP, b, q_lora_rank],
// kv_compressed [s/TP, b, kv_lora_rank], k_pos_emb [s/TP, b, qk_pos_emb_head_dim]), 1536 + 512 +
// 64 = 2112 bf16 values a token, not the 7168 of h; the output side's reduce-scatter stays h wide.
TEST(Mla, TensorParallelCollectivesMoveTheLatents) {
  json d = v3_doc();
  d["cluster"]["num_gpus"] = 256;
  d["training"]["global_batch_size"] = 256;
  d["parallel"] = {{"tp", 8},
                   {"pp", 16},
                   {"dp", 2},
                   {"ep", 8},
                   {"zero_stage", 1},
                   {"sequence_parallel", true},
                   {"schedule", "1f1b"},
                   {"recompute", "none"}};
  const Scenario s = testing::scenario(d);
  const Count m = s.num_microbatches();
  const Estimate e = estimate(s);
  const StageMemory& st = e.memory.stages[5];
  const Count layers = st.end_layer - st.first_layer;
  ASSERT_GE(st.first_layer, 3);  // MoE layers only, each with its shared expert's TP MLP
  Count latent_gather = 0, latent_rs = 0;
  Bytes latent_bytes = 0, hidden_rs_bytes = 0;
  Count hidden_rs = 0;
  for (const Collective& c : stage_communication(s, 5)) {  // 4 MoE layers (layers 15-18)
    if (c.group != Group::tp) continue;
    if (c.purpose == Traffic::attention_latents) {
      latent_bytes = c.bytes_per_call;
      if (c.op == CollectiveOp::all_gather) latent_gather = c.calls_per_step;
      if (c.op == CollectiveOp::reduce_scatter) latent_rs = c.calls_per_step;
    }
    if (c.purpose == Traffic::layer_activations && c.op == CollectiveOp::reduce_scatter) {
      hidden_rs_bytes = c.bytes_per_call;
      hidden_rs = c.calls_per_step;
    }
  }
  EXPECT_EQ(latent_bytes, 4096 * 2112 * 2);
  EXPECT_EQ(hidden_rs_bytes, 4096 * 7168 * 2);
  // Per layer and micro-batch: the forward gather and the backward's re-gather; one
  // reduce-scatter of the latents' gradients.
  EXPECT_EQ(latent_gather, 2 * layers * m);
  EXPECT_EQ(latent_rs, 1 * layers * m);
  // The shared expert's MLP keeps its two h-wide reduce-scatters (forward output, backward input
  // gradient) and the attention output its forward one.
  EXPECT_EQ(hidden_rs, 3 * layers * m);
}

// Context parallelism exchanges the attention's keys and values as the core sees them: 128 heads
// of 192-wide keys and 128-wide values, 40,960 values a token (not the 2 x 128 x 56 of h / a).
TEST(Mla, ContextParallelRingCarriesEveryHeadsKeysAndValues) {
  json d = v3_doc();
  d["cluster"]["num_gpus"] = 4096;
  d["parallel"]["cp"] = 2;
  d["parallel"]["cp_comm"] = "p2p";
  const Scenario s = testing::scenario(d);
  Bytes ring = 0;
  for (const Collective& c : stage_communication(s, 3)) {
    if (c.group == Group::cp && c.purpose == Traffic::cp_ring_kv) ring = c.bytes_per_call;
  }
  EXPECT_EQ(ring, 2048 * (128 * 192 + 128 * 128) * 2);
}

// What one MLA layer keeps for its backward, as Megatron-Core's MLA with Transformer Engine
// saves it (tp 1, bf16, flash attention, no recomputation), per token: the input norm's input
// and output (7168 each; both down-projections read the same output), each latent's norm input
// and normed output (1536 + 1536, 512 + 512), the attention core's q, k (128 x 192 each) and v
// (128 x 128), its fp32 log-sum-exp (128 heads) and output (128 x 128, saved by o_proj), then the
// MLP side of a dense layer: the post-attention norm's input, SwiGLU's 2 x 18432 input, the down
// projection's 18432 input and mlp_in's 7168 input.
TEST(Mla, SavedTensorsAreTheOnesMegatronKeeps) {
  const ModelSpec m = *find_model_preset("deepseek-v3");
  TrainingSpec t;
  t.seq_length = 4096;
  t.micro_batch_size = 1;
  t.precision = DType::bf16;
  t.attention = Attention::flash;
  const LayerTable table = build_layer_table(m, t);
  const LayerActivation a = layer_activation(table, m, t, 1, false, Recompute::none);
  const Bytes attention =
      2 * (7168 + 7168 + 1536 + 1536 + 512 + 512 + 128 * 192 * 2 + 128 * 128 + 128 * 128) + 4 * 128;
  const Bytes mlp = 2 * (7168 + 7168 + 2 * 18432 + 18432);
  EXPECT_EQ(a.kept, 4096 * (attention + mlp));
  // Tensor parallelism splits every head's tensor, not the latents (without SP) or the layer
  // input.
  const LayerActivation a8 = layer_activation(table, m, t, 8, false, Recompute::none);
  const Bytes per_head = 2 * (128 * 192 * 2 + 128 * 128 + 128 * 128) + 4 * 128;
  const Bytes mlp8 = 2 * (7168 + 7168 + (2 * 18432 + 18432) / 8);
  EXPECT_EQ(a8.kept, 4096 * (2 * (7168 + 7168 + 1536 + 1536 + 512 + 512) + per_head / 8 + mlp8));
}

// DeepSeek-V2-Lite has no query latent (q_lora_rank null): queries are projected from h by a
// column-parallel q_proj. Published: 15.7 B parameters, 2.4 B activated (DeepSeek-V2 paper,
// appendix B, DeepSeek-V2-Lite).
TEST(Mla, QueriesWithoutALatentPlan) {
  json d = testing::default_doc();
  d["model"] = {{"num_layers", 27},
                {"hidden_size", 2048},
                {"num_attention_heads", 16},
                {"num_kv_heads", 16},
                {"ffn_hidden_size", 10944},
                {"vocab_size", 102400},
                {"mlp", "swiglu"},
                {"norm", "rmsnorm"},
                {"position_embedding", "rotary"},
                {"max_position_embeddings", 163840},
                {"tied_embeddings", false},
                {"moe",
                 {{"num_experts", 64},
                  {"top_k", 6},
                  {"expert_ffn_hidden_size", 1408},
                  {"num_shared_experts", 2},
                  {"shared_expert_ffn_hidden_size", 1408},
                  {"first_dense_layers", 1}}},
                {"mla",
                 {{"q_lora_rank", nullptr},
                  {"kv_lora_rank", 512},
                  {"qk_nope_head_dim", 128},
                  {"qk_rope_head_dim", 64},
                  {"v_head_dim", 128}}}};
  d["cluster"] = {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}};
  d["training"]["seq_length"] = 4096;
  d["training"]["global_batch_size"] = 64;
  d["training"]["micro_batch_size"] = 1;
  d["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 8}, {"ep", 8}, {"sequence_parallel", true}};
  const Scenario s = testing::scenario(d);
  const ParameterCount c = count_parameters(s.model);
  EXPECT_NEAR(static_cast<double>(c.total), 15.7e9, 0.05e9);
  // "Activated" without the input embedding (2.45 B; 2.66 B with it), rounded by the paper.
  EXPECT_NEAR(static_cast<double>(c.active_non_embedding), 2.4e9, 0.05e9 * 2.4);
  const LayerTable t = build_layer_table(s.model, s.training);  // ops_by_name points into it
  auto op = ops_by_name(t);
  EXPECT_EQ(op.count("q_down"), 0u);
  EXPECT_EQ(op.at("q_proj")->weight_params, 2048 * 16 * 192);
  const Estimate e = sim::plan(s);
  EXPECT_GT(e.time.step_seconds, 0);
  // Without a query latent the gathered input is h itself beside the kv latent and rotary key.
  Bytes lat = 0;
  for (const Collective& x : stage_communication(s, 0))
    if (x.purpose == Traffic::attention_latents) lat = x.bytes_per_call;
  EXPECT_EQ(lat, 4096 * (2048 + 512 + 64) * 2);
}

// DeepSeek-V3's MTP module on the last pipeline stage (Megatron-Core's default placement), held
// against its published size: README_WEIGHTS.md's 11.5 B unique parameters (count_parameters()'s
// 11,610,068,224, within 0.12 B: moe_test.cpp) plus the stage's own copy of the 129,280 x 7,168
// word embedding, which the MTP stage builds when it does not hold the embedding (GPTModel:
// `pre_process or mtp_process`). bf16 weights, tp = ep = 1: the stage's weights grow by exactly
// their bytes, the first stage's not at all.
TEST(Mtp, TheLastStageHoldsTheModuleAndAnEmbeddingCopy) {
  json d = testing::default_doc();
  d["model"] = {{"preset", "deepseek-v3"}, {"mtp_layers", 0}};
  d["cluster"] = {{"gpu", "h800-sxm-80gb"}, {"num_gpus", 2}};
  d["training"]["seq_length"] = 4096;
  d["training"]["global_batch_size"] = 8;
  d["training"]["micro_batch_size"] = 1;
  d["parallel"] = {{"tp", 1}, {"pp", 2}, {"dp", 1}, {"schedule", "1f1b"}, {"recompute", "full"}};
  const Estimate without = estimate(testing::scenario(d));
  d["model"]["mtp_layers"] = 1;
  const Scenario s = testing::scenario(d);
  const Estimate with = estimate(s);
  const Count mtp = count_parameters(s.model).mtp;
  EXPECT_NEAR(static_cast<double>(mtp), 11.5e9, 0.12e9);
  const Bytes word = 129280LL * 7168;  // 129,280 is a multiple of 128: no padding
  EXPECT_EQ(with.memory.stages[1].weights_bytes - without.memory.stages[1].weights_bytes,
            2 * (mtp + word));
  EXPECT_EQ(with.memory.stages[0].weights_bytes, without.memory.stages[0].weights_bytes);
  // The embedding copy's gradient is summed with the first stage's.
  bool summed = false;
  for (const Collective& c : stage_communication(s, 1))
    summed |= c.group == Group::embedding && c.purpose == Traffic::mtp_embedding_gradients &&
              c.bytes_per_call == word * bytes_of(s.training.grad_accumulation_dtype);
  EXPECT_TRUE(summed);
}

// Its FLOPs, two ways: the plan's model FLOPs (the layer table's ops for the MTP layer, its head's
// logits and its 2h -> h projection, as Megatron-LM's num_floating_point_operations adds them)
// against 6 FLOPs per active MTP parameter (the module's count less the 248 experts a token does
// not use) plus its logits' 6 h V and the causal attention of one more layer, 3 x 2a(d_qk +
// d_v) x s/2.
TEST(Mtp, FlopsAreOneMoreLayerItsProjectionAndItsLogits) {
  json d = v3_doc();
  const Scenario s0 = testing::scenario(d);
  d["model"]["mtp_layers"] = 1;
  const Scenario s1 = testing::scenario(d);
  const double tokens = 15360.0 * 4096.0;
  const double delta =
      (estimate(s1).compute.model_flops_per_step - estimate(s0).compute.model_flops_per_step) /
      tokens;
  const ModelSpec& m = s1.model;
  const double expert = 3.0 * 7168 * 2048;
  const double active = static_cast<double>(count_parameters(m).mtp) - 248 * expert;
  const double want = 6 * active + 6.0 * 7168 * 129280 + 3 * 2.0 * 128 * (192 + 128) * 4096 / 2;
  EXPECT_NEAR(delta / want, 1.0, 0.005);
}

// What is not modelled with MLA stays refused at its field; the MTP module too.
TEST(Mla, WhatIsNotModelledIsRefusedAtItsField) {
  auto path_of = [](const json& doc) -> std::string {
    try {
      validate_scenario(testing::scenario(doc));
    } catch (const InputError& e) {
      return e.path();
    }
    return "accepted";
  };
  json d = v3_doc();
  EXPECT_EQ(path_of(d), "accepted");
  d["model"]["mtp_layers"] = 1;
  EXPECT_EQ(path_of(d), "accepted");
  d["parallel"]["tp"] = 2;
  d["parallel"]["dp"] = 64;
  d["parallel"]["sequence_parallel"] = true;
  EXPECT_EQ(path_of(d), "/parallel/tp");
  d["parallel"]["tp"] = 1;
  d["parallel"]["cp"] = 2;
  EXPECT_EQ(path_of(d), "/parallel/cp");
  d = v3_doc();
  d["model"]["qk_norm"] = true;
  EXPECT_EQ(path_of(d), "/model/qk_norm");
  d = v3_doc();
  d["parallel"]["schedule"] = "1f1b";
  d["parallel"]["recompute"] = "selective_op";
  EXPECT_EQ(path_of(d), "/parallel/recompute");
}

}  // namespace
}  // namespace distplan
