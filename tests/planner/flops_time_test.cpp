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
           {{"seq_length", m["seq_length"]},
            {"global_batch_size", m["global_batch_size"]},
            {"attention", "standard"}}},  // as in 2021: the whole s x s square is computed
          {"parallel", {{"tp", 8}, {"recompute", recompute}}}};
}

// Narayanan et al. 2021, eq. (3).
TEST(Flops, FullRecomputeMatchesMegatronFormula) {
  // Hardware FLOPs: what the GPUs run, standard attention computing the whole s x s square, and
  // the full recompute a fourth pass of the layers: eq. (3).
  const auto ref = testing::reference("megatron_flops.json");
  const Estimate e = estimate(testing::scenario(gpt3_doc(ref, "full")));
  const double B = ref["model"]["global_batch_size"], s = ref["model"]["seq_length"],
               l = ref["model"]["num_layers"], h = ref["model"]["hidden_size"],
               V = ref["model"]["vocab_size"];
  const double expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(e.compute.hardware_flops_per_step / expected, 1.0, 1e-12);
  // Model FLOPs count causal attention (half the square, Megatron-LM's current count): three
  // forward passes of 24 B s l h^2 (1 + s/12h) and the LM head's 2 B s h V.
  const double model = 72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h));
  EXPECT_NEAR(e.compute.model_flops_per_step / model, 1.0, 1e-12);
}

// Issue 24: MFU counts causal attention as Megatron-LM's num_floating_point_operations does
// (megatron/training/training.py: "causal mask (only half of the mask is non-zero)"); the count is
// written out here from that function's terms for a GQA, SwiGLU model at 128k tokens, where the
// attention square dominates and the full count would be 1.7x as large.
TEST(Flops, ModelFlopsAreMegatronsCausalCount) {
  json doc = {{"model", "llama3.1-8b"},
              {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 8}}},
              {"training", {{"seq_length", 131072}, {"global_batch_size", 8}}},
              {"parallel", {{"tp", 1}, {"cp", 8}, {"recompute", "full"}}}};
  const Scenario sc = testing::scenario(doc);
  const Estimate e = estimate(sc);
  const ModelSpec& m = sc.model;
  const double B = 8, s = 131072, L = static_cast<double>(m.num_layers);
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size);
  const double q = static_cast<double>(m.head_dim() * m.num_attention_heads);
  const double kv = static_cast<double>(m.head_dim() * m.num_kv_heads);
  const double V = static_cast<double>(e.padded_vocab_size);
  const double attn = 3 * 2 * (h * (q + 2 * kv) + q * s / 2 * 2 + q * h);
  const double mlp = 3 * 2 * h * f * 3;
  const double megatron = B * s * (L * (attn + mlp) + 3 * 2 * h * V);
  EXPECT_NEAR(e.compute.model_flops_per_step / megatron, 1.0, 1e-12);
  // Flash attention skips the masked half, also when the full recompute runs the forward again.
  const double recompute = B * s * L * (attn + mlp) / 3;
  EXPECT_NEAR(e.compute.hardware_flops_per_step / (megatron + recompute), 1.0, 1e-12);
}

TEST(Time, MfuIsModelFlopsOverPeakTime) {
  const Scenario s = testing::scenario(testing::default_doc());
  const Estimate e = sim::plan(s);
  const double expected =
      e.compute.model_flops_per_step / (e.time.step_seconds * 64 * s.cluster.gpu.peak_flops.bf16);
  EXPECT_NEAR(e.time.mfu, expected, 1e-12);
  EXPECT_GT(e.time.mfu, 0.0);
  EXPECT_LT(e.time.mfu, s.cluster.gpu.gemm_efficiency);  // no op runs above the GEMM ceiling
  EXPECT_NEAR(e.time.tokens_per_second, 512.0 * 4096 / e.time.step_seconds, 1e-6);
}

// With many micro-batches per step the walk's 1F1B bubble is small, and the closed-form bound
// (the busiest stage's passes after the first micro-batch's fill) comes within a few per cent of
// the walk without exceeding it.
TEST(Time, LowerBoundIsTightForLongOneFOneBSteps) {
  const Scenario s = testing::scenario(testing::default_doc());
  const Estimate bound = estimate(s);
  const Estimate walk = sim::plan(s);
  EXPECT_EQ(bound.time.engine, TimeEngine::lower_bound);
  EXPECT_EQ(walk.time.engine, TimeEngine::schedule_walk);
  EXPECT_LE(bound.time.step_seconds, walk.time.step_seconds);
  EXPECT_GT(bound.time.step_seconds, 0.97 * walk.time.step_seconds);
}

TEST(Time, InterleavingShrinksTheBubbleByV) {
  json doc = testing::default_doc();
  doc["parallel"]["schedule"] = "1f1b";
  const Estimate a = sim::plan(testing::scenario(doc));
  doc["parallel"]["schedule"] = "interleaved_1f1b";
  doc["parallel"]["virtual_stages"] = 5;
  const Estimate b = sim::plan(testing::scenario(doc));
  EXPECT_LT(b.time.bubble_fraction, a.time.bubble_fraction);
  // With 256 micro-batches on 4 stages the bubble is 1.2 %, less than what v times the blocking
  // pipeline sends cost; once the sends overlap compute, interleaving wins.
  EXPECT_GT(b.time.step_seconds, a.time.step_seconds);
  doc["assumptions"] = {{"overlap_p2p", true}};
  const Estimate c = sim::plan(testing::scenario(doc));
  doc["parallel"]["schedule"] = "1f1b";
  doc["parallel"]["virtual_stages"] = 1;
  const Estimate d = sim::plan(testing::scenario(doc));
  EXPECT_LT(c.time.step_seconds, d.time.step_seconds);
}

TEST(Time, ComputeEfficiencyIsANamedAssumption) {
  json doc = testing::default_doc();
  doc["assumptions"] = {{"compute_efficiency", 0.25}};
  const Estimate slow = sim::plan(testing::scenario(doc));
  doc["assumptions"] = {{"compute_efficiency", 0.5}};
  const Estimate fast = sim::plan(testing::scenario(doc));
  // Weight-gradient GEMMs carry no communication and are compute bound: their time scales with
  // the ceiling, up to the fixed kernel launches (4 GEMMs x 20 layers x 3 us of ~30 ms).
  EXPECT_NEAR(slow.stage_costs[1].backward_weight / fast.stage_costs[1].backward_weight, 2.0, 0.01);
  EXPECT_GT(slow.time.step_seconds, fast.time.step_seconds);
  // 0 (the default) takes the GPU preset's ceiling.
  doc["assumptions"] = {{"compute_efficiency", 0}};
  const Estimate preset = sim::plan(testing::scenario(doc));
  doc["assumptions"] = {{"compute_efficiency", testing::scenario(doc).cluster.gpu.gemm_efficiency}};
  EXPECT_EQ(preset.time, sim::plan(testing::scenario(doc)).time);
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
  // Default scenario (ZeRO-1): the post-step all-gather runs after the optimizer, exposed in full;
  // with overlap_param_gather_after_step it hides behind the next step's first forward, leaving
  // what does not fit plus overlap_compute_slowdown (0.1) of what does (docs/simulator.md).
  json doc = testing::default_doc();
  const Estimate base = sim::plan(testing::scenario(doc));
  doc["assumptions"] = {{"overlap_param_gather_after_step", true}};
  const Estimate hidden = sim::plan(testing::scenario(doc));
  // The gather ends every stage's step; in 1F1B the first stage ends last (the last backward
  // reaches it last).
  const StageCosts& k = base.stage_costs.front();
  const double saved = k.param_gather - (std::max(0.0, k.param_gather - k.forward) +
                                         0.1 * std::min(k.param_gather, k.forward));
  EXPECT_GT(saved, 0);
  EXPECT_NEAR(base.time.step_seconds - hidden.time.step_seconds, saved, 1e-9);
  // TP overlap: every stage's forward loses the hidden share of its TP collectives.
  doc["assumptions"] = {{"tp_comm_overlap", true}};
  const Estimate tp = sim::plan(testing::scenario(doc));
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
    const Estimate e = sim::plan(testing::scenario(doc));
    EXPECT_GT(e.time.mfu, last) << h;
    last = e.time.mfu;
  }
}

}  // namespace
}  // namespace distplan
