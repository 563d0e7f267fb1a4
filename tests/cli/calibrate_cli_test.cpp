// `distplan calibrate` end to end: runs timed by `distplan plan` under known assumptions are fitted
// back; the calibration file given to plan, simulate and search acts exactly as those assumptions
// written into the scenario; bad runs and degenerate fits exit 2 with the JSON error object.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

constexpr double kCompute = 0.43, kComm = 0.67;

json scenario(const char* model, const char* gpu, int gpus, int tp, int pp, int zero, int batch,
              int seq) {
  return {{"model", model},
          {"cluster", {{"gpu", gpu}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
          {"training", {{"seq_length", seq}, {"global_batch_size", batch}}},
          {"parallel",
           {{"tp", tp},
            {"pp", pp},
            {"zero_stage", zero},
            {"sequence_parallel", tp > 1},
            {"recompute", "selective"}}}};
}

std::vector<json> scenarios() {
  return {scenario("llama2-7b", "h100-sxm-80gb", 8, 8, 1, 1, 64, 4096),
          scenario("gpt3-13b", "a100-80gb", 16, 4, 2, 1, 128, 2048),
          scenario("llama2-70b", "h100-sxm-80gb", 64, 8, 4, 1, 512, 4096),
          scenario("gpt3-1.3b", "h100-sxm-80gb", 8, 1, 1, 0, 64, 2048),
          scenario("llama2-13b", "a100-40gb", 32, 2, 2, 1, 256, 4096)};
}

json plan(const TempDir& dir, const json& doc, const std::vector<std::string>& extra = {}) {
  const auto file = dir.write("plan_in.json", doc.dump());
  std::vector<std::string> args = {"plan", file.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

// The measured runs: each scenario's step time from `distplan plan` with the known assumptions.
json runs_doc(const TempDir& dir) {
  json runs = json::array();
  for (json s : scenarios()) {
    json timed = s;
    timed["assumptions"] = {{"compute_efficiency", kCompute}, {"communication_efficiency", kComm}};
    const double step = plan(dir, timed).at("time").at("step_seconds").get<double>();
    runs.push_back({{"scenario", s}, {"measured", {{"step_seconds", step}}}});
  }
  return {{"runs", runs}};
}

void expect_input_error(const CliResult& r, const std::string& path, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const json e = json::parse(r.err).at("error");
  EXPECT_EQ(e.at("code"), "invalid_input");
  EXPECT_EQ(e.at("path"), path) << e.dump();
  EXPECT_NE(e.at("message").get<std::string>().find(needle), std::string::npos) << e.dump();
}

TEST(CalibrateCli, FitsRunsAndRoundTripsThroughPlanSimulateAndSearch) {
  TempDir dir;
  const json runs = runs_doc(dir);
  const auto runs_file = dir.write("runs.json", runs.dump());
  const CliResult c = run_cli({"calibrate", runs_file.string()});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const json cal = json::parse(c.out);
  EXPECT_EQ(cal.at("schema"), "distplan.calibration/v1");
  const double ce = cal.at("assumptions").at("compute_efficiency").get<double>();
  const double cme = cal.at("assumptions").at("communication_efficiency").get<double>();
  EXPECT_NEAR(ce, kCompute, kCompute * 1e-6);
  EXPECT_NEAR(cme, kComm, kComm * 1e-6);
  EXPECT_EQ(cal.at("fit").at("runs"), 5);
  EXPECT_LT(cal.at("fit").at("mape_after").get<double>(), 1e-7);
  EXPECT_LT(cal.at("fit").at("leave_one_out_mape").get<double>(), 1e-6);
  EXPECT_GT(cal.at("fit").at("mape_before").get<double>(), 0.05);
  const auto cal_file = dir.write("calibration.json", c.out);

  // plan --calibration over a scenario that says otherwise: the measured step time.
  for (std::size_t i = 0; i < runs.at("runs").size(); ++i) {
    json s = runs.at("runs")[i].at("scenario");
    s["assumptions"] = {{"compute_efficiency", 0.9}, {"communication_efficiency", 0.1}};
    const double measured = runs.at("runs")[i].at("measured").at("step_seconds").get<double>();
    const double step =
        plan(dir, s, {"--calibration", cal_file.string()}).at("time").at("step_seconds");
    EXPECT_NEAR(step, measured, measured * 1e-7) << i;
  }

  // simulate and search: --calibration is the same as the fitted values in the scenario.
  json fitted = scenarios()[2];
  fitted["assumptions"] = {{"compute_efficiency", ce}, {"communication_efficiency", cme}};
  const auto plain_file = dir.write("plain.json", scenarios()[2].dump());
  const auto fitted_file = dir.write("fitted.json", fitted.dump());
  const CliResult s1 =
      run_cli({"simulate", plain_file.string(), "--calibration", cal_file.string()});
  const CliResult s2 = run_cli({"simulate", fitted_file.string()});
  if (s2.exit_code == 0) {  // builds without the simulator have no `simulate`
    ASSERT_EQ(s1.exit_code, 0) << s1.err;
    // The same document, plus the calibration it applied: its file and the values it set.
    json calibrated = json::parse(s1.out);
    const json named = {{"file", cal_file.string()}, {"assumptions", cal.at("assumptions")}};
    EXPECT_EQ(calibrated.at("calibration"), named);
    calibrated.erase("calibration");
    EXPECT_EQ(calibrated, json::parse(s2.out));
    EXPECT_FALSE(json::parse(s2.out).contains("calibration"));
  }
  json search = scenarios()[3];
  search.erase("parallel");
  json search_fitted = search;
  search_fitted["assumptions"] = fitted["assumptions"];
  const auto q1 = dir.write("q1.json", search.dump());
  const auto q2 = dir.write("q2.json", search_fitted.dump());
  const CliResult r1 = run_cli(
      {"search", q1.string(), "--threads", "1", "--quiet", "--calibration", cal_file.string()});
  const CliResult r2 = run_cli({"search", q2.string(), "--threads", "1", "--quiet"});
  if (r2.exit_code == 0) {
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    EXPECT_EQ(json::parse(r1.out).at("plans"), json::parse(r2.out).at("plans"));
    EXPECT_EQ(json::parse(r1.out).at("calibration").at("file"), cal_file.string());
  }
  // Every output the calibration changed names it; plan's JSON and every table too.
  const auto plan_file = dir.write("p.json", scenarios()[2].dump());
  EXPECT_EQ(plan(dir, scenarios()[2], {"--calibration", cal_file.string()}).at("calibration"),
            json({{"file", cal_file.string()}, {"assumptions", cal.at("assumptions")}}));
  for (const std::string command : {"plan", "simulate", "search"}) {
    std::vector<std::string> args = {
        command,         command == "search" ? q1.string() : plan_file.string(),
        "--format",      "table",
        "--calibration", cal_file.string()};
    if (command == "search") args.push_back("--quiet");
    const CliResult table = run_cli(args);
    if (table.exit_code != 0 && command != "plan") continue;  // a build without the module
    ASSERT_EQ(table.exit_code, 0) << command << ": " << table.err;
    EXPECT_EQ(
        table.out.rfind("calibration: " + cal_file.string() + " applied (compute_efficiency ", 0),
        0u)
        << command << ": " << table.out.substr(0, 200);
  }

  // The table for people.
  const CliResult t = run_cli({"calibrate", runs_file.string(), "--format", "table"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("compute_efficiency"), std::string::npos);
  EXPECT_NE(t.out.find("MAPE before"), std::string::npos);
  // Five runs, two parameters: a fit that could have missed.
  EXPECT_EQ(t.out.find("exact by construction"), std::string::npos);
  EXPECT_EQ(cal.at("fit").at("exact_by_construction"), false);
}

// As many parameters as runs fit every run whatever the model: flagged, in JSON and table, so a
// 0.00 % after the fit is not read as accuracy.
TEST(CalibrateCli, AsManyParametersAsRunsIsFlaggedExactByConstruction) {
  TempDir dir;
  json runs = runs_doc(dir);
  runs["runs"] = json::array({runs["runs"][0], runs["runs"][2]});
  const auto file = dir.write("two.json", runs.dump());
  const CliResult j = run_cli({"calibrate", file.string()});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const json fit = json::parse(j.out).at("fit");
  ASSERT_EQ(fit.at("parameters").size(), 2u);
  EXPECT_EQ(fit.at("exact_by_construction"), true);
  const CliResult t = run_cli({"calibrate", file.string(), "--format", "table"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("note: exact by construction: 2 parameters fitted to 2 runs"),
            std::string::npos)
      << t.out;
  // One parameter on the same two runs can miss: not flagged.
  const CliResult one = run_cli({"calibrate", file.string(), "--fit", "compute_efficiency"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(json::parse(one.out).at("fit").at("exact_by_construction"), false);
}

TEST(CalibrateCli, TokensPerSecondValidateResultsAndSeveralFiles) {
  TempDir dir;
  json runs = runs_doc(dir);
  // Run 1 given as tokens per second, run 2 as a validate result measured on cuda.
  json& r1 = runs["runs"][1];
  const double tokens = 128.0 * 2048.0;
  r1["measured"] = {
      {"tokens_per_second", tokens / r1.at("measured").at("step_seconds").get<double>()}};
  const json p2 = plan(dir, runs["runs"][2].at("scenario"));
  const double step2 = runs["runs"][2].at("measured").at("step_seconds").get<double>();
  // The run was made with the known communication efficiency: its scenario says so.
  json p2_scenario = p2.at("scenario");
  p2_scenario["assumptions"]["communication_efficiency"] = kComm;
  const json validate = {{"schema", "distplan.validate/v1"},
                         {"scenario", p2_scenario},
                         {"device", "cuda"},
                         {"steps", 3},
                         {"emulate_rank", nullptr},
                         {"predicted", {{"time", p2.at("time")}}},
                         {"measured",
                          {{"memory", {{"fits", true}}},
                           {"time", {{"step_seconds", step2}, {"optimizer_seconds", 0.1}}}}},
                         {"losses", {11.0, 10.9, 10.8}}};
  runs["runs"].erase(2);
  const auto a = dir.write("a.json", runs.dump());
  const auto v = dir.write("validate.json", validate.dump());
  const CliResult c = run_cli({"calibrate", a.string(), v.string()});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const json cal = json::parse(c.out);
  EXPECT_NEAR(cal.at("assumptions").at("compute_efficiency").get<double>(), kCompute, 1e-6);
  EXPECT_NEAR(cal.at("assumptions").at("communication_efficiency").get<double>(), kComm, 1e-6);
  EXPECT_EQ(cal.at("fit").at("runs"), 5);
  EXPECT_EQ(cal.at("predictions").back().at("path"), v.string() + "#");

  // A validate result alone is one run: enough for one parameter.
  const CliResult one = run_cli({"calibrate", v.string(), "--fit", "compute_efficiency", "--start",
                                 "compute_efficiency=0.2"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NEAR(json::parse(one.out).at("assumptions").at("compute_efficiency").get<double>(),
              kCompute, 1e-6);
  EXPECT_TRUE(json::parse(one.out).at("fit").at("leave_one_out_mape").is_null());
}

TEST(CalibrateCli, BadRunsAndDegenerateFitsExitTwo) {
  TempDir dir;
  const json runs = runs_doc(dir);
  json bad = runs;
  bad["runs"][3]["measured"]["step_seconds"] = -0.5;
  expect_input_error(run_cli({"calibrate", dir.write("bad.json", bad.dump()).string()}),
                     "/runs/3/measured/step_seconds", "step_seconds");
  // One run for two parameters.
  json one = {{"runs", {runs.at("runs")[0]}}};
  expect_input_error(run_cli({"calibrate", dir.write("one.json", one.dump()).string()}), "/runs",
                     "cannot determine 2 parameters");
  // Single-GPU runs and communication named: nothing depends on it.
  json single = {{"runs", json::array()}};
  for (const char* m : {"gpt3-1.3b", "llama2-7b", "gpt3-6.7b"}) {
    single["runs"].push_back({{"scenario", scenario(m, "h100-sxm-80gb", 1, 1, 1, 0, 8, 2048)},
                              {"measured", {{"step_seconds", 1.0}}}});
  }
  expect_input_error(run_cli({"calibrate", dir.write("single.json", single.dump()).string(),
                              "--fit", "compute_efficiency,communication_efficiency"}),
                     "/runs", "communication_efficiency");
  expect_input_error(run_cli({"calibrate", dir.write("r.json", runs.dump()).string(), "--start",
                              "compute_efficiency=7"}),
                     "", "outside");
  // A broken calibration file names its field.
  json cal = {{"schema", "distplan.calibration/v1"}, {"assumptions", {{"compute_efficiency", 0}}}};
  expect_input_error(run_cli({"plan", "--calibration", dir.write("cal.json", cal.dump()).string()}),
                     "/assumptions/compute_efficiency", "--calibration file");
  expect_input_error(run_cli({"plan", "--calibration", (dir.path() / "missing.json").string()}), "",
                     "cannot open");
}

}  // namespace
}  // namespace distplan::testing
