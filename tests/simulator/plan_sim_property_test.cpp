// Property: over random layouts, the planner's saved activations per stage (a closed form per
// schedule) equal the peak the simulator observes executing the schedule's program pass by pass
// (zb_auto's, whose order follows the stage costs, bound it from above).
// The two are computed independently: the planner counts, the simulator runs the program.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>

#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim {
namespace {

struct Drawn {
  nlohmann::json doc;
  std::string label;
};

Drawn draw(std::mt19937_64& rng) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  static const char* kSchedules[] = {"gpipe",      "1f1b",   "interleaved_1f1b", "zb_h1",
                                     "zb_h2",      "zb_v",   "v_half",           "v_min",
                                     "dualpipe_v", "zb_auto"};
  const std::string sched = kSchedules[pick(0, 9)];
  const bool vee =
      sched == "zb_v" || sched == "v_half" || sched == "v_min" || sched == "dualpipe_v";
  const int pp = pick(1, 6);
  const int v = sched == "interleaved_1f1b" ? pick(1, 4) : vee ? 2 : 1;
  const int layers = pp * v * pick(1, 3);
  const int tp = pick(1, 2), dp = pick(1, 2), mbs = pick(1, 2), cp = pick(1, 2);
  // Megatron-LM's interleaved order needs m to be a multiple of pp; the V schedules at least 2 pp.
  const int m = sched == "interleaved_1f1b" ? pp * pick(1, 4)
                : vee                       ? 2 * pp + pick(0, 9)
                                            : pick(1, 17);
  static const char* kRecompute[] = {"none", "selective"};
  nlohmann::json j = {
      {"model", {{"preset", "llama2-7b"}, {"num_layers", layers}}},
      {"cluster",
       {{"gpu", "h100-sxm-80gb"}, {"gpus_per_node", 8}, {"num_gpus", tp * cp * pp * dp}}},
      {"training",
       {{"seq_length", 128 * pick(1, 4)},
        {"global_batch_size", m * mbs * dp},
        {"micro_batch_size", mbs},
        {"dropout", pick(0, 1) == 1 ? 0.1 : 0.0}}},
      {"parallel",
       {{"tp", tp},
        {"cp", cp},
        {"pp", pp},
        {"zero_stage", pick(0, 1)},
        {"sequence_parallel", tp > 1 && pick(0, 1) == 1},
        {"recompute", kRecompute[pick(0, 1)]},
        {"schedule", sched},
        {"virtual_stages", v}}}};
  return {j, j.dump()};
}

TEST(PlanEqualsSimulation, SavedActivationsPerStageOverRandomLayouts) {
  std::mt19937_64 rng(20241117);
  int checked = 0;
  for (int i = 0; i < 640; ++i) {
    const Drawn d = draw(rng);
    const Scenario s = scenario_from_json(d.doc);
    const Estimate e = estimate(s);
    const SimResult r = simulate(s, e);
    ASSERT_EQ(r.stages.size(), e.memory.stages.size()) << d.label;
    for (std::size_t k = 0; k < r.stages.size(); ++k) {
      const StageMemory& plan = e.memory.stages[k];
      if (s.parallel.schedule == Schedule::zb_auto) {
        // The heuristic's order depends on the stage costs: the closed form counts its whole
        // memory limit, an upper bound of what the order holds.
        EXPECT_GE(plan.inflight_chunks, r.stages[k].peak_inflight_chunks) << d.label;
        EXPECT_GE(plan.activations_bytes, r.stages[k].peak_activation_bytes) << d.label;
        continue;
      }
      EXPECT_EQ(plan.inflight_chunks, r.stages[k].peak_inflight_chunks)
          << "stage " << k << " of " << d.label;
      EXPECT_EQ(plan.activations_bytes, r.stages[k].peak_activation_bytes)
          << "stage " << k << " of " << d.label;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 640);
}

// Issue 17 item 1: 4 layers, pp 2, v 2, global batch 2 (m = p). Megatron-LM's current warm-up
// count gives stage 1 (p - 1 - 1) * 2 + (v - 1) * p = 2 warm-up forwards and a third before the
// first backward: 3 chunks, in the plan and in the simulation.
TEST(PlanEqualsSimulation, InterleavedWithAsManyMicrobatchesAsStages) {
  const nlohmann::json j = {
      {"model", {{"preset", "llama2-7b"}, {"num_layers", 4}}},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2}}},
      {"training", {{"seq_length", 1024}, {"global_batch_size", 2}, {"micro_batch_size", 1}}},
      {"parallel", {{"pp", 2}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}}};
  const Scenario s = scenario_from_json(j);
  const Estimate e = estimate(s);
  const SimResult r = simulate(s, e);
  EXPECT_EQ(e.memory.stages[1].inflight_chunks, 3);
  EXPECT_EQ(r.stages[1].peak_inflight_chunks, 3);
  EXPECT_EQ(r.stages[0].peak_inflight_chunks, 4);  // stage 0: (2 - 0 - 1) * 2 + 2 = 4 = m v
  for (std::size_t k = 0; k < 2; ++k)
    EXPECT_EQ(e.memory.stages[k].activations_bytes, r.stages[k].peak_activation_bytes) << k;
}

// Issue 17 item 4: under interleaving, stage 0 keeps the embedding-dropout mask of every chunk-0
// micro-batch it holds. In Megatron-LM's order with v = 2 and m >= 2p that is 2p of them at the
// peak: p from the first micro-batch group plus p from the second before chunk 0's first
// backward (backward order runs p chunk-1 passes first).
TEST(PlanEqualsSimulation, InterleavedStageZeroHoldsTwoPDropoutMasks) {
  for (int p : {2, 3, 4}) {
    nlohmann::json j = {
        {"model", {{"preset", "llama2-7b"}, {"num_layers", 4 * p}}},
        {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", p}}},
        {"training",
         {{"seq_length", 1024},
          {"global_batch_size", 4 * p},
          {"micro_batch_size", 1},
          {"dropout", 0.1}}},
        {"parallel", {{"pp", p}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}}};
    const Scenario s = scenario_from_json(j);
    const Estimate e = estimate(s);
    const StageMemory& st0 = e.memory.stages[0];
    ASSERT_GT(st0.embedding_activation_bytes, 0);
    const Bytes chunk = (st0.activation_bytes_per_microbatch - st0.embedding_activation_bytes) / 2;
    const Count chunks = (p - 1) * 2 + p + 1;  // Megatron-LM warm-up + 1
    EXPECT_EQ(st0.activations_bytes, chunks * chunk + 2 * p * st0.embedding_activation_bytes)
        << "p " << p;
    EXPECT_EQ(simulate(s, e).stages[0].peak_activation_bytes, st0.activations_bytes) << "p " << p;
  }
}

// The V schedules on every p up to 8 (V-Min's stage pattern repeats with p mod 3), with the
// embedding-dropout and LM-head bytes both on stage 0.
TEST(PlanEqualsSimulation, VScheduleStagesWithEmbeddingAndHeadOnStageZero) {
  for (const char* sched : {"zb_v", "v_half", "v_min", "dualpipe_v"}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m : {2 * p, 2 * p + 5}) {
        const nlohmann::json j = {{"model", {{"preset", "llama2-7b"}, {"num_layers", 2 * p}}},
                                  {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", p}}},
                                  {"training",
                                   {{"seq_length", 256},
                                    {"global_batch_size", m},
                                    {"micro_batch_size", 1},
                                    {"dropout", 0.1}}},
                                  {"parallel", {{"pp", p}, {"schedule", sched}}}};
        const Scenario s = scenario_from_json(j);
        const Estimate e = estimate(s);
        const SimResult r = simulate(s, e);
        ASSERT_GT(e.memory.stages[0].embedding_activation_bytes, 0);
        ASSERT_GT(e.memory.stages[0].head_activation_bytes, 0);
        for (std::size_t k = 0; k < r.stages.size(); ++k) {
          EXPECT_EQ(e.memory.stages[k].inflight_chunks, r.stages[k].peak_inflight_chunks)
              << sched << " p " << p << " m " << m << " stage " << k;
          EXPECT_EQ(e.memory.stages[k].activations_bytes, r.stages[k].peak_activation_bytes)
              << sched << " p " << p << " m " << m << " stage " << k;
        }
      }
    }
  }
}

// DualPipe on even p up to 8: both end stages hold an embedding (dropout mask) and an LM head,
// each in the other direction's chunk.
TEST(PlanEqualsSimulation, DualPipeStagesWithEmbeddingAndHeadOnBothEnds) {
  for (int p = 2; p <= 8; p += 2) {
    for (int m : {2 * p, 2 * p + 6}) {
      const nlohmann::json j = {{"model", {{"preset", "llama2-7b"}, {"num_layers", 2 * p}}},
                                {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", p}}},
                                {"training",
                                 {{"seq_length", 256},
                                  {"global_batch_size", m},
                                  {"micro_batch_size", 1},
                                  {"dropout", 0.1}}},
                                {"parallel", {{"pp", p}, {"schedule", "dualpipe"}}}};
      const Scenario s = scenario_from_json(j);
      const Estimate e = estimate(s);
      const SimResult r = simulate(s, e);
      for (std::size_t end : {std::size_t{0}, static_cast<std::size_t>(p - 1)}) {
        ASSERT_GT(e.memory.stages[end].embedding_activation_bytes, 0);
        ASSERT_GT(e.memory.stages[end].head_activation_bytes, 0);
      }
      for (std::size_t k = 0; k < r.stages.size(); ++k) {
        EXPECT_EQ(e.memory.stages[k].inflight_chunks, r.stages[k].peak_inflight_chunks)
            << "p " << p << " m " << m << " stage " << k;
        EXPECT_EQ(e.memory.stages[k].activations_bytes, r.stages[k].peak_activation_bytes)
            << "p " << p << " m " << m << " stage " << k;
      }
    }
  }
}

}  // namespace
}  // namespace distplan::sim
