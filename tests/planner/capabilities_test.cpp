// What each framework runs (capabilities.h, docs/frameworks.md): every layout below is one the
// named framework's code refuses (its assertion or missing option, cited in capabilities.cpp), or
// one it runs; the test holds the planner's answer to that behaviour, at the field.
#include "distplan/planner/capabilities.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"

namespace distplan {
namespace {

using nlohmann::json;

// Llama-3.1-8B on 16 H100s, one layout; `framework` and `parallel` as given.
json doc(const std::string& framework, const json& parallel, const json& training_extra = {}) {
  json d = {
      {"model", "llama3.1-8b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}}},
      {"training", {{"seq_length", 8192}, {"global_batch_size", 64}, {"framework", framework}}},
      {"parallel", parallel}};
  for (const auto& [k, v] : training_extra.items()) d["training"][k] = v;
  return d;
}

// The refusal of `d`: its JSON path, or "" when the scenario is accepted.
std::string refused_at(const json& d, std::string* message = nullptr) {
  try {
    (void)scenario_from_json(d);
  } catch (const InputError& e) {
    if (message) *message = e.what();
    return e.path();
  }
  return "";
}

void expect_refused(const json& d, const std::string& path, const std::string& needle) {
  std::string message;
  EXPECT_EQ(refused_at(d, &message), path) << d.dump();
  EXPECT_NE(message.find(needle), std::string::npos) << message;
  // Every refusal names the framework and says what to do.
  EXPECT_NE(message.find("training.framework"), std::string::npos) << message;
  EXPECT_NE(message.find("\"generic\""), std::string::npos) << message;
}

void expect_runs(const json& d) {
  std::string message;
  EXPECT_EQ(refused_at(d, &message), "") << d.dump() << ": " << message;
}

TEST(Capabilities, DefaultFrameworkIsMegatronAndEveryEchoNamesIt) {
  json d = doc("megatron", {{"tp", 2}, {"pp", 2}, {"dp", 4}});
  d["training"].erase("framework");
  const Scenario s = scenario_from_json(d);
  EXPECT_EQ(s.training.framework, Framework::megatron);
  EXPECT_EQ(to_json(s)["training"]["framework"], "megatron");
  d["training"]["framework"] = "generic";
  EXPECT_EQ(to_json(scenario_from_json(d))["training"]["framework"], "generic");
}

TEST(Capabilities, Fsdp2IsReadAsTorchtitan) {
  json d = doc("fsdp2", {{"tp", 2}, {"dp", 8}, {"zero_stage", 3}, {"sequence_parallel", true}});
  const Scenario s = scenario_from_json(d);
  EXPECT_EQ(s.training.framework, Framework::torchtitan);
  EXPECT_EQ(to_json(s)["training"]["framework"], "torchtitan");
  d["training"]["framework"] = "torchtitan";
  EXPECT_EQ(scenario_from_json(d), s);
}

TEST(Capabilities, MegatronRunsOneFOneBAndInterleavedOnly) {
  for (const char* sched :
       {"gpipe", "zb_h1", "zb_h2", "zb_v", "v_half", "v_min", "dualpipe_v", "zb_auto"}) {
    expect_refused(doc("megatron", {{"pp", 4}, {"dp", 4}, {"schedule", sched}}),
                   "/parallel/schedule", "get_forward_backward_func");
  }
  expect_runs(doc("megatron", {{"pp", 4}, {"dp", 4}, {"schedule", "1f1b"}}));
  expect_runs(doc("megatron",
                  {{"pp", 4}, {"dp", 4}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}));
  // At pp = 2 without p2p overlap arguments.py asserts pp > 2; with the overlap it runs.
  json pp2 = doc("megatron",
                 {{"pp", 2}, {"dp", 8}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}});
  expect_refused(pp2, "/assumptions/overlap_p2p", "pipeline-model-parallel size > 2");
  pp2["assumptions"]["overlap_p2p"] = true;
  expect_runs(pp2);
}

// The 70B layout: a generic search's winner, which Megatron-LM cannot run.
TEST(Capabilities, Llama70bDualPipeVLayoutIsNotReportedAsFittingByDefault) {
  json d = {{"model", "llama3.1-70b"},
            {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}}},
            {"training", {{"seq_length", 8192}, {"global_batch_size", 512}}},
            {"parallel",
             {{"tp", 4},
              {"pp", 2},
              {"dp", 4},
              {"cp", 2},
              {"schedule", "dualpipe_v"},
              {"zero_stage", 1},
              {"sequence_parallel", true},
              {"recompute", "none"}}}};
  expect_refused(d, "/parallel/schedule", "dualpipe_v");
  // Under torchtitan, which runs DualPipeV, the ZeRO-1 of the layout is what it lacks.
  d["training"]["framework"] = "torchtitan";
  expect_refused(d, "/parallel/zero_stage", "no ZeRO-1");
}

TEST(Capabilities, MegatronLevers) {
  json d = doc("megatron", {{"tp", 2}, {"dp", 8}, {"recompute", "selective_op"}});
  expect_refused(d, "/parallel/recompute", "torchtitan's policy");
  expect_refused(doc("megatron", {{"dp", 16}, {"zero_stage", 2}, {"offload_optimizer", "cpu"}}),
                 "/parallel/offload_optimizer", "--use-distributed-optimizer");
  expect_runs(doc("megatron", {{"dp", 16}, {"zero_stage", 1}, {"offload_optimizer", "cpu"}}));
  json ov = doc("megatron", {{"tp", 2}, {"dp", 8}, {"sequence_parallel", false}});
  ov["assumptions"]["tp_comm_overlap"] = true;
  expect_refused(ov, "/assumptions/tp_comm_overlap", "--sequence-parallel");
  ov["parallel"]["sequence_parallel"] = true;
  expect_runs(ov);
  // Hybrid sharding at every ZeRO stage (distributed optimizer instances, Megatron FSDP HSDP).
  for (int z : {1, 2, 3})
    expect_runs(doc("megatron", {{"dp", 16}, {"zero_stage", z}, {"fsdp_shard_size", 8}}));
}

TEST(Capabilities, TorchtitanShardsWithFsdp2Only) {
  expect_refused(doc("torchtitan", {{"dp", 16}, {"zero_stage", 1}}), "/parallel/zero_stage",
                 "no ZeRO-1");
  // ZeRO-2: parameters kept gathered from the forward to the end of the backward
  // (fsdp_reshard_after_forward = "never"), also hybrid-sharded.
  expect_runs(doc("torchtitan", {{"dp", 16}, {"zero_stage", 2}}));
  expect_runs(doc("torchtitan", {{"dp", 16}, {"zero_stage", 2}, {"fsdp_shard_size", 4}}));
  expect_runs(doc("torchtitan", {{"dp", 16}, {"zero_stage", 0}}));  // DDP, 1-D
  expect_refused(doc("torchtitan", {{"pp", 2}, {"dp", 8}, {"zero_stage", 0}}),
                 "/parallel/zero_stage", "DDP has not supported > 1D parallelism");
  expect_runs(doc("torchtitan", {{"pp", 2}, {"dp", 8}, {"zero_stage", 3}}));
  expect_runs(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}, {"fsdp_shard_size", 4}}));  // HSDP
  // Context parallelism folds into the FSDP mesh: never with ZeRO-0.
  expect_refused(doc("torchtitan", {{"cp", 2}, {"dp", 1}, {"pp", 8}, {"zero_stage", 0}}),
                 "/parallel/zero_stage", "fsdp_enabled");
}

TEST(Capabilities, TorchtitanParallelismAndPrecision) {
  expect_refused(
      doc("torchtitan", {{"tp", 2}, {"dp", 8}, {"zero_stage", 3}, {"sequence_parallel", false}}),
      "/parallel/sequence_parallel", "always shards the sequence");
  expect_refused(doc("torchtitan", {{"cp", 2}, {"cp_comm", "a2a"}, {"dp", 8}, {"zero_stage", 3}}),
                 "/parallel/cp_comm", "Ulysses");
  expect_runs(doc("torchtitan", {{"cp", 2}, {"cp_comm", "p2p"}, {"dp", 8}, {"zero_stage", 3}}));
  expect_refused(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}}, {{"precision", "fp16"}}),
                 "/training/precision", "no fp16");
  expect_refused(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}}, {{"precision", "fp8"}}),
                 "/training/precision", "no delayed scaling");
  expect_runs(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}},
                  {{"precision", "fp8"}, {"fp8_recipe", "current"}}));
  expect_refused(
      doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}}, {{"grad_accumulation_dtype", "bf16"}}),
      "/training/grad_accumulation_dtype", "float32 only");
  expect_refused(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}, {"recompute", "selective"}}),
                 "/parallel/recompute", "per-op");
  expect_runs(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}, {"recompute", "selective_op"}}));
  for (const char* sched : {"gpipe", "1f1b", "zb_v", "dualpipe_v"})
    expect_runs(doc("torchtitan", {{"pp", 2}, {"dp", 8}, {"zero_stage", 3}, {"schedule", sched}}));
  for (const char* sched : {"zb_h1", "zb_h2", "v_half", "v_min", "zb_auto"})
    expect_refused(
        doc("torchtitan", {{"pp", 2}, {"dp", 8}, {"zero_stage", 3}, {"schedule", sched}}),
        "/parallel/schedule", "get_schedule_class");
  // CPUOffloadPolicy moves parameters with the optimizer.
  json off = doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}, {"offload_optimizer", "cpu"}});
  expect_refused(off, "/parallel/offload_params", "CPUOffloadPolicy");
  off["parallel"]["offload_params"] = "cpu";
  expect_runs(off);
}

TEST(Capabilities, DeepSpeedPipelineEngineAndAutoTp) {
  expect_refused(doc("deepspeed", {{"pp", 2}, {"dp", 8}, {"zero_stage", 2}}),
                 "/parallel/zero_stage", "incompatible with pipeline parallelism");
  expect_runs(doc("deepspeed", {{"pp", 2}, {"dp", 8}, {"zero_stage", 1}}));
  // Tensor parallelism in a PipelineModule comes from Megatron-DeepSpeed's model code, as
  // BLOOM-176B and MT-NLG 530B ran.
  expect_runs(doc("deepspeed", {{"tp", 2}, {"pp", 2}, {"dp", 4}, {"zero_stage", 1}}));
  expect_runs(doc("deepspeed", {{"tp", 2}, {"dp", 8}, {"zero_stage", 2}}));
  expect_refused(doc("deepspeed", {{"tp", 2}, {"dp", 8}, {"zero_stage", 3}}),
                 "/parallel/zero_stage", "zero_stage = 3");
  expect_refused(doc("deepspeed", {{"tp", 2}, {"dp", 8}, {"sequence_parallel", true}}),
                 "/parallel/sequence_parallel", "AutoTP");
  expect_refused(doc("deepspeed", {{"cp", 2}, {"dp", 8}, {"zero_stage", 1}}), "/parallel/cp",
                 "no context parallelism");
  expect_refused(doc("deepspeed", {{"dp", 16}, {"zero_stage", 1}, {"fsdp_shard_size", 8}}),
                 "/parallel/fsdp_shard_size", "whole data-parallel group");
  expect_runs(doc("deepspeed", {{"dp", 16}, {"zero_stage", 3}, {"fsdp_shard_size", 8}}));  // MiCS
  expect_refused(doc("deepspeed", {{"dp", 16}}, {{"precision", "fp8"}, {"fp8_recipe", "current"}}),
                 "/training/fp8_recipe", "model code");
  // 32 layers over 3 stages (11, 11, 10): DeepSpeed's partitioner is not told a split.
  json uneven = doc("deepspeed", {{"pp", 3}, {"zero_stage", 1}});
  uneven["cluster"]["num_gpus"] = 3;
  uneven["training"]["global_batch_size"] = 6;
  expect_refused(uneven, "/parallel/pp", "partition");
  uneven["training"]["framework"] = "megatron";  // --pipeline-model-parallel-layout
  expect_runs(uneven);
  // 30 layers over 4 stages (7, 8, 8, 7): the embedding and the tied head weighed as layers in
  // partition_method, (30 + 2) / 4 = 8 per stage, BLOOM-176B's split (70 over 12: 5, 6 x 10, 5).
  json weighed = doc("deepspeed", {{"pp", 4}, {"zero_stage", 1}, {"layers_per_stage", {7, 8, 8, 7}}});
  weighed["model"] = {{"preset", "llama3.1-8b"}, {"num_layers", 30}};
  weighed["cluster"]["num_gpus"] = 4;
  weighed["training"]["global_batch_size"] = 8;
  weighed["training"]["framework"] = "deepspeed";
  expect_runs(weighed);
  weighed["parallel"]["layers_per_stage"] = {8, 7, 7, 8};
  expect_refused(weighed, "/parallel/layers_per_stage", "partition");
}

TEST(Capabilities, FineTuningRunsWhereHuggingFacePeftRunsIt) {
  const json lora = {{"method", "lora"}, {"rank", 8}, {"target_modules", {"q_proj", "v_proj"}}};
  expect_refused(doc("megatron", {{"dp", 16}, {"zero_stage", 1}}, {{"peft", lora}}),
                 "/training/peft", "no LoRA");
  expect_refused(doc("torchtitan", {{"dp", 16}, {"zero_stage", 3}}, {{"peft", lora}}),
                 "/training/peft", "no LoRA");
  expect_runs(doc("deepspeed", {{"dp", 16}, {"zero_stage", 2}}, {{"peft", lora}}));
  expect_runs(doc("generic", {{"dp", 16}, {"zero_stage", 2}}, {{"peft", lora}}));
}

TEST(Capabilities, GenericRunsEverythingTheOthersRefuse) {
  for (const json& p : {json{{"pp", 4}, {"dp", 4}, {"schedule", "zb_h1"}},
                        json{{"tp", 2}, {"pp", 2}, {"dp", 4}, {"zero_stage", 2}},
                        json{{"tp", 2}, {"dp", 8}, {"recompute", "selective_op"}},
                        json{{"cp", 2}, {"cp_comm", "a2a"}, {"dp", 8}},
                        json{{"dp", 16}, {"zero_stage", 1}, {"fsdp_shard_size", 8}}}) {
    expect_runs(doc("generic", p));
  }
}

TEST(Capabilities, EveryRowOfEveryFrameworkHasASource) {
  for (Framework f :
       {Framework::generic, Framework::megatron, Framework::torchtitan, Framework::deepspeed}) {
    const FrameworkCapabilities& c = capabilities(f);
    EXPECT_EQ(c.framework, f);
    EXPECT_FALSE(c.code.empty());
    EXPECT_FALSE(c.split_source.empty());
    auto check = [&](const Support& row, const char* what) {
      EXPECT_FALSE(row.source.empty()) << to_string(f) << ": " << what;
    };
    for (const auto& r : c.schedule) check(r, "schedule");
    for (const auto& r : c.zero_stage) check(r, "zero_stage");
    for (const auto& r : c.hybrid_shard) check(r, "hybrid_shard");
    for (const auto& r : c.sharding_with_pipeline) check(r, "sharding_with_pipeline");
    for (const auto& r : c.sharding_with_tensor_parallel) check(r, "sharding_with_tensor_parallel");
    for (const auto& r : c.context_parallel) check(r, "context_parallel");
    for (const auto& r : c.precision) check(r, "precision");
    for (const auto& r : c.fp8_recipe) check(r, "fp8_recipe");
    for (const auto& r : c.recompute) check(r, "recompute");
    for (const auto& r : c.offload_optimizer) check(r, "offload_optimizer");
    for (const auto& r : c.offload_params) check(r, "offload_params");
    for (const auto& r : c.offload_with_zero) check(r, "offload_with_zero");
    for (const Support* r : {&c.pipeline_with_tensor_parallel,
                             &c.replicas_with_model_parallel,
                             &c.unsharded_with_context_parallel,
                             &c.tensor_parallel,
                             &c.sequence_parallel,
                             &c.tensor_parallel_without_sp,
                             &c.expert_parallel,
                             &c.expert_tensor_parallel_equal_tp,
                             &c.expert_tensor_parallel_other,
                             &c.expert_parallel_beyond_shard,
                             &c.fp32_gradients_with_half,
                             &c.half_gradients,
                             &c.offload_optimizer_alone,
                             &c.fine_tuning,
                             &c.tp_comm_overlap,
                             &c.tp_comm_overlap_without_sp,
                             &c.overlap_grad_reduce,
                             &c.overlap_param_gather,
                             &c.overlap_param_gather_after_step,
                             &c.overlap_param_gather_after_step_flat,
                             &c.overlap_p2p,
                             &c.overlap_p2p_interleaved,
                             &c.interleaved_pp2_without_p2p_overlap,
                             &c.p2p_overlap_default,
                             &c.ep_dispatch_overlap,
                             &c.grouped_gemm,
                             &c.fused_kernels,
                             &c.torch_compile}) {
      check(*r, "row");
    }
  }
}

}  // namespace
}  // namespace distplan
