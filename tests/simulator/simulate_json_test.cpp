// The simulate document, the costs object and the trace, including a golden trace.
#include "distplan/simulator/simulate_json.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "sim_fixtures.h"

namespace distplan::sim {
namespace {

using testing::pipeline;
using testing::uniform_estimate;
using testing::with_costs;

std::string error_path(const nlohmann::json& j) {
  try {
    (void)cost_override_from_json(j);
  } catch (const InputError& e) {
    return e.path();
  }
  return "<no error>";
}

TEST(CostsJson, ParsesAllFields) {
  const CostOverride c = cost_override_from_json(nlohmann::json::parse(
      R"({"forward_seconds": 1.0, "backward_seconds": 2, "backward_weight_seconds": 0.5,
          "p2p_seconds": 0.125})"));
  EXPECT_EQ(c, (CostOverride{1.0, 2.0, 0.5, 0.125, std::nullopt}));
  EXPECT_FALSE(cost_override_from_json(nlohmann::json::parse(R"({"forward_seconds": 1})"))
                   .backward_weight_seconds.has_value());
}

TEST(CostsJson, RejectsUnknownNegativeAndWrongTypes) {
  EXPECT_EQ(error_path(nlohmann::json::parse(R"({"forward_sec": 1})")), "/costs/forward_sec");
  EXPECT_EQ(error_path(nlohmann::json::parse(R"({"backward_seconds": -1})")),
            "/costs/backward_seconds");
  EXPECT_EQ(error_path(nlohmann::json::parse(R"({"p2p_seconds": "fast"})")), "/costs/p2p_seconds");
  EXPECT_EQ(error_path(nlohmann::json::parse(R"([1, 2])")), "/costs");
}

TEST(SimulateJson, HasTheContractFields) {
  const Scenario s = pipeline(2, 4, Schedule::one_f_one_b);
  const SimResult r = simulate(s, uniform_estimate(2, 1000), with_costs(1, 2));
  const nlohmann::json j = simulate_to_json(s, r);
  EXPECT_EQ(j.at("schema"), "distplan.simulate/v1");
  EXPECT_TRUE(j.at("scenario").is_object());
  EXPECT_DOUBLE_EQ(j.at("step_seconds").get<double>(), r.step_seconds);
  EXPECT_DOUBLE_EQ(j.at("bubble_fraction").get<double>(), r.bubble_fraction);
  EXPECT_TRUE(j.at("exposed_communication_seconds").is_number());
  ASSERT_EQ(j.at("stages").size(), 2u);
  for (const char* k : {"busy_seconds", "peak_inflight_microbatches", "peak_activation_bytes"})
    EXPECT_TRUE(j.at("stages")[0].contains(k)) << k;
  EXPECT_EQ(j.at("stages")[0].at("peak_activation_bytes").get<Bytes>(), 2000);
}

TEST(SimulateTrace, IsChromeTraceJsonWithNamedTracks) {
  SimOptions o = with_costs(1, 2, std::nullopt, 0.5);
  o.record_trace = true;
  const SimResult r = simulate(pipeline(2, 2, Schedule::one_f_one_b), uniform_estimate(2, 10), o);
  const nlohmann::json t = nlohmann::json::parse(trace_to_json(r));
  std::size_t slices = 0, names = 0;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("ph") == "X") {
      ++slices;
      EXPECT_GE(e.at("dur").get<double>(), 0);
      EXPECT_TRUE(e.at("args").contains("kind"));
    }
    if (e.at("ph") == "M" && e.at("name") == "thread_name") ++names;
  }
  EXPECT_EQ(slices, r.trace.size());
  EXPECT_EQ(names, 2u * 5u);  // five streams per stage
  // A forward slice on stage 1 names its micro-batch and chunk and is in microseconds.
  bool found = false;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("name") == "Fmb1 c0" && e.at("pid") == 1) {
      found = true;
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 1e6);
    }
  EXPECT_TRUE(found);
}

// The streamed trace (TraceWriter as the simulation's sink, nothing stored) holds the same events
// as the trace built from a stored run, a second path through the simulator: ZB-H1 over 4 stages
// (F, B and W slices, sends both ways, the activation counter).
TEST(SimulateTrace, StreamedTraceHoldsTheStoredTracesEvents) {
  SimOptions stored = with_costs(1, 2, 0.5, 0.25);
  stored.record_trace = true;
  const Scenario s = pipeline(4, 8, Schedule::zb_h1);
  const Estimate e = uniform_estimate(4, 1000);
  const SimResult a = simulate(s, e, stored);
  std::ostringstream out;
  TraceWriter w(out, "memory stream", 4);
  SimOptions streamed = stored;
  streamed.trace_sink = &w;
  const SimResult b = simulate(s, e, streamed);
  w.finish(b);
  EXPECT_TRUE(b.trace.empty());
  EXPECT_TRUE(b.memory.empty());
  EXPECT_EQ(b.step_seconds, a.step_seconds);
  const nlohmann::json ta = nlohmann::json::parse(trace_to_json(a));
  const nlohmann::json tb = nlohmann::json::parse(out.str());
  std::multiset<std::string> ea, eb;
  for (const auto& x : ta.at("traceEvents")) ea.insert(x.dump());
  for (const auto& x : tb.at("traceEvents")) eb.insert(x.dump());
  EXPECT_EQ(ea.size(), a.trace.size() + a.memory.size() + 4 * (2 + 2 * 5));
  EXPECT_EQ(ea, eb);
  EXPECT_EQ(ta.at("otherData"), tb.at("otherData"));
}

// A trace that cannot be written is an error naming the file, not a silently short trace.
TEST(SimulateTrace, FailedWriteThrowsNamingTheFile) {
  std::ofstream full("/dev/full", std::ios::binary);
  if (!full) GTEST_SKIP() << "no /dev/full";
  SimOptions o = with_costs(1, 2, std::nullopt, 0.5);
  o.record_trace = true;
  TraceWriter w(full, "/dev/full", 2);
  o.trace_sink = &w;
  const SimResult r = simulate(pipeline(2, 4, Schedule::one_f_one_b), uniform_estimate(2, 10), o);
  try {
    w.finish(r);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& err) {
    EXPECT_NE(std::string(err.what()).find("/dev/full"), std::string::npos) << err.what();
  }
}

// A bounded writer stops at its limit: the same ZB-H1 step whose unbounded trace is N bytes
// throws TraceTooLarge under a limit of N / 2, having held no more than the limit, and writes
// it whole under a limit of N + 1 KiB (the closing fields are not counted against it).
TEST(SimulateTrace, BoundedWriterStopsAtItsLimit) {
  SimOptions o = with_costs(1, 2, 0.5, 0.25);
  o.record_trace = true;
  const Scenario s = pipeline(4, 8, Schedule::zb_h1);
  const Estimate e = uniform_estimate(4, 1000);
  std::ostringstream whole;
  TraceWriter unbounded(whole, "whole", 4);
  o.trace_sink = &unbounded;
  unbounded.finish(simulate(s, e, o));
  const auto n = static_cast<std::uint64_t>(whole.str().size());
  ASSERT_GT(n, 4096u);

  std::ostringstream half;
  TraceWriter bounded(half, "half", 4, n / 2);
  o.trace_sink = &bounded;
  EXPECT_THROW((void)simulate(s, e, o), TraceTooLarge);
  EXPECT_LE(bounded.bytes(), n / 2);
  EXPECT_GT(bounded.bytes(), n / 4);  // it wrote up to the limit, not nothing

  std::ostringstream roomy;
  TraceWriter enough(roomy, "roomy", 4, n + 1024);
  o.trace_sink = &enough;
  enough.finish(simulate(s, e, o));
  EXPECT_EQ(roomy.str(), whole.str());
}

// Golden trace: 1F1B, p = 2, m = 3, F = 0.5 s, B = 1 s, sends 0.25 s (binary fractions, so every
// time is exact). Regenerate with DISTPLAN_UPDATE_GOLDEN=1 after an intended change, and review
// the diff. The step is 7 s, derived by hand in docs/simulator.md ("Golden trace"): unlike GPipe,
// 1F1B's steady phase waits for a gradient round trip, so sends add more than 2(p - 1)c.
TEST(SimulateTrace, MatchesTheGoldenTrace) {
  SimOptions o = with_costs(0.5, 1.0, std::nullopt, 0.25);
  o.record_trace = true;
  const SimResult r =
      simulate(pipeline(2, 3, Schedule::one_f_one_b), uniform_estimate(2, 1 << 20), o);
  EXPECT_DOUBLE_EQ(r.step_seconds, 7.0);
  const std::string text = trace_to_json(r);
  const std::string path =
      std::string(DISTPLAN_SOURCE_DIR) + "/tests/simulator/golden/trace_1f1b_p2_m3.json";
  if (std::getenv("DISTPLAN_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path) << text;
  }
  std::ifstream f(path);
  ASSERT_TRUE(f) << "missing golden file " << path;
  std::stringstream golden;
  golden << f.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(text), nlohmann::json::parse(golden.str()));
}

TEST(SimulateTable, LabelsUnits) {
  const Scenario s = pipeline(2, 4, Schedule::gpipe);
  const std::string t =
      format_simulate_table(s, simulate(s, uniform_estimate(2, 1 << 30), with_costs(0.001, 0.002)));
  EXPECT_NE(t.find("step time"), std::string::npos);
  EXPECT_NE(t.find(" ms"), std::string::npos);
  EXPECT_NE(t.find("GiB"), std::string::npos);
}

}  // namespace
}  // namespace distplan::sim
