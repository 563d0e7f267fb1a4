// Regression tests for input-handling defects found by fuzz/scenario_fuzz (docs/trust.md lists
// each finding and its fix). Each feeds the exact input class that failed.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"

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

}  // namespace
}  // namespace distplan
