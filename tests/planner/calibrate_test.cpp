// Calibration: runs generated from known assumptions are fitted back (from several starting
// points), the least-squares minimum on noisy runs matches an independent grid search, and
// under-determined or degenerate fits are refused naming the JSON path.
#include "distplan/planner/calibrate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distplan/planner/calibrate_json.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/simulator/plan.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

struct Layout {
  const char* model;
  const char* gpu;
  Count gpus, tp, pp;
  int zero;
  Count global_batch, seq;
  Count gpus_per_node = 8;
};

json scenario_doc(const Layout& l) {
  return {{"model", l.model},
          {"cluster", {{"gpu", l.gpu}, {"num_gpus", l.gpus}, {"gpus_per_node", l.gpus_per_node}}},
          {"training",
           {{"seq_length", l.seq}, {"global_batch_size", l.global_batch}, {"micro_batch_size", 1}}},
          {"parallel",
           {{"tp", l.tp},
            {"pp", l.pp},
            {"zero_stage", l.zero},
            {"sequence_parallel", l.tp > 1},
            {"recompute", "selective"}}}};
}

// Layouts over models, GPUs, node counts and tp/pp/dp/ZeRO: the share of communication in the
// step differs from one to the next, which is what separates the two efficiencies.
const std::vector<Layout> kLayouts = {
    {"llama2-7b", "h100-sxm-80gb", 8, 8, 1, 1, 64, 4096},
    {"llama2-7b", "h100-sxm-80gb", 16, 2, 1, 1, 64, 4096},
    {"gpt3-13b", "a100-80gb", 16, 4, 2, 1, 128, 2048},
    {"llama2-70b", "h100-sxm-80gb", 64, 8, 4, 1, 512, 4096},
    {"llama3.1-8b", "a100-40gb", 32, 2, 1, 3, 256, 2048, 4},
    {"gpt3-1.3b", "h100-sxm-80gb", 8, 1, 1, 0, 64, 2048},
    {"qwen2.5-7b", "h100-sxm-80gb", 32, 4, 2, 2, 256, 4096},
};

// Fits match the plan's step: the schedule walk (docs/calibration.md).
CalibrationOptions fit_options() {
  CalibrationOptions o;
  o.step_seconds = sim::plan_step_seconds;
  return o;
}

Assumptions truth() {
  Assumptions a;
  a.compute_efficiency = 0.43;
  a.communication_efficiency = 0.67;
  return a;
}

std::vector<CalibrationRun> runs_from(const std::vector<Layout>& layouts, const Assumptions& a,
                                      const std::vector<double>& noise = {}) {
  std::vector<CalibrationRun> runs;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    CalibrationRun r;
    r.scenario = testing::scenario(scenario_doc(layouts[i]));
    r.measured_step_seconds = predicted_step_seconds(sim::plan_step_seconds, r.scenario, a) *
                              (1.0 + (i < noise.size() ? noise[i] : 0.0));
    r.path = "/runs/" + std::to_string(i);
    r.measured_path = r.path + "/measured/step_seconds";
    runs.push_back(std::move(r));
  }
  return runs;
}

double value_of(const CalibrationResult& r, const std::string& name) {
  for (std::size_t j = 0; j < r.parameters.size(); ++j)
    if (r.parameters[j] == name) return r.values[j];
  ADD_FAILURE() << name << " was not fitted";
  return 0;
}

template <typename F>
void expect_refused(F&& f, const std::string& path, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), path) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

TEST(Calibrate, TableHasTheTimeAssumptionsWithinTheParserRange) {
  ASSERT_NE(find_fit_parameter("compute_efficiency"), nullptr);
  ASSERT_NE(find_fit_parameter("communication_efficiency"), nullptr);
  EXPECT_EQ(find_fit_parameter("zero3_prefetch_layers"), nullptr);
  for (const FitParameter& f : fit_parameters()) {
    EXPECT_GE(f.lower, 0) << f.name;
    EXPECT_LT(f.lower, f.upper) << f.name;
    EXPECT_LE(f.upper, 1) << f.name;
    EXPECT_FALSE(f.meaning.empty()) << f.name;
    // get/set reach the field the name says: the JSON echo of a scenario shows the value set.
    Scenario s = testing::scenario(testing::default_doc());
    const double inside = f.lower + 0.321 * (f.upper - f.lower);
    f.set(s.assumptions, inside);
    EXPECT_EQ(to_json(s).at("assumptions").at(std::string(f.name)).get<double>(), inside);
    EXPECT_EQ(f.get(s.assumptions), inside);
    // Both bounds are values the scenario parser accepts (a calibration file goes through it).
    for (double v : {f.lower, f.upper}) {
      json doc = testing::default_doc();
      doc["assumptions"][std::string(f.name)] = v;
      EXPECT_EQ(f.get(testing::scenario(doc).assumptions), v) << f.name;
    }
  }
  // The long form, for a field a member pointer cannot reach in one step.
  constexpr FitParameter by_lambdas{"compute_efficiency",
                                    [](const Assumptions& a) { return a.compute_efficiency; },
                                    [](Assumptions& a, double v) { a.compute_efficiency = v; },
                                    0.01,
                                    1.0,
                                    "test"};
  Assumptions a;
  by_lambdas.set(a, 0.25);
  EXPECT_EQ(a.compute_efficiency, 0.25);
}

TEST(Calibrate, RecoversKnownAssumptionsFromEveryStart) {
  const auto runs = runs_from(kLayouts, truth());
  for (const auto& [ce, cme] : std::vector<std::pair<double, double>>{
           {0.5, 0.8}, {0.1, 0.1}, {0.95, 0.95}, {0.9, 0.2}, {0.2, 0.99}}) {
    CalibrationOptions o = fit_options();
    o.start.compute_efficiency = ce;
    o.start.communication_efficiency = cme;
    const CalibrationResult r = calibrate(runs, o);
    SCOPED_TRACE(::testing::Message() << "start " << ce << ", " << cme);
    ASSERT_EQ(r.parameters.size(), 2u);
    // Noise-free runs: the minimum is the truth, to the solver's precision (far inside 1 %).
    EXPECT_NEAR(value_of(r, "compute_efficiency"), 0.43, 0.43 * 1e-6);
    EXPECT_NEAR(value_of(r, "communication_efficiency"), 0.67, 0.67 * 1e-6);
    EXPECT_LT(r.mape_after, 1e-7);
    ASSERT_TRUE(r.leave_one_out_mape.has_value()) << r.leave_one_out_note;
    EXPECT_LT(*r.leave_one_out_mape, 1e-6);
    EXPECT_GT(r.mape_before, 0.05);  // the shipped defaults are off from these runs
    EXPECT_TRUE(r.at_bound.empty());
  }
}

TEST(Calibrate, RecoversOtherTruthsOnEachLayoutSubset) {
  // Several truths, each fitted from the shipped defaults, over subsets of the layouts.
  for (const auto& [ce, cme] :
       std::vector<std::pair<double, double>>{{0.3, 0.9}, {0.62, 0.41}, {0.75, 0.55}}) {
    Assumptions t;
    t.compute_efficiency = ce;
    t.communication_efficiency = cme;
    for (std::size_t skip = 0; skip < kLayouts.size(); ++skip) {
      std::vector<Layout> some;
      for (std::size_t i = 0; i < kLayouts.size(); ++i)
        if (i != skip) some.push_back(kLayouts[i]);
      const CalibrationResult r = calibrate(runs_from(some, t), fit_options());
      EXPECT_NEAR(value_of(r, "compute_efficiency"), ce, ce * 1e-6);
      EXPECT_NEAR(value_of(r, "communication_efficiency"), cme, cme * 1e-6);
    }
  }
}

// Sum of squared relative residuals at (ce, cme).
double cost(const std::vector<CalibrationRun>& runs, double ce, double cme) {
  Assumptions a;
  a.compute_efficiency = ce;
  a.communication_efficiency = cme;
  double c = 0;
  for (const CalibrationRun& r : runs) {
    const double e =
        predicted_step_seconds(sim::plan_step_seconds, r.scenario, a) / r.measured_step_seconds - 1;
    c += e * e;
  }
  return c;
}

TEST(Calibrate, NoisyRunsReachTheLeastSquaresMinimumOfAGridSearch) {
  // ±3 % measurement noise: the fit is the least-squares minimum, found independently by a
  // refining grid search over the box.
  const auto runs = runs_from(kLayouts, truth(), {0.03, -0.02, 0.01, -0.03, 0.025, -0.01, 0.02});
  const CalibrationResult r = calibrate(runs, fit_options());
  double lo_c = 0.05, hi_c = 1.0, lo_m = 0.05, hi_m = 1.0;
  double best_c = 0, best_m = 0;
  for (int level = 0; level < 8; ++level) {
    double best = 1e300;
    constexpr int kN = 40;
    for (int i = 0; i <= kN; ++i) {
      for (int k = 0; k <= kN; ++k) {
        const double c = lo_c + (hi_c - lo_c) * i / kN, m = lo_m + (hi_m - lo_m) * k / kN;
        const double v = cost(runs, c, m);
        if (v < best) best = v, best_c = c, best_m = m;
      }
    }
    const double wc = (hi_c - lo_c) / kN * 2, wm = (hi_m - lo_m) / kN * 2;
    lo_c = std::max(0.001, best_c - wc), hi_c = std::min(1.0, best_c + wc);
    lo_m = std::max(0.001, best_m - wm), hi_m = std::min(1.0, best_m + wm);
  }
  EXPECT_NEAR(value_of(r, "compute_efficiency"), best_c, 1e-5);
  EXPECT_NEAR(value_of(r, "communication_efficiency"), best_m, 1e-5);
  EXPECT_LE(cost(runs, value_of(r, "compute_efficiency"), value_of(r, "communication_efficiency")),
            cost(runs, best_c, best_m) * (1 + 1e-9));
  // The noise stays: about its mean size, never below what the best fit can do.
  EXPECT_GT(r.mape_after, 0.005);
  EXPECT_LT(r.mape_after, 0.03);
  ASSERT_TRUE(r.leave_one_out_mape.has_value());
  EXPECT_GE(*r.leave_one_out_mape, r.mape_after);
}

TEST(Calibrate, FitsOnlyTheNamedParameter) {
  auto runs = runs_from(kLayouts, truth());
  // The runs' own communication_efficiency (the truth here) is kept; only compute is fitted.
  for (CalibrationRun& r : runs) r.scenario.assumptions.communication_efficiency = 0.67;
  CalibrationOptions o = fit_options();
  o.parameters = {"compute_efficiency"};
  const CalibrationResult r = calibrate(runs, o);
  ASSERT_EQ(r.parameters, std::vector<std::string>{"compute_efficiency"});
  EXPECT_NEAR(r.values[0], 0.43, 0.43 * 1e-6);
  const Assumptions applied = r.apply(Assumptions{});
  EXPECT_NEAR(applied.compute_efficiency, 0.43, 1e-6);
  EXPECT_EQ(applied.communication_efficiency, Assumptions{}.communication_efficiency);
}

TEST(Calibrate, LeaveOneOutIsBoundedAndNeedsASpareRun) {
  CalibrationOptions o = fit_options();
  o.max_leave_one_out_runs = 3;
  const CalibrationResult many = calibrate(runs_from(kLayouts, truth()), o);
  EXPECT_FALSE(many.leave_one_out_mape.has_value());
  EXPECT_NE(many.leave_one_out_note.find("more than 3 runs"), std::string::npos);
  // Two runs, two parameters: no run can be left out.
  const CalibrationResult two =
      calibrate(runs_from({kLayouts[0], kLayouts[5]}, truth()), fit_options());
  EXPECT_NEAR(value_of(two, "compute_efficiency"), 0.43, 0.43 * 1e-6);
  EXPECT_FALSE(two.leave_one_out_mape.has_value());
  EXPECT_NE(two.leave_one_out_note.find("at least 3 runs"), std::string::npos);
}

TEST(Calibrate, KeepsEachRunsOwnUnfittedAssumptions) {
  // Half the runs reduce gradients without overlap; their measurements were taken that way, so
  // the fit must predict them that way too.
  auto runs = runs_from(kLayouts, truth());
  bool changed = false;
  for (std::size_t i = 0; i < runs.size(); i += 2) {
    CalibrationRun& r = runs[i];
    r.scenario.assumptions.overlap_grad_reduce = false;
    Assumptions a = r.scenario.assumptions;
    a.compute_efficiency = 0.43;
    a.communication_efficiency = 0.67;
    const double t = predicted_step_seconds(sim::plan_step_seconds, r.scenario, a);
    changed = changed || t != r.measured_step_seconds;
    r.measured_step_seconds = t;
  }
  ASSERT_TRUE(changed);  // the flag matters for these layouts
  const CalibrationResult r = calibrate(runs, fit_options());
  EXPECT_NEAR(value_of(r, "compute_efficiency"), 0.43, 0.43 * 1e-6);
  EXPECT_NEAR(value_of(r, "communication_efficiency"), 0.67, 0.67 * 1e-6);
}

TEST(Calibrate, DefaultSelectionLeavesOutWhatTheRunsDoNotTouch) {
  // One GPU per run: no collective, so communication_efficiency is not fitted.
  const std::vector<Layout> single = {{"gpt3-1.3b", "h100-sxm-80gb", 1, 1, 1, 0, 8, 2048},
                                      {"llama2-7b", "a100-80gb", 1, 1, 1, 0, 4, 1024}};
  const CalibrationResult r = calibrate(runs_from(single, truth()), fit_options());
  ASSERT_EQ(r.parameters, std::vector<std::string>{"compute_efficiency"});
  EXPECT_NEAR(r.values[0], 0.43, 0.43 * 1e-6);
  // Besides the entries fitted only when named, communication_efficiency is left out.
  std::vector<std::string> left_out;
  for (const NotFitted& n : r.not_fitted) {
    if (!find_fit_parameter(n.name)->by_default) continue;
    left_out.push_back(n.name);
  }
  EXPECT_EQ(left_out, std::vector<std::string>{"communication_efficiency"});
}

TEST(Calibrate, RefusesAParameterNoRunDependsOn) {
  const std::vector<Layout> single = {{"gpt3-1.3b", "h100-sxm-80gb", 1, 1, 1, 0, 8, 2048},
                                      {"llama2-7b", "a100-80gb", 1, 1, 1, 0, 4, 1024},
                                      {"gpt3-13b", "a100-80gb", 1, 1, 1, 0, 4, 2048}};
  CalibrationOptions o = fit_options();
  o.parameters = {"compute_efficiency", "communication_efficiency"};
  expect_refused([&] { (void)calibrate(runs_from(single, truth()), o); }, "/runs",
                 "no run's predicted step time depends on communication_efficiency");
}

// The work bound (CalibrationOptions::max_total_passes) is checked before any run is planned:
// one pass under the runs' total refuses naming the run with the most passes, and nothing was
// planned; at the total the fit runs.
TEST(Calibrate, RefusesRunsOverThePassBoundBeforePlanning) {
  const auto runs = runs_from(kLayouts, truth());
  double total = 0, most = -1;
  std::string worst;
  for (const CalibrationRun& r : runs) {
    const Scenario& s = r.scenario;
    const double passes = static_cast<double>(s.training.global_batch_size /
                                              (s.training.micro_batch_size * s.parallel.dp)) *
                          static_cast<double>(s.parallel.pp * s.parallel.virtual_stages);
    total += passes;
    if (passes > most) most = passes, worst = r.path;
  }
  int plans = 0;
  CalibrationOptions o = fit_options();
  o.step_seconds = [&plans](const Scenario& s) {
    ++plans;
    return sim::plan_step_seconds(s);
  };
  o.leave_one_out = false;
  o.max_total_passes = total - 1;
  expect_refused([&] { (void)calibrate(runs, o); }, worst, "pipeline passes in all");
  EXPECT_EQ(plans, 0);
  o.max_total_passes = total;
  EXPECT_NEAR(value_of(calibrate(runs, o), "compute_efficiency"), 0.43, 0.43 * 1e-6);
  EXPECT_GT(plans, 0);
}

TEST(Calibrate, RefusesFewerRunsThanParameters) {
  const auto runs = runs_from({kLayouts[0]}, truth());
  expect_refused([&] { (void)calibrate(runs, fit_options()); }, "/runs",
                 "1 run cannot determine 2");
}

TEST(Calibrate, RefusesConfoundedParameters) {
  // One layout at several batch sizes: compute and TP communication scale together, so the runs
  // cannot tell the two efficiencies apart.
  std::vector<Layout> same;
  for (Count b : {64, 128, 256, 512})
    same.push_back({"llama2-7b", "h100-sxm-80gb", 8, 8, 1, 1, b, 4096});
  expect_refused([&] { (void)calibrate(runs_from(same, truth()), fit_options()); }, "/runs",
                 "cannot tell compute_efficiency and communication_efficiency apart");
}

TEST(Calibrate, RefusesNonPositiveMeasurementsAndUnknownNames) {
  auto runs = runs_from(kLayouts, truth());
  runs[3].measured_step_seconds = 0;
  expect_refused([&] { (void)calibrate(runs, fit_options()); }, "/runs/3/measured/step_seconds",
                 "positive");
  runs[3].measured_step_seconds = 1;
  CalibrationOptions o = fit_options();
  o.parameters = {"compute_eficiency"};
  expect_refused([&] { (void)calibrate(runs, o); }, "", "not a fittable assumption");
  expect_refused([&] { (void)calibrate({}, fit_options()); }, "/runs", "no runs");
}

TEST(Calibrate, KeepsFittedValuesInsideTheBounds) {
  // Runs faster than the GPUs' peak allows: compute_efficiency wants to exceed 1 and stops there.
  Assumptions fast = truth();
  auto runs = runs_from(kLayouts, fast);
  for (CalibrationRun& r : runs) {
    Assumptions a = truth();
    a.compute_efficiency = 1.0;
    r.measured_step_seconds = predicted_step_seconds(sim::plan_step_seconds, r.scenario, a) * 0.8;
  }
  const CalibrationResult r = calibrate(runs, fit_options());
  EXPECT_LE(value_of(r, "compute_efficiency"), 1.0);
  EXPECT_GT(value_of(r, "compute_efficiency"), 0.999);
  // Every speed-up the runs can use ends on its bound (with the schedule walk, communication
  // that is exposed shortens with communication_efficiency too), never past it.
  EXPECT_NE(std::find(r.at_bound.begin(), r.at_bound.end(), "compute_efficiency"),
            r.at_bound.end());
  for (std::size_t j = 0; j < r.parameters.size(); ++j) {
    const FitParameter* f = find_fit_parameter(r.parameters[j]);
    ASSERT_NE(f, nullptr);
    EXPECT_LE(r.values[j], f->upper) << r.parameters[j];
    EXPECT_GE(r.values[j], f->lower) << r.parameters[j];
  }
}

// ---- JSON ------------------------------------------------------------------------------------

json runs_doc(const std::vector<Layout>& layouts, const Assumptions& a, bool as_tokens) {
  json runs = json::array();
  for (const Layout& l : layouts) {
    const json sc = scenario_doc(l);
    const Scenario s = testing::scenario(sc);
    const double step = predicted_step_seconds(sim::plan_step_seconds, s, a);
    const double tokens = static_cast<double>(l.global_batch * l.seq);
    runs.push_back({{"scenario", sc},
                    {"measured", as_tokens ? json{{"tokens_per_second", tokens / step}}
                                           : json{{"step_seconds", step}}}});
  }
  return {{"runs", runs}};
}

TEST(CalibrateJson, TokensPerSecondIsTheSameMeasurement) {
  const auto a = calibration_runs_from_json(runs_doc(kLayouts, truth(), false));
  const auto b = calibration_runs_from_json(runs_doc(kLayouts, truth(), true));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i].measured_step_seconds, a[i].measured_step_seconds,
                a[i].measured_step_seconds * 1e-14);
    EXPECT_EQ(b[i].measured_path, "/runs/" + std::to_string(i) + "/measured/tokens_per_second");
  }
  const CalibrationResult ra = calibrate(a, fit_options()), rb = calibrate(b, fit_options());
  for (std::size_t j = 0; j < ra.values.size(); ++j) EXPECT_NEAR(ra.values[j], rb.values[j], 1e-9);
}

TEST(CalibrateJson, NamesTheFieldOfBadRuns) {
  json doc = runs_doc(kLayouts, truth(), false);
  auto refused = [](const json& d, const std::string& path, const std::string& needle) {
    expect_refused([&] { (void)calibration_runs_from_json(d); }, path, needle);
  };
  json d = doc;
  d["runs"][3]["measured"]["step_seconds"] = 0;
  refused(d, "/runs/3/measured/step_seconds", "step_seconds");
  d = doc;
  d["runs"][1]["measured"] = {{"tokens_per_second", -5}};
  refused(d, "/runs/1/measured/tokens_per_second", "tokens_per_second");
  d = doc;
  d["runs"][2]["measured"]["tokens_per_second"] = 100;
  refused(d, "/runs/2/measured/tokens_per_second", "not both");
  d = doc;
  d["runs"][2]["measured"] = json::object();
  refused(d, "/runs/2/measured", "step_seconds or tokens_per_second");
  d = doc;
  d["runs"][4]["scenario"]["parallel"]["tp"] = 0;
  refused(d, "/runs/4/scenario/parallel/tp", "at least 1");
  d = doc;
  d["runs"][0].erase("scenario");
  refused(d, "/runs/0/scenario", "scenario");
  d = doc;
  d["runs"][0]["measure"] = 1;
  refused(d, "/runs/0/measure", "unknown field");
  refused(json{{"runs", json::array()}}, "/runs", "no runs");
  refused(json{{"run", 1}}, "/run", "unknown field");
}

json validate_doc(const Scenario& s, double step, const std::string& device) {
  const Estimate e = sim::plan(s);
  const json plan = plan_to_json(s, e);
  // The fields `distplan validate` writes (cli/src/cmd_validate.cpp, docs/api.md).
  return {{"schema", "distplan.validate/v1"},
          {"scenario", to_json(s)},
          {"device", device},
          {"steps", 3},
          {"ranks", s.parallel.tp * s.parallel.pp * s.parallel.dp},
          {"emulate_rank", nullptr},
          {"predicted", {{"memory", plan.at("memory")}, {"time", plan.at("time")}}},
          {"measured",
           {{"memory", {{"fits", true}, {"peak_bytes", 1}}},
            {"time",
             {{"step_seconds", step},
              {"compute_seconds", step * 0.9},
              {"bubble_fraction", 0.0},
              {"optimizer_seconds", 0.01}}}}},
          {"relative_error", json::object()},
          {"losses", {10.1, 10.0, 9.9}},
          {"skipped_steps", 0}};
}

TEST(CalibrateJson, AcceptsValidateResults) {
  std::vector<json> runs;
  json mixed = runs_doc(kLayouts, truth(), false);
  for (std::size_t i : {0u, 3u}) {
    const Scenario s = testing::scenario(scenario_doc(kLayouts[i]));
    mixed["runs"][i] =
        validate_doc(s, predicted_step_seconds(sim::plan_step_seconds, s, truth()), "cuda");
  }
  const auto parsed = calibration_runs_from_json(mixed);
  EXPECT_EQ(parsed[3].measured_path, "/runs/3/measured/time/step_seconds");
  EXPECT_EQ(parsed[3].scenario, testing::scenario(scenario_doc(kLayouts[3])));
  const CalibrationResult r = calibrate(parsed, fit_options());
  EXPECT_NEAR(value_of(r, "compute_efficiency"), 0.43, 0.43 * 1e-6);
  EXPECT_NEAR(value_of(r, "communication_efficiency"), 0.67, 0.67 * 1e-6);

  // A whole file that is one validate result is one run.
  const Scenario s = testing::scenario(scenario_doc(kLayouts[0]));
  const auto one = calibration_runs_from_json(validate_doc(s, 0.5, "cuda"));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].measured_step_seconds, 0.5);
  EXPECT_EQ(one[0].measured_path, "/measured/time/step_seconds");

  // CPU runs, emulated ranks and runs out of memory time nothing the planner predicts.
  json d = mixed;
  d["runs"][3]["device"] = "cpu";
  expect_refused([&] { (void)calibration_runs_from_json(d); }, "/runs/3/device", "cuda");
  d = mixed;
  d["runs"][3]["emulate_rank"] = 0;
  expect_refused([&] { (void)calibration_runs_from_json(d); }, "/runs/3/emulate_rank", "emulated");
  d = mixed;
  d["runs"][0]["measured"] = {{"memory", {{"fits", false}, {"message", "oom"}}}};
  expect_refused([&] { (void)calibration_runs_from_json(d); }, "/runs/0/measured/memory/fits",
                 "did not fit");
  d = mixed;
  d["runs"][0]["measured"]["time"]["step_seconds"] = -1;
  expect_refused([&] { (void)calibration_runs_from_json(d); }, "/runs/0/measured/time/step_seconds",
                 "step_seconds");
}

TEST(CalibrateJson, CalibrationFileOverridesTheScenario) {
  const auto runs = runs_from(kLayouts, truth());
  const CalibrationResult r = calibrate(runs, fit_options());
  const json out = calibration_to_json(r, runs);
  EXPECT_EQ(out.at("schema"), "distplan.calibration/v1");
  EXPECT_EQ(out.at("fit").at("runs"), kLayouts.size());
  EXPECT_EQ(out.at("fit").at("parameters").size(), 2u);
  for (const char* k : {"mape_before", "mape_after", "leave_one_out_mape"})
    EXPECT_TRUE(out.at("fit").at(k).is_number()) << k;

  // Round trip: the file's values over a scenario that says otherwise give the fitted time.
  const auto values = calibration_from_json(json::parse(out.dump()));
  ASSERT_EQ(values.size(), 2u);
  json doc = scenario_doc(kLayouts[3]);
  doc["assumptions"] = {{"compute_efficiency", 0.9}, {"zero3_prefetch_layers", 2}};
  apply_calibration(doc, values);
  const Scenario s = testing::scenario(doc);
  EXPECT_EQ(s.assumptions.zero3_prefetch_layers, 2);  // fields the file does not name stay
  EXPECT_NEAR(sim::plan_step_seconds(s), runs[3].measured_step_seconds,
              runs[3].measured_step_seconds * 1e-7);

  json bad = out;
  bad["assumptions"]["compute_efficiency"] = 1.5;
  expect_refused([&] { (void)calibration_from_json(bad); }, "/assumptions/compute_efficiency",
                 "at most");
  bad = out;
  bad["assumptions"]["overlap_grad_reduce"] = false;
  expect_refused([&] { (void)calibration_from_json(bad); }, "/assumptions/overlap_grad_reduce",
                 "unknown field");
  bad = out;
  bad["schema"] = "distplan.plan/v1";
  expect_refused([&] { (void)calibration_from_json(bad); }, "/schema", "distplan.calibration/v1");
}

}  // namespace
}  // namespace distplan
