// V-shape schedules (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"; ZB-V in Qi
// et al. 2023, Sec. 6): the chunk map, the generator against the checker, and the published
// figures of the authors' README table (sail-sg/zero-bubble-pipeline-parallelism README.md, commit
// 47d9a8ed3afdfcd90e6ba4af017c2c87473ae253): with T_F = T_B = T_W, ZB-V's bubble rate is 0, its
// activation memory 1x 1F1B's and its pipeline communication volume 2x 1F1B's.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/simulator/schedule.h"
#include "distplan/simulator/schedule_io.h"
#include "distplan/simulator/simulate.h"
#include "sim_fixtures.h"

namespace distplan::sim {
namespace {

using testing::pipeline;
using testing::uniform_estimate;
using testing::with_costs;

TEST(VShape, ChunkMapIsTheVAndRoundTrips) {
  for (Count p = 1; p <= 9; ++p) {
    EXPECT_EQ(virtual_stage_of(true, p, 0, 0), 0);
    EXPECT_EQ(virtual_stage_of(true, p, 0, 1), 2 * p - 1);  // embedding and head on stage 0
    EXPECT_EQ(virtual_stage_of(true, p, p - 1, 0), p - 1);
    EXPECT_EQ(virtual_stage_of(true, p, p - 1, 1), p);  // the turn stays on stage p - 1
    for (Count vs = 0; vs < 2 * p; ++vs) {
      const StageChunk sc = locate_virtual_stage(true, p, vs);
      EXPECT_EQ(virtual_stage_of(true, p, sc.stage, sc.chunk), vs) << p << " " << vs;
      const StageChunk il = locate_virtual_stage(false, p, vs);
      EXPECT_EQ(virtual_stage_of(false, p, il.stage, il.chunk), vs) << p << " " << vs;
    }
    EXPECT_EQ(head_stage(Schedule::zb_v, p), 0);
    EXPECT_EQ(head_stage(Schedule::interleaved_1f1b, p), p - 1);
  }
}

TEST(VShape, ZbVProgramsPassTheChecker) {
  for (Count p = 1; p <= 8; ++p) {
    for (Count m = 2 * p; m <= 3 * p + 4; ++m) {
      const SchedulePrograms prog = make_zb_v(p, m);
      EXPECT_TRUE(prog.v_shape);
      EXPECT_EQ(prog.virtual_stages, 2);
      EXPECT_NO_THROW(check_program(prog)) << "p " << p << " m " << m;
      EXPECT_EQ(prog.num_actions(), static_cast<std::size_t>(6 * p * m));  // F, B, W x 2 chunks
    }
  }
}

TEST(VShape, TheSameProgramInterleavedDeadlocks) {
  // The map is what makes ZB-V's order feasible: read with Megatron-LM's placement, stage 0's
  // chunk 1 would wait for stage p - 1's chunk 0 while that stage waits for it.
  SchedulePrograms prog = make_zb_v(4, 8);
  prog.v_shape = false;
  EXPECT_THROW(check_program(prog), InputError);
}

TEST(VShape, ZbVHasNoBubbleWhenPassesAreEqual) {
  // README table, ZBV column: bubble rate 0 assuming T_F = T_B = T_W (p2p 0). A stage's chunk
  // runs half its layers, so each chunk pass takes 1 unit when the whole stage's take 2.
  for (Count p = 1; p <= 8; ++p) {
    for (Count m : {2 * p, 2 * p + 1, 3 * p, 4 * p + 3}) {
      const SimResult r = simulate(pipeline(p, m, Schedule::zb_v, 2), uniform_estimate(p),
                                   with_costs(2.0, 2.0, 2.0, 0.0));
      EXPECT_NEAR(r.bubble_fraction, 0.0, 1e-12) << "p " << p << " m " << m;
      EXPECT_NEAR(r.step_seconds, 6.0 * static_cast<double>(m), 1e-9) << "p " << p << " m " << m;
    }
  }
}

TEST(VShape, ZbVActivationPeakIsOneFOneBs) {
  // README table: activation memory 1x 1F1B's, i.e. p micro-batches of a whole stage (2p chunks
  // of half a stage) on stage 0, where 1F1B peaks.
  const Bytes act = 1 << 20;  // one micro-batch through one whole stage
  for (Count p = 1; p <= 8; ++p) {
    for (Count m : {2 * p, 3 * p + 1}) {
      const SimResult v = simulate(pipeline(p, m, Schedule::zb_v, 2), uniform_estimate(p, act),
                                   with_costs(2.0, 2.0, 2.0));
      const SimResult one = simulate(pipeline(p, m, Schedule::one_f_one_b),
                                     uniform_estimate(p, act), with_costs(1.0, 2.0));
      EXPECT_EQ(one.stages[0].peak_activation_bytes, p * act);
      Bytes peak = 0;
      for (const StageResult& st : v.stages) {
        EXPECT_EQ(st.peak_inflight_chunks, 2 * p) << "p " << p << " m " << m;
        peak = std::max(peak, st.peak_activation_bytes);
      }
      EXPECT_EQ(v.stages[0].peak_activation_bytes, one.stages[0].peak_activation_bytes)
          << "p " << p << " m " << m;
      EXPECT_EQ(peak, one.stages[0].peak_activation_bytes) << "p " << p << " m " << m;
    }
  }
}

TEST(VShape, ZbVSendsTwiceOneFOneBsVolume) {
  // README table: pipeline communication volume 2x 1F1B's. Each micro-batch crosses 2p - 2 GPU
  // boundaries each way (the turn at stage p - 1 stays on the GPU) against 1F1B's p - 1.
  for (Count p = 2; p <= 6; ++p) {
    const Count m = 2 * p + 1;
    const SimResult v = simulate(pipeline(p, m, Schedule::zb_v, 2), uniform_estimate(p),
                                 with_costs(2.0, 2.0, 2.0, 0.25));
    const SimResult one = simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p),
                                   with_costs(1.0, 2.0, std::nullopt, 0.25));
    double sv = 0, s1 = 0;
    for (const StageResult& st : v.stages) sv += st.send_seconds;
    for (const StageResult& st : one.stages) s1 += st.send_seconds;
    EXPECT_NEAR(s1, 0.25 * 2.0 * static_cast<double>(m * (p - 1)), 1e-9);
    EXPECT_NEAR(sv, 2.0 * s1, 1e-9) << "p " << p;
  }
}

TEST(VShape, PlacementTravelsWithTheScheduleFile) {
  const SchedulePrograms prog = make_zb_v(3, 6);
  const SchedulePrograms back = schedule_from_json(schedule_to_json(prog));
  EXPECT_EQ(back, prog);
  // A V program does not run under an interleaved scenario.
  SimOptions o = with_costs(1.0, 1.0, 1.0);
  o.program = &prog;
  EXPECT_THROW((void)simulate(pipeline(3, 6, Schedule::zb_h2), uniform_estimate(3), o), InputError);
}

TEST(VShape, VirtualStagesOtherThanTwoAreRefused) {
  EXPECT_THROW((void)make_schedule(Schedule::zb_v, 4, 8, 1), InputError);
  EXPECT_THROW((void)make_schedule(Schedule::zb_v, 4, 8, 3), InputError);
  EXPECT_NO_THROW((void)make_schedule(Schedule::zb_v, 4, 8, 2));
}

// V-Half and V-Min: the authors' building blocks (make_v_half / make_v_min). README table:
// activation memory 1/2x and 1/3x 1F1B's. The table states the leading term; the building block
// adds a constant (whole building blocks alive at the peak, Qi et al. 2024). The
// exact peaks are 2 floor(p / 2) + 2 chunks (V-Half) and 2 floor((p + 1) / 3) + 2 (V-Min): about
// p/2 + 1 and p/3 + 1 micro-batches of a whole stage against 1F1B's p.
TEST(VShape, VHalfAndVMinProgramsPassTheChecker) {
  for (Count p = 1; p <= 10; ++p) {
    for (Count m = 1; m <= 3 * p + 2; ++m) {
      for (const SchedulePrograms& prog : {make_v_half(p, m), make_v_min(p, m)}) {
        EXPECT_TRUE(prog.v_shape);
        EXPECT_NO_THROW(check_program(prog)) << "p " << p << " m " << m;
        EXPECT_EQ(prog.num_actions(), static_cast<std::size_t>(6 * p * m));
      }
    }
  }
}

TEST(VShape, VHalfAndVMinActivationPeaksAreAHalfAndAThirdOfOneFOneBs) {
  const Bytes act = 1 << 20;  // one micro-batch through one whole stage (two chunks)
  for (Count p = 2; p <= 12; ++p) {
    const Count m = 3 * p;
    const double one_f_one_b = static_cast<double>(p * act);  // stage 0's peak (test above)
    for (const Schedule kind : {Schedule::v_half, Schedule::v_min}) {
      const SchedulePrograms prog = make_schedule(kind, p, m, 2);
      SimOptions o = with_costs(2.0, 2.0, 2.0);
      o.program = &prog;
      const SimResult r = simulate(pipeline(p, m, kind, 2), uniform_estimate(p, act), o);
      Count chunks = 0;
      Bytes peak = 0;
      for (const StageResult& st : r.stages) {
        chunks = std::max(chunks, st.peak_inflight_chunks);
        peak = std::max(peak, st.peak_activation_bytes);
      }
      const bool half = kind == Schedule::v_half;
      EXPECT_EQ(chunks, half ? 2 * (p / 2) + 2 : 2 * ((p + 1) / 3) + 2)
          << to_string(kind) << " p " << p;
      const double fraction = half ? 0.5 : 1.0 / 3.0;
      // Leading term the README's fraction, plus at most two micro-batches of one stage.
      EXPECT_GE(static_cast<double>(peak), fraction * one_f_one_b) << to_string(kind) << p;
      EXPECT_LE(static_cast<double>(peak), fraction * one_f_one_b + 2.0 * act)
          << to_string(kind) << " p " << p;
    }
  }
}

TEST(VShape, VHalfAndVMinTradeBubbleForMemory) {
  // README table with T_F = T_B = T_W: 1F1B's bubble B = (p - 1)/(m + p - 1); ZB-V 0; V-Half B/2
  // and V-Min 2B/3 + O(n) after the authors' reordering pass, which distplan runs (v_reorder.h):
  // V-Half lands at 0.30-0.55 B here (0.55 B at p = 16, m = 2p; below B/2 wherever m >= 8p or
  // p <= 8; without the reordering it was about 0.65 B), V-Min within 0.025 of 2B/3 (the README's
  // O(n) overhead, unquantified). Asserted: V-Half above ZB-V's 0 and at most 0.56 B, V-Min within
  // 0.025 of 2B/3.
  for (Count p : {4, 8, 16}) {
    for (Count m : {2 * p, 4 * p, 8 * p}) {
      const double B = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
      auto bubble = [&](Schedule k) {
        return simulate(pipeline(p, m, k, 2), uniform_estimate(p), with_costs(2.0, 2.0, 2.0))
            .bubble_fraction;
      };
      const double half = bubble(Schedule::v_half), third = bubble(Schedule::v_min);
      EXPECT_GT(half, 0.0);
      EXPECT_LE(half, 0.56 * B) << "p " << p << " m " << m;
      if (p <= 8 || m >= 8 * p) {
        EXPECT_LE(half, B / 2) << "p " << p << " m " << m;
      }
      EXPECT_NEAR(third, 2.0 * B / 3.0, 0.025) << "p " << p << " m " << m;
    }
  }
}

}  // namespace
}  // namespace distplan::sim
