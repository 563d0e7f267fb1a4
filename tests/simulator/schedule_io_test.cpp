// Schedule files: JSON and CSV round trips, and errors that name the offending cell.
#include "distplan/simulator/schedule_io.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"

namespace distplan::sim {
namespace {

std::string error_path(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.path();
  }
  return "<no error>";
}

TEST(ScheduleText, ParsesEveryActionForm) {
  EXPECT_EQ(parse_action("F3", ""), (Action{Op::forward, 3, 0, false}));
  EXPECT_EQ(parse_action(" B12 ", ""), (Action{Op::backward, 12, 0, false}));
  EXPECT_EQ(parse_action("BI2.1", ""), (Action{Op::backward_input, 2, 1, false}));
  EXPECT_EQ(parse_action("W0.3", ""), (Action{Op::backward_weight, 0, 3, false}));
}

TEST(ScheduleText, RejectsMalformedActions) {
  for (const char* bad : {"X3", "F", "F-1", "F3.", "F3.x", "B 3", ""})
    EXPECT_EQ(error_path([&] { (void)parse_action(bad, "/stages/1/2"); }), "/stages/1/2") << bad;
}

TEST(ScheduleJson, RoundTripsEveryGenerator) {
  for (const auto& prog : {make_gpipe(3, 5), make_1f1b(4, 6), make_interleaved_1f1b(2, 4, 3),
                           make_zb_h1(3, 4), make_zb_h2(3, 6)}) {
    EXPECT_EQ(schedule_from_json(schedule_to_json(prog)), prog);
    EXPECT_EQ(schedule_from_csv(schedule_to_csv(prog)), prog);
    EXPECT_EQ(schedule_from_text(schedule_to_json(prog).dump()), prog);
  }
}

TEST(ScheduleJson, AcceptsObjectActions) {
  const auto j = nlohmann::json::parse(R"({"stages": [[
      {"op": "forward", "microbatch": 0}, {"op": "backward_input", "microbatch": 0, "chunk": 0},
      "W0"]]})");
  const SchedulePrograms p = schedule_from_json(j);
  EXPECT_EQ(p.stages, 1);
  EXPECT_EQ(p.microbatches, 1);
  ASSERT_EQ(p.programs[0].size(), 3u);
  EXPECT_EQ(p.programs[0][1], (Action{Op::backward_input, 0, 0, false}));
}

TEST(ScheduleJson, RejectsUnknownFieldsWithTheirPath) {
  EXPECT_EQ(
      error_path([] {
        (void)schedule_from_json(nlohmann::json::parse(R"({"stages": [["F0"]], "stagse": 1})"));
      }),
      "/stagse");
  EXPECT_EQ(error_path([] {
              (void)schedule_from_json(
                  nlohmann::json::parse(R"({"stages": [["F0", {"op": "forward", "mb": 1}]]})"));
            }),
            "/stages/0/1/mb");
  EXPECT_EQ(error_path([] {
              (void)schedule_from_json(nlohmann::json::parse(
                  R"({"stages": [["F0", {"op": "sideways", "microbatch": 1}]]})"));
            }),
            "/stages/0/1/op");
  EXPECT_EQ(error_path([] { (void)schedule_from_json(nlohmann::json::parse(R"({"x": 1})")); }),
            "/x");
  EXPECT_EQ(error_path([] { (void)schedule_from_text("{not json"); }), "");
}

TEST(ScheduleCsv, SkipsCommentsAndBlankLinesAndNamesTheCell) {
  const SchedulePrograms p = schedule_from_csv("# 2 stages\nF0,B0\n\n F0 , B0\n");
  EXPECT_EQ(p.stages, 2);
  EXPECT_EQ(p.microbatches, 1);
  EXPECT_EQ(error_path([] { (void)schedule_from_csv("F0,B0\nF0,Q0\n"); }), "/stages/1/1");
}

TEST(ScheduleFiles, ShippedExamplesAreValid) {
  for (const char* name : {"1f1b_p4_m8.csv", "zb_h1_p4_m8.json"}) {
    std::ifstream f(std::string(DISTPLAN_SOURCE_DIR) + "/data/schedules/" + name);
    ASSERT_TRUE(f) << name;
    std::stringstream ss;
    ss << f.rdbuf();
    const SchedulePrograms p = schedule_from_text(ss.str());
    EXPECT_NO_THROW(check_program(p)) << name;
    EXPECT_EQ(p.stages, 4);
    EXPECT_EQ(p.microbatches, 8);
  }
}

}  // namespace
}  // namespace distplan::sim
