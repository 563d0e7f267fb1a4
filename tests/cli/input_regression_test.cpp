// Regression tests for input-handling defects found by fuzz/scenario_fuzz (docs/trust.md lists
// each finding and its fix). Each feeds the exact input class that failed.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"

namespace distplan {
namespace {

std::string error_path(std::string_view text) {
  try {
    (void)parse_json_text(text);
  } catch (const InputError& e) {
    return e.path();
  }
  return "<accepted>";
}

// Finding 1: a number that overflows a double (1e999) escaped as nlohmann's out_of_range
// exception, which the CLI reported as an internal error (exit 1) instead of bad input.
TEST(InputRegression, OverflowingNumberIsInputErrorAtItsField) {
  EXPECT_EQ(error_path(R"({"training": {"dropout": 1e999}})"), "/training/dropout");
  EXPECT_EQ(error_path(R"({"a": [0, {"b": -1e400}]})"), "/a/1/b");
  EXPECT_EQ(error_path("1e999"), "");
  EXPECT_EQ(error_path(R"({"x/y~": 1e309})"), "/x~1y~0");
}

TEST(InputRegression, SyntaxErrorsStayAtTheDocument) {
  EXPECT_EQ(error_path(R"({"model": )"), "");
  EXPECT_EQ(error_path("{\"model\": \"\xff\"}"), "");
}

// Finding 2: fit suggestions of a valid scenario with ~10^9 micro-batches per step tried "2 GPUs,
// ZeRO-3", whose per-micro-batch parameter gathers (wire bytes = calls × bytes) overflowed int64 in
// estimate() (UBSan: signed overflow). Validation now bounds ZeRO-2/3 traffic per step.
// The reproducer as found (GPipe at pp 1, which Megatron-LM does not run: distplan's textbook
// model).
nlohmann::json huge_batch_scenario() {
  return nlohmann::json::parse(
      R"({"cluster": {"gpu": "a100-40gb", "gpus_per_node": 1, "num_gpus": 1},
    "model": "mistral-7b",
    "parallel": {"dp": 1, "pp": 1, "tp": 1, "zero_stage": 0, "schedule": "gpipe"},
    "training": {"global_batch_size": 1886671360, "micro_batch_size": 1, "precision": "fp32",
                 "seq_length": 1, "framework": "generic"}})");
}

TEST(InputRegression, ZeroThreeTrafficBeyondInt64IsRejected) {
  nlohmann::json doc = huge_batch_scenario();
  doc["cluster"]["num_gpus"] = 2;
  doc["parallel"]["dp"] = 2;
  doc["parallel"]["zero_stage"] = 3;
  try {
    (void)scenario_from_json(doc);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/training/global_batch_size");
    EXPECT_NE(std::string(e.what()).find("once per micro-batch"), std::string::npos);
  }
  // ZeRO-1 moves the model state once per step: the same batch stays valid.
  doc["parallel"]["zero_stage"] = 1;
  EXPECT_NO_THROW((void)scenario_from_json(doc));
}

TEST(InputRegression, FitSuggestionsOfAHugeBatchStayInRange) {
  const Scenario s = scenario_from_json(huge_batch_scenario());
  // Its step is too long to walk (the plan refuses it at the batch, naming the bound); the
  // estimates of the changes its suggestions try must still stay in range.
  try {
    (void)sim::plan(s);
    ADD_FAILURE() << "a step of 1.9e9 passes was walked";
  } catch (const InputError& err) {
    EXPECT_EQ(err.path(), "/training/global_batch_size");
  }
  const Estimate e = estimate(s);
  const PlanFunction plan = [](const Scenario& x) { return estimate(x); };
  for (const FitSuggestion& f : fit_suggestions(s, e, plan)) {
    SCOPED_TRACE(f.change);
    EXPECT_GE(f.peak_bytes, 0);
    EXPECT_GE(f.saving_bytes, 0);
    const Estimate fe = estimate(f.scenario);
    EXPECT_GE(fe.communication.wire_bytes_per_gpu_per_step, 0);
    for (const Collective& c : fe.communication.collectives) {
      EXPECT_GE(c.wire_bytes_per_gpu_per_step, 0) << c.what();
    }
  }
  EXPECT_FALSE(format_plan_table(s, e, plan).empty());
}

}  // namespace
}  // namespace distplan
