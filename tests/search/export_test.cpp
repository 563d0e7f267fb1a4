#include "distplan/search/export.h"

#include <algorithm>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/capabilities.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"
#include "distplan/planner/presets.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"

namespace distplan::search {
namespace {

Scenario scenario_of(const Layout& l, const std::string& model = "llama2-70b",
                     const std::string& framework = "megatron") {
  nlohmann::json doc = {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
      {"training",
       {{"seq_length", std::min<Count>(4096, find_model_preset(model)->max_position_embeddings)},
        {"global_batch_size", 512},
        {"framework", framework}}}};
  return make_scenario(request_from_json(doc).space.base, l);
}

/// The JSON path an export of `s` is refused at ("" when it is not).
std::string refused_at(const Scenario& s, ExportFormat f) {
  try {
    (void)export_scenario(s, f);
  } catch (const InputError& e) {
    return e.path();
  }
  return "";
}

Layout layout(Count tp, Count pp, Count dp, int zero, Count shard, Recompute r, bool sp,
              Schedule sched, Count v, Count mb) {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.zero_stage = zero, l.fsdp_shard_size = shard;
  l.recompute = r, l.sequence_parallel = sp, l.schedule = sched, l.virtual_stages = v;
  l.micro_batch_size = mb;
  return l;
}

/// "--flag value" pairs and bare flags of a Megatron-LM export (comments skipped).
std::multimap<std::string, std::string> megatron_args(const std::string& text) {
  std::multimap<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream w(line);
    std::string flag, value;
    w >> flag;
    if (w >> value && value != "\\")
      out.emplace(flag, value);
    else
      out.emplace(flag, "");
  }
  return out;
}

/// The value of `flag`, or "<absent>".
std::string value_of(const std::multimap<std::string, std::string>& args, const std::string& flag) {
  const auto it = args.find(flag);
  return it == args.end() ? "<absent>" : it->second;
}

/// key = value of one TOML table.
std::map<std::string, std::string> toml_table(const std::string& text, const std::string& table) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      current = line.substr(1, line.find(']') - 1);
      continue;
    }
    const auto eq = line.find(" = ");
    if (current == table && eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

TEST(Export, MegatronArgumentsAreThePlansValues) {
  const Scenario s = scenario_of(
      layout(8, 4, 2, 1, 0, Recompute::selective, true, Schedule::interleaved_1f1b, 5, 2));
  const auto a = megatron_args(export_scenario(s, ExportFormat::megatron).text);
  EXPECT_EQ(value_of(a, "--tensor-model-parallel-size"), "8");
  EXPECT_EQ(value_of(a, "--pipeline-model-parallel-size"), "4");
  EXPECT_EQ(value_of(a, "--num-layers-per-virtual-pipeline-stage"), "4");  // 80 / (4*5)
  EXPECT_EQ(value_of(a, "--micro-batch-size"), "2");
  EXPECT_EQ(value_of(a, "--global-batch-size"), "512");
  EXPECT_EQ(value_of(a, "--seq-length"), "4096");
  EXPECT_EQ(value_of(a, "--num-layers"), "80");
  EXPECT_EQ(value_of(a, "--num-query-groups"), "8");
  EXPECT_EQ(value_of(a, "--recompute-granularity"), "selective");
  EXPECT_EQ(a.count("--sequence-parallel"), 1u);
  EXPECT_EQ(a.count("--use-distributed-optimizer"), 1u);
  EXPECT_EQ(a.count("--use-custom-fsdp"), 0u);
  EXPECT_EQ(a.count("--bf16"), 1u);
}

TEST(Export, MegatronZero3AndFullRecompute) {
  const Scenario s =
      scenario_of(layout(4, 2, 8, 3, 0, Recompute::full, false, Schedule::one_f_one_b, 1, 1));
  const auto a = megatron_args(export_scenario(s, ExportFormat::megatron).text);
  EXPECT_EQ(value_of(a, "--data-parallel-sharding-strategy"), "optim_grads_params");
  EXPECT_EQ(value_of(a, "--recompute-granularity"), "full");
  EXPECT_EQ(value_of(a, "--recompute-num-layers"), "1");
  EXPECT_EQ(a.count("--sequence-parallel"), 0u);
  EXPECT_EQ(a.count("--num-layers-per-virtual-pipeline-stage"), 0u);
}

// DeepSpeed's start-up check (runtime/config.py _batch_assertion, v0.18.0): train_batch_size =
// train_micro_batch_size_per_gpu x gradient_accumulation_steps x its world size, which is the
// pipeline grid's data-parallel size with a PipelineModule and every rank for a plain (AutoTP)
// model. The "512 != 1 x 128 x 8" is what the old export wrote.
TEST(Export, DeepSpeedConfigIsThePlansValuesAndPassesItsBatchCheck) {
  // AutoTP (pp = 1): 64 ranks in DeepSpeed's world, 16 data-parallel groups of 4.
  const Scenario tp =
      scenario_of(layout(4, 1, 16, 2, 0, Recompute::full, false, Schedule::one_f_one_b, 1, 2),
                  "llama2-70b", "deepspeed");
  const nlohmann::json j = nlohmann::json::parse(export_scenario(tp, ExportFormat::deepspeed).text);
  EXPECT_EQ(j.at("train_micro_batch_size_per_gpu"), 2);
  EXPECT_EQ(j.at("gradient_accumulation_steps"), 512 / (2 * 16));
  EXPECT_EQ(j.at("train_batch_size"), 2 * 16 * 64);
  EXPECT_EQ(j.at("zero_optimization").at("stage"), 2);
  EXPECT_EQ(j.at("tensor_parallel").at("autotp_size"), 4);
  EXPECT_TRUE(j.at("bf16").at("enabled").get<bool>());
  EXPECT_EQ(j.at("data_types").at("grad_accum_dtype"), "bf16");  // DeepSpeed's default
  // A pipeline (tp = 1): the grid's data-parallel size, 32.
  const Scenario pp =
      scenario_of(layout(1, 2, 32, 1, 0, Recompute::full, false, Schedule::one_f_one_b, 1, 1),
                  "llama2-70b", "deepspeed");
  const Exported e = export_scenario(pp, ExportFormat::deepspeed);
  const nlohmann::json k = nlohmann::json::parse(e.text);
  EXPECT_EQ(k.at("train_batch_size"), 512);
  EXPECT_EQ(k.at("gradient_accumulation_steps"), 16);
  EXPECT_EQ(k.at("train_batch_size").get<Count>(),
            k.at("train_micro_batch_size_per_gpu").get<Count>() *
                k.at("gradient_accumulation_steps").get<Count>() * 32);
  EXPECT_TRUE(std::any_of(e.to_add.begin(), e.to_add.end(), [](const std::string& a) {
    return a.find("num_stages=2") != std::string::npos;
  }));
  // MiCS: hybrid ZeRO-3 shards of 4.
  const Scenario mics =
      scenario_of(layout(1, 1, 64, 3, 4, Recompute::full, false, Schedule::one_f_one_b, 1, 1),
                  "llama2-70b", "deepspeed");
  EXPECT_EQ(nlohmann::json::parse(export_scenario(mics, ExportFormat::deepspeed).text)
                .at("zero_optimization")
                .at("mics_shard_size"),
            4);
}

// The DeepSpeed export of a cp = 2 layout: DeepSpeed has no context parallelism, so the
// plan is refused (at the field) instead of exported.
TEST(Export, DeepSpeedRefusesContextParallelism) {
  Layout l = layout(1, 1, 32, 1, 0, Recompute::full, false, Schedule::one_f_one_b, 1, 1);
  l.cp = 2;
  EXPECT_EQ(refused_at(scenario_of(l, "llama2-70b", "deepspeed"), ExportFormat::deepspeed),
            "/parallel/cp");
}

TEST(Export, TorchtitanConfigIsThePlansValues) {
  const Scenario s = scenario_of(
      layout(8, 2, 4, 3, 2, Recompute::selective_op, true, Schedule::interleaved_1f1b, 2, 1),
      "llama2-70b", "torchtitan");
  const std::string text = export_scenario(s, ExportFormat::torchtitan).text;
  const auto par = toml_table(text, "parallelism");
  EXPECT_EQ(par.at("tensor_parallel_degree"), "8");
  EXPECT_EQ(par.at("pipeline_parallel_degree"), "2");
  EXPECT_EQ(par.at("data_parallel_shard_degree"), "2");
  EXPECT_EQ(par.at("data_parallel_replicate_degree"), "2");
  EXPECT_EQ(par.at("pipeline_parallel_schedule"), "\"Interleaved1F1B\"");
  // torchtitan's _generate_llm_fqn_per_model_part with no weights gives (80 + 0 + 0) / 4 = 20
  // layers to each of the 4 stages, the plan's split; 2 stages per rank is its default for a
  // multi-stage schedule, so no pipeline_parallel_layers_per_stage.
  EXPECT_EQ(par.at("pipeline_parallel_first_stage_less_layers"), "0");
  EXPECT_EQ(par.at("pipeline_parallel_last_stage_less_layers"), "0");
  EXPECT_EQ(par.at("fsdp_reshard_after_forward"), "\"default\"");
  EXPECT_EQ(par.count("pipeline_parallel_layers_per_stage"), 0u);
  EXPECT_EQ(par.at("pipeline_parallel_microbatch_size"), "1");
  const auto tr = toml_table(text, "training");
  EXPECT_EQ(tr.at("global_batch_size"), "512");
  EXPECT_EQ(tr.at("local_batch_size"), "128");  // 512 / dp, split into pipeline micro-batches
  EXPECT_EQ(tr.at("seq_len"), "4096");
  EXPECT_EQ(toml_table(text, "activation_checkpoint").at("mode"), "\"selective\"");
  EXPECT_EQ(toml_table(text, "activation_checkpoint").at("selective_ac_option"), "\"op\"");
}

TEST(Export, MegatronUnevenStagesGiveFirstAndLastCounts) {
  // 80 layers over pp = 6: 13 each, 2 extra on stages 1 and 2 (planner) -> unequal middle stages,
  // which only --pipeline-model-parallel-layout states; Megatron's parser of it
  // (parse_megatron_layout) gives the plan's stages back.
  Scenario s =
      scenario_of(layout(8, 6, 1, 0, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1));
  s.cluster.num_gpus = 48;
  const auto sa = megatron_args(export_scenario(s, ExportFormat::megatron).text);
  std::string stages = value_of(sa, "--pipeline-model-parallel-layout");
  ASSERT_GE(stages.size(), 2u);
  stages = stages.substr(1, stages.size() - 2);  // the quotes
  EXPECT_EQ(parse_megatron_layout(stages, 6, 80, 0, "").decoder, stage_layer_counts(s));
  // 80 layers over pp = 3: 27 / 27 / 26, what Megatron's get_num_layers_to_build gives with the
  // loss counted as a layer ((80 + 1) / 3 = 27, the last stage one fewer).
  Scenario t =
      scenario_of(layout(8, 3, 1, 0, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1));
  t.cluster.num_gpus = 24;
  const auto a = megatron_args(export_scenario(t, ExportFormat::megatron).text);
  EXPECT_EQ(stage_layer_counts(t), (std::vector<Count>{27, 27, 26}));
  EXPECT_EQ(a.count("--account-for-loss-in-pipeline-split"), 1u);
  EXPECT_EQ(a.count("--account-for-embedding-in-pipeline-split"), 0u);
  // 18 / 22 / 22 / 18 over pp = 4: first and last counts say it all (the middle (80 - 36) / 2).
  Scenario u =
      scenario_of(layout(8, 4, 1, 0, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1));
  u.cluster.num_gpus = 32;
  u.parallel.layers_per_stage = {18, 22, 22, 18};
  const auto b = megatron_args(export_scenario(u, ExportFormat::megatron).text);
  EXPECT_EQ(value_of(b, "--decoder-first-pipeline-num-layers"), "18");
  EXPECT_EQ(value_of(b, "--decoder-last-pipeline-num-layers"), "18");
}

// An export never substitutes: what the framework cannot run is refused at its field, and a plan
// made under another framework is not exported.
TEST(Export, WhatTheFrameworkCannotRunIsRefusedNotSubstituted) {
  const Layout zb = layout(8, 4, 2, 1, 0, Recompute::none, true, Schedule::zb_h1, 1, 1);
  EXPECT_EQ(refused_at(scenario_of(zb), ExportFormat::megatron), "/parallel/schedule");
  EXPECT_EQ(refused_at(scenario_of(zb, "llama2-70b", "generic"), ExportFormat::megatron),
            "/training/framework");
  EXPECT_EQ(refused_at(scenario_of(zb), ExportFormat::torchtitan), "/training/framework");
  // torchtitan has no ZeRO-1 (FSDP2 shards everything), DeepSpeed no ZeRO-2 with a pipeline.
  const Layout z1 = layout(8, 4, 2, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1);
  EXPECT_EQ(refused_at(scenario_of(z1, "llama2-70b", "torchtitan"), ExportFormat::torchtitan),
            "/parallel/zero_stage");
  const Layout z2 = layout(1, 4, 16, 2, 0, Recompute::none, false, Schedule::one_f_one_b, 1, 1);
  EXPECT_EQ(refused_at(scenario_of(z2, "llama2-70b", "deepspeed"), ExportFormat::deepspeed),
            "/parallel/zero_stage");
}

// --- Megatron-LM: every flag in the named version ---------------------------------------------

/// Megatron-LM's own argument list (data/reference, transcribed from the version's
/// megatron/training/arguments.py): the independent oracle for the flag names and values.
const nlohmann::json& megatron_reference() {
  static const nlohmann::json j =
      nlohmann::json::parse(*embedded_data_file("reference/megatron_core_v0.15.3_arguments.json"));
  return j;
}

// Layouts over ZeRO stages, recompute, schedules, sequence parallelism, hybrid sharding, uneven
// stages and precisions, on a learned-position GeLU model with biases and on Llama 3.1.
// Only what `framework` runs (framework_refusal), which is all an export is given.
std::vector<Scenario> export_matrix(const std::string& framework = "megatron") {
  std::vector<Scenario> out;
  for (const std::string model : {"llama3.1-70b", "gpt3-13b", "llama2-70b"}) {
    for (int zero = 0; zero <= 3; ++zero) {
      for (Recompute r :
           {Recompute::none, Recompute::selective, Recompute::full, Recompute::selective_op}) {
        for (Schedule sched :
             {Schedule::one_f_one_b, Schedule::interleaved_1f1b, Schedule::zb_h1}) {
          for (bool sp : {false, true}) {
            const Count v = sched == Schedule::interleaved_1f1b ? 2 : 1;
            const Count shard = zero > 0 ? 2 : 0;
            Scenario s =
                scenario_of(layout(4, 4, 4, zero, shard, r, sp, sched, v, 1), model, framework);
            for (DType prec : {DType::bf16, DType::fp16, DType::fp32}) {
              for (DType grad : {DType::bf16, DType::fp16, DType::fp32}) {
                if (prec == DType::fp32 && grad != DType::fp32) continue;
                s.training.precision = prec;
                s.training.grad_accumulation_dtype = grad;
                if (!framework_refusal(s)) out.push_back(s);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

TEST(Export, EveryMegatronFlagExistsInTheNamedVersionWithAValidValue) {
  const nlohmann::json& flags = megatron_reference().at("flags");
  ASSERT_GT(flags.size(), 500u);
  EXPECT_EQ(kMegatronVersion, "Megatron-LM core_v0.15.3");
  const std::vector<Scenario> matrix = export_matrix();
  ASSERT_GT(matrix.size(), 500u);
  for (const Scenario& s : matrix) {
    const std::string text = export_scenario(s, ExportFormat::megatron).text;
    for (const auto& [flag, value] : megatron_args(text)) {
      ASSERT_TRUE(flags.contains(flag)) << flag << " is not a Megatron-LM core_v0.15.3 argument";
      const nlohmann::json& f = flags.at(flag);
      if (!f.value("takes_value", true)) {
        EXPECT_EQ(value, "") << flag << " is a switch";
      } else {
        EXPECT_NE(value, "") << flag << " needs a value";
      }
      if (f.contains("choices")) {
        const auto& c = f.at("choices");
        EXPECT_NE(std::find(c.begin(), c.end(), value), c.end()) << flag << " " << value;
      }
    }
  }
}

// What Megatron-LM core_v0.15.3 makes of the precision switches (arguments.py, validate_args):
// --bf16 accumulates and reduces gradients in fp32 unless --grad-reduce-in-bf16; --fp16 keeps
// fp16 gradients unless --accumulate-allreduce-grads-in-fp32; neither: fp32 everywhere.
DType megatron_grad_dtype(const std::multimap<std::string, std::string>& a) {
  if (a.count("--bf16")) return a.count("--grad-reduce-in-bf16") ? DType::bf16 : DType::fp32;
  if (a.count("--fp16"))
    return a.count("--accumulate-allreduce-grads-in-fp32") ? DType::fp32 : DType::fp16;
  return DType::fp32;
}

TEST(Export, MegatronGradientDtypeIsThePlans) {
  for (const Scenario& s : export_matrix()) {
    const Exported e = export_scenario(s, ExportFormat::megatron);
    EXPECT_EQ(megatron_grad_dtype(megatron_args(e.text)), s.training.grad_accumulation_dtype)
        << to_string(s.training.precision) << " " << to_string(s.training.grad_accumulation_dtype);
  }
  // What Megatron cannot express (fp16 gradients with bf16 compute, bf16 with fp16) is refused
  // at plan time.
  Scenario s =
      scenario_of(layout(4, 4, 4, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1));
  s.training.grad_accumulation_dtype = DType::fp16;
  ASSERT_TRUE(framework_refusal(s));
  EXPECT_EQ(framework_refusal(s)->path, "/training/grad_accumulation_dtype");
}

TEST(Export, MegatronLlama31HasItsRotaryBaseAndScaling) {
  // Published values: Llama 3.1 config.json rope_theta 500000, rope_scaling factor 8.0
  // (rope_type llama3); Llama 2 uses the RoFormer default 10000.
  const auto a = megatron_args(
      export_scenario(
          scenario_of(layout(8, 1, 8, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1),
                      "llama3.1-70b"),
          ExportFormat::megatron)
          .text);
  EXPECT_EQ(value_of(a, "--rotary-base"), "500000");
  EXPECT_EQ(a.count("--use-rope-scaling"), 1u);
  EXPECT_EQ(value_of(a, "--rope-scaling-factor"), "8");
  const auto b = megatron_args(
      export_scenario(
          scenario_of(layout(8, 1, 8, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1)),
          ExportFormat::megatron)
          .text);
  EXPECT_EQ(value_of(b, "--rotary-base"), "10000");
  EXPECT_EQ(b.count("--use-rope-scaling"), 0u);
  // A learned-position model has no rotary flags at all.
  const auto c = megatron_args(
      export_scenario(
          scenario_of(layout(8, 1, 8, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1),
                      "gpt3-13b"),
          ExportFormat::megatron)
          .text);
  EXPECT_EQ(c.count("--rotary-base"), 0u);
  EXPECT_EQ(value_of(c, "--position-embedding-type"), "learned_absolute");
}

TEST(Export, MegatronQwen2AddsItsQkvBiases) {
  // Qwen2.5 has biases on q, k and v only (its released checkpoint's q_proj.bias etc.): Megatron
  // needs --add-qkv-bias beside --disable-bias-linear; Llama has neither bias.
  const Layout l = layout(4, 1, 16, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1);
  const auto q =
      megatron_args(export_scenario(scenario_of(l, "qwen2.5-7b"), ExportFormat::megatron).text);
  EXPECT_EQ(q.count("--add-qkv-bias"), 1u);
  EXPECT_EQ(q.count("--disable-bias-linear"), 1u);
  const auto ll =
      megatron_args(export_scenario(scenario_of(l, "llama3.1-8b"), ExportFormat::megatron).text);
  EXPECT_EQ(ll.count("--add-qkv-bias"), 0u);
}

TEST(Export, Qwen3HeadWidthAndQkNormsReachMegatronAndNoFlavor) {
  // Qwen3's head_dim differs from hidden / heads and it normalises q and k: Megatron-LM needs
  // --kv-channels and --qk-layernorm (both core_v0.15.3 arguments); torchtitan's llama3 flavors
  // have neither, so no flavor is named.
  const Layout l = layout(4, 1, 16, 1, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1);
  Scenario s = scenario_of(l, "llama3.1-8b");
  s.model.explicit_head_dim = 64;  // 4096 / 32 = 128
  s.model.qk_norm = true;
  const auto a = megatron_args(export_scenario(s, ExportFormat::megatron).text);
  EXPECT_EQ(value_of(a, "--kv-channels"), "64");
  EXPECT_EQ(a.count("--qk-layernorm"), 1u);
  const nlohmann::json& flags = megatron_reference().at("flags");
  EXPECT_TRUE(flags.contains("--kv-channels"));
  EXPECT_FALSE(flags.at("--qk-layernorm").value("takes_value", true));
  Scenario tt =
      scenario_of(layout(4, 1, 16, 3, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1),
                  "llama3.1-8b", "torchtitan");
  tt.model = s.model;
  const Exported t = export_scenario(tt, ExportFormat::torchtitan);
  EXPECT_NE(t.text.find("distplan_custom"), std::string::npos);
  const auto plain =
      megatron_args(export_scenario(scenario_of(l, "llama3.1-8b"), ExportFormat::megatron).text);
  EXPECT_EQ(plain.count("--kv-channels"), 0u);
  EXPECT_EQ(plain.count("--qk-layernorm"), 0u);
}

TEST(Export, MegatronFsdpUsesTheRenamedFlag) {
  for (int zero : {2, 3}) {
    const auto a =
        megatron_args(export_scenario(scenario_of(layout(4, 2, 8, zero, 0, Recompute::none, true,
                                                         Schedule::one_f_one_b, 1, 1)),
                                      ExportFormat::megatron)
                          .text);
    EXPECT_EQ(a.count("--use-custom-fsdp"), 0u);
    EXPECT_EQ(a.count("--use-megatron-fsdp"), 1u);
    // core_v0.15.3 asserts Megatron FSDP checkpoints in fsdp_dtensor format.
    EXPECT_EQ(value_of(a, "--ckpt-format"), "fsdp_dtensor");
  }
}

// --- torchtitan -----------------------------------------------------------------------------

TEST(Export, TorchtitanModelSectionNamesTheFlavorOfTheSameShape) {
  const Layout l = layout(8, 1, 8, 3, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1);
  // torchtitan v0.2.2 llama3_args: "8B" and "70B" are Llama 3.1 8B and 70B.
  for (const auto& [model, flavor] : std::vector<std::pair<std::string, std::string>>{
           {"llama3.1-8b", "\"8B\""}, {"llama3.1-70b", "\"70B\""}, {"llama3.1-405b", "\"405B\""}}) {
    const Exported e =
        export_scenario(scenario_of(l, model, "torchtitan"), ExportFormat::torchtitan);
    const auto m = toml_table(e.text, "model");
    EXPECT_EQ(m.at("name"), "\"llama3\"");
    EXPECT_EQ(m.at("flavor"), flavor) << model;
  }
  // Llama 2 70B differs (rotary base, vocabulary): no flavor fits, and the note says what to add.
  const Exported e =
      export_scenario(scenario_of(l, "llama2-70b", "torchtitan"), ExportFormat::torchtitan);
  EXPECT_EQ(toml_table(e.text, "model").at("flavor"), "\"distplan_custom\"");
  EXPECT_TRUE(std::any_of(e.notes.begin(), e.notes.end(), [](const std::string& n) {
    return n.find("dim=8192") != std::string::npos && n.find("n_kv_heads=8") != std::string::npos;
  }));
}

TEST(Export, TorchtitanPrecisionKeysTakeOnlyItsValues) {
  // torchtitan v0.2.2 job_config.py: mixed_precision_param bfloat16 | float32,
  // mixed_precision_reduce float32.
  const std::vector<Scenario> matrix = export_matrix("torchtitan");
  ASSERT_GT(matrix.size(), 20u);
  for (const Scenario& s : matrix) {
    const Exported e = export_scenario(s, ExportFormat::torchtitan);
    const auto t = toml_table(e.text, "training");
    EXPECT_TRUE(t.at("mixed_precision_param") == "\"bfloat16\"" ||
                t.at("mixed_precision_param") == "\"float32\"");
    EXPECT_EQ(t.at("mixed_precision_reduce"), "\"float32\"");
  }
}

// --- fit and what is left to the user ---------------------------------------------------------

// A layout each framework runs that fits (Llama 2 70B on 64 H100s).
Scenario fitting(ExportFormat f) {
  switch (f) {
    case ExportFormat::megatron:
      return scenario_of(
          layout(8, 4, 2, 1, 0, Recompute::selective, true, Schedule::one_f_one_b, 1, 1));
    case ExportFormat::deepspeed:
      return scenario_of(
          layout(1, 1, 64, 3, 0, Recompute::full, false, Schedule::one_f_one_b, 1, 1), "llama2-70b",
          "deepspeed");
    case ExportFormat::torchtitan:
      return scenario_of(layout(8, 1, 8, 3, 0, Recompute::full, true, Schedule::one_f_one_b, 1, 1),
                         "llama2-70b", "torchtitan");
  }
  return {};
}

TEST(Export, ALayoutThatDoesNotFitSaysSoFirst) {
  // Llama 2 70B replicated on every GPU (tp 1, no ZeRO) cannot fit 80 GB: 70e9 bf16 weights alone
  // are 140 GB.
  for (ExportFormat f :
       {ExportFormat::megatron, ExportFormat::deepspeed, ExportFormat::torchtitan}) {
    const Scenario big =
        scenario_of(layout(1, 1, 64, 0, 0, Recompute::none, false, Schedule::one_f_one_b, 1, 1),
                    "llama2-70b", std::string(to_string(framework_of(f))));
    const Scenario ok = fitting(f);
    ASSERT_FALSE(estimate(big).memory.fits);
    ASSERT_TRUE(estimate(ok).memory.fits) << to_string(f);
    const Exported e = export_scenario(big, f);
    EXPECT_FALSE(e.fits);
    EXPECT_GT(e.peak_bytes, e.capacity_bytes);
    if (f != ExportFormat::deepspeed) {
      EXPECT_EQ(e.text.rfind("# WARNING: this layout does not fit", 0), 0u);
    }
    const Exported g = export_scenario(ok, f);
    EXPECT_TRUE(g.fits);
    EXPECT_EQ(g.text.find("WARNING"), std::string::npos);
  }
}

TEST(Export, EachExportSaysWhatTheUserStillAdds) {
  const Scenario s = fitting(ExportFormat::megatron);
  for (ExportFormat f :
       {ExportFormat::megatron, ExportFormat::deepspeed, ExportFormat::torchtitan}) {
    const Exported e = export_scenario(fitting(f), f);
    std::string all;
    for (const std::string& a : e.to_add) all += a + "\n";
    for (const char* what : {"tokenizer", "data", "lr"}) {
      EXPECT_NE(all.find(what), std::string::npos) << to_string(f) << " lacks " << what;
    }
    if (f != ExportFormat::deepspeed) {
      EXPECT_NE(e.text.find("# you still add: "), std::string::npos) << to_string(f);
    }
  }
  // The Megatron flags named there exist in the named version too.
  const nlohmann::json& flags = megatron_reference().at("flags");
  for (const std::string& a : export_scenario(s, ExportFormat::megatron).to_add) {
    for (std::size_t pos = a.find("--"); pos != std::string::npos; pos = a.find("--", pos + 2)) {
      const std::size_t end = a.find_first_of(" ,;)", pos);
      const std::string flag = a.substr(pos, end - pos);
      EXPECT_TRUE(flags.contains(flag)) << flag;
    }
  }
}

TEST(Export, TorchtitanNamesZbvZeroBubble) {
  // torch.distributed.pipelining's get_schedule_class("ZBVZeroBubble") is ScheduleZBVZeroBubble:
  // two stages per rank in a V, so torchtitan cuts num_layers / (2 pp) layers per stage.
  const Scenario s = scenario_of(layout(8, 2, 4, 3, 0, Recompute::none, true, Schedule::zb_v, 2, 1),
                                 "llama2-70b", "torchtitan");
  const std::string text = export_scenario(s, ExportFormat::torchtitan).text;
  const auto par = toml_table(text, "parallelism");
  EXPECT_EQ(par.at("pipeline_parallel_schedule"), "\"ZBVZeroBubble\"");
  // 4 stages (2 per rank, torchtitan's default for a multi-stage schedule) of 80 / 4 = 20 layers:
  // torchtitan's rule with no weights.
  EXPECT_EQ(par.at("pipeline_parallel_first_stage_less_layers"), "0");
  EXPECT_EQ(par.count("pipeline_parallel_layers_per_stage"), 0u);
}

TEST(Export, TorchtitanRefusesVHalfInsteadOfRunningZbv) {
  const Scenario s =
      scenario_of(layout(8, 2, 4, 3, 0, Recompute::none, true, Schedule::v_half, 2, 1),
                  "llama2-70b", "torchtitan");
  EXPECT_EQ(refused_at(s, ExportFormat::torchtitan), "/parallel/schedule");
}

}  // namespace
}  // namespace distplan::search
