// Generators build valid programs; the checker rejects invalid ones with a clear path and message.
#include "distplan/simulator/schedule.h"

#include <gtest/gtest.h>

#include "distplan/planner/error.h"

namespace distplan::sim {
namespace {

Action F(int mb, int c = 0) {
  return {Op::forward, mb, c};
}
Action B(int mb, int c = 0) {
  return {Op::backward, mb, c};
}
Action BI(int mb, int c = 0) {
  return {Op::backward_input, mb, c};
}
Action W(int mb, int c = 0) {
  return {Op::backward_weight, mb, c};
}

SchedulePrograms program(Count m, std::vector<std::vector<Action>> stages, Count v = 1) {
  SchedulePrograms p;
  p.stages = static_cast<Count>(stages.size());
  p.microbatches = m;
  p.virtual_stages = v;
  p.programs = std::move(stages);
  return p;
}

// Runs check_program and returns the InputError's path and message ("" when it passes).
std::pair<std::string, std::string> rejection(const SchedulePrograms& p) {
  try {
    check_program(p);
  } catch (const InputError& e) {
    return {e.path(), e.what()};
  }
  return {"", ""};
}

TEST(ScheduleGenerators, EveryGeneratorPassesTheChecker) {
  for (Count p : {1, 2, 3, 4, 8}) {
    for (Count m : {1, 2, 3, 4, 7, 8, 16}) {
      EXPECT_EQ(rejection(make_gpipe(p, m)).first, "") << "gpipe p=" << p << " m=" << m;
      EXPECT_EQ(rejection(make_1f1b(p, m)).second, "") << "1f1b p=" << p << " m=" << m;
      EXPECT_EQ(rejection(make_zb_h1(p, m)).second, "") << "zb_h1 p=" << p << " m=" << m;
      EXPECT_EQ(rejection(make_zb_h2(p, m)).second, "") << "zb_h2 p=" << p << " m=" << m;
      for (Count v : {2, 3, 4}) {
        if (m % p != 0) continue;
        EXPECT_EQ(rejection(make_interleaved_1f1b(p, m, v)).second, "")
            << "interleaved p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(ScheduleGenerators, ProgramsHoldEveryPassOnce) {
  const Count p = 4, m = 8;
  for (const auto& prog : {make_gpipe(p, m), make_1f1b(p, m)})
    for (const auto& stage : prog.programs)
      EXPECT_EQ(stage.size(), static_cast<std::size_t>(2 * m));
  for (const auto& prog : {make_zb_h1(p, m), make_zb_h2(p, m)})
    for (const auto& stage : prog.programs)
      EXPECT_EQ(stage.size(), static_cast<std::size_t>(3 * m));
  const auto inter = make_interleaved_1f1b(p, m, 3);
  for (const auto& stage : inter.programs)
    EXPECT_EQ(stage.size(), static_cast<std::size_t>(2 * m * 3));
}

TEST(ScheduleGenerators, OneFOneBWarmsUpWithPMinusStageMinusOneForwards) {
  const Count p = 4, m = 8;
  const auto prog = make_1f1b(p, m);
  for (Count s = 0; s < p; ++s) {
    const auto& a = prog.programs[static_cast<std::size_t>(s)];
    // Forwards before the first backward: the warm-up (p - s - 1) plus the first steady forward.
    std::size_t first_b = 0;
    while (a[first_b].op == Op::forward) ++first_b;
    EXPECT_EQ(static_cast<Count>(first_b), p - s) << "stage " << s;
  }
}

TEST(ScheduleGenerators, InterleavedFollowsMegatronWarmupCount) {
  // Megatron-LM: warm-up = (p - s - 1) * 2 + (v - 1) * p, then one forward before the first
  // backward of the steady phase.
  const Count p = 4, m = 8, v = 2;
  const auto prog = make_interleaved_1f1b(p, m, v);
  for (Count s = 0; s < p; ++s) {
    const auto& a = prog.programs[static_cast<std::size_t>(s)];
    std::size_t first_b = 0;
    while (a[first_b].op == Op::forward) ++first_b;
    EXPECT_EQ(static_cast<Count>(first_b), (p - s - 1) * 2 + (v - 1) * p + 1) << "stage " << s;
    // Chunk order of forwards: p micro-batches on chunk 0, then p on chunk 1, ...
    EXPECT_EQ(a[0], F(0, 0));
    EXPECT_EQ(a[static_cast<std::size_t>(p)], F(0, 1));
  }
  // The first backward of every stage is on the last chunk.
  EXPECT_EQ(prog.programs[0][static_cast<std::size_t>((p - 1) * 2 + (v - 1) * p + 1)], B(0, 1));
}

TEST(ScheduleGenerators, InterleavedNeedsMicrobatchesAMultipleOfStages) {
  try {
    (void)make_interleaved_1f1b(4, 6, 2);
    FAIL() << "m = 6, p = 4 must be rejected";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/schedule");
    EXPECT_NE(std::string(e.what()).find("multiple of pp = 4"), std::string::npos) << e.what();
  }
}

TEST(ScheduleGenerators, VirtualStagesNeedTheInterleavedSchedule) {
  EXPECT_THROW((void)make_schedule(Schedule::one_f_one_b, 4, 8, 2), InputError);
  EXPECT_EQ(make_schedule(Schedule::interleaved_1f1b, 4, 8, 1), make_1f1b(4, 8));
}

TEST(ScheduleChecker, RejectsBackwardBeforeForward) {
  const auto [path, msg] = rejection(program(1, {{B(0), F(0)}}));
  EXPECT_EQ(path, "/stages/0/0");
  EXPECT_NE(msg.find("backward before its forward"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsDuplicatedMicrobatch) {
  const auto [path, msg] = rejection(program(2, {{F(0), F(1), F(1), B(0), B(1)}}));
  EXPECT_EQ(path, "/stages/0/2");
  EXPECT_NE(msg.find("duplicated forward"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsMissingMicrobatch) {
  const auto [path, msg] = rejection(program(2, {{F(0), B(0)}}));
  EXPECT_EQ(path, "/stages/0");
  EXPECT_NE(msg.find("forward of micro-batch 1"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsMissingWeightPass) {
  const auto [path, msg] = rejection(program(1, {{F(0), BI(0)}}));
  EXPECT_EQ(path, "/stages/0");
  EXPECT_NE(msg.find("weight-gradient pass"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsWeightPassBeforeInputPass) {
  const auto [path, msg] = rejection(program(1, {{F(0), W(0), BI(0)}}));
  EXPECT_EQ(path, "/stages/0/1");
  EXPECT_NE(msg.find("before its input-gradient pass"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsMicrobatchOutOfRange) {
  const auto [path, msg] = rejection(program(1, {{F(0), B(0), F(3)}}));
  EXPECT_EQ(path, "/stages/0/2");
  EXPECT_NE(msg.find("can never be met"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsChunkOutOfRange) {
  const auto [path, msg] = rejection(program(1, {{F(0), B(0), F(0, 1)}}));
  EXPECT_EQ(path, "/stages/0/2");
  EXPECT_NE(msg.find("chunk 1 is out of range"), std::string::npos) << msg;
}

TEST(ScheduleChecker, RejectsDeadlock) {
  // Stage 1 waits for micro-batch 1, which stage 0 sends only after B0, which needs stage 1's B0.
  const auto [path, msg] =
      rejection(program(2, {{F(0), B(0), F(1), B(1)}, {F(1), F(0), B(0), B(1)}}));
  EXPECT_EQ(path, "/stages/0/1");
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 1 waits at action 0 (F1)"), std::string::npos) << msg;
}

// The deadlock message names a few stuck stages and counts the rest: bounded at any p (4,096
// stuck stages gave a message of hundreds of kB on one line).
TEST(ScheduleChecker, DeadlockMessageIsBounded) {
  std::vector<std::vector<Action>> rows(4096, {F(1), F(0), B(0), B(1)});
  rows[0] = {F(0), B(0), F(1), B(1)};
  const auto [path, msg] = rejection(program(2, rows));
  EXPECT_NE(msg.find("deadlock"), std::string::npos);
  EXPECT_NE(msg.find("and 4088 more stages"), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 2000u);
}

TEST(ScheduleChecker, RejectsWrongStageCount) {
  auto p = make_1f1b(3, 4);
  p.programs.pop_back();
  EXPECT_EQ(rejection(p).first, "/stages");
}

TEST(ScheduleChecker, AcceptsMixedFullAndSplitBackward) {
  EXPECT_EQ(rejection(program(2, {{F(0), F(1), B(1), BI(0), W(0)}})).second, "");
}

TEST(ActionText, FormatsOpsAndChunks) {
  EXPECT_EQ(action_to_string(F(3)), "F3");
  EXPECT_EQ(action_to_string(BI(2, 1)), "BI2.1");
  EXPECT_EQ(action_to_string(W(0)), "W0");
  EXPECT_EQ(action_to_string(B(7, 2)), "B7.2");
}

}  // namespace
}  // namespace distplan::sim
