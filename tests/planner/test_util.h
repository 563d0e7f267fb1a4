// Helpers shared by the planner tests.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/report.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::testing {

/// A reference case from data/reference/ (compiled into the planner).
inline nlohmann::json reference(const std::string& name) {
  return nlohmann::json::parse(*embedded_data_file("reference/" + name));
}

/// The embedded default scenario as JSON, to be modified by a test.
inline nlohmann::json default_doc() {
  return parse_json_text(default_scenario_text());
}

inline Scenario scenario(const nlohmann::json& doc) {
  return scenario_from_json(doc);
}

/// What every face plans a changed scenario with: the schedule walk (report.h, PlanFunction).
inline PlanFunction planner() {
  return [](const Scenario& x) { return sim::plan(x); };
}

/// The table `distplan plan --format table` prints for `s`.
inline std::string plan_table(const Scenario& s) {
  return format_plan_table(s, sim::plan(s), planner());
}

/// Compares the text between `begin` and `end` in a repository file with `want`, the text the
/// code produces; with DISTPLAN_WRITE_DOCS=1 it replaces that text instead. `filter` is the
/// gtest filter named in the failure message (the tests that rewrite the block).
/// What the caching allocator reserves on one stage (torch.cuda.max_memory_reserved(), what
/// torchtitan and Megatron-LM log): the stage's reserved bytes less the CUDA context and NCCL's
/// buffers outside the allocator (the cuBLAS workspace is inside).
inline Bytes allocator_reserved_bytes(const Scenario& s, const StageMemory& st) {
  const Bytes outside = st.runtime_bytes - s.assumptions.framework_profile.cublas_workspace_bytes;
  return st.reserved_bytes - outside;
}

inline void check_doc_block(const std::string& file, const std::string& begin,
                            const std::string& end, const std::string& want,
                            const std::string& filter) {
  const std::string path = std::string(DISTPLAN_SOURCE_DIR) + "/" + file;
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  std::string text = ss.str();
  const auto b = text.find(begin);
  ASSERT_NE(b, std::string::npos) << file << ": no '" << begin << "'";
  const auto from = b + begin.size();
  const auto to = text.find(end, from);
  ASSERT_NE(to, std::string::npos) << file << ": no '" << end << "' after '" << begin << "'";
  if (const char* w = std::getenv("DISTPLAN_WRITE_DOCS"); w && std::string(w) == "1") {
    text.replace(from, to - from, want);
    std::ofstream(path) << text;
    return;
  }
  EXPECT_EQ(text.substr(from, to - from), want)
      << file << " drifted from the planner; DISTPLAN_WRITE_DOCS=1 planner_tests "
      << "--gtest_filter='" << filter << "' rewrites it";
}

/// The scenario of a README example: the ```json block after `<!-- NAME example: scenario -->`.
inline std::string readme_scenario(const std::string& name) {
  std::stringstream ss;
  ss << std::ifstream(std::string(DISTPLAN_SOURCE_DIR) + "/README.md").rdbuf();
  const std::string text = ss.str();
  const std::string begin = "<!-- " + name + " example: scenario -->\n```json\n";
  const auto b = text.find(begin);
  EXPECT_NE(b, std::string::npos) << "README.md: no '" << begin << "'";
  if (b == std::string::npos) return "{}";
  const auto from = b + begin.size();
  return text.substr(from, text.find("```\n", from) - from);
}

/// Checks (or, with DISTPLAN_WRITE_DOCS=1, rewrites) the table block of a README example, the
/// ``` block after `<!-- NAME example: table -->`.
inline void check_readme_table(const std::string& name, const std::string& want,
                               const std::string& filter) {
  check_doc_block("README.md", "<!-- " + name + " example: table -->\n```\n", "```\n", want,
                  filter);
}

}  // namespace distplan::testing
