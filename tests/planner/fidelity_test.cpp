// Step-time fidelity against published measurements (data/reference/): the shipped, uncalibrated
// presets must reproduce Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 5 within
// 5 % mean absolute percentage error each. The same rows write docs/fidelity.md; a test fails when
// the committed file drifts from the code (DISTPLAN_WRITE_DOCS=1 rewrites it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "distplan/planner/estimate.h"
#include "test_util.h"

namespace distplan {
namespace {

struct Row {
  std::string name;
  double measured = 0;
  double predicted = 0;
  [[nodiscard]] double error() const { return (predicted - measured) / measured; }
};

struct Table {
  std::string file, source, inputs, metric, unit;
  std::vector<Row> rows;
  [[nodiscard]] double mape() const {
    double sum = 0;
    for (const Row& r : rows) sum += std::abs(r.error());
    return rows.empty() ? 0 : sum / static_cast<double>(rows.size());
  }
};

// Narayanan et al. 2021, eq. (3): FLOPs per iteration with full recomputation, the paper's own
// count (an oracle independent of the planner's FLOP tally).
double megatron_eq3(const nlohmann::json& sc) {
  const double B = sc["training"]["global_batch_size"];
  const double s = sc["training"]["seq_length"];
  const double l = sc["model"]["num_layers"];
  const double h = sc["model"]["hidden_size"];
  const double V = sc["model"]["vocab_size"];
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

Table table1() {
  const auto ref = testing::reference("narayanan2021_table1.json");
  Table t{"narayanan2021_table1.json", ref["source"],
          ref["inputs_source"],        ref["metric"],
          "TFLOP/s per GPU",           {}};
  for (const auto& c : ref["cases"]) {
    const Scenario s = testing::scenario(c["scenario"]);
    const Estimate e = sim::plan(s);
    const double tf = megatron_eq3(c["scenario"]) /
                      (e.time.step_seconds * static_cast<double>(s.cluster.num_gpus)) / 1e12;
    t.rows.push_back({c["name"], c["measured"]["tflops_per_gpu"], tf});
  }
  return t;
}

Table table5() {
  const auto ref = testing::reference("korthikanti2022_table5.json");
  Table t{"korthikanti2022_table5.json", ref["source"],
          ref["inputs_source"],          ref["metric"],
          "iteration time (s)",          {}};
  for (const auto& c : ref["cases"]) {
    const Estimate e = sim::plan(testing::scenario(c["scenario"]));
    t.rows.push_back({c["name"], c["measured"]["step_seconds"], e.time.step_seconds});
  }
  return t;
}

std::string render(const std::vector<Table>& tables) {
  std::string md =
      "# Fidelity: predicted beside measured\n\n"
      "Written by `tests/planner/fidelity_test.cpp` from `data/reference/` with the shipped,\n"
      "uncalibrated GPU presets (`DISTPLAN_WRITE_DOCS=1 planner_tests "
      "--gtest_filter='Fidelity.*'`\nrewrites it; `Fidelity.DocMatchesCode` fails when it "
      "drifts). The step is the plan's: the schedule walk over the op costs "
      "(docs/time.md).\nTarget: MAPE at most 5 % per table.\n";
  for (const Table& t : tables) {
    md += fmt::format("\n## `data/reference/{}`\n\n{}\n\nInputs: {}\n\nMetric: {}.\n\n", t.file,
                      t.source, t.inputs, t.metric);
    md += fmt::format("| case | measured {} | predicted | error |\n|---|---:|---:|---:|\n", t.unit);
    for (const Row& r : t.rows) {
      md += fmt::format("| {} | {:.2f} | {:.2f} | {:+.1f} % |\n", r.name, r.measured, r.predicted,
                        100 * r.error());
    }
    md += fmt::format("\nMAPE {:.1f} %.\n", 100 * t.mape());
  }
  md +=
      "\n## What limits the agreement\n\n"
      "The two papers measured Megatron-LM a year apart on the same machine (Selene), and disagree "
      "with each other: Table 1's 1T row (163 TFLOP/s per GPU, 512 micro-batches per pipeline) "
      "implies 102.6 s per iteration, Table 5's 1T full-recompute row (the same layout and work "
      "per pipeline) measured 94.4 s; for 530B 54.1 s against 49.1 s. A physical model with one "
      "set of A100 figures therefore sits between them: it is a few percent fast on Table 1 and a "
      "few percent slow on Table 5, on the large models most. Within each table the trends "
      "(achieved FLOP/s rising with the hidden size; 20-29 % gained by sequence parallelism with "
      "selective recompute) come from the op costs, not from per-case figures.\n";
  return md;
}

TEST(Fidelity, Narayanan2021Table1WithinFivePercent) {
  const Table t = table1();
  ASSERT_EQ(t.rows.size(), 10u);
  for (const Row& r : t.rows) {
    // No single row may be far off, whatever the mean.
    EXPECT_LT(std::abs(r.error()), 0.10) << r.name << ": " << r.predicted << " vs " << r.measured;
  }
  EXPECT_LE(t.mape(), 0.05) << render({t});
}

TEST(Fidelity, Korthikanti2022Table5WithinFivePercent) {
  const Table t = table5();
  ASSERT_EQ(t.rows.size(), 8u);
  for (const Row& r : t.rows) {
    EXPECT_LT(std::abs(r.error()), 0.10) << r.name << ": " << r.predicted << " vs " << r.measured;
  }
  EXPECT_LE(t.mape(), 0.05) << render({t});
}

TEST(Fidelity, SelectiveRecomputeWithSequenceParallelIsFasterAsMeasured) {
  // Korthikanti et al. 2022 measure 20-29 % shorter iterations with SP + selective recompute;
  // the model must reproduce the direction and the rough size for every row.
  const Table t = table5();
  for (std::size_t i = 0; i + 1 < t.rows.size(); i += 2) {
    const double measured = t.rows[i + 1].measured / t.rows[i].measured;
    const double predicted = t.rows[i + 1].predicted / t.rows[i].predicted;
    EXPECT_NEAR(predicted, measured, 0.05) << t.rows[i].name;
  }
}

TEST(Fidelity, DocMatchesCode) {
  const std::string path = std::string(DISTPLAN_SOURCE_DIR) + "/docs/fidelity.md";
  const std::string want = render({table1(), table5()});
  if (const char* w = std::getenv("DISTPLAN_WRITE_DOCS"); w && std::string(w) == "1") {
    std::ofstream(path) << want;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing; run with DISTPLAN_WRITE_DOCS=1";
  std::stringstream have;
  have << in.rdbuf();
  EXPECT_EQ(have.str(), want) << "docs/fidelity.md drifted from the model; run "
                                 "DISTPLAN_WRITE_DOCS=1 planner_tests --gtest_filter=Fidelity.*";
}

}  // namespace
}  // namespace distplan
