// Fine-tuning (training.peft): PEFT's printed parameter counts, bitsandbytes' storage against the
// QLoRA paper's bits per parameter, the memory categories of frozen and trainable parameters, the
// FLOPs a frozen weight saves, and the refusals (docs/peft.md).
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/peft.h"
#include "distplan/planner/report.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// One GPU of an H100 fine-tuning `model` with `peft`, framework generic (distplan's textbook
// conventions, a flat 2 GiB runtime).
json peft_doc(const std::string& model, json peft, Count gpus = 1) {
  return {{"model", model},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}}},
          {"training",
           {{"seq_length", 2048},
            {"global_batch_size", 8 * gpus},
            {"micro_batch_size", 1},
            {"precision", "bf16"},
            {"framework", "generic"},
            {"peft", std::move(peft)}}},
          {"parallel", {{"tp", 1}, {"pp", 1}, {"dp", gpus}}}};
}

json plan_of(const json& doc) {
  const Scenario s = testing::scenario(doc);
  return plan_to_json(s, estimate(s));
}

TEST(PeftCounts, EqualWhatPeftPrints) {
  const json ref = testing::reference("peft_trainable_parameters.json");
  for (const json& c : ref["cases"]) {
    json peft = {{"method", c.contains("base_storage") ? "qlora" : "lora"},
                 {"rank", c["rank"]},
                 {"target_modules", c["target_modules"]}};
    if (c.contains("base_storage")) peft["base_storage"] = c["base_storage"];
    const json plan = plan_of(peft_doc(c["model"], peft));
    SCOPED_TRACE(c.dump());
    EXPECT_EQ(plan["model_summary"]["trainable_parameters"], c["trainable"]);
    EXPECT_EQ(plan["model_summary"]["all_parameters"], c["all"]);
  }
}

TEST(PeftCounts, AllLinearSelectsEveryLinearModule) {
  const json seven = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const Scenario a = testing::scenario(
      peft_doc("llama2-7b", {{"method", "lora"}, {"rank", 16}, {"target_modules", "all-linear"}}));
  const Scenario b = testing::scenario(
      peft_doc("llama2-7b", {{"method", "lora"}, {"rank", 16}, {"target_modules", seven}}));
  EXPECT_EQ(a.training.peft.targets, b.training.peft.targets);
  EXPECT_TRUE(a.training.peft.all_linear);
  // GPT-2's names: c_proj is both output projections; all-linear has no gate.
  const ModelSpec gpt = *find_model_preset("gpt3-1.3b");
  EXPECT_EQ(default_peft_naming(gpt), PeftNaming::gpt2);
  EXPECT_EQ(peft_targets_from_names(PeftNaming::gpt2, gpt, {"c_proj"}, "/t"),
            unsigned{peft_o | peft_down});
  EXPECT_EQ(peft_all_linear_targets(PeftNaming::gpt2, gpt),
            unsigned{peft_qkv | peft_o | peft_up | peft_down});
}

TEST(PeftCounts, Params4bitPackingExplainsTheOldPrint) {
  // Before PEFT counted a Params4bit weight as numel * 2, it printed the packed storage: two
  // values per byte. The base less half of every quantized linear weight reproduces that print.
  const json ref = testing::reference("peft_trainable_parameters.json");
  const json& c = ref["cases"][3];
  const ModelSpec m = *find_model_preset("llama2-7b");
  Count packed_saving = 0;
  for (const WeightTensor& w : layer_weight_tensors(m, PeftNaming::llama))
    packed_saving += w.numel() - (w.numel() + 1) / 2;
  const Count base = testing::reference("parameter_counts.json")["models"]["llama2-7b"];
  EXPECT_EQ(base - m.num_layers * packed_saving + c["trainable"].get<Count>(),
            c["all_params_before_params4bit_fix"].get<Count>());
}

TEST(PeftCounts, UnknownModuleRefusedWithTheFamilysNames) {
  try {
    (void)testing::scenario(peft_doc(
        "llama2-7b", {{"method", "lora"}, {"target_modules", {"q_proj", "query_key_value"}}}));
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/training/peft/target_modules/1");
    EXPECT_NE(std::string(e.what()).find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                         "down_proj"),
              std::string::npos)
        << e.what();
  }
  // A GeLU MLP has no gate_proj.
  json doc =
      peft_doc("gpt3-1.3b",
               {{"method", "lora"}, {"module_names", "llama"}, {"target_modules", {"gate_proj"}}});
  EXPECT_THROW((void)testing::scenario(doc), InputError);
}

// The QLoRA paper (Dettmers et al. 2023, sec. 3, "Double Quantization"): blocks of 64 with an
// fp32 constant cost 32/64 = 0.5 bits per parameter; double quantization stores them in 8 bits
// with an fp32 constant per 256 of them, 8/64 + 32/(64 * 256) = 0.127 bits.
TEST(PeftStorage, Nf4BitsPerParameterAreTheQloraPapers) {
  const WeightTensor w{8192, 8192, 0};
  const double n = static_cast<double>(w.numel());
  const double plain = 8.0 * static_cast<double>(stored_weight_bytes(BaseStorage::nf4, false, w));
  const double dq = 8.0 * static_cast<double>(stored_weight_bytes(BaseStorage::nf4, true, w));
  EXPECT_NEAR(plain / n, 4.5, 1e-5);
  EXPECT_NEAR(dq / n, 4.0 + 8.0 / 64 + 32.0 / (64 * 256), 1e-5);
  // LLM.int8: one byte per value and an fp32 scale per output row.
  EXPECT_EQ(stored_weight_bytes(BaseStorage::int8, false, w), 8192 * 8192 + 8192 * 4);
}

TEST(PeftStorage, DoubleQuantizationSavesAboutThreeGigabytesOn65B) {
  // "reduces the memory footprint ... approximately 3 GB for a 65B model" (sec. 3): LLaMA-65B's
  // linear weights (Touvron et al. 2023, Table 2: 80 layers of hidden 8192, FFN 22016).
  ModelSpec m = *find_model_preset("llama2-70b");
  m.num_kv_heads = m.num_attention_heads;
  m.ffn_hidden_size = 22016;
  double saved = 0;
  for (const WeightTensor& w : layer_weight_tensors(m, PeftNaming::llama)) {
    saved += static_cast<double>(stored_weight_bytes(BaseStorage::nf4, false, w) -
                                 stored_weight_bytes(BaseStorage::nf4, true, w));
  }
  saved *= static_cast<double>(m.num_layers);
  EXPECT_NEAR(saved / 1e9, 3.0, 0.1);
}

TEST(PeftMemory, FrozenWeightsHaveNoGradientsOrOptimizerStates) {
  // LoRA r 8 on q, v of Llama-2-7B, one GPU: the base in bf16, the adapters in fp32 (PEFT's
  // autocast_adapter_dtype) with fp32 gradients and Adam's two fp32 moments, no master copy.
  const Scenario s = testing::scenario(peft_doc(
      "llama2-7b", {{"method", "lora"}, {"rank", 8}, {"target_modules", {"q_proj", "v_proj"}}}));
  const Estimate e = estimate(s);
  const StageMemory& st = e.memory.stages[0];
  const Count base = testing::reference("parameter_counts.json")["models"]["llama2-7b"];
  const Count adapters = 4194304;
  EXPECT_EQ(st.weights_bytes, base * 2 + adapters * 4);
  EXPECT_EQ(st.gradients_bytes, adapters * 4);
  EXPECT_EQ(st.optimizer_bytes, adapters * 8);
}

TEST(PeftMemory, Zero3ShardsFrozenAndTrainableZero1OnlyTheOptimizer) {
  const json peft = {{"method", "lora"}, {"rank", 16}, {"target_modules", "all-linear"}};
  json d1 = peft_doc("llama2-7b", peft, 8), d3 = d1;
  d1["parallel"]["zero_stage"] = 1;
  d3["parallel"]["zero_stage"] = 3;
  const StageMemory z1 = estimate(testing::scenario(d1)).memory.stages[0];
  const StageMemory z3 = estimate(testing::scenario(d3)).memory.stages[0];
  const StageMemory one = estimate(testing::scenario(peft_doc("llama2-7b", peft))).memory.stages[0];
  EXPECT_EQ(z1.weights_bytes, one.weights_bytes);      // replicated under ZeRO-1
  EXPECT_EQ(z1.gradients_bytes, one.gradients_bytes);  // full gradients under ZeRO-1
  EXPECT_NEAR(static_cast<double>(z1.optimizer_bytes), one.optimizer_bytes / 8.0,
              8.0 * 12 * 32);  // padding: at most S - 1 elements per unit
  EXPECT_NEAR(static_cast<double>(z3.weights_bytes), one.weights_bytes / 8.0,
              one.weights_bytes * 1e-4);
}

TEST(PeftMemory, QloraWeightsFollowTheBitsPerParameter) {
  // NF4 with double quantization: the layers' linear weights at 4.127 bits; the embedding, LM
  // head and norms in fp32 (PEFT's prepare_model_for_kbit_training upcasts them).
  const Scenario s = testing::scenario(peft_doc(
      "llama2-7b", {{"method", "qlora"}, {"rank", 8}, {"target_modules", {"q_proj", "v_proj"}}}));
  EXPECT_EQ(s.training.peft.base_storage, BaseStorage::nf4);
  EXPECT_TRUE(s.training.peft.double_quant);
  const Estimate e = estimate(s);
  const StageMemory& st = e.memory.stages[0];
  const ModelSpec& m = s.model;
  const double linear = 32.0 * (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008);
  const double other = 2.0 * 32000 * 4096 + (2 * 32 + 1) * 4096.0;
  const double expect =
      linear * (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8 + other * 4 + 4194304.0 * 4;
  EXPECT_NEAR(static_cast<double>(st.weights_bytes), expect, expect * 1e-4);
  (void)m;
}

TEST(PeftMemory, FrozenLayersBelowSaveNoActivations) {
  json a = peft_doc("llama2-7b", {{"method", "lora"}, {"target_modules", "all-linear"}});
  json b = a;
  b["training"]["peft"]["frozen_layers"] = 16;
  const StageMemory sa = estimate(testing::scenario(a)).memory.stages[0];
  const StageMemory sb = estimate(testing::scenario(b)).memory.stages[0];
  // Layers 0-15 carry no adapters and nothing below them trains: no graph, nothing saved.
  // Layer 16 starts the graph (its input norm keeps nothing); all above alike.
  const Bytes per_layer = (sa.activations_bytes - sa.head_activation_bytes) / 32;
  EXPECT_LT(sb.activations_bytes - sb.head_activation_bytes, 16 * per_layer + 1);
  EXPECT_GT(sb.activations_bytes - sb.head_activation_bytes, 15 * per_layer);
  EXPECT_LT(sb.gradients_bytes, sa.gradients_bytes);
}

TEST(PeftMemory, LoraKeepsLessThanFullTrainingOfTheSameLayer) {
  // A frozen projection keeps no input for a weight gradient; LoRA on q and v keeps the shared
  // input of q/k/v once, A's r-wide outputs, and flash attention's output for its backward.
  const ModelSpec m = *find_model_preset("llama2-7b");
  TrainingSpec t;
  t.seq_length = 2048;
  t.precision = DType::bf16;
  t.peft.method = PeftMethod::lora;
  t.peft.rank = 8;
  t.peft.targets = peft_q | peft_v;
  const LayerTable table = build_layer_table(m, t);
  const LoraLayer lora = lora_layer(table, m, t.peft);
  const Bytes full = layer_activation(table, m, t, 1, false, Recompute::none).kept;
  const Bytes peft =
      peft_layer_activation(table, m, t, lora, false, true, false, 1, Recompute::none).kept;
  const Bytes T = 2048, h = 4096, f = 11008;
  // Full keeps: input_norm x, qkv input, q, k, v, lse, attention_out input, post norm x2,
  // mlp_in input, activation input (2f), mlp_out input (f) (layer_ops.cpp).
  // LoRA keeps the same less mlp_in's and mlp_out's inputs, plus two A outputs.
  EXPECT_EQ(full - peft, T * h * 2 + T * f * 2 - 2 * T * 8 * 2);
}

TEST(PeftFlops, FrozenWeightsSaveTheirWeightGradients) {
  // Model FLOPs of a LoRA step against full training: every linear's dW = 2 T P is gone
  // (Narayanan et al. 2021, sec. 5.1: 2 FLOPs per parameter per token for each of the three
  // GEMMs), the adapters add 2 T r (in + out) forward, the same for dA and dB, and their input
  // gradients (B^T dy everywhere, A^T d(Ax) where the gradient goes on: all but layer 0, whose
  // frozen embedding below needs none).
  const json peft = {{"method", "lora"}, {"rank", 8}, {"target_modules", {"q_proj", "v_proj"}}};
  json full_doc = peft_doc("llama2-7b", peft);
  full_doc["training"].erase("peft");
  const Estimate lora = estimate(testing::scenario(peft_doc("llama2-7b", peft)));
  const Estimate full = estimate(testing::scenario(full_doc));
  const double T = 8.0 * 2048;  // tokens per step
  const double linear = 32.0 * (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008) + 32000.0 * 4096;
  const double per_layer_a = 8.0 * (4096 + 4096) * 2;                   // q and v adapters
  const double adapters = 32 * (6 * per_layer_a) - 2 * 8.0 * 4096 * 2;  // no A^T dx in layer 0
  // Layer 0 passes no gradient down (the embedding is frozen): no input gradient of its qkv.
  const double layer0_qkv_dx = 2 * T * 4096.0 * (3 * 4096);
  const double want =
      full.compute.model_flops_per_step - 2 * T * linear - layer0_qkv_dx + T * adapters;
  EXPECT_NEAR(lora.compute.model_flops_per_step, want, want * 1e-9);
  const double ratio = lora.compute.model_flops_per_step / full.compute.model_flops_per_step;
  EXPECT_GT(ratio, 0.66);
  EXPECT_LT(ratio, 0.72);
}

TEST(PeftScenario, EchoReadsBackToTheSameScenario) {
  for (const json& peft :
       {json{{"method", "qlora"},
             {"rank", 64},
             {"alpha", 16},
             {"dropout", 0.05},
             {"target_modules", "all-linear"},
             {"paged_optimizer", true}},
        json{{"method", "lora"}, {"target_modules", {"q_proj", "o_proj"}}, {"frozen_layers", 4}},
        json{{"method", "full"}, {"freeze_embeddings", true}, {"frozen_layers", 2}}}) {
    const Scenario s = testing::scenario(peft_doc("llama2-7b", peft));
    EXPECT_EQ(testing::scenario(to_json(s)), s) << peft.dump();
  }
}

TEST(PeftScenario, RefusesWhatItDoesNotModel) {
  auto refused = [](json doc, const std::string& path) {
    try {
      (void)testing::scenario(doc);
      ADD_FAILURE() << "accepted: " << doc["training"]["peft"].dump();
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), path) << e.what();
    }
  };
  const json lora = {{"method", "lora"}};
  json tp = peft_doc("llama2-7b", lora, 2);
  tp["parallel"] = {{"tp", 2}, {"pp", 1}, {"dp", 1}};
  refused(tp, "/parallel/tp");
  refused(peft_doc("mixtral-8x7b", lora), "/training/peft/method");
  refused(peft_doc("llama2-7b", {{"method", "qlora"}, {"base_storage", "bf16"}}),
          "/training/peft/base_storage");
  refused(peft_doc("llama2-7b", {{"method", "lora"}, {"double_quant", true}}),
          "/training/peft/double_quant");
  refused(peft_doc("llama2-7b", {{"method", "full"}, {"rank", 8}}), "/training/peft/rank");
  refused(peft_doc("llama2-7b", {{"method", "lora"}, {"frozen_layers", 32}}),
          "/training/peft/frozen_layers");
  refused(peft_doc("llama2-7b", {{"method", "qlora"}, {"compute_dtype", "fp16"}}),
          "/training/peft/compute_dtype");
}

}  // namespace
}  // namespace distplan

namespace distplan {
namespace {

// The QLoRA paper's headline (Dettmers et al. 2023, abstract and sec. 3): LLaMA-65B fine-tuned on
// one 48 GB GPU. Its recipe (sec. 4 and Appendix B; artidoro/qlora qlora.py): NF4 with double
// quantization, bf16 compute, LoRA r 64 on every linear layer with dropout 0.05, adapters and the
// embeddings / LM head in bf16 (qlora.py casts them after prepare_model_for_kbit_training, norms
// fp32), gradient checkpointing, a paged 32-bit AdamW, micro-batch 1 of 512 tokens (source 384 +
// target 128).
json llama65b_qlora(bool paged) {
  return {{"model",
           {{"num_layers", 80},
            {"hidden_size", 8192},
            {"num_attention_heads", 64},
            {"num_kv_heads", 64},
            {"ffn_hidden_size", 22016},
            {"vocab_size", 32000},
            {"mlp", "swiglu"},
            {"norm", "rmsnorm"},
            {"position_embedding", "rotary"},
            {"tied_embeddings", false}}},
          {"cluster", {{"gpu", "l40s-48gb"}, {"num_gpus", 1}}},
          {"training",
           {{"seq_length", 512},
            {"global_batch_size", 16},
            {"micro_batch_size", 1},
            {"precision", "bf16"},
            // Hugging Face PEFT on one GPU, eager PyTorch: none of the three frameworks (torchtitan
            // reduces in fp32 only); distplan's textbook conventions.
            {"framework", "generic"},
            {"kernels", "eager"},
            {"grad_accumulation_dtype", "bf16"},  // the bf16 adapters' own gradients
            {"peft",
             {{"method", "qlora"},
              {"rank", 64},
              {"alpha", 16},
              {"dropout", 0.05},
              {"target_modules", "all-linear"},
              {"base_dtype", "bf16"},
              {"adapter_dtype", "bf16"},
              {"paged_optimizer", paged},
              {"input_requires_grad", true}}}}},
          {"parallel", {{"tp", 1}, {"pp", 1}, {"dp", 1}, {"recompute", "full"}}}};
}

TEST(PeftPublished, Qlora65BFitsOneFortyEightGigabyteGpu) {
  const Estimate e = estimate(testing::scenario(llama65b_qlora(true)));
  const StageMemory& st = e.memory.stages[0];
  EXPECT_TRUE(e.memory.fits);
  EXPECT_LT(static_cast<double>(st.reserved_bytes), 48e9);  // "<48GB" (sec. 1), decimal GB
  // The 4-bit base alone is most of it: 64.8 B linear weights at 4.127 bits = 33.4 GB.
  EXPECT_GT(static_cast<double>(st.weights_bytes), 33.4e9);
  // The paged optimizer's states wait in host memory; resident, they take their GPU bytes.
  const Estimate u = estimate(testing::scenario(llama65b_qlora(false)));
  const StageMemory& su = u.memory.stages[0];
  EXPECT_EQ(st.host_bytes, su.optimizer_bytes);
  EXPECT_EQ(su.allocated_bytes - st.allocated_bytes, su.optimizer_bytes);
}

}  // namespace
}  // namespace distplan

namespace distplan {
namespace {

// README's QLoRA example: its scenario block, planned, prints its table block (the first lines).
// DISTPLAN_WRITE_DOCS=1 rewrites the table.
TEST(PeftPublished, ReadmeQloraExampleIsWhatThePlannerPrints) {
  const Scenario s = scenario_from_text(testing::readme_scenario("qlora"));
  const std::string table = testing::plan_table(s);
  const std::string want = table.substr(0, table.find("\nCommunication per GPU"));
  testing::check_readme_table("qlora", want, "PeftPublished.ReadmeQlora*");
  EXPECT_TRUE(estimate(s).memory.fits);
}

}  // namespace
}  // namespace distplan
