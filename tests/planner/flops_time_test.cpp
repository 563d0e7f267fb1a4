#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "distplan/planner/estimate.h"
#include "distplan/planner/op_costs.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

json gpt3_doc(const json& ref, const char* recompute) {
  const json& m = ref["model"];
  return {{"model",
           {{"preset", "gpt3-175b"}, {"vocab_size", m["vocab_size"]}, {"tied_embeddings", false}}},
          {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 8}}},
          {"training",
           {{"seq_length", m["seq_length"]}, {"global_batch_size", m["global_batch_size"]}}},
          {"parallel", {{"tp", 8}, {"recompute", recompute}}}};
}

// Narayanan et al. 2021, eq. (3).
TEST(Flops, FullRecomputeMatchesMegatronFormula) {
  const auto ref = testing::reference("megatron_flops.json");
  const Estimate e = estimate(testing::scenario(gpt3_doc(ref, "full")));
  const double B = ref["model"]["global_batch_size"], s = ref["model"]["seq_length"],
               l = ref["model"]["num_layers"], h = ref["model"]["hidden_size"],
               V = ref["model"]["vocab_size"];
  const double expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(e.compute.hardware_flops_per_step / expected, 1.0, 1e-12);
  // Without recompute the model FLOPs are three forward passes: 72 B s l h^2 (1 + s/6h + V/12lh).
  const double model = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(e.compute.model_flops_per_step / model, 1.0, 1e-12);
}

TEST(Time, MfuIsModelFlopsOverPeakTime) {
  const Scenario s = testing::scenario(testing::default_doc());
  const Estimate e = estimate(s);
  const double expected =
      e.compute.model_flops_per_step / (e.time.step_seconds * 64 * s.cluster.gpu.peak_flops.bf16);
  EXPECT_NEAR(e.time.mfu, expected, 1e-12);
  EXPECT_GT(e.time.mfu, 0.0);
  EXPECT_LT(e.time.mfu, s.cluster.gpu.gemm_efficiency);  // no op runs above the GEMM ceiling
  EXPECT_NEAR(e.time.tokens_per_second, 512.0 * 4096 / e.time.step_seconds, 1e-6);
}

TEST(Time, OneFOneBBubbleIsClosedFormForEqualStages) {
  // Equal stages: no embedding or head imbalance matters when they are tiny; use a model whose
  // first and last stages differ little and check the closed form on the slowest stage.
  json doc = testing::default_doc();
  const Estimate e = estimate(testing::scenario(doc));
  const double m = static_cast<double>(e.num_microbatches);
  double t_max = 0, sum = 0;
  for (const auto& k : e.stage_costs) {
    const double t = k.forward + k.backward_input + k.backward_weight;
    t_max = std::max(t_max, t);
    sum += t;
  }
  const double pipe = (m - 1) * t_max + sum + 2 * 3 * e.stage_costs.back().p2p;
  EXPECT_NEAR(e.time.step_seconds,
              pipe + e.time.exposed_communication_seconds + e.time.optimizer_seconds, 1e-9);
}

TEST(Time, InterleavingShrinksTheBubbleByV) {
  json doc = testing::default_doc();
  doc["parallel"]["schedule"] = "1f1b";
  const Estimate a = estimate(testing::scenario(doc));
  doc["parallel"]["schedule"] = "interleaved_1f1b";
  doc["parallel"]["virtual_stages"] = 5;
  const Estimate b = estimate(testing::scenario(doc));
  EXPECT_LT(b.time.bubble_fraction, a.time.bubble_fraction);
  // With 256 micro-batches on 4 stages the bubble is 1.2 %, less than what v times the blocking
  // pipeline sends cost; once the sends overlap compute, interleaving wins.
  EXPECT_GT(b.time.step_seconds, a.time.step_seconds);
  doc["assumptions"] = {{"overlap_p2p", true}};
  const Estimate c = estimate(testing::scenario(doc));
  doc["parallel"]["schedule"] = "1f1b";
  doc["parallel"]["virtual_stages"] = 1;
  const Estimate d = estimate(testing::scenario(doc));
  EXPECT_LT(c.time.step_seconds, d.time.step_seconds);
}

TEST(Time, ComputeEfficiencyIsANamedAssumption) {
  json doc = testing::default_doc();
  doc["assumptions"] = {{"compute_efficiency", 0.25}};
  const Estimate slow = estimate(testing::scenario(doc));
  doc["assumptions"] = {{"compute_efficiency", 0.5}};
  const Estimate fast = estimate(testing::scenario(doc));
  // Weight-gradient GEMMs carry no communication and are compute bound: their time scales with
  // the ceiling, up to the fixed kernel launches (4 GEMMs x 20 layers x 3 us of ~30 ms).
  EXPECT_NEAR(slow.stage_costs[1].backward_weight / fast.stage_costs[1].backward_weight, 2.0, 0.01);
  EXPECT_GT(slow.time.step_seconds, fast.time.step_seconds);
  // 0 (the default) takes the GPU preset's ceiling.
  doc["assumptions"] = {{"compute_efficiency", 0}};
  const Estimate preset = estimate(testing::scenario(doc));
  doc["assumptions"] = {{"compute_efficiency", testing::scenario(doc).cluster.gpu.gemm_efficiency}};
  EXPECT_EQ(preset.time, estimate(testing::scenario(doc)).time);
}

TEST(Time, OpCostMemoNeverServesAnotherScenario) {
  // estimate() keeps the last op costs per thread; any input that changes them must be seen.
  json doc = testing::default_doc();
  const Estimate first = estimate(testing::scenario(doc));
  for (const auto& [section, key, value] : std::vector<std::tuple<std::string, std::string, json>>{
           {"assumptions", "compute_efficiency", 0.4},
           {"assumptions", "memory_efficiency", 0.3},
           {"assumptions", "kernel_launch_seconds", 1e-4},
           {"training", "micro_batch_size", 2},
           {"training", "seq_length", 2048},
           {"training", "dropout", 0.1},
           {"training", "attention", "standard"}}) {
    json changed = doc;
    changed[section][key] = value;
    if (key == "micro_batch_size" || key == "seq_length")
      changed["training"]["global_batch_size"] = 512;
    const Estimate other = estimate(testing::scenario(changed));
    EXPECT_NE(other.stage_costs[1].forward, first.stage_costs[1].forward) << key;
    EXPECT_EQ(estimate(testing::scenario(doc)), first) << key;
  }
}

TEST(Time, OverlapOptionsHideCommunicationAtTheNamedSlowdown) {
  // Default scenario (ZeRO-1): the post-step all-gather is exposed in full; with
  // overlap_param_gather_after_step it hides behind one micro-batch's forward, leaving what does
  // not fit plus overlap_compute_slowdown (0.1) of what does (docs/time.md's table).
  json doc = testing::default_doc();
  const Estimate base = estimate(testing::scenario(doc));
  doc["assumptions"] = {{"overlap_param_gather_after_step", true}};
  const Estimate hidden = estimate(testing::scenario(doc));
  auto hide = [](double c, double w) { return std::max(0.0, c - w) + 0.1 * std::min(c, w); };
  double want_base = 0, want_hidden = 0;
  for (const StageCosts& k : base.stage_costs) {
    const double rs = hide(k.grad_reduce, k.backward_input + k.backward_weight);
    want_base = std::max(want_base, rs + k.param_gather);
    want_hidden = std::max(want_hidden, rs + hide(k.param_gather, k.forward));
  }
  EXPECT_NEAR(base.time.exposed_communication_seconds, want_base, 1e-12);
  EXPECT_NEAR(hidden.time.exposed_communication_seconds, want_hidden, 1e-12);
  EXPECT_LT(hidden.time.step_seconds, base.time.step_seconds);
  // TP overlap: every stage's forward loses the hidden share of its TP collectives.
  doc["assumptions"] = {{"tp_comm_overlap", true}};
  const Estimate tp = estimate(testing::scenario(doc));
  EXPECT_LT(tp.stage_costs[1].forward, base.stage_costs[1].forward);
  EXPECT_LT(tp.time.step_seconds, base.time.step_seconds);
  // Blocking pipeline sends cost v sends per micro-batch each way; overlapped, none.
  doc["assumptions"] = {{"overlap_p2p", true}};
  const Estimate p2p = estimate(testing::scenario(doc));
  EXPECT_NEAR(base.stage_costs[1].forward - p2p.stage_costs[1].forward, base.stage_costs[1].p2p,
              1e-12);
}

TEST(Time, GemmEfficiencyFollowsTileAndWaveQuantisation) {
  // Oracle: NVIDIA's Deep Learning Performance Guide ("Matrix Multiplication Background"): a GEMM
  // whose tiles fill exactly one wave runs at the ceiling; one more tile adds a nearly idle wave.
  DeviceRates r;
  r.gemm_efficiency = 0.8;
  r.k_overhead = 0;  // isolate quantisation
  r.sms = 108;
  r.peak = 1;
  r.hbm = 1;
  r.flash_forward = r.flash_backward = 1;
  r.finish();
  // 108 tiles of 256x128 (or 128x256): one full wave.
  EXPECT_NEAR(gemm_efficiency(r, 256 * 12, 128 * 9, 4096, 1), 0.8, 1e-12);
  // 109 tiles need two waves; the best tile shape then is 128x128 with 218 tiles in 3 waves.
  const double two = gemm_efficiency(r, 256 * 109, 128, 4096, 1);
  EXPECT_NEAR(two, 0.8 * 218.0 / (3 * 108), 1e-12);
  // A GEMM too small to fill the SMs runs at its share of them.
  EXPECT_NEAR(gemm_efficiency(r, 128, 128, 4096, 1), 0.8 / 108, 1e-12);
  // Short K pays the tile prologue/epilogue: K / (K + k_overhead).
  r.k_overhead = 64;
  EXPECT_NEAR(gemm_efficiency(r, 256 * 12, 128 * 9, 64, 1), 0.4, 1e-12);
  // gemm_seconds is the FLOPs over peak times this efficiency (compute-bound shapes).
  r.peak = 312e12;
  r.hbm = 1e30;
  r.launch = 0;
  r.finish();
  for (double m : {1000.0, 2048.0, 27904.0}) {
    for (double n : {96.0, 1152.0, 6144.0}) {
      const double k = 4096;
      EXPECT_NEAR(gemm_seconds(r, m, n, k, 3),
                  2 * m * n * k * 3 / (r.peak * gemm_efficiency(r, m, n, k, 3)),
                  1e-9 * gemm_seconds(r, m, n, k, 3));
    }
  }
}

TEST(Time, BandwidthBoundOpsFollowTheRoofline) {
  DeviceRates r;
  r.peak = 1e15;
  r.gemm_efficiency = 1;
  r.hbm = 1e12;
  r.launch = 0;
  r.element_bytes = 2;
  r.finish();
  // A GEMM with n = 1 (a matrix-vector product) is bound by reading A: 2 bytes per m*k element.
  EXPECT_NEAR(gemm_seconds(r, 8192, 1, 8192), 2.0 * (8192.0 * 8192 + 8192 + 8192) / 1e12, 1e-15);
  EXPECT_NEAR(memory_seconds(r, 1e9, 0), 1e-3, 1e-15);
}

TEST(Time, SmallerHiddenSizesRunFartherBelowPeak) {
  // Per token, GEMM FLOPs grow as h^2 and elementwise bytes as h: the op model's achieved
  // FLOP/s must rise with the hidden size (Narayanan et al. 2021, Table 1's trend).
  double last = 0;
  for (int h : {1024, 2048, 4096, 8192}) {
    json doc = testing::default_doc();
    doc["model"] = {
        {"num_layers", 8},         {"hidden_size", h},         {"num_attention_heads", h / 128},
        {"num_kv_heads", h / 128}, {"ffn_hidden_size", 4 * h}, {"vocab_size", 32000}};
    doc["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
    doc["cluster"] = {{"gpu", "a100-80gb"}, {"num_gpus", 1}};
    doc["training"]["global_batch_size"] = 8;
    const Estimate e = estimate(testing::scenario(doc));
    EXPECT_GT(e.time.mfu, last) << h;
    last = e.time.mfu;
  }
}

}  // namespace
}  // namespace distplan
