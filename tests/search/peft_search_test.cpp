// Fine-tuning in the search and the exports (docs/search.md, docs/exports.md): the space holds only
// what validate accepts with training.peft, a QLoRA of Llama-2-70B on one 48 GB GPU is found with
// gradient checkpointing, and the PEFT export states the run in PEFT's and Accelerate's own keys.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "distplan/search/export.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"

namespace distplan::search {
namespace {

using nlohmann::json;

json lora_on(const std::string& model, const std::string& gpu, Count gpus, json peft) {
  return {{"model", model},
          {"cluster", {{"gpu", gpu}, {"num_gpus", gpus}}},
          {"training",
           {{"seq_length", 2048},
            {"global_batch_size", 16},
            {"precision", "bf16"},
            // Hugging Face PEFT + Accelerate FSDP: distplan's textbook conventions (Megatron-LM
            // and torchtitan v0.2.2 fine-tune nothing; docs/frameworks.md).
            {"framework", "generic"},
            {"peft", std::move(peft)}}}};
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(PeftSearch, RanksOnlyLayoutsValidateAccepts) {
  Request req = request_from_json(lora_on("llama2-13b", "a100-80gb", 8,
                                          {{"method", "lora"}, {"target_modules", "all-linear"}}));
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  for (const Plan& p : r.plans) {
    EXPECT_EQ(p.layout.tp, 1);
    EXPECT_EQ(p.layout.cp, 1);
    // Every ranked plan is a valid scenario, planned as the planner plans it.
    const Scenario s = make_scenario(req.space.base, p.layout);
    EXPECT_NO_THROW(validate_scenario(s));
  }
  EXPECT_GT(r.rejected[static_cast<int>(Reject::peft_not_planned)], 0u);
}

TEST(PeftSearch, Qlora70BOnOne48GBGpuNeedsGradientCheckpointing) {
  // "Can I QLoRA Llama-2-70B on one 48 GB GPU?": with micro-batch 1 of 2048 tokens, only
  // recomputation makes room for the activations beside the 4-bit base.
  json doc = lora_on("llama2-70b", "l40s-48gb", 1,
                     {{"method", "qlora"}, {"rank", 16}, {"target_modules", "all-linear"}});
  doc["training"]["micro_batch_size"] = {1};
  Request req = request_from_json(doc);
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty());
  for (const Plan& p : r.plans) EXPECT_NE(p.layout.recompute, Recompute::none);
  const Scenario s = make_scenario(req.space.base, r.plans.front().layout);
  const Estimate e = estimate(s);
  EXPECT_TRUE(e.memory.fits);
  Scenario none = s;
  none.parallel.recompute = Recompute::none;
  EXPECT_FALSE(estimate(none).memory.fits);
}

TEST(PeftExport, QloraWithFsdpStoresTheFourBitWeightsInBf16) {
  json doc = lora_on("llama2-70b", "h100-sxm-80gb", 8,
                     {{"method", "qlora"},
                      {"rank", 8},
                      {"alpha", 16},
                      {"dropout", 0.1},
                      {"target_modules", "all-linear"}});
  doc["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 8}, {"zero_stage", 3}, {"recompute", "full"}};
  const Exported e = export_scenario(scenario_from_json(doc), ExportFormat::peft);
  // PEFT v0.20.0 examples/sft: configs/fsdp_config_qlora.yaml and run_peft_qlora_fsdp.sh.
  for (const char* line :
       {"distributed_type: FSDP", "  fsdp_sharding_strategy: FULL_SHARD", "mixed_precision: 'no'",
        "num_processes: 8", "--use_peft_lora True", "--lora_r 8", "--lora_alpha 16",
        "--lora_dropout 0.1", "--lora_target_modules \"all-linear\"",
        "--use_4bit_quantization True", "--use_nested_quant True", "--bnb_4bit_quant_type nf4",
        "--bnb_4bit_compute_dtype bfloat16", "--bnb_4bit_quant_storage_dtype bfloat16",
        "--gradient_checkpointing True", "--per_device_train_batch_size 1",
        "--gradient_accumulation_steps 2", "--max_length 2048"}) {
    EXPECT_TRUE(has(e.text, std::string(line) + "\n")) << line << "\n" << e.text;
  }
}

TEST(PeftExport, LoraWithDeepSpeedNamesTheModules) {
  json doc = lora_on("llama2-7b", "a100-80gb", 4,
                     {{"method", "lora"}, {"rank", 16}, {"target_modules", {"q_proj", "v_proj"}}});
  doc["training"]["framework"] = "deepspeed";
  doc["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 4}, {"zero_stage", 2}};
  const Scenario s = scenario_from_json(doc);
  const Exported e = export_scenario(s, ExportFormat::peft);
  for (const char* line :
       {"distributed_type: DEEPSPEED", "  zero_stage: 2", "mixed_precision: bf16",
        "--lora_target_modules \"q_proj,v_proj\"", "--optim adamw_torch"}) {
    EXPECT_TRUE(has(e.text, std::string(line) + "\n")) << line << "\n" << e.text;
  }
  EXPECT_FALSE(has(e.text, "use_4bit_quantization"));
  // Megatron-LM and torchtitan v0.2.2 do not run adapters: refused, pointing at the peft export.
  try {
    (void)export_scenario(s, ExportFormat::megatron);
    FAIL() << "exported";
  } catch (const InputError& x) {
    EXPECT_EQ(x.path(), "/training/peft");
    EXPECT_TRUE(has(x.what(), "export peft"));
  }
  EXPECT_THROW((void)export_scenario(s, ExportFormat::torchtitan), InputError);
}

}  // namespace
}  // namespace distplan::search
