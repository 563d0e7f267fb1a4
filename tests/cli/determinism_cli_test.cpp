// Determinism: the same input gives byte-identical output, run after run, whichever way it is
// fed in, whatever the environment, and (for `distplan search`) whatever the thread count.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

// Scenarios that reach every schedule, ZeRO stage, recompute mode and model family.
std::vector<std::string> scenario_texts() {
  std::vector<std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(
           std::filesystem::path(DISTPLAN_SOURCE_DIR) / "data" / "scenarios")) {
    if (f.path().extension() == ".json") {
      out.push_back(read_source_file("data/scenarios/" + f.path().filename().string()));
    }
  }
  json base = json::parse(read_source_file("data/scenarios/default.json"));
  // Every schedule and ZeRO stage, under distplan's textbook model, which runs them all.
  base["training"]["framework"] = "generic";
  const json layouts[] = {
      {{"tp", 8},
       {"pp", 4},
       {"dp", 2},
       {"zero_stage", 3},
       {"recompute", "full"},
       {"schedule", "gpipe"}},
      {{"tp", 4},
       {"pp", 4},
       {"dp", 4},
       {"zero_stage", 2},
       {"sequence_parallel", true},
       {"schedule", "interleaved_1f1b"},
       {"virtual_stages", 5}},
      {{"tp", 2}, {"pp", 8}, {"dp", 4}, {"zero_stage", 1}, {"schedule", "zb_h1"}},
      {{"tp", 1}, {"pp", 1}, {"dp", 64}, {"zero_stage", 3}, {"fsdp_shard_size", 8}},
  };
  for (const json& p : layouts) {
    json doc = base;
    doc["parallel"] = p;
    out.push_back(doc.dump());
  }
  json gpt = base;
  gpt["model"] = "gpt3-175b";
  gpt["training"]["seq_length"] = 2048;  // GPT-3's learned positions stop at 2048
  gpt["training"]["attention"] = "standard";
  gpt["training"]["dropout"] = 0.1;
  gpt["parallel"] = {{"tp", 8}, {"pp", 8}, {"dp", 1}, {"recompute", "selective"}};
  out.push_back(gpt.dump());
  return out;
}

TEST(Determinism, PlanIsByteIdenticalAcrossRuns) {
  TempDir dir;
  int i = 0;
  for (const std::string& text : scenario_texts()) {
    SCOPED_TRACE(text);
    const auto file = dir.write("s" + std::to_string(i++) + ".json", text);
    const CliResult first = run_cli({"plan", file.string()});
    ASSERT_EQ(first.exit_code, 0) << first.err;
    ASSERT_FALSE(first.out.empty());
    for (int run = 0; run < 3; ++run) {
      const CliResult again = run_cli({"plan", file.string()});
      EXPECT_EQ(again.exit_code, 0);
      EXPECT_EQ(again.out, first.out) << "run " << run;
    }
    const CliResult table1 = run_cli({"plan", file.string(), "--format", "table"});
    const CliResult table2 = run_cli({"plan", file.string(), "--format", "table"});
    EXPECT_EQ(table1.exit_code, 0) << table1.err;
    EXPECT_EQ(table1.out, table2.out);
  }
}

TEST(Determinism, PlanIsTheSameFromFileStdinAndTheEmbeddedDefault) {
  const std::string text = read_source_file("data/scenarios/default.json");
  TempDir dir;
  const CliResult from_file = run_cli({"plan", dir.write("d.json", text).string()});
  const CliResult from_stdin = run_cli({"plan", "-"}, text);
  const CliResult embedded = run_cli({"plan"});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_stdin.out, from_file.out);
  EXPECT_EQ(embedded.out, from_file.out);
}

TEST(Determinism, PlanDoesNotDependOnLocaleOrEnvironment) {
  const CliResult plain = run_cli({"plan"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  // A decimal-comma locale (when installed; C.UTF-8 otherwise), another time zone, and a thread
  // count hint must not change a digit.
  for (const char* locale : {"de_DE.UTF-8", "C.UTF-8", "POSIX"}) {
    const CliResult r =
        run_cli({"plan"}, {}, std::chrono::seconds(60),
                {std::string("LC_ALL=") + locale, "TZ=Asia/Kolkata", "OMP_NUM_THREADS=3"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out) << locale;
  }
}

// `distplan search` reports how it ran at the top level: wall times (`seconds`, `*_seconds`),
// `layouts_per_second`, `threads`, and `pruned` (layouts skipped by the bound, which depends on
// when each thread's best plans were found). The answer itself (plans, evaluated, feasible,
// rejected counts) must match byte for byte.
json without_timing(const std::string& out) {
  json j = json::parse(out);
  json kept = json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const bool timing = k == "seconds" || (k.size() > 8 && k.ends_with("_seconds")) ||
                        k == "layouts_per_second" || k == "threads" || k == "pruned";
    if (!timing) kept[k] = it.value();
  }
  return kept;
}

TEST(Determinism, SearchIsIdenticalAcrossRunsAndThreadCounts) {
  const CliResult help = run_cli({"search", "--help"});
  if (help.exit_code != 0) GTEST_SKIP() << "this build has no `distplan search`";
  json doc = json::parse(read_source_file("data/scenarios/default.json"));
  doc.erase("parallel");
  doc["model"] = "llama2-13b";
  doc["cluster"]["num_gpus"] = 32;
  doc["search"] = {{"top_k", 20}};
  TempDir dir;
  const auto file = dir.write("search.json", doc.dump());
  const CliResult one = run_cli({"search", file.string(), "--threads", "1", "--quiet"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const json reference = without_timing(one.out);
  ASSERT_FALSE(reference.at("plans").empty());
  for (const char* threads : {"1", "2", "3", "8"}) {
    SCOPED_TRACE(threads);
    const CliResult r = run_cli({"search", file.string(), "--threads", threads, "--quiet"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(without_timing(r.out).dump(2), reference.dump(2));
  }
}

}  // namespace
}  // namespace distplan::testing
