// The worked examples in README.md ("A worked example": `distplan plan --format table` of the
// default scenario) and docs/time.md ("Worked example") are produced by the code: these tests fail
// when the committed text differs from what the planner prints today. DISTPLAN_WRITE_DOCS=1
// rewrites both blocks in place.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "distplan/planner/estimate.h"
#include "distplan/planner/report.h"
#include "test_util.h"

namespace distplan {
namespace {

void check_block(const std::string& file, const std::string& begin, const std::string& end,
                 const std::string& want) {
  testing::check_doc_block(file, begin, end, want, "WorkedExamples.*");
}

TEST(WorkedExamples, ReadmePlanTableIsWhatThePlannerPrints) {
  const Scenario s = testing::scenario(testing::default_doc());
  check_block("README.md", "`./build/cli/distplan plan --format table` prints:\n\n```\n", "```\n",
              testing::plan_table(s));
}

TEST(WorkedExamples, TimeDocExampleIsWhatThePlannerComputes) {
  const Scenario s = testing::scenario(testing::default_doc());
  const Estimate e = sim::plan(s);
  const StageCosts& k = e.stage_costs.front();
  const TimeEstimate& t = e.time;
  const std::string want = fmt::format(
      "Stage 0 per micro-batch: forward {:.1f} ms, backward-input {:.1f} ms (selective recompute "
      "{:.1f} ms), backward-weight {:.1f} ms; of these, TP collectives {:.1f} ms and blocking "
      "pipeline sends 2 x {:.2f} ms. Per step grad_reduce {:.1f} ms, param_gather {:.1f} ms, "
      "optimizer {:.1f} ms.\nStep {:.2f} s (the schedule walk) = busiest stage's passes {:.2f} s + "
      "bubble {:.2f} s ({:.1f} % of the step; the stages idle {:.1f} % of their time) + exposed "
      "communication {:.1f} ms + optimizer {:.1f} ms; {:.0f} tokens/s, MFU {:.1f} %.\n",
      k.forward * 1e3, k.backward_input * 1e3, k.recompute * 1e3, k.backward_weight * 1e3,
      k.tp_communication * 1e3, k.p2p * 1e3, k.grad_reduce * 1e3, k.param_gather * 1e3,
      k.optimizer * 1e3, t.step_seconds, t.compute_seconds, t.bubble_seconds,
      100 * t.bubble_seconds / t.step_seconds, 100 * t.bubble_fraction,
      t.exposed_communication_seconds * 1e3, t.optimizer_seconds * 1e3, t.tokens_per_second,
      100 * t.mfu);
  check_block("docs/time.md", "<!-- worked example: generated -->\n",
              "<!-- end of worked example -->", want);
}

}  // namespace
}  // namespace distplan
