// FP8 training: what is stored in fp8, by hand against Transformer Engine's and DeepSeek-V3's
// choices; GEMMs at the fp8 peak; refusals on GPUs without FP8 tensor cores.
#include <string>

#include <gtest/gtest.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/op_costs.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// Llama-2-7B (h 4096, f 11008, 32 layers, MHA) on 8 GPUs, one 4096-token sequence per
// micro-batch, no TP, no recompute: per-layer figures are per token times 4096.
json doc(const char* precision, const char* recipe = nullptr, const char* gpu = "h100-sxm-80gb") {
  json d = {
      {"model", "llama2-7b"},
      {"cluster", {{"gpu", gpu}, {"num_gpus", 8}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 64}, {"precision", precision}}},
      {"parallel", {{"tp", 1}, {"zero_stage", 1}}}};
  if (recipe) d["training"]["fp8_recipe"] = recipe;
  return d;
}

Bytes layer_activation(const json& d) {
  const Scenario s = testing::scenario(d);
  return layer_activation_bytes(build_layer_table(s.model, s.training), s.model, s.training, 1,
                                false, Recompute::none);
}

TEST(Fp8, SavedGemmInputsAreOneByte) {
  // Per token, bf16 saves 2 bytes of each linear input; fp8 saves 1 (TE's fp8 input for wgrad,
  // DeepSeek-V3 sec. 3.3.2), except that attention_out's input, the attention output, stays
  // saved in bf16 for flash attention's backward and gains its fp8 copy: qkv -h, out +h,
  // mlp_in -h, mlp_out -f bytes per token.
  const Count s = 4096, h = 4096, f = 11008;
  const Bytes bf16 = layer_activation(doc("bf16"));
  for (const char* r : {"delayed", "current"}) {
    EXPECT_EQ(bf16 - layer_activation(doc("fp8", r)), s * (h + f)) << r;
  }
  // Blockwise keeps one fp32 scale per 1x128 tile of each input.
  EXPECT_EQ(layer_activation(doc("fp8", "blockwise")) - layer_activation(doc("fp8", "current")),
            s * (3 * (h / 128) + f / 128) * 4);
  // MXFP8 (a Blackwell GPU) one E8M0 byte per 32 elements; f = 11008 = 344 x 32.
  EXPECT_EQ(layer_activation(doc("fp8", "mxfp8", "b200-192gb")) -
                layer_activation(doc("fp8", "current", "b200-192gb")),
            s * (3 * (h / 32) + f / 32));
}

TEST(Fp8, WeightCopiesAndAmaxHistory) {
  // Each linear weight cached in two fp8 layouts (1 byte each) and, with delayed scaling, an
  // amax history of 1024 (+ the scale) fp32 values for input, weight and gradient of each of the
  // 4 linears: per layer 2 (4h^2 + 3hf) + 4 x 3 x 1025 x 4 bytes.
  const Count h = 4096, f = 11008;
  const Estimate a = estimate(testing::scenario(doc("bf16")));
  const Estimate b = estimate(testing::scenario(doc("fp8", "delayed")));
  const Bytes per_layer = 2 * (4 * h * h + 3 * h * f) + 4 * 3 * 1025 * 4;
  EXPECT_EQ(b.memory.stages[0].weights_bytes - a.memory.stages[0].weights_bytes, 32 * per_layer);
  // Master weights, moments and gradients do not change.
  EXPECT_EQ(a.memory.stages[0].optimizer_bytes, b.memory.stages[0].optimizer_bytes);
  EXPECT_EQ(a.memory.stages[0].gradients_bytes, b.memory.stages[0].gradients_bytes);
}

TEST(Fp8, LinearGemmsRunAtTheFp8Peak) {
  // H100 SXM: 1979 vs 989 TFLOP/s dense. The layer's linear GEMMs take about half as long (the
  // same ceiling fraction of a twice higher peak; one-byte operands); FLOPs are the model's.
  const Scenario a = testing::scenario(doc("bf16"));
  const Scenario b = testing::scenario(doc("fp8", "current"));
  const PassCosts ca = layer_pass_costs(build_layer_table(a.model, a.training), a.model, a.training,
                                        1, false, device_rates(a));
  const PassCosts cb = layer_pass_costs(build_layer_table(b.model, b.training), b.model, b.training,
                                        1, false, device_rates(b));
  const double ratio = cb.gemm_forward / ca.gemm_forward;
  EXPECT_GT(ratio, 0.49);
  EXPECT_LT(ratio, 0.52);
  // The casts are extra bandwidth-bound kernels: the whole forward falls by less.
  EXPECT_GT(cb.forward - cb.gemm_forward, ca.forward - ca.gemm_forward);
  EXPECT_EQ(estimate(a).compute.model_flops_per_step, estimate(b).compute.model_flops_per_step);
  EXPECT_LT(sim::plan(b).time.step_seconds, sim::plan(a).time.step_seconds);
}

TEST(Fp8, RefusesWhatIsNotModelled) {
  auto refused = [](const json& d, const std::string& path) {
    try {
      (void)testing::scenario(d);
    } catch (const InputError& err) {
      EXPECT_EQ(err.path(), path) << err.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << d.dump();
  };
  refused(doc("fp8", "delayed", "a100-80gb"), "/training/precision");     // no FP8 tensor cores
  refused(doc("fp8", "mxfp8", "h100-sxm-80gb"), "/training/fp8_recipe");  // MXFP8: Blackwell
  refused(doc("bf16", "delayed"), "/training/fp8_recipe");                // recipe without fp8
  refused(doc("fp8", "rowwise"), "/training/fp8_recipe");
  // The echo reads back to the same scenario.
  const Scenario s = testing::scenario(doc("fp8", "blockwise"));
  EXPECT_EQ(testing::scenario(to_json(s)), s);
}

}  // namespace
}  // namespace distplan
