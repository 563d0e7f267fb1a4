// The simulator against closed forms. F, B, W: one micro-batch's forward, backward (input part
// when W is split off) and weight-gradient time through a whole stage; p stages, m micro-batches,
// v chunks per GPU. Derivations: docs/simulator.md, "Closed forms".
#include "distplan/simulator/simulate.h"

#include <cmath>

#include <gtest/gtest.h>

#include "distplan/planner/error.h"
#include "sim_fixtures.h"

namespace distplan::sim {
namespace {

using testing::pipeline;
using testing::uniform_estimate;
using testing::with_costs;

constexpr double kRel = 1e-12;

void expect_close(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, kRel * std::max(1.0, std::abs(expected))) << what;
}

std::string label(Count p, Count m, double f, double b) {
  return "p=" + std::to_string(p) + " m=" + std::to_string(m) + " F=" + std::to_string(f) +
         " B=" + std::to_string(b);
}

TEST(SimulateClosedForm, GpipeAndOneFOneBTakeMPlusPMinusOneTimesFPlusB) {
  for (Schedule kind : {Schedule::gpipe, Schedule::one_f_one_b}) {
    for (Count p : {1, 2, 4, 7}) {
      for (Count m : {1, 3, 4, 8, 13}) {
        for (auto [f, b] : {std::pair{1.0, 2.0}, {0.3, 0.7}, {2.0, 1.0}}) {
          const Scenario s = pipeline(p, m, kind);
          const SimResult r = simulate(s, uniform_estimate(p), with_costs(f, b));
          expect_close(
              r.step_seconds, static_cast<double>(m + p - 1) * (f + b),
              std::string(to_string(kind) == "gpipe" ? "gpipe " : "1f1b ") + label(p, m, f, b));
          // Idle share: (p - 1) / (m + p - 1) of every stage.
          expect_close(r.bubble_fraction,
                       static_cast<double>(p - 1) / static_cast<double>(m + p - 1),
                       "bubble " + label(p, m, f, b));
          EXPECT_EQ(r.exposed_communication_seconds, 0.0);
        }
      }
    }
  }
}

TEST(SimulateClosedForm, InterleavedTakesMTimesFPlusBPlusShrunkenBubble) {
  // Narayanan et al. 2021, Sec. 2.2: the bubble shrinks to (p - 1)(F + B) / v.
  for (Count p : {2, 4}) {
    for (Count v : {2, 3, 4}) {
      for (Count mult : {1, 2, 3}) {
        const Count m = mult * p;
        const double f = 1.0, b = 2.0;
        const SimResult r = simulate(pipeline(p, m, Schedule::interleaved_1f1b, v),
                                     uniform_estimate(p), with_costs(f, b));
        expect_close(r.step_seconds,
                     static_cast<double>(m) * (f + b) +
                         static_cast<double>(p - 1) * (f + b) / static_cast<double>(v),
                     label(p, m, f, b) + " v=" + std::to_string(v));
      }
    }
  }
}

TEST(SimulateClosedForm, OneFOneBHoldsPMinusStageMicrobatches) {
  const Count p = 6, m = 10;
  const Bytes act = 3'000'000;
  const SimResult r =
      simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p, act), with_costs(1, 2));
  ASSERT_EQ(r.stages.size(), static_cast<std::size_t>(p));
  for (Count s = 0; s < p; ++s) {
    const auto& st = r.stages[static_cast<std::size_t>(s)];
    EXPECT_EQ(st.peak_inflight_microbatches, p - s) << "stage " << s;
    EXPECT_EQ(st.peak_activation_bytes, (p - s) * act) << "stage " << s;
  }
}

TEST(SimulateClosedForm, OneFOneBInflightIsCappedByMicrobatches) {
  const Count p = 6, m = 3;
  const SimResult r =
      simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p), with_costs(1, 2));
  for (Count s = 0; s < p; ++s)
    EXPECT_EQ(r.stages[static_cast<std::size_t>(s)].peak_inflight_microbatches, std::min(p - s, m));
}

TEST(SimulateClosedForm, GpipeHoldsAllMicrobatches) {
  const Count p = 4, m = 9;
  const SimResult r =
      simulate(pipeline(p, m, Schedule::gpipe), uniform_estimate(p, 1000), with_costs(1, 2));
  for (const auto& st : r.stages) {
    EXPECT_EQ(st.peak_inflight_microbatches, m);
    EXPECT_EQ(st.peak_activation_bytes, m * 1000);
  }
}

TEST(SimulateClosedForm, InterleavedHoldsMegatronWarmupPlusOneChunks) {
  // Peak (micro-batch, chunk) sets = warm-up + 1, capped at m v; a chunk holds 1/v of the bytes.
  const Count p = 4, m = 8, v = 2;
  const Bytes act = 1'000'000;
  const SimResult r = simulate(pipeline(p, m, Schedule::interleaved_1f1b, v),
                               uniform_estimate(p, act), with_costs(1, 2));
  for (Count s = 0; s < p; ++s) {
    const auto& st = r.stages[static_cast<std::size_t>(s)];
    const Count chunks = std::min((p - s - 1) * 2 + (v - 1) * p + 1, m * v);
    EXPECT_EQ(st.peak_inflight_chunks, chunks) << "stage " << s;
    EXPECT_EQ(st.peak_activation_bytes, chunks * (act / v)) << "stage " << s;
  }
}

// Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", ICLR 2024), Table 2: the bubble of a stage
// (idle time between its first and last pass) is (p-1)(F+B+W) for 1F1B, (p-1)(F+B-W) for ZB-H1
// and (p-1)(F+B-2W) for ZB-H2. The handcrafted schedules assume T_F = T_B = T_W; the order our
// generators use keeps the formulas whenever W <= F (ZB-H2 also needs 2W <= F + B and m >= 2p - 1),
// which the sweep below covers (docs/simulator.md).
struct Fbw {
  double f, b, w;
};
const Fbw kFbw[] = {{1, 1, 1}, {1, 1.5, 0.7}, {2, 1, 0.5}, {1.5, 1.5, 1}, {3, 2, 1}, {1, 2, 0.5}};

double max_span_idle(const SimResult& r) {
  double x = 0;
  for (const auto& st : r.stages) x = std::max(x, st.span_idle_seconds);
  return x;
}

TEST(SimulateZeroBubble, OneFOneBBubbleIsPMinusOneTimesFPlusBPlusW) {
  for (Count p : {2, 4, 6}) {
    for (Count m : {p, 2 * p + 1, 3 * p}) {
      for (const Fbw& c : kFbw) {
        // 1F1B runs B and W as one backward pass.
        const SimResult r = simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p),
                                     with_costs(c.f, c.b, c.w));
        expect_close(max_span_idle(r), static_cast<double>(p - 1) * (c.f + c.b + c.w),
                     "1f1b " + label(p, m, c.f, c.b));
      }
    }
  }
}

TEST(SimulateZeroBubble, ZbH1BubbleIsPMinusOneTimesFPlusBMinusW) {
  for (Count p : {2, 4, 6}) {
    for (Count m : {p, 2 * p + 1, 3 * p}) {
      for (const Fbw& c : kFbw) {
        const SimResult r = simulate(pipeline(p, m, Schedule::zb_h1), uniform_estimate(p),
                                     with_costs(c.f, c.b, c.w));
        const double bubble = static_cast<double>(p - 1) * (c.f + c.b - c.w);
        expect_close(max_span_idle(r), bubble, "zb_h1 " + label(p, m, c.f, c.b));
        // With W <= B as well, stage 0 spans the step: step = m(F+B+W) + bubble.
        if (c.w <= c.b)
          expect_close(r.step_seconds, static_cast<double>(m) * (c.f + c.b + c.w) + bubble,
                       "zb_h1 step " + label(p, m, c.f, c.b));
      }
    }
  }
}

TEST(SimulateZeroBubble, ZbH2BubbleIsPMinusOneTimesFPlusBMinusTwoW) {
  for (Count p : {2, 4, 6}) {
    for (Count m : {2 * p - 1, 2 * p + 3, 4 * p}) {
      for (const Fbw& c : kFbw) {
        if (2 * c.w > c.f + c.b) continue;
        const SimResult r = simulate(pipeline(p, m, Schedule::zb_h2), uniform_estimate(p),
                                     with_costs(c.f, c.b, c.w));
        expect_close(max_span_idle(r), static_cast<double>(p - 1) * (c.f + c.b - 2 * c.w),
                     "zb_h2 " + label(p, m, c.f, c.b));
      }
    }
  }
}

TEST(SimulateZeroBubble, ZbH2IsAParallelogramWhenPassesAreEqual) {
  // T_F = T_B = T_W = 1: stage s runs without a gap from s to s + 3m (Qi et al. 2023, Fig. 3).
  const Count p = 4, m = 12;
  const SimResult r =
      simulate(pipeline(p, m, Schedule::zb_h2), uniform_estimate(p), with_costs(1, 1, 1));
  for (Count s = 0; s < p; ++s) {
    const auto& st = r.stages[static_cast<std::size_t>(s)];
    expect_close(st.first_start_seconds, static_cast<double>(s), "start");
    expect_close(st.compute_end_seconds, static_cast<double>(s + 3 * m), "end");
  }
}

TEST(SimulateZeroBubble, PeakMemoryMatchesTableTwo) {
  // Table 2: ZB-H1 peak pM_B (as 1F1B), ZB-H2 (2p - 1)M_B; activations count until W ends.
  const Count p = 5, m = 20;
  const SimResult h1 =
      simulate(pipeline(p, m, Schedule::zb_h1), uniform_estimate(p), with_costs(1, 1, 1));
  const SimResult h2 =
      simulate(pipeline(p, m, Schedule::zb_h2), uniform_estimate(p), with_costs(1, 1, 1));
  for (Count s = 0; s < p; ++s) {
    EXPECT_EQ(h1.stages[static_cast<std::size_t>(s)].peak_inflight_microbatches, p);
    EXPECT_EQ(h2.stages[static_cast<std::size_t>(s)].peak_inflight_microbatches, 2 * p - 1);
  }
}

TEST(SimulateCommunication, GpipeAddsTwoPMinusOneSendsWhenSendsAreShort) {
  // With a send time c <= min(F, B), the first micro-batch reaches the last stage after
  // (p-1)(F+c) and the last gradient reaches stage 0 (p-1)(B+c) after the last stage's
  // backwards: step = (m+p-1)(F+B) + 2(p-1)c, and all 2(p-1)c of it is exposed.
  const Count p = 4, m = 6;
  const double f = 1, b = 2, c = 0.25;
  const SimResult r = simulate(pipeline(p, m, Schedule::gpipe), uniform_estimate(p),
                               with_costs(f, b, std::nullopt, c));
  expect_close(r.step_seconds, (m + p - 1) * (f + b) + 2 * (p - 1) * c, "step");
  expect_close(r.exposed_communication_seconds, 2 * (p - 1) * c, "exposed");
  for (Count s = 0; s + 1 < p; ++s)
    expect_close(r.stages[static_cast<std::size_t>(s)].send_seconds,
                 2.0 * m * c - (s == 0 ? m * c : 0), "sends of stage " + std::to_string(s));
}

StageCosts plain_costs(double f, double bi, double bw) {
  StageCosts c;
  c.forward = f;
  c.backward_input = bi;
  c.backward_weight = bw;
  return c;
}

TEST(SimulateCommunication, OverlappedGradientReductionLeavesOnlyTheLastBucket) {
  // One stage, one micro-batch: F = 1, B = 2 (1.5 + 0.5), reduction R = 1 over 4 buckets of
  // 25 MiB: bucket i is ready at F + (i+1)/4 B and takes R/4 <= B/4, so only the last bucket's
  // R/4 runs after the backward; the optimizer (0.5) follows it. Without overlap all of R does.
  Scenario s = pipeline(1, 1, Schedule::one_f_one_b);
  StageCosts c = plain_costs(1, 1.5, 0.5);
  c.grad_reduce = 1;
  c.optimizer = 0.5;
  Estimate e = uniform_estimate(1, 0, c);
  s.training.grad_accumulation_dtype = DType::fp32;
  e.memory.stages[0].parameters = 25 * 1024 * 1024;  // 100 MiB of fp32 gradients: 4 buckets
  s.assumptions.overlap_compute_slowdown = 0;
  const SimResult overlapped = simulate(s, e);
  expect_close(overlapped.step_seconds, 1 + 2 + 0.25 + 0.5, "overlapped");
  expect_close(overlapped.exposed_communication_seconds, 0.25, "exposed");
  // The backward that hides the reduction runs overlap_compute_slowdown slower for what it hides:
  // 0.1 x min(R, B) = 0.1 more (its last bucket then starts at 3.1).
  s.assumptions.overlap_compute_slowdown = 0.1;
  const SimResult slowed = simulate(s, e);
  expect_close(slowed.step_seconds, 1 + 2.1 + 0.25 + 0.5, "slowed");
  expect_close(slowed.exposed_communication_seconds, 0.35, "exposed with the slowdown");
  s.assumptions.overlap_grad_reduce = false;
  const SimResult serial = simulate(s, e);
  expect_close(serial.step_seconds, 1 + 2 + 1 + 0.5, "not overlapped");
  expect_close(serial.exposed_communication_seconds, 1, "exposed");
}

TEST(SimulateCommunication, ZeroThreeGathersArePrefetched) {
  // One stage, 1F1B with m = 2: F0 B0 F1 B1, each needing a gather g = 0.25 (zero3_gather covers
  // forward and backward: 2g). Prefetched, only the first gather is exposed; otherwise all four.
  Scenario s = pipeline(1, 2, Schedule::one_f_one_b);
  s.parallel.zero_stage = 3;
  StageCosts c = plain_costs(1, 2, 0);
  c.zero3_gather = 0.5;
  const Estimate e = uniform_estimate(1, 0, c);
  s.assumptions.overlap_compute_slowdown = 0;
  const SimResult pre = simulate(s, e);
  expect_close(pre.step_seconds, 0.25 + 2 * 3, "prefetched");
  // Each of the first three passes hides the next one's gather and runs 0.1 x 0.25 slower.
  s.assumptions.overlap_compute_slowdown = 0.1;
  expect_close(simulate(s, e).step_seconds, 0.25 + 2 * 3 + 3 * 0.025, "prefetched, slowed");
  s.assumptions.overlap_param_gather = false;
  const SimResult serial = simulate(s, e);
  expect_close(serial.step_seconds, 4 * 0.25 + 2 * 3, "serial");
  expect_close(serial.exposed_communication_seconds, 1.0, "exposed");
}

TEST(SimulateCommunication, ParamGatherFollowsTheOptimizer) {
  Scenario s = pipeline(2, 2, Schedule::one_f_one_b);
  StageCosts c = plain_costs(1, 2, 0);
  c.optimizer = 0.5;
  c.param_gather = 0.25;
  const SimResult r = simulate(s, uniform_estimate(2, 0, c));
  // 1F1B core (m + p - 1)(F + B) = 9, then optimizer, then the all-gather.
  expect_close(r.step_seconds, 9 + 0.5 + 0.25, "step");
  expect_close(r.exposed_communication_seconds, 0.25, "exposed");
}

TEST(SimulateCosts, UnevenStagesCostWhatTheyCost) {
  // GPipe, p = 2, m = 1: stage 0 costs (1, 3), stage 1 costs (2, 4): step = 1 + 2 + 4 + 3.
  const Scenario s = pipeline(2, 1, Schedule::gpipe);
  Estimate e = uniform_estimate(2);
  e.stage_costs[0] = plain_costs(1, 2, 1);
  e.stage_costs[1] = plain_costs(2, 3, 1);
  const SimResult r = simulate(s, e);
  expect_close(r.step_seconds, 10, "step");
  expect_close(r.stages[0].busy_seconds, 4, "busy 0");
  expect_close(r.stages[1].busy_seconds, 6, "busy 1");
  expect_close(r.bubble_fraction, 1 - 10.0 / 20.0, "bubble");
}

TEST(SimulateCosts, BackwardWithoutWeightSplitCarriesTheWholeBackward) {
  // costs without backward_weight_seconds: a split schedule's W takes no time, B all of it.
  const Count p = 3, m = 6;
  const SimResult split =
      simulate(pipeline(p, m, Schedule::zb_h1), uniform_estimate(p), with_costs(1, 2));
  const SimResult full =
      simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p), with_costs(1, 2));
  expect_close(split.step_seconds, full.step_seconds, "W = 0");
}

TEST(SimulateCosts, RejectsNegativeOrNanCosts) {
  const Scenario s = pipeline(2, 2, Schedule::one_f_one_b);
  EXPECT_THROW((void)simulate(s, uniform_estimate(2), with_costs(-1, 2)), InputError);
  EXPECT_THROW((void)simulate(s, uniform_estimate(2), with_costs(1, std::nan(""))), InputError);
}

TEST(SimulateProgram, CustomProgramMustFitTheScenario) {
  const auto prog = make_1f1b(3, 4);
  SimOptions o = with_costs(1, 2);
  o.program = &prog;
  try {
    (void)simulate(pipeline(2, 4, Schedule::one_f_one_b), uniform_estimate(2), o);
    FAIL() << "a 3-stage program on a 2-stage pipeline must be rejected";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/stages");
  }
}

TEST(SimulateProgram, CustomProgramRunsLikeTheGenerated) {
  const auto prog = make_zb_h1(4, 8);
  SimOptions o = with_costs(1, 1, 1);
  o.program = &prog;
  const SimResult custom = simulate(pipeline(4, 8, Schedule::gpipe), uniform_estimate(4), o);
  const SimResult gen =
      simulate(pipeline(4, 8, Schedule::zb_h1), uniform_estimate(4), with_costs(1, 1, 1));
  EXPECT_EQ(custom, gen);
}

TEST(SimulateDeterminism, TwoRunsAreIdentical) {
  const Scenario s = pipeline(4, 8, Schedule::interleaved_1f1b, 2);
  SimOptions o = with_costs(0.1, 0.2, 0.05, 0.01);
  o.record_trace = true;
  const SimResult a = simulate(s, uniform_estimate(4, 12345), o);
  const SimResult b = simulate(s, uniform_estimate(4, 12345), o);
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a.trace.empty());
  EXPECT_FALSE(a.memory.empty());
}

TEST(SimulateTrace, SlicesCoverEveryPassOnce) {
  const Count p = 3, m = 4;
  SimOptions o = with_costs(1, 2, std::nullopt, 0.5);
  o.record_trace = true;
  const SimResult r = simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p), o);
  std::size_t compute = 0, sends = 0;
  for (const auto& e : r.trace) {
    if (e.track == Track::compute) ++compute;
    if (e.track == Track::send_next || e.track == Track::send_prev) ++sends;
  }
  EXPECT_EQ(compute, static_cast<std::size_t>(2 * p * m));
  EXPECT_EQ(sends, static_cast<std::size_t>(2 * (p - 1) * m));
  // Compute slices of one stage never overlap.
  for (Count s = 0; s < p; ++s) {
    double end = 0;
    for (const auto& e : r.trace) {
      if (e.stage != s || e.track != Track::compute) continue;
      EXPECT_GE(e.start, end - 1e-12);
      end = e.start + e.duration;
    }
  }
}

TEST(StageLinks, FollowMegatronRankOrder) {
  Scenario s = pipeline(4, 8, Schedule::one_f_one_b);
  s.parallel.tp = 4;
  s.parallel.dp = 1;
  s.cluster.gpus_per_node = 8;  // two stages per node
  EXPECT_FALSE(stages_cross_nodes(s, 0, 1));
  EXPECT_TRUE(stages_cross_nodes(s, 1, 2));
  EXPECT_TRUE(stages_cross_nodes(s, 3, 0));
}

}  // namespace
}  // namespace distplan::sim

namespace distplan::sim {
namespace {

// The pass bounds hold before any work: zb_auto one micro-batch over kMaxPasses / 4 is refused at
// global_batch_size naming its own bound (its program would take about 9 s and 0.8 GB to build),
// and any schedule one micro-batch over kMaxPasses names the general one.
TEST(SimulateBounds, ZbAutoAcceptsAQuarterOfThePasses) {
  const Count p = 64, m = static_cast<Count>(kMaxPasses / kZbAutoPassCost) / p + 1;
  const Scenario zb = pipeline(p, m, Schedule::zb_auto);
  try {
    (void)simulate(zb, uniform_estimate(p), with_costs(1, 2));
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/training/global_batch_size");
    EXPECT_NE(std::string(e.what()).find("4194304 passes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zb_auto"), std::string::npos) << e.what();
  }
  // Over kMaxPasses every schedule is refused, naming the general bound.
  const Count big = static_cast<Count>(kMaxPasses) / p + 1;
  try {
    (void)simulate(pipeline(p, big, Schedule::one_f_one_b), uniform_estimate(p), with_costs(1, 2));
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("16777216 passes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distplan::sim
