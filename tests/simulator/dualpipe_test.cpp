// DualPipeV (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipev.py, commit 3da1bbe): the
// generator against the checker and against hand counts of the source's eight steps, and the
// README's table ("Pipeline Bubbles and Memory Usage Comparison", same number of PP stages): with
// PP stages of one chunk each on PP/2 devices, bubble (PP/2 - 1)(F&B + B - 3W), parameters 2x,
// activations PP + 1 per device. distplan's pp counts devices: PP = 2 pp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/overlap.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "distplan/simulator/schedule.h"
#include "distplan/simulator/schedule_io.h"
#include "distplan/simulator/simulate.h"
#include "sim_fixtures.h"

namespace distplan::sim {
namespace {

using testing::chunk_costs;
using testing::pipeline;
using testing::uniform_estimate;

TEST(DualPipeV, ProgramsPassTheCheckerAndCountAsTheSource) {
  for (Count p = 1; p <= 8; ++p) {
    for (Count m = 2 * p; m <= 3 * p + 3; ++m) {
      const SchedulePrograms prog = make_dualpipe_v(p, m);
      EXPECT_TRUE(prog.v_shape);
      EXPECT_NO_THROW(check_program(prog)) << "p " << p << " m " << m;
      for (Count r = 0; r < p; ++r) {
        const auto& a = prog.programs[static_cast<std::size_t>(r)];
        // Split backwards (a W of their own): step 3 (p - r - 1), step 6 (r + 1 of its 2(r + 1)
        // backwards), step 7 (p - r - 1). Pairs: step 4 two per iteration (m - 2p + r + 1 of
        // them, the last rank's first not overlapped), step 5 one each (p - r - 1).
        const Count split = 2 * p - r - 1;
        const Count pairs = 2 * (m - 2 * p + r + 1) - (r == p - 1 ? 1 : 0) + (p - r - 1);
        Count w = 0, overlapped = 0;
        for (const Action& x : a) {
          w += x.op == Op::backward_weight;
          overlapped += x.overlap_next;
        }
        EXPECT_EQ(static_cast<Count>(a.size()), 4 * m + split) << "p " << p << " r " << r;
        EXPECT_EQ(w, split) << "p " << p << " r " << r;
        EXPECT_EQ(overlapped, pairs) << "p " << p << " m " << m << " r " << r;
        // Warm-up: 2(p - r - 1) chunk-0 forwards, then alternating chunk 0 and chunk 1.
        for (Count i = 0; i < 2 * (p - r - 1); ++i)
          EXPECT_EQ(a[static_cast<std::size_t>(i)],
                    (Action{Op::forward, static_cast<int>(i), 0, false}));
        EXPECT_EQ(a[static_cast<std::size_t>(2 * (p - r - 1) + 1)],
                  (Action{Op::forward, 0, 1, false}));
      }
    }
  }
}

TEST(DualPipeV, RefusesFewerThanTwiceAsManyMicrobatchesAsDevices) {
  // dualpipev.py asserts num_chunks >= num_ranks * 2.
  try {
    (void)make_dualpipe_v(4, 7);
    FAIL() << "m = 7 < 2 pp = 8 was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/schedule");
  }
  EXPECT_NO_THROW((void)make_dualpipe_v(4, 8));
  // Through the scenario: the same path, before any estimate.
  const nlohmann::json j = {
      {"model", {{"preset", "llama2-7b"}, {"num_layers", 8}}},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 4}}},
      {"training", {{"seq_length", 256}, {"global_batch_size", 7}, {"micro_batch_size", 1}}},
      {"parallel", {{"pp", 4}, {"schedule", "dualpipe_v"}}}};
  try {
    (void)estimate(scenario_from_json(j));
    FAIL() << "dualpipe_v with m = 7, pp = 4 was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/schedule");
  }
}

TEST(DualPipeV, OverlappedPairsRoundTripThroughScheduleFiles) {
  const SchedulePrograms prog = make_dualpipe_v(3, 7);
  EXPECT_EQ(schedule_from_json(schedule_to_json(prog)), prog);
  // A pair must be a forward followed by a backward of another micro-batch or chunk.
  SchedulePrograms bad = make_dualpipe_v(2, 4);
  auto& s0 = bad.programs[0];
  const auto it =
      std::find_if(s0.begin(), s0.end(), [](const Action& a) { return a.overlap_next; });
  ASSERT_NE(it, s0.end());
  std::iter_swap(it, it + 1);  // now the backward carries the flag
  it->overlap_next = true;
  (it + 1)->overlap_next = false;
  EXPECT_THROW(check_program(bad), InputError);
}

TEST(DualPipeV, BubbleIsTheReadmes) {
  // README: bubble (PP/2 - 1)(F&B + B - 3W), B the whole backward of a chunk, F&B the
  // overlapped pair, PP/2 = p devices. It holds exactly when the forward and the input-gradient
  // pass take the same time (the README's drawing), for any W <= F and any F&B from a whole
  // backward B = B_in + W (swept down to it; a shorter pair, F&B = 1.8 F with W = F, idles more)
  // up to F + B (nothing hidden); with F > B_in it becomes (p - 1)(F&B + F - 2W).
  // The bubble is the idle time of the device that runs the most F&B pairs (the last).
  for (Count p = 1; p <= 8; ++p) {
    for (Count m : {2 * p, 2 * p + 3, 4 * p}) {
      for (double f : {1.0, 2.0}) {
        for (double w : {0.0, 0.5 * f, f}) {
          const double whole = f + f + w;  // F + B_in + W of a chunk
          for (double hide : {1.0, 0.85, 0.7, 0.6}) {
            const double fb = hide * whole;
            if (fb < f + w) continue;  // shorter than a whole backward: outside the form
            const SimResult r = simulate(pipeline(p, m, Schedule::dualpipe_v, 2),
                                         uniform_estimate(p), chunk_costs(f, f, w, fb));
            double idle = 0;
            for (const StageResult& st : r.stages)
              idle = std::max(idle, r.step_seconds - st.busy_seconds);
            const double readme = static_cast<double>(p - 1) * (fb + (f + w) - 3 * w);
            EXPECT_NEAR(idle, readme, 1e-9)
                << "p " << p << " m " << m << " F " << f << " W " << w << " F&B " << fb;
          }
        }
      }
    }
  }
  for (Count p : {2, 4, 8}) {
    const double f = 2, b = 1, w = 0.5, fb = 0.8 * (f + b + w);
    const SimResult r = simulate(pipeline(p, 3 * p, Schedule::dualpipe_v, 2), uniform_estimate(p),
                                 chunk_costs(f, b, w, fb));
    double idle = 0;
    for (const StageResult& st : r.stages) idle = std::max(idle, r.step_seconds - st.busy_seconds);
    EXPECT_NEAR(idle, static_cast<double>(p - 1) * (fb + f - 2 * w), 1e-9) << "p " << p;
  }
}

TEST(DualPipeV, ActivationsArePpPlusOneChunksOnEveryDevice) {
  // README: activations PP + 1 per device, PP = 2p chunks of one stage; the planner's count.
  for (Count p = 1; p <= 8; ++p) {
    for (Count m : {2 * p, 3 * p + 1}) {
      const SimResult r = simulate(pipeline(p, m, Schedule::dualpipe_v, 2),
                                   uniform_estimate(p, 1 << 20), chunk_costs(1, 1, 1, 2.5));
      for (const StageResult& st : r.stages) {
        EXPECT_EQ(st.peak_inflight_chunks, 2 * p + 1) << "p " << p << " m " << m;
        EXPECT_EQ(st.peak_activation_bytes, (2 * p + 1) * (1 << 19)) << "p " << p << " m " << m;
        EXPECT_EQ(inflight_chunks(Schedule::dualpipe_v, p, 2, st.stage, m), 2 * p + 1);
      }
    }
  }
}

TEST(DualPipeV, ParametersAreTwiceOneFOneBsWithTheSameStages) {
  // README: 2x parameters per device against 1F1B over the same PP stages (here 1F1B with
  // 2p stages against DualPipeV on p devices): a device holds two stages. Compared on a device
  // with neither embedding nor LM head (stage 1).
  auto doc = [](const char* sched, int pp) {
    return nlohmann::json{
        {"model", {{"preset", "llama2-7b"}, {"num_layers", 16}}},
        {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", pp}}},
        {"training", {{"seq_length", 256}, {"global_batch_size", 32}, {"micro_batch_size", 1}}},
        {"parallel", {{"pp", pp}, {"schedule", sched}}}};
  };
  for (int p : {2, 4}) {
    const Estimate dual = estimate(scenario_from_json(doc("dualpipe_v", p)));
    const Estimate one = estimate(scenario_from_json(doc("1f1b", 2 * p)));
    EXPECT_EQ(dual.memory.stages[1].parameters, 2 * one.memory.stages[1].parameters) << p;
  }
}

TEST(DualPipeV, PairHidesInPassCommunicationBehindTheOtherPass) {
  // overlap.h: a pair of 3 s with 1 s of in-pass communication computes 2 s and hides the
  // communication behind it, paying the SM-sharing slowdown on what it hides.
  EXPECT_DOUBLE_EQ(overlapped_pair_seconds(3.0, 1.0, 0.0), 2.0);
  EXPECT_DOUBLE_EQ(overlapped_pair_seconds(3.0, 1.0, 0.1), 2.1);
  EXPECT_DOUBLE_EQ(overlapped_pair_seconds(3.0, 2.0, 0.0), 2.0);  // only 1 s to hide behind
  EXPECT_DOUBLE_EQ(overlapped_pair_seconds(3.0, 0.0, 0.1), 3.0);
  // From the planner's costs: TP communication 1 s per micro-batch and stage (0.5 s a chunk).
  StageCosts c;
  c.forward = 2, c.backward_input = 3, c.backward_weight = 1, c.tp_communication = 1;
  Scenario s = pipeline(2, 4, Schedule::dualpipe_v, 2);
  s.assumptions.overlap_compute_slowdown = 0;
  SimOptions o;
  o.record_trace = true;
  o.exposed_communication = false;
  const SimResult r = simulate(s, uniform_estimate(2, 0, c), o);
  // Every stage's busy time: 4m chunk passes of (F + B + W)/2 = 3 s, less 0.5 s per pair.
  const SchedulePrograms prog = make_dualpipe_v(2, 4);
  for (Count k = 0; k < 2; ++k) {
    Count pairs = 0;
    for (const Action& a : prog.programs[static_cast<std::size_t>(k)]) pairs += a.overlap_next;
    EXPECT_NEAR(r.stages[static_cast<std::size_t>(k)].busy_seconds, 2 * 4 * 3.0 - 0.5 * pairs,
                1e-12);
  }
}

TEST(DualPipeV, PlanIsTheWalkAndTheClosedFormBoundsIt) {
  // Llama-2-7B, tp 2, pp 4, dp 2, ZeRO-1, sequence parallel: the plan's step is the walk's, the
  // planner's closed form a lower bound of it, and the planner's in-flight sets and bytes the
  // order's peak.
  nlohmann::json j = nlohmann::json::parse(R"({
      "model": "llama2-7b",
      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
      "training": {"seq_length": 4096, "global_batch_size": 64, "framework": "generic"},
      "parallel": {"tp": 2, "pp": 4, "zero_stage": 1, "sequence_parallel": true,
                   "schedule": "dualpipe_v"}})");
  const Scenario s = scenario_from_json(j);
  const Estimate e = estimate(s);
  const SimResult r = simulate(s, e);
  EXPECT_EQ(plan(s).time.step_seconds, r.step_seconds);
  EXPECT_LE(e.time.step_seconds, r.step_seconds);
  for (std::size_t k = 0; k < r.stages.size(); ++k) {
    EXPECT_EQ(e.memory.stages[k].inflight_chunks, r.stages[k].peak_inflight_chunks) << k;
    EXPECT_EQ(e.memory.stages[k].activations_bytes, r.stages[k].peak_activation_bytes) << k;
  }
}

TEST(VScheduleTime, ClosedFormBoundsTheWalkForZbVVHalfAndVMin) {
  for (const char* sched : {"zb_v", "v_half", "v_min"}) {
    nlohmann::json j = nlohmann::json::parse(R"({
        "model": "llama2-7b",
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"seq_length": 4096, "global_batch_size": 64, "framework": "generic"},
        "parallel": {"tp": 2, "pp": 4, "zero_stage": 1, "sequence_parallel": true}})");
    j["parallel"]["schedule"] = sched;
    const Scenario s = scenario_from_json(j);
    EXPECT_LE(estimate(s).time.step_seconds, plan(s).time.step_seconds) << sched;
  }
}

}  // namespace
}  // namespace distplan::sim
