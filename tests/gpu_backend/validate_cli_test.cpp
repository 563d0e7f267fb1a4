// `distplan validate` as a user runs it: a 2-rank CPU layout launched under mpirun by the CLI
// itself, the distplan.validate/v1 document, exact weight/gradient/optimizer bytes, and a rank that
// crashes or hangs stopping the whole job with exit 1 within the time-out.
#include <dirent.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `distplan <args>` with `env` prefixed, TMPDIR set to a directory of its own (so the ranks'
// command lines can be recognised), and an outer time-out as a safety net.
CliResult run_cli(const std::string& args, const std::string& env, const std::string& tmpdir) {
  std::system(("mkdir -p " + tmpdir).c_str());
  const std::string out = tmpdir + "/stdout", err = tmpdir + "/stderr";
  const std::string cmd = env + " TMPDIR=" + tmpdir + " timeout 120 " + DISTPLAN_CLI + " " + args +
                          " > " + out + " 2> " + err;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

std::string two_rank_scenario(const std::string& dir, const json& parallel = json(nullptr),
                              bool tied = false, int layers = 4) {
  json doc = {{"model",
               {{"num_layers", layers},
                {"hidden_size", 64},
                {"num_attention_heads", 4},
                {"ffn_hidden_size", 256},
                {"vocab_size", 512},
                {"mlp", "gelu"},
                {"norm", "layernorm"},
                {"position_embedding", "learned"},
                {"max_position_embeddings", 32},
                {"tied_embeddings", false},
                {"bias", true}}},
              {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2}, {"gpus_per_node", 8}}},
              {"training",
               {{"seq_length", 32},
                {"global_batch_size", 4},
                {"micro_batch_size", 1},
                {"precision", "fp32"},
                {"optimizer", "adamw"},
                {"framework", "generic"}}},  // the conventions the backend trains by
              {"parallel", {{"tp", 1}, {"pp", 2}, {"dp", 1}, {"schedule", "1f1b"}}}};
  if (!parallel.is_null()) {
    doc["parallel"] = parallel;
    doc["cluster"]["num_gpus"] = parallel.value("tp", 1) * parallel.value("cp", 1) *
                                 parallel.value("pp", 1) * parallel.value("dp", 1);
  }
  doc["model"]["tied_embeddings"] = tied;
  std::system(("mkdir -p " + dir).c_str());
  const std::string path = dir + "/scenario.json";
  std::ofstream(path) << doc.dump();
  return path;
}

// Processes whose command line mentions `marker` (ranks left behind).
int processes_mentioning(const std::string& marker) {
  int n = 0;
  DIR* d = opendir("/proc");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file("/proc/" + name + "/cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(marker) != std::string::npos &&
        cmdline.find("rank-worker-job") != std::string::npos)
      ++n;
  }
  closedir(d);
  return n;
}

TEST(ValidateCli, TwoRankLayoutReportsPredictedAndMeasured) {
  const std::string dir = ::testing::TempDir() + "/validate_ok";
  const std::string scenario = two_rank_scenario(dir);
  const CliResult r = run_cli("validate " + scenario + " --steps 2 --timeout 60", "", dir + "/tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc.at("schema"), "distplan.validate/v1");
  ASSERT_EQ(doc.at("losses").size(), 2u);
  for (const json& l : doc.at("losses")) EXPECT_GT(l.get<double>(), 0.0);
  const json& ps = doc.at("predicted").at("memory").at("stages");
  const json& ms = doc.at("measured").at("memory").at("stages");
  const json& es = doc.at("relative_error").at("memory").at("stages");
  ASSERT_EQ(ps.size(), 2u);
  ASSERT_EQ(ms.size(), 2u);
  ASSERT_EQ(es.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("stage " + std::to_string(i));
    for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"}) {
      EXPECT_GT(ms[i].at(k).get<long long>(), 0) << k;
      EXPECT_EQ(ms[i].at(k).get<long long>(), ps[i].at(k).get<long long>()) << k;
      EXPECT_EQ(es[i].at(k).get<double>(), 0.0) << k;
    }
    EXPECT_TRUE(es[i].at("activations_bytes").is_number());
    // The caching-allocator replay reserves at least the joint peak of the tensors it served.
    EXPECT_GE(ms[i].at("reserved_bytes").get<long long>(),
              ms[i].at("total_bytes").get<long long>());
    // The generic profile (this scenario's) has no allocator model: reserved is not compared.
    EXPECT_TRUE(es[i].at("reserved_bytes").is_null());
  }
  // Point-to-point traffic of both stages equals the planner's, byte for byte.
  for (const json& st : doc.at("relative_error").at("communication").at("stages"))
    EXPECT_EQ(st.at("collectives").at("pp/send_recv").get<double>(), 0.0);
  EXPECT_GT(doc.at("measured").at("time").at("step_seconds").get<double>(), 0.0);
  EXPECT_GT(doc.at("predicted").at("time").at("simulated_step_seconds").get<double>(), 0.0);
  EXPECT_TRUE(doc.at("relative_error").at("time").at("simulated_step_seconds").is_number());

  const CliResult t =
      run_cli("validate " + scenario + " --steps 1 --format table", "", dir + "/tmp2");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("Memory per GPU"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("weights"), std::string::npos);
  EXPECT_NE(t.out.find("pp/send_recv"), std::string::npos);
}

// `--trace FILE`: the executed timeline in the simulator's Chrome / Perfetto format: one process
// per stage, and on each stage's compute thread one slice per action of its 1F1B program (p = 2,
// m = 4) in program order, named like the simulator's ("Fmb0 c0", "Bmb0 c0"), followed by the
// optimizer.
TEST(ValidateCli, TraceHoldsTheExecutedProgramOfEveryStage) {
  const std::string dir = ::testing::TempDir() + "/validate_trace";
  const std::string scenario = two_rank_scenario(dir);
  const std::string trace = dir + "/trace.json";
  std::remove(trace.c_str());
  const CliResult r = run_cli("validate " + scenario + " --steps 1 --trace " + trace, "", dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(read_file(trace));
  const json& events = doc.at("traceEvents");
  std::map<int, std::vector<std::string>> compute;
  std::map<int, std::string> process;
  std::map<int, double> last_end;
  int sends = 0;
  for (const json& e : events) {
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      process[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
    if (e.at("ph") != "X") continue;
    const int pid = e.at("pid").get<int>();
    if (e.at("cat") == "communication") ++sends;
    if (e.at("tid").get<int>() != 0) continue;
    compute[pid].push_back(e.at("name").get<std::string>());
    // Compute slices of a stage do not overlap: each starts after the previous one ends.
    const double ts = e.at("ts").get<double>();
    EXPECT_GE(ts + 1e-3, last_end[pid]) << e.dump();
    last_end[pid] = ts + e.at("dur").get<double>();
  }
  ASSERT_EQ(process.size(), 2u);
  EXPECT_EQ(process[0], "stage 0");
  EXPECT_EQ(process[1], "stage 1");
  // 1F1B with p = 2, m = 4: stage 0 warms up with 1 forward, stage 1 with none.
  const std::vector<std::string> stage0 = {"Fmb0 c0", "Fmb1 c0", "Bmb0 c0", "Fmb2 c0",  "Bmb1 c0",
                                           "Fmb3 c0", "Bmb2 c0", "Bmb3 c0", "optimizer"};
  const std::vector<std::string> stage1 = {"Fmb0 c0", "Bmb0 c0", "Fmb1 c0", "Bmb1 c0",  "Fmb2 c0",
                                           "Bmb2 c0", "Fmb3 c0", "Bmb3 c0", "optimizer"};
  EXPECT_EQ(compute[0], stage0);
  EXPECT_EQ(compute[1], stage1);
  // Activations forward and gradients back: 4 sends each way, plus the DP reduction slices.
  EXPECT_GE(sends, 8);
}

// Hybrid sharding (dp4, ZeRO-2, shard groups of 2) and tied embeddings (ZeRO-1 dp2 x pp2) through
// the CLI: every stage's bytes per (group, op) equal the planner's, including the replicas'
// all-reduce (dp_replicate) and the tied embedding gradients (embedding group); tied embeddings
// with ZeRO-2 are refused with the field's path.
TEST(ValidateCli, HybridShardingAndTiedEmbeddingsMatchThePlannersCollectives) {
  struct Case {
    const char* name;
    json parallel;
    bool tied;
    const char* key;  // the group/op the layout adds
  };
  const Case cases[] = {
      {"hybrid",
       {{"dp", 4}, {"zero_stage", 2}, {"fsdp_shard_size", 2}},
       false,
       "dp_replicate/all_reduce"},
      {"tied", {{"dp", 2}, {"pp", 2}, {"zero_stage", 1}}, true, "embedding/all_reduce"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = ::testing::TempDir() + "/validate_" + c.name;
    const std::string scenario = two_rank_scenario(dir, c.parallel, c.tied);
    const CliResult r = run_cli("validate " + scenario + " --steps 2 --timeout 60", "", dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json doc = json::parse(r.out);
    int with_key = 0;
    for (const json& st : doc.at("relative_error").at("communication").at("stages")) {
      for (const auto& [k, v] : st.at("collectives").items()) {
        ASSERT_TRUE(v.is_number()) << k;
        EXPECT_EQ(v.get<double>(), 0.0) << k;
      }
      if (st.at("collectives").contains(c.key)) ++with_key;
    }
    EXPECT_EQ(with_key, doc.at("scenario").at("parallel").value("pp", 1)) << c.key;
  }
  const std::string dir = ::testing::TempDir() + "/validate_tied_zero2";
  const std::string scenario = two_rank_scenario(dir, {{"pp", 2}, {"zero_stage", 2}}, true);
  const CliResult r = run_cli("validate " + scenario + " --steps 1", "", dir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/model/tied_embeddings"), std::string::npos) << r.err;
}

// DualPipe through the CLI (pp = 2, m = 4 = 2p): accepted, every stage's collectives (the
// pipeline sends of both directions and the mirror exchange) and its weights, gradients,
// optimizer states (two model stages per stage), activations and buffers equal the planner's.
TEST(ValidateCli, DualPipeMatchesThePlannerExactly) {
  const std::string dir = ::testing::TempDir() + "/validate_dualpipe";
  const std::string scenario = two_rank_scenario(dir, {{"pp", 2}, {"schedule", "dualpipe"}});
  const CliResult r = run_cli("validate " + scenario + " --steps 2 --timeout 60", "", dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  const json& stages = doc.at("relative_error").at("communication").at("stages");
  ASSERT_EQ(stages.size(), 2u);
  for (const json& st : stages) {
    ASSERT_TRUE(st.at("collectives").contains("pp/send_recv")) << st.dump();
    for (const auto& [name, v] : st.at("collectives").items()) {
      ASSERT_TRUE(v.is_number()) << name;
      EXPECT_EQ(v.get<double>(), 0.0) << name;
    }
  }
  for (const json& es : doc.at("relative_error").at("memory").at("stages")) {
    for (const char* m : {"weights_bytes", "gradients_bytes", "optimizer_bytes",
                          "activations_bytes", "buffers_bytes"})
      EXPECT_EQ(es.at(m).get<double>(), 0.0) << m;
  }
}

// Uneven splits through the CLI (pipeline_split.h): 5 layers over pp 2 x v 2 interleaved
// (virtual stages of 1, 2, 1, 1 layers) and over a V (stage 0's chunks hold 1 and 1 layers, stage
// 1's 2 and 1): every stage's collectives and its weights, gradients and optimizer states equal
// the planner's exactly, its saved activations within 2 % (the V's exactly: its sets are the
// program's), and the losses are finite.
TEST(ValidateCli, UnevenSplitsMatchThePlanner) {
  for (const char* schedule : {"interleaved_1f1b", "zb_v"}) {
    SCOPED_TRACE(schedule);
    const std::string dir = ::testing::TempDir() + "/validate_uneven_" + schedule;
    const std::string scenario = two_rank_scenario(
        dir, {{"pp", 2}, {"schedule", schedule}, {"virtual_stages", 2}}, false, 5);
    const CliResult r = run_cli("validate " + scenario + " --steps 2 --timeout 60", "", dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json doc = json::parse(r.out);
    for (const json& l : doc.at("losses")) EXPECT_GT(l.get<double>(), 0.0);
    const json& stages = doc.at("relative_error").at("communication").at("stages");
    ASSERT_EQ(stages.size(), 2u);
    for (const json& st : stages) {
      for (const auto& [name, v] : st.at("collectives").items()) {
        ASSERT_TRUE(v.is_number()) << name;
        EXPECT_EQ(v.get<double>(), 0.0) << name;
      }
    }
    const json& ps = doc.at("predicted").at("memory").at("stages");
    EXPECT_NE(ps.at(0).at("num_layers"), ps.at(1).at("num_layers"));
    for (const json& es : doc.at("relative_error").at("memory").at("stages")) {
      for (const char* m : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
        EXPECT_EQ(es.at(m).get<double>(), 0.0) << m;
      EXPECT_LE(std::abs(es.at("activations_bytes").get<double>()),
                std::string(schedule) == "zb_v" ? 0.0 : 0.02);
    }
  }
}

// Context parallelism with tensor parallelism, 4 ranks in the order tp, cp, dp, pp, for each
// cp_comm (the ring, the KV all-gather, Ulysses' all-to-all): every collective, the cp group's
// included, and every memory category but the time-dependent total equal the planner's exactly.
TEST(ValidateCli, ContextParallelMatchesThePlannerExactly) {
  const std::map<std::string, std::string> key = {
      {"p2p", "cp/send_recv"}, {"all_gather", "cp/all_gather"}, {"a2a", "cp/all_to_all"}};
  for (const auto& [comm, k] : key) {
    SCOPED_TRACE(comm);
    const std::string dir = ::testing::TempDir() + "/validate_cp_" + comm;
    const std::string scenario = two_rank_scenario(dir, {{"cp", 2}, {"cp_comm", comm}, {"tp", 2}});
    const CliResult r = run_cli("validate " + scenario + " --steps 2 --timeout 60", "", dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json doc = json::parse(r.out);
    const json& st = doc.at("relative_error").at("communication").at("stages").at(0);
    ASSERT_TRUE(st.at("collectives").contains(k)) << st.dump();
    for (const auto& [name, v] : st.at("collectives").items()) {
      ASSERT_TRUE(v.is_number()) << name;
      EXPECT_EQ(v.get<double>(), 0.0) << name;
    }
    const json& es = doc.at("relative_error").at("memory").at("stages").at(0);
    for (const char* m : {"weights_bytes", "gradients_bytes", "optimizer_bytes",
                          "activations_bytes", "buffers_bytes"})
      EXPECT_EQ(es.at(m).get<double>(), 0.0) << m;
  }
}

TEST(ValidateCli, EmulatedRankMeasuresItsStageOnly) {
  const std::string dir = ::testing::TempDir() + "/validate_emulated";
  const std::string scenario = two_rank_scenario(dir);
  const CliResult r = run_cli("validate " + scenario + " --steps 1 --emulate-rank 1", "", dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  const json& ms = doc.at("measured").at("memory").at("stages");
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].at("stage"), 1);
  const json& ps = doc.at("predicted").at("memory").at("stages").at(1);
  for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
    EXPECT_EQ(ms[0].at(k).get<long long>(), ps.at(k).get<long long>()) << k;
  const json& ec = doc.at("relative_error").at("communication").at("stages");
  ASSERT_EQ(ec.size(), 1u);
  EXPECT_EQ(ec[0].at("collectives").at("pp/send_recv").get<double>(), 0.0);
}

TEST(ValidateCli, CrashingRankStopsTheJobWithExitOne) {
  const std::string dir = ::testing::TempDir() + "/validate_crash";
  const std::string scenario = two_rank_scenario(dir);
  const std::string tmp = dir + "/tmp";
  const CliResult r =
      run_cli("validate " + scenario + " --steps 2 --timeout 30", "DISTPLAN_TEST_FAULT=crash", tmp);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.err.find("a rank failed"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(processes_mentioning(tmp), 0);
}

TEST(ValidateCli, HangingRankIsStoppedAtTheTimeout) {
  const std::string dir = ::testing::TempDir() + "/validate_hang";
  const std::string scenario = two_rank_scenario(dir);
  const std::string tmp = dir + "/tmp";
  const CliResult r =
      run_cli("validate " + scenario + " --steps 2 --timeout 4", "DISTPLAN_TEST_FAULT=hang", tmp);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_GE(r.seconds, 4.0);
  EXPECT_LT(r.seconds, 4.0 + 10.0);  // SIGTERM, then SIGKILL 3 s later
  EXPECT_NE(r.err.find("did not finish within"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(processes_mentioning(tmp), 0);
}

// SIGTERM, SIGINT or an outer `timeout` to the launcher while its ranks run (here: hang): the
// signal reaches the ranks' process group, every rank is gone and the temporary folder removed,
// and the launcher ends by the signal it got. Before, mpirun and the ranks were left running.
TEST(ValidateCli, TerminationSignalStopsEveryRankAndRemovesTheFolder) {
  for (const char* sig : {"TERM", "INT"}) {
    SCOPED_TRACE(sig);
    const std::string dir = ::testing::TempDir() + "/validate_signal_" + sig;
    const std::string scenario = two_rank_scenario(dir);
    const std::string tmp = dir + "/tmp";
    std::system(("rm -rf " + tmp + " && mkdir -p " + tmp).c_str());
    // Start, wait for both ranks (at most 60 s), signal the launcher, wait for it.
    const std::string script =
        "DISTPLAN_TEST_FAULT=hang TMPDIR=" + tmp + " " + DISTPLAN_CLI + " validate " + scenario +
        " --steps 2 --timeout 300 > " + tmp + "/stdout 2> " + tmp + "/stderr & pid=$!; i=0; " +
        "while [ $(pgrep -f -c \"rank-worker-jo[b] " + tmp + "/distplan-validate-\") -lt 2 ] && " +
        "[ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; sleep 0.5; kill -" + sig +
        " $pid; wait $pid; echo $? > " + tmp + "/rc";
    const auto t0 = std::chrono::steady_clock::now();
    std::system(("bash -c '" + script + "'").c_str());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string rc = read_file(tmp + "/rc");
    const int want = 128 + (std::string(sig) == "TERM" ? SIGTERM : SIGINT);
    EXPECT_EQ(std::atoi(rc.c_str()), want) << read_file(tmp + "/stderr");
    EXPECT_LT(seconds, 90.0);
    EXPECT_EQ(processes_mentioning(tmp), 0);
    // No distplan-validate-<pid> folder is left in TMPDIR.
    int folders = 0;
    if (DIR* d = opendir(tmp.c_str())) {
      while (dirent* e = readdir(d))
        if (std::string(e->d_name).rfind("distplan-validate-", 0) == 0) ++folders;
      closedir(d);
    }
    EXPECT_EQ(folders, 0);
  }
}

// SIGKILL to the launcher (what Python's subprocess does to `distplan validate` on Ctrl-C inside
// distplan.validate()): it cannot stop anything itself, so mpirun and the ranks must die with
// it (issue 29, item 14: they ran on under init past --timeout, with their job folder). Every
// rank and mpirun are gone within seconds and no distplan-validate-<pid> folder is left.
TEST(ValidateCli, KilledLauncherTakesItsRanksWithIt) {
  const std::string dir = ::testing::TempDir() + "/validate_sigkill";
  const std::string scenario = two_rank_scenario(dir);
  const std::string tmp = dir + "/tmp";
  std::system(("rm -rf " + tmp + " && mkdir -p " + tmp).c_str());
  const std::string script =
      "DISTPLAN_TEST_FAULT=hang DISTPLAN_TEST_FAULT_RANK=0 TMPDIR=" + tmp + " " + DISTPLAN_CLI +
      " validate " + scenario + " --steps 2 --timeout 300 > " + tmp + "/stdout 2> " + tmp +
      "/stderr & pid=$!; i=0; " + "while [ $(pgrep -f -c \"rank-worker-jo[b] " + tmp +
      "/distplan-validate-\") -lt 2 ] && " +
      "[ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; sleep 0.5; kill -KILL $pid; wait $pid; " +
      "echo $? > " + tmp + "/rc";
  std::system(("bash -c '" + script + "'").c_str());
  EXPECT_EQ(std::atoi(read_file(tmp + "/rc").c_str()), 128 + SIGKILL);
  // The ranks exit as their parent does; give a loaded machine 20 s.
  int left = processes_mentioning(tmp);
  for (int i = 0; i < 200 && left > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = processes_mentioning(tmp);
  }
  EXPECT_EQ(left, 0);
  int folders = 0;
  if (DIR* d = opendir(tmp.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("distplan-validate-", 0) == 0) ++folders;
    closedir(d);
  }
  EXPECT_EQ(folders, 0);
}

// ---- beyond one machine ------------------------------------------------------------------------

// Weights, gradients and optimizer bytes of both stages equal the plan's; the losses.
std::vector<double> check_two_stage_document(const json& doc) {
  EXPECT_EQ(doc.at("schema"), "distplan.validate/v1");
  const json& ps = doc.at("predicted").at("memory").at("stages");
  const json& ms = doc.at("measured").at("memory").at("stages");
  EXPECT_EQ(ms.size(), 2u);
  for (std::size_t i = 0; i < ms.size() && i < ps.size(); ++i)
    for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
      EXPECT_EQ(ms[i].at(k).get<long long>(), ps[i].at(k).get<long long>()) << k;
  std::vector<double> losses;
  for (const json& l : doc.at("losses")) losses.push_back(l.get<double>());
  return losses;
}

// A two-"node" hostfile on this machine: mpirun starts its daemon on node-a and node-b through a
// stand-in for ssh (tests/gpu_backend/local_ssh.sh, which runs the command here from / and logs
// the host), shared memory is off (btl self,tcp: every message crosses the network stack as
// between hosts), and the ranks read no file of the launcher: the scenario travels on the command
// line, the measurement comes back on rank 0's standard output. The result is the local run's.
TEST(ValidateCli, TwoNodeHostfileRunsLikeTheLocalLaunch) {
  const std::string dir = ::testing::TempDir() + "/validate_hostfile";
  const std::string scenario = two_rank_scenario(dir);
  const std::string hosts = dir + "/hosts";
  std::ofstream(hosts) << "node-a slots=1\nnode-b slots=1\n";
  const std::string ssh_log = dir + "/ssh.log";
  std::remove(ssh_log.c_str());
  const std::string agent = std::string(DISTPLAN_SOURCE_DIR) + "/tests/gpu_backend/local_ssh.sh";
  const CliResult r =
      run_cli("validate " + scenario + " --steps 2 --timeout 90 --hostfile " + hosts +
                  " --launcher-args=\"--mca plm_rsh_agent " + agent + "\"",
              "OMPI_MCA_btl=self,tcp DISTPLAN_TEST_SSH_LOG=" + ssh_log, dir + "/tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> remote = check_two_stage_document(json::parse(r.out));
  const std::string log = read_file(ssh_log);
  EXPECT_NE(log.find("node-a"), std::string::npos) << log;
  EXPECT_NE(log.find("node-b"), std::string::npos) << log;

  const CliResult l =
      run_cli("validate " + scenario + " --steps 2 --timeout 90", "", dir + "/tmp2");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  const std::vector<double> local = check_two_stage_document(json::parse(l.out));
  ASSERT_EQ(remote.size(), 2u);
  ASSERT_EQ(local.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_NEAR(remote[i], local[i], 1e-6 * local[i]) << i;
}

// A rank that runs out of memory tells the launcher on its standard output (no shared file):
// the document says the layout does not fit, exit 0. Capacity 600 000 bytes, no runtime reserve:
// each stage holds 557 056 bytes before its next weight tensor.
TEST(ValidateCli, OutOfMemoryOnARankIsAResult) {
  const std::string dir = ::testing::TempDir() + "/validate_oom";
  const std::string path = two_rank_scenario(dir);
  json doc = json::parse(read_file(path));
  json gpu =
      json::parse(read_file(std::string(DISTPLAN_SOURCE_DIR) + "/data/gpus/h100-sxm-80gb.json"))
          .at("gpu");
  gpu["memory_bytes"] = 600000;
  doc["cluster"]["gpu"] = gpu;
  doc["cluster"]["runtime_reserve_bytes"] = 0;
  std::ofstream(path) << doc.dump();
  const CliResult r = run_cli("validate " + path + " --steps 1 --timeout 60", "", dir + "/tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json m = json::parse(r.out).at("measured").at("memory");
  EXPECT_FALSE(m.at("fits").get<bool>());
  EXPECT_NE(m.at("message").get<std::string>().find("out of memory"), std::string::npos);
}

// Inside a Slurm allocation (SLURM_JOB_ID set) the ranks start with srun: here a stand-in srun
// (tests/gpu_backend/fake_srun.sh) that logs its arguments and runs mpirun with the task count.
TEST(ValidateCli, InsideSlurmAllocationLaunchesWithSrun) {
  const std::string dir = ::testing::TempDir() + "/validate_srun";
  const std::string scenario = two_rank_scenario(dir);
  const std::string srun_log = dir + "/srun.log";
  std::remove(srun_log.c_str());
  const std::string srun = std::string(DISTPLAN_SOURCE_DIR) + "/tests/gpu_backend/fake_srun.sh";
  const CliResult r =
      run_cli("validate " + scenario + " --steps 1 --timeout 90 --launcher-args=--cpu-bind=none",
              "SLURM_JOB_ID=4242 DISTPLAN_SRUN=" + srun + " DISTPLAN_TEST_SRUN_LOG=" + srun_log,
              dir + "/tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  check_two_stage_document(json::parse(r.out));
  const std::string log = read_file(srun_log);
  EXPECT_NE(log.find("--ntasks=2 --kill-on-bad-exit=1 --cpu-bind=none "), std::string::npos) << log;
  EXPECT_NE(log.find(" validate --rank-worker "), std::string::npos) << log;

  // --hostfile is mpirun's: refused with srun, before anything starts.
  const CliResult bad = run_cli("validate " + scenario + " --launcher srun --hostfile " + scenario,
                                "DISTPLAN_SRUN=" + srun, dir + "/tmp2");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--hostfile"), std::string::npos) << bad.err;
}

// The public rank-worker mode under the user's own launcher: `mpirun -np 2 distplan validate
// FILE --rank-worker` prints rank 0's comparison, the same document the CLI's own launch gives.
TEST(ValidateCli, RankWorkerUnderTheUsersLauncherPrintsTheComparison) {
  const std::string dir = ::testing::TempDir() + "/validate_rank_worker";
  const std::string scenario = two_rank_scenario(dir);
  const std::string tmp = dir + "/tmp";
  std::system(("mkdir -p " + tmp).c_str());
  // The user's launcher gets the environment a user gives it: root in a container must allow it.
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun -np 2 --oversubscribe " +
      std::string(DISTPLAN_CLI) + " validate " + scenario + " --steps 2 --rank-worker > " + tmp +
      "/stdout 2> " + tmp + "/stderr";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << read_file(tmp + "/stderr");
  const std::vector<double> losses =
      check_two_stage_document(json::parse(read_file(tmp + "/stdout")));
  EXPECT_EQ(losses.size(), 2u);
}

// A tiny MoE GPT (4 routed experts, top-2, one shared expert) on 2 ranks with ep = 2: the
// backend trains it (tests/gpu_backend/moe_training_test.cpp) and `validate` holds it against the
// planner's MoE plan: model states and every collective exactly.
TEST(ValidateCli, TinyMoeWithExpertParallelismMatchesThePlanExactly) {
  const std::string dir = ::testing::TempDir() + "/validate_moe";
  json doc = {{"model",
               {{"num_layers", 2},
                {"hidden_size", 64},
                {"num_attention_heads", 4},
                {"ffn_hidden_size", 128},
                {"vocab_size", 512},
                {"mlp", "swiglu"},
                {"norm", "rmsnorm"},
                {"position_embedding", "rotary"},
                {"moe",
                 {{"num_experts", 4},
                  {"top_k", 2},
                  {"expert_ffn_hidden_size", 32},
                  {"num_shared_experts", 1},
                  {"shared_expert_ffn_hidden_size", 32}}}}},
              {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2}, {"gpus_per_node", 8}}},
              {"training",
               {{"seq_length", 32},
                {"global_batch_size", 4},
                {"micro_batch_size", 1},
                {"precision", "fp32"},
                {"optimizer", "adamw"},
                {"framework", "generic"}}},  // the conventions the backend trains by
              {"parallel", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"ep", 2}}}};
  std::system(("mkdir -p " + dir).c_str());
  const std::string scenario = dir + "/scenario.json";
  std::ofstream(scenario) << doc.dump();
  const CliResult plan = run_cli("plan " + scenario, "", dir + "/plan");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const CliResult r = run_cli("validate " + scenario + " --steps 2", "", dir + "/tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  const json& ps = out.at("predicted").at("memory").at("stages");
  const json& ms = out.at("measured").at("memory").at("stages");
  ASSERT_EQ(ms.size(), 1u);
  for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
    EXPECT_EQ(ms[0].at(k).get<long long>(), ps[0].at(k).get<long long>()) << k;
  // Every collective is measured and predicted under the same (group, op, what) with the same
  // bytes and calls: the all-to-alls record the token-side buffer, which the routing does not
  // change (what crossed ranks is in moe_routing).
  const json& mc = out.at("measured").at("communication").at("stages").at(0).at("collectives");
  const json& pc = out.at("predicted").at("communication").at("stages").at(0).at("collectives");
  EXPECT_EQ(mc, pc);
  int all_to_alls = 0;
  for (const json& c : mc) all_to_alls += c.at("op") == "all_to_all" && c.at("group") == "ep";
  EXPECT_EQ(all_to_alls, 4);
}

// A dense first layer before the MoE layer (DeepSeek's first_k_dense_replace), under ZeRO-1:
// model states and every collective, the dense layer's gradient reduction beside the MoE
// layer's, as planned.
TEST(ValidateCli, TinyMoeWithADenseFirstLayerMatchesThePlanExactly) {
  const std::string dir = ::testing::TempDir() + "/validate_moe_mixed";
  json doc = {{"model",
               {{"num_layers", 2},
                {"hidden_size", 64},
                {"num_attention_heads", 4},
                {"ffn_hidden_size", 128},
                {"vocab_size", 512},
                {"mlp", "swiglu"},
                {"norm", "rmsnorm"},
                {"position_embedding", "rotary"},
                {"moe",
                 {{"num_experts", 4},
                  {"top_k", 2},
                  {"expert_ffn_hidden_size", 32},
                  {"num_shared_experts", 1},
                  {"shared_expert_ffn_hidden_size", 32},
                  {"first_dense_layers", 1}}}}},
              {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2}, {"gpus_per_node", 8}}},
              {"training",
               {{"seq_length", 32},
                {"global_batch_size", 4},
                {"micro_batch_size", 1},
                {"precision", "fp32"},
                {"optimizer", "adamw"}}},
              {"parallel", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"ep", 2}, {"zero_stage", 1}}}};
  std::system(("mkdir -p " + dir).c_str());
  const std::string scenario = dir + "/scenario.json";
  std::ofstream(scenario) << doc.dump();
  const CliResult plan = run_cli("plan " + scenario, "", dir + "/plan");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const CliResult r = run_cli("validate " + scenario + " --steps 2", "", dir + "/tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  const json& ps = out.at("predicted").at("memory").at("stages");
  const json& ms = out.at("measured").at("memory").at("stages");
  ASSERT_EQ(ms.size(), 1u);
  for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes"})
    EXPECT_EQ(ms[0].at(k).get<long long>(), ps[0].at(k).get<long long>()) << k;
  // Every collective is measured and predicted under the same (group, op, what) with the same
  // bytes and calls: the all-to-alls record the token-side buffer, which the routing does not
  // change (what crossed ranks is in moe_routing).
  const json& mc = out.at("measured").at("communication").at("stages").at(0).at("collectives");
  const json& pc = out.at("predicted").at("communication").at("stages").at(0).at("collectives");
  EXPECT_EQ(mc, pc);
  int all_to_alls = 0;
  for (const json& c : mc) all_to_alls += c.at("op") == "all_to_all" && c.at("group") == "ep";
  EXPECT_EQ(all_to_alls, 4);
  EXPECT_EQ(out.at("scenario").at("model").at("moe").at("first_dense_layers"), 1);
}

}  // namespace
