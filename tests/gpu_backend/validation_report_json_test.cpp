// Reading a distplan.validate/v1 document back into the typed report (validation_report.h): the
// inverse of to_json on reports compare() made and on the checked-in CLI result; bad input is
// refused at its JSON pointer; a predicted figure that is not the plan recomputed from the
// document's scenario is refused as stale.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "validation_scenarios.h"

namespace distplan::backend {
namespace {

using nlohmann::json;

// The CLI's output for tiny-gpt tp2·pp2·dp2 on 8 CPU ranks (tests/gui/validation_test.cpp reads
// it too).
const char* const kFixture =
    DISTPLAN_SOURCE_DIR "/data/validation/tiny-gpt-tp2-pp2-dp2.result.json";

json read_fixture() {
  std::ifstream in(kFixture);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

Scenario two_stage(const std::string& framework = "") {
  return testing::two_stage_gpt(2, "bf16", framework);
}

// Figures of every kind, distinct per rank and stage: two ranks per stage (dp = 2), each with
// its own memory, a pp send and a dp reduction, forwards, backwards and weight-gradient passes.
Measurement measurement_of(const Scenario& s, const Estimate& e) {
  Measurement m;
  for (int rank = 0; rank < 4; ++rank) {
    const int st = rank / 2;
    const StageMemory& p = e.memory.stages[static_cast<std::size_t>(st)];
    RankMeasurement r;
    r.rank = rank;
    r.coords.pp = st;
    r.coords.dp = rank % 2;
    for (int t = 0; t < kNumMemoryTags; ++t) r.memory.peak[t] = 1000 * (t + 1) + 7 * rank;
    r.memory.peak[static_cast<int>(MemoryTag::weights)] = p.weights_bytes;
    r.memory.peak_total = p.total_bytes - p.runtime_bytes + 123 * rank;
    r.memory.peak_reserved = r.memory.peak_total + 4096;
    for (int mb = 0; mb < 4; ++mb) {
      r.actions.push_back({{sim::Op::forward, mb, 0}, 1.25e-3 + 1e-5 * rank});
      r.actions.push_back({{sim::Op::backward_input, mb, 0}, 2.5e-3});
      r.actions.push_back({{sim::Op::backward_weight, mb, 0}, 0.75e-3});
    }
    r.step_seconds = 31e-3 + 1e-4 * rank;
    r.optimizer_seconds = 1.5e-3;
    r.communication[{Group::pp, CollectiveOp::send_recv, Traffic::activations_forward}] = {
        4096 * (st + 1), 4};
    r.communication[{Group::dp, CollectiveOp::all_reduce,
                      unit_traffic(UnitTraffic::gradients, ParamUnit::layers)}] = {1 << 20, 1};
    m.ranks.push_back(r);
  }
  (void)s;
  m.losses = {6.25, 6.125, 6.0625};
  m.skipped = {false, true, false};
  return m;
}

void expect_round_trip(const ValidationReport& r) {
  const json doc = to_json(r);
  const ValidationReport back = validation_report_from_json(doc);
  EXPECT_EQ(to_json(back), doc);
  // Through text, as a file holds it.
  EXPECT_EQ(to_json(validation_report_from_json(json::parse(doc.dump(2)))), doc);
}

TEST(ValidationReportJson, ReadsBackWhatCompareWrote) {
  const Scenario s = two_stage();
  const Estimate e = sim::plan(s);
  const Measurement m = measurement_of(s, e);
  ValidationSettings vs;
  vs.steps = 3;
  const ValidationReport r = compare(s, e, &m, "", vs);
  ASSERT_TRUE(r.fits);
  ASSERT_EQ(r.memory.size(), 2u);
  ASSERT_TRUE(r.costs.backward_weight_seconds.has_value());
  expect_round_trip(r);

  // The typed fields themselves, against the report compare() made.
  const ValidationReport back = validation_report_from_json(to_json(r));
  EXPECT_EQ(back.memory[1].bytes, r.memory[1].bytes);
  EXPECT_EQ(back.memory_error[0].by_category, r.memory_error[0].by_category);
  EXPECT_EQ(back.in_gib, r.in_gib);
  ASSERT_EQ(back.measured_collectives.size(), 2u);
  EXPECT_EQ(back.measured_collectives[1].by_op.at("pp/send_recv").bytes, 2 * 4096);
  EXPECT_EQ(back.predicted_collectives[0].by_op.size(), r.predicted_collectives[0].by_op.size());
  EXPECT_EQ(back.collectives_error[0].by_op, r.collectives_error[0].by_op);
  EXPECT_EQ(back.estimate.memory.peak_bytes, e.memory.peak_bytes);
  EXPECT_EQ(back.simulated_step_seconds, r.simulated_step_seconds);
  EXPECT_EQ(back.skipped, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(back.time.step_seconds, r.time.step_seconds);
  EXPECT_EQ(to_table(back), to_table(r));
}

TEST(ValidationReportJson, ReadsBackAnEmulatedRankAndACudaRunAndTheAllocatorModel) {
  const Scenario s = two_stage("megatron");
  const Estimate e = sim::plan(s);
  Measurement m = measurement_of(s, e);
  m.ranks.erase(m.ranks.begin(), m.ranks.begin() + 3);  // rank 3 alone: stage 1
  ValidationSettings vs;
  vs.emulate_rank = 3;
  vs.device = "cuda";
  const ValidationReport r = compare(s, e, &m, "", vs);
  ASSERT_EQ(r.memory.size(), 1u);
  EXPECT_EQ(r.memory[0].stage, 1);
  ASSERT_TRUE(r.step_error.has_value());
  ASSERT_TRUE(r.memory_error[0].by_category.at("reserved").has_value());
  expect_round_trip(r);
  EXPECT_EQ(validation_report_from_json(to_json(r)).settings.emulate_rank, 3);
}

// A real model's report is in GiB (the table's unit): one rank of stage 0 of the default
// scenario (Llama-2-70B), its weights as planned.
TEST(ValidationReportJson, ReadsBackAReportInGiB) {
  const Scenario s = default_scenario();
  const Estimate e = sim::plan(s);
  Measurement m;
  RankMeasurement rank;
  rank.memory.peak[static_cast<int>(MemoryTag::weights)] = e.memory.stages[0].weights_bytes;
  rank.memory.peak_total = e.memory.stages[0].weights_bytes;
  rank.actions.push_back({{sim::Op::forward, 0, 0}, 0.5});
  rank.actions.push_back({{sim::Op::backward, 0, 0}, 1.0});
  rank.step_seconds = 4;
  m.ranks.push_back(rank);
  m.losses = {7.5};
  m.skipped = {false};
  ValidationSettings vs;
  vs.emulate_rank = 0;
  const ValidationReport r = compare(s, e, &m, "", vs);
  ASSERT_TRUE(r.in_gib);
  expect_round_trip(r);
  const ValidationReport back = validation_report_from_json(to_json(r));
  EXPECT_TRUE(back.in_gib);
  EXPECT_EQ(to_table(back), to_table(r));
}

TEST(ValidationReportJson, ReadsBackAnOutOfMemoryResult) {
  const Scenario s = two_stage();
  const ValidationReport r =
      compare(s, sim::plan(s), nullptr, "out of memory: 5 B > 4 B on stage 0", {});
  expect_round_trip(r);
  const ValidationReport back = validation_report_from_json(to_json(r));
  EXPECT_FALSE(back.fits);
  EXPECT_EQ(back.oom_message, "out of memory: 5 B > 4 B on stage 0");
}

// The oracle: the file the CLI wrote for a real 8-rank CPU run.
TEST(ValidationReportJson, ReadsBackTheCliResultExactly) {
  const json doc = read_fixture();
  const ValidationReport r = validation_report_from_json(doc);
  EXPECT_EQ(to_json(r), doc);
  EXPECT_EQ(r.ranks, 8);
  ASSERT_EQ(r.memory.size(), 2u);
  EXPECT_EQ(r.memory[1].bytes.at("weights"),
            doc["measured"]["memory"]["stages"][1]["weights_bytes"].get<Bytes>());
}

// Mutates a copy of `doc` and expects InputError at `path` with `reason` in its message.
template <class F>
void expect_refused(const json& doc, const std::string& path, const std::string& reason, F&& f) {
  json bad = doc;
  f(bad);
  try {
    (void)validation_report_from_json(bad);
    ADD_FAILURE() << "accepted; expected an error at " << path;
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), path) << e.what();
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

TEST(ValidationReportJson, BadInputIsRefusedAtItsPath) {
  const json doc = read_fixture();
  expect_refused(doc, "/measured/memory/stages/0/weights_bytes", "required",
                 [](json& d) { d["measured"]["memory"]["stages"][0].erase("weights_bytes"); });
  expect_refused(doc, "/measured/memory/stages/1/activations_bytes", "at least 0",
                 [](json& d) { d["measured"]["memory"]["stages"][1]["activations_bytes"] = -1; });
  expect_refused(doc, "/measured/time/step_seconds", "must be a number",
                 [](json& d) { d["measured"]["time"]["step_seconds"] = "fast"; });
  expect_refused(
      doc, "/relative_error/memory/stages/0/total_bytes", "must be a number",
      [](json& d) { d["relative_error"]["memory"]["stages"][0]["total_bytes"] = json::array(); });
  expect_refused(
      doc, "/measured/communication/stages/0/collectives/0/group", "must be a string",
      [](json& d) { d["measured"]["communication"]["stages"][0]["collectives"][0]["group"] = 1; });
  expect_refused(doc, "/measured/memory/peak", "unknown field",
                 [](json& d) { d["measured"]["memory"]["peak"] = 1; });
  expect_refused(doc, "/schema", "distplan.validate/v1",
                 [](json& d) { d["schema"] = "distplan.plan/v1"; });
  expect_refused(doc, "/scenario/parallel/tp", "tp",
                 [](json& d) { d["scenario"]["parallel"]["tp"] = 0; });
  expect_refused(doc, "/measured/memory/stages/1/stage", "follows stage",
                 [](json& d) { d["measured"]["memory"]["stages"][1]["stage"] = 0; });
  expect_refused(doc, "/relative_error/communication/stages",
                 "1 entries, where the measured communication has 2", [](json& d) {
                   auto& st = d["relative_error"]["communication"]["stages"];
                   st.erase(st.begin());
                 });
  expect_refused(doc, "", "must be an object", [](json& d) { d = json::array(); });
}

TEST(ValidationReportJson, AStalePredictedFigureIsRefusedAtItsPath) {
  const json doc = read_fixture();
  expect_refused(doc, "/predicted/memory/stages/0/weights_bytes", "recomputed from /scenario",
                 [](json& d) {
                   auto& w = d["predicted"]["memory"]["stages"][0]["weights_bytes"];
                   w = w.get<Bytes>() + 1;
                 });
  expect_refused(doc, "/predicted/time/simulated_step_seconds", "recomputed from /scenario",
                 [](json& d) {
                   auto& t = d["predicted"]["time"]["simulated_step_seconds"];
                   t = t.get<double>() * 1.001;
                 });
  expect_refused(doc, "/predicted/communication/stages/1/wire_bytes_per_gpu_per_step",
                 "recomputed from /scenario", [](json& d) {
                   auto& w =
                       d["predicted"]["communication"]["stages"][1]["wire_bytes_per_gpu_per_step"];
                   w = w.get<Bytes>() * 2;
                 });
  expect_refused(doc, "/ranks", "recomputed from /scenario", [](json& d) { d["ranks"] = 4; });
}

// Issue 29, item 8: a result edited to hold an absurd measured value kept its stored 0 % error
// and was shown so. The errors are recomputed from the measured and predicted figures: the
// stored one is refused where it differs, and a consistent edit shows the error it implies.
TEST(ValidationReportJson, AnEditedMeasurementIsNotShownWithItsStoredError) {
  const json doc = read_fixture();
  expect_refused(
      doc, "/relative_error/memory/stages/0/weights_bytes", "relative errors are recomputed",
      [](json& d) { d["measured"]["memory"]["stages"][0]["weights_bytes"] = Bytes{1} << 50; });
  expect_refused(doc, "/relative_error/time/simulated_step_seconds",
                 "relative errors are recomputed",
                 [](json& d) { d["measured"]["time"]["step_seconds"] = 1e9; });
  expect_refused(doc, "/relative_error/memory/peak_bytes", "relative errors are recomputed",
                 [](json& d) { d["relative_error"]["memory"]["peak_bytes"] = 0.0; });
  // The measured value with the error it implies is read, and shown with that error.
  json edited = doc;
  const Bytes planned = doc["predicted"]["memory"]["stages"][0]["weights_bytes"].get<Bytes>();
  edited["measured"]["memory"]["stages"][0]["weights_bytes"] = 3 * planned;
  edited["relative_error"]["memory"]["stages"][0]["weights_bytes"] = 2.0;
  const ValidationReport r = validation_report_from_json(edited);
  ASSERT_TRUE(r.memory_error[0].by_category.at("weights").has_value());
  EXPECT_DOUBLE_EQ(*r.memory_error[0].by_category.at("weights"), 2.0);
}

}  // namespace
}  // namespace distplan::backend
