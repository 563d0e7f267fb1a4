// distplan validate: runs the planner, the GPU backend and the simulator (with the costs measured
// in this run) on one scenario and puts predicted and measured side by side
// (distplan.validate/v1, docs/gpu_backend.md "distplan validate").
//
// A layout with several ranks runs under mpirun, started here: this same executable is launched
// once per rank with the hidden option --rank-worker-out, rank 0 gathers every rank's measurement
// and writes it to that file. A rank that crashes or hangs stops the whole job: mpirun's own abort,
// or --timeout, after which every rank is killed and the command exits 1 with a message.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command.h"
#include "distplan/gpu_backend/comm.h"
#include "distplan/gpu_backend/measurement_json.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/simulate.h"

namespace distplan::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ValidateOptions {
  CommonOptions common;
  std::string device = "cpu";
  Count steps = 3;
  int emulate_rank = -1;
  double timeout_seconds = 600;
  std::string rank_worker_out;  // hidden: this process is one rank under mpirun
  std::string trace_path;       // --trace: the executed timeline as a Chrome / Perfetto trace
  bool force = false;           // --force: run even when the host looks too small
};

// --timeout bound: a week. Beyond it a run is not "hung" but unbounded (docs/trust.md).
constexpr double kMaxTimeoutSeconds = 7.0 * 24 * 3600;
// Local ranks per host core accepted without --force: the CPU backend's ranks mostly wait on each
// other, so some oversubscription is normal (tests run 8 ranks on 2 cores); far more only thrashes.
constexpr Count kMaxRanksPerCore = 8;
// Share of the host's physical memory the ranks' predicted bytes may take without --force.
constexpr double kMaxHostMemoryShare = 0.8;

Count ranks_of(const Scenario& s) {
  return s.parallel.tp * s.parallel.dp * s.parallel.pp;
}

backend::Device device_of(const std::string& d) {
  if (d == "cpu") return backend::Device::cpu;
  if (d == "cuda") return backend::Device::cuda;
  throw InputError("", "--device must be cpu or cuda, not '" + d + "'");
}

// The tracked bytes a GPU of the scenario can hold: its memory less the runtime's reserve, as the
// planner counts it (docs/memory.md). Stage 0's runtime figure is the same on every stage.
Bytes tracked_capacity(const Estimate& e) {
  const Bytes runtime = e.memory.stages.empty() ? 0 : e.memory.stages.front().runtime_bytes;
  return e.memory.capacity_bytes - runtime;
}

// Hidden fault injection for the crash/hang tests: DISTPLAN_TEST_FAULT=crash|hang on rank
// DISTPLAN_TEST_FAULT_RANK (default 1).
void maybe_inject_fault(int rank) {
  const char* fault = std::getenv("DISTPLAN_TEST_FAULT");
  if (fault == nullptr) return;
  const char* r = std::getenv("DISTPLAN_TEST_FAULT_RANK");
  if (rank != (r ? std::atoi(r) : 1)) return;
  if (std::string(fault) == "crash") std::abort();
  if (std::string(fault) == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// ---- one rank under mpirun ----------------------------------------------------------------------
void run_rank_worker(const Scenario& s, const ValidateOptions& o) {
  backend::mpi_init_if_needed();
  const int rank = backend::mpi_world_rank();
  maybe_inject_fault(rank);
  backend::RunOptions ro;
  ro.steps = o.steps;
  ro.comm = backend::CommBackend::mpi;
  ro.device = device_of(o.device);
  ro.capacity_bytes = tracked_capacity(estimate(s));
  backend::Measurement m;
  try {
    m = backend::run(s, ro);
  } catch (const backend::OutOfMemory& e) {
    // A measured result: leave a marker for the launcher and stop every rank.
    std::ofstream(o.rank_worker_out + ".oom") << e.what() << '\n';
    backend::mpi_abort(3);
  }
  const auto all = backend::gather_measurements(backend::to_json(m.ranks.front()).dump());
  if (!all.empty()) {
    m.ranks.clear();
    for (const auto& r : all)
      m.ranks.push_back(backend::rank_measurement_from_json(json::parse(r)));
    std::ofstream(o.rank_worker_out) << backend::to_json(m).dump() << '\n';
  }
  backend::mpi_finalize_if_initialised();
}

// ---- launching mpirun
// -----------------------------------------------------------------------------
std::string find_mpirun() {
  if (const char* env = std::getenv("DISTPLAN_MPIRUN"); env && *env) {
    std::error_code ec;
    if (!fs::is_regular_file(env, ec) || ::access(env, X_OK) != 0) {
      throw std::runtime_error(fmt::format(
          "validate: DISTPLAN_MPIRUN is '{}', which is not an executable file; set it to "
          "mpirun's path, unset it to search PATH, or use --emulate-rank",
          env));
    }
    return env;
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    for (const char* name : {"mpirun", "mpiexec"}) {
      const fs::path p = fs::path(dir) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return {};
}

void set_default_env(const char* name, const char* value) {
  if (std::getenv(name) == nullptr) ::setenv(name, value, 0);
}

struct LaunchResult {
  bool timed_out = false;
  int exit_code = 0;
  std::string log;
};

// A termination signal received while the ranks run: the launcher stops their process group,
// removes its folder, then ends with the same signal.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

// Installs on_stop_signal for SIGTERM, SIGINT and SIGHUP while alive; restores the old handlers.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < std::size(kSignals); ++i)
      ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
  struct sigaction old_[3]{};
};

// Removes the launcher's temporary folder on every way out (never throws).
struct TempFolder {
  fs::path path;
  ~TempFolder() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

// SIGTERM to the whole group, SIGKILL 3 s later to whatever is left; reaps the leader.
void stop_group(pid_t pid, int& status) {
  ::kill(-pid, SIGTERM);
  const auto hard = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() >= hard) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);  // ranks left in the group
  // Return only once the group is gone (a killed rank still exits asynchronously; under load
  // that takes a while), at most 10 s.
  const auto gone = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::kill(-pid, 0) == 0 && std::chrono::steady_clock::now() < gone)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Runs argv in its own process group with stdout/stderr to `log_path`; after `timeout` seconds, or
// on SIGTERM/SIGINT/SIGHUP to this process, the whole group is terminated (SIGTERM, then SIGKILL
// 3 s later). After a signal, `folder` is removed and this process ends by the same signal.
LaunchResult launch(const std::vector<std::string>& args, const std::string& log_path,
                    double timeout, TempFolder& folder) {
  const StopSignals guard;
  g_stop_signal = 0;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("validate: fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  ::setpgid(pid, pid);
  LaunchResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (const int sig = g_stop_signal; sig != 0) {
      stop_group(pid, status);
      std::error_code ec;
      fs::remove_all(folder.path, ec);
      folder.path.clear();
      std::signal(sig, SIG_DFL);
      std::raise(sig);
      std::_Exit(128 + sig);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      stop_group(pid, status);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream f(log_path);
  std::stringstream ss;
  ss << f.rdbuf();
  r.log = ss.str();
  return r;
}

std::string tail(const std::string& s, std::size_t n) {
  return s.size() <= n ? s : s.substr(s.size() - n);
}

// Stops a single-rank run at --timeout: that run is this process, so the watchdog ends it with the
// JSON error and exit 1, as the launcher does for a multi-rank run. `partial_output` (the trace
// file, opened before the run) is removed first when it is a regular file.
class Watchdog {
 public:
  Watchdog(double seconds, std::string message, std::string partial_output)
      : thread_([this, seconds, msg = std::move(message), out = std::move(partial_output)] {
          std::unique_lock lock(mutex_);
          if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; }))
            return;
          std::error_code ec;
          if (!out.empty() && fs::is_regular_file(out, ec)) fs::remove(out, ec);
          const json err = {{"error", {{"code", "internal"}, {"message", msg}}}};
          std::cerr << err.dump() << std::endl;
          std::_Exit(1);
        }) {}
  ~Watchdog() {
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Before starting any rank: the local ranks' predicted memory (CPU device: host memory) and their
// number against the host's memory and cores. Refused (exit 2, with the numbers) unless --force.
void check_host_resources(const Scenario& s, const Estimate& e, const ValidateOptions& o) {
  if (o.force) return;
  const bool one = o.emulate_rank >= 0 || ranks_of(s) == 1;
  const Count ranks = one ? 1 : ranks_of(s);
  const Count per_stage = s.parallel.tp * s.parallel.dp;
  double bytes = 0;
  for (std::size_t st = 0; st < e.memory.stages.size(); ++st) {
    const StageMemory& m = e.memory.stages[st];
    const double rank_bytes = static_cast<double>(m.total_bytes - m.runtime_bytes);
    if (one) {
      const Count r = std::max(o.emulate_rank, 0);
      if (static_cast<Count>(st) == r / per_stage) bytes = rank_bytes;
    } else {
      bytes += rank_bytes * static_cast<double>(per_stage);
    }
  }
  const auto pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const double host =
      pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  const Count cores = std::max<Count>(1, std::thread::hardware_concurrency());
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const std::string alternative =
      one ? std::string("use a smaller scenario")
          : fmt::format("use --emulate-rank R (0..{}) to run one rank in this process",
                        ranks_of(s) - 1);
  if (o.device == "cpu" && host > 0 && bytes > kMaxHostMemoryShare * host) {
    throw InputError(
        "/parallel",
        fmt::format("validate would start {} local rank{} predicted to need {:.2f} GiB together "
                    "(tracked bytes, without the runtime reserve), more than {:.0f} % of this "
                    "host's {:.2f} GiB of memory; {}, or --force to run anyway",
                    ranks, ranks == 1 ? "" : "s", bytes / gib, 100 * kMaxHostMemoryShare,
                    host / gib, alternative));
  }
  if (ranks > kMaxRanksPerCore * cores) {
    throw InputError("/parallel",
                     fmt::format("validate would start {} local ranks on this host's {} cores "
                                 "(more than {} per core); {}, or --force to run anyway",
                                 ranks, cores, kMaxRanksPerCore, alternative));
  }
}

// The planner's levers the backend does not train with: a validation would run without them and
// hold the plan against a different run, so it is refused at the field.
void refuse_unvalidated_levers(const Scenario& s) {
  const ParallelSpec& p = s.parallel;
  if (p.cp > 1) {
    throw InputError("/parallel/cp",
                     "the backend does not run context parallelism yet; validate a layout with "
                     "cp = 1");
  }
  if (p.offload_optimizer != Offload::none || p.offload_params != Offload::none) {
    throw InputError(p.offload_optimizer != Offload::none ? "/parallel/offload_optimizer"
                                                          : "/parallel/offload_params",
                     "the backend keeps every model state on its device; offload is planned, not "
                     "validated");
  }
  if (s.training.fp8 != Fp8Recipe::none) {
    throw InputError("/training/precision",
                     "the backend trains in fp32, fp16 or bf16; fp8 is planned, not validated");
  }
}

struct BackendResult {
  bool fits = true;
  std::string oom_message;
  backend::Measurement m;
};

BackendResult run_backend(const Scenario& s, const json& doc, const ValidateOptions& o) {
  BackendResult br;
  const Count ranks = ranks_of(s);
  if (ranks == 1 || o.emulate_rank >= 0) {
    backend::RunOptions ro;
    ro.steps = o.steps;
    ro.comm = backend::CommBackend::emulated;
    ro.emulate_rank = std::max(o.emulate_rank, 0);
    ro.device = device_of(o.device);
    ro.capacity_bytes = tracked_capacity(estimate(s));
    const Watchdog watchdog(o.timeout_seconds,
                            fmt::format("validate: the run did not finish within {} s (--timeout); "
                                        "it was stopped",
                                        o.timeout_seconds),
                            o.trace_path);
    try {
      br.m = backend::run(s, ro);
    } catch (const backend::OutOfMemory& e) {
      br.fits = false;
      br.oom_message = e.what();
    }
    return br;
  }
  const std::string mpirun = find_mpirun();
  if (mpirun.empty())
    throw std::runtime_error("validate: the layout needs " + std::to_string(ranks) +
                             " ranks and no mpirun was found (set DISTPLAN_MPIRUN or PATH), or "
                             "use --emulate-rank");
  TempFolder folder{fs::temp_directory_path() /
                    ("distplan-validate-" + std::to_string(::getpid()))};
  const fs::path dir = folder.path;
  fs::create_directories(dir);
  const std::string in = (dir / "scenario.json").string();
  const std::string out = (dir / "measurement.json").string();
  {
    std::ofstream f(in);
    f << doc.dump();
    f.close();
    if (!f) throw std::runtime_error("validate: cannot write '" + in + "'");
  }
  // Open MPI refuses root without these; shared memory between local ranks (TOOLCHAIN.md).
  if (::geteuid() == 0) {
    set_default_env("OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default_env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  set_default_env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
  set_default_env("OMPI_MCA_rmaps_base_oversubscribe", "1");
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> args = {mpirun,
                                         "-np",
                                         std::to_string(ranks),
                                         "--oversubscribe",
                                         self,
                                         "validate",
                                         in,
                                         "--device",
                                         o.device,
                                         "--steps",
                                         std::to_string(o.steps),
                                         "--rank-worker-out",
                                         out};
  const LaunchResult lr = launch(args, (dir / "mpirun.log").string(), o.timeout_seconds, folder);
  if (fs::exists(out + ".oom")) {
    std::ifstream f(out + ".oom");
    std::getline(f, br.oom_message);
    br.fits = false;
    fs::remove_all(dir);
    return br;
  }
  if (lr.timed_out) {
    fs::remove_all(dir);
    throw std::runtime_error(fmt::format(
        "validate: the {} ranks did not finish within {} s (a rank hangs); every rank was "
        "stopped. mpirun output: {}",
        ranks, o.timeout_seconds, tail(lr.log, 2000)));
  }
  if (lr.exit_code != 0 || !fs::exists(out)) {
    fs::remove_all(dir);
    throw std::runtime_error(
        fmt::format("validate: a rank failed (mpirun exit code {}); every rank was stopped. "
                    "mpirun output: {}",
                    lr.exit_code, tail(lr.log, 2000)));
  }
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  br.m = backend::measurement_from_json(json::parse(ss.str()));
  fs::remove_all(dir);
  return br;
}

// ---- comparison
// -----------------------------------------------------------------------------------
std::string pct(double x) {
  return fmt::format("{:+.2f} %", 100 * x);
}

json rel(double predicted, double measured) {
  if (predicted == 0) return measured == 0 ? json(0.0) : json(nullptr);
  return (measured - predicted) / predicted;
}

constexpr const char* kCategories[] = {"weights", "gradients", "optimizer", "activations",
                                       "buffers", "runtime",   "total"};  // total: tracked

// Collectives of one stage, summed per (group, op, what) and per (group, op).
struct StageComm {
  std::map<std::tuple<std::string, std::string, std::string>, backend::CommTotals> by_what;
  std::map<std::string, backend::CommTotals> by_op;  // "group/op"
  Bytes wire = 0;
};

json stage_comm_json(int stage, const StageComm& c) {
  json list = json::array();
  for (const auto& [k, v] : c.by_what)
    list.push_back({{"group", std::get<0>(k)},
                    {"op", std::get<1>(k)},
                    {"what", std::get<2>(k)},
                    {"bytes_per_step", v.bytes},
                    {"calls_per_step", v.calls}});
  return {{"stage", stage}, {"wire_bytes_per_gpu_per_step", c.wire}, {"collectives", list}};
}

struct Report {
  json doc;
  std::string table;
};

Report compare(const Scenario& s, const Estimate& e, const BackendResult& br,
               const ValidateOptions& o) {
  const json plan = plan_to_json(s, e);
  json predicted = {{"memory", plan.at("memory")},
                    {"communication", plan.at("communication")},
                    {"time", plan.at("time")}};
  json measured, err;
  const int pp = static_cast<int>(s.parallel.pp);
  std::ostringstream t;
  t << fmt::format("distplan validate: {} on {} ({} rank{}{}), {} step{}\n",
                   s.model.name.empty() ? std::string("model") : s.model.name, o.device,
                   ranks_of(s), ranks_of(s) == 1 ? "" : "s",
                   o.emulate_rank >= 0 ? fmt::format(", emulating rank {}", o.emulate_rank) : "",
                   o.steps, o.steps == 1 ? "" : "s");
  // Ranks time-sharing cores run slower by the sharing, not by the layout.
  const unsigned cores = std::thread::hardware_concurrency();
  const Count processes = o.emulate_rank >= 0 ? 1 : ranks_of(s);
  if (o.device != "cuda" && cores > 0 && processes > static_cast<Count>(cores)) {
    t << fmt::format(
        "note: {} ranks on {} CPU cores: oversubscribed; measured times include the ranks "
        "waiting for a core\n",
        processes, cores);
  }
  if (!br.fits) {
    measured = {{"memory", {{"fits", false}, {"message", br.oom_message}}}};
    t << "measured: does not fit (" << br.oom_message << ")\n";
    t << fmt::format("predicted: peak {:.3f} GiB, {}\n",
                     static_cast<double>(e.memory.peak_bytes) / (1ull << 30),
                     e.memory.fits ? "fits" : "does not fit");
    return {{{"schema", "distplan.validate/v1"},
             {"scenario", to_json(s)},
             {"device", o.device},
             {"steps", o.steps},
             {"predicted", predicted},
             {"measured", measured},
             {"relative_error", {{"memory", {{"fits", e.memory.fits ? 1.0 : 0.0}}}}},
             {"losses", json::array()}},
            t.str()};
  }
  const backend::Measurement& m = br.m;

  // Memory per stage: the largest figure of the stage's ranks in each category.
  json mstages = json::array(), estages = json::array();
  Bytes peak = 0;
  // People read GiB for real models and MiB (2^20 bytes) for the small ones a CPU runs.
  const bool in_gib = e.memory.peak_bytes - s.cluster.runtime_reserve_bytes >= (Bytes{1} << 30);
  const double unit = in_gib ? static_cast<double>(Bytes{1} << 30) : static_cast<double>(1 << 20);
  t << fmt::format("\nMemory per GPU ({})      predicted   measured   rel. error\n",
                   in_gib ? "GiB" : "MiB");
  for (int st = 0; st < pp; ++st) {
    json ms = {{"stage", st}};
    bool present = false;
    std::map<std::string, Bytes> cat;
    for (const backend::RankMeasurement& r : m.ranks) {
      if (r.coords.pp != st) continue;
      present = true;
      auto take = [&](const char* k, Bytes v) { cat[k] = std::max(cat[k], v); };
      take("weights", r.memory.peak_of(backend::MemoryTag::weights));
      take("gradients", r.memory.peak_of(backend::MemoryTag::gradients));
      take("optimizer", r.memory.peak_of(backend::MemoryTag::optimizer));
      take("activations", r.memory.peak_of(backend::MemoryTag::activations));
      take("buffers", r.memory.peak_of(backend::MemoryTag::buffers));
      take("temporaries", r.memory.peak_of(backend::MemoryTag::temporaries));
      take("total", r.memory.peak_total);
    }
    if (!present) continue;
    for (const auto& [k, v] : cat) ms[k + "_bytes"] = v;
    peak = std::max(peak, cat["total"]);
    mstages.push_back(ms);
    const json& ps = predicted["memory"]["stages"][static_cast<std::size_t>(st)];
    json es = {{"stage", st}};
    t << fmt::format("stage {}\n", st);
    for (const char* c : kCategories) {
      const std::string key = std::string(c) + "_bytes";
      double pv = ps.value(key, 0.0);
      const double mv = ms.value(key, 0.0);
      // Host memory has no device runtime: the measured total is the tracked joint peak,
      // compared with the predicted total less the runtime reserve.
      if (key == "runtime_bytes") {
        es[key] = nullptr;
        t << fmt::format("  {:<22}{:>10.3f} {:>10}   n/a\n", c, pv / unit, "-");
        continue;
      }
      if (key == "total_bytes") pv -= ps.value("runtime_bytes", 0.0);
      es[key] = rel(pv, mv);
      const json& r = es[key];
      t << fmt::format("  {:<22}{:>10.3f} {:>10.3f}   {}\n", c, pv / unit, mv / unit,
                       r.is_null() ? std::string("n/a") : pct(r.get<double>()));
    }
    // Temporaries (activation gradients, collective staging inside one op) are measured and
    // counted in the measured total; the planner has no such category (docs/gpu_backend.md).
    t << fmt::format("  {:<22}{:>10} {:>10.3f}   n/a\n", "temporaries", "-",
                     ms.value("temporaries_bytes", 0.0) / unit);
    estages.push_back(es);
  }
  t << "  (temporaries: activation gradients and collective staging that live inside one op;\n"
       "   the planner has no such category, the measured total includes them)\n";
  measured["memory"] = {{"capacity_bytes", e.memory.capacity_bytes},
                        {"peak_bytes", peak},
                        {"fits", true},
                        {"stages", mstages}};
  const Bytes runtime = e.memory.stages.empty() ? 0 : e.memory.stages.front().runtime_bytes;
  err["memory"] = {{"peak_bytes", rel(static_cast<double>(e.memory.peak_bytes - runtime),
                                      static_cast<double>(peak))},
                   {"stages", estages}};

  // Communication per stage (the first rank of each stage), against
  // stage_communication().
  json pcs = json::array(), mcs = json::array(), ecs = json::array();
  Bytes busiest_wire = 0;
  t << "\nCollectives per GPU per step (bytes handed)    predicted       measured   rel. error\n";
  for (int st = 0; st < pp; ++st) {
    StageComm pc, mc;
    for (const Collective& c : stage_communication(s, st)) {
      auto& a = pc.by_what[{std::string(to_string(c.group)), std::string(to_string(c.op)),
                            std::string(c.what)}];
      a.bytes += c.bytes_per_call * c.calls_per_step;
      a.calls += c.calls_per_step;
      auto& b = pc.by_op[std::string(to_string(c.group)) + "/" + std::string(to_string(c.op))];
      b.bytes += c.bytes_per_call * c.calls_per_step;
      b.calls += c.calls_per_step;
      pc.wire += c.wire_bytes_per_gpu_per_step;
    }
    // The stage's first measured rank (tp = 0, dp = 0 unless one emulated rank stands for it).
    const backend::RankMeasurement* first = nullptr;
    for (const backend::RankMeasurement& r : m.ranks)
      if (r.coords.pp == st && (first == nullptr || r.rank < first->rank)) first = &r;
    for (const backend::RankMeasurement& r : m.ranks) {
      if (&r != first) continue;
      for (const auto& [k, v] : r.communication) {
        const auto [g, op, what] = k;
        auto& a = mc.by_what[{std::string(to_string(g)), std::string(to_string(op)), what}];
        a.bytes += v.bytes;
        a.calls += v.calls;
        auto& b = mc.by_op[std::string(to_string(g)) + "/" + std::string(to_string(op))];
        b.bytes += v.bytes;
        b.calls += v.calls;
        if (v.calls > 0)
          mc.wire += ring_wire_bytes(op, v.bytes / v.calls, group_size(s, g)) * v.calls;
      }
    }
    // An emulated run measures one rank: only its stage is compared.
    const bool have = std::any_of(m.ranks.begin(), m.ranks.end(),
                                  [&](const auto& r) { return r.coords.pp == st; });
    if (!have) continue;
    busiest_wire = std::max(busiest_wire, mc.wire);
    pcs.push_back(stage_comm_json(st, pc));
    mcs.push_back(stage_comm_json(st, mc));
    json eo = json::object();
    std::map<std::string, bool> keys;
    for (const auto& [k, v] : pc.by_op) keys[k] = true;
    for (const auto& [k, v] : mc.by_op) keys[k] = true;
    t << fmt::format("stage {}\n", st);
    for (const auto& [k, unused] : keys) {
      const double pv = static_cast<double>(pc.by_op[k].bytes);
      const double mv = static_cast<double>(mc.by_op[k].bytes);
      eo[k] = rel(pv, mv);
      t << fmt::format("  {:<40}{:>12} {:>14}   {}\n", k, static_cast<Bytes>(pv),
                       static_cast<Bytes>(mv),
                       eo[k].is_null() ? std::string("n/a") : pct(eo[k].get<double>()));
    }
    ecs.push_back({{"stage", st},
                   {"wire_bytes_per_gpu_per_step",
                    rel(static_cast<double>(pc.wire), static_cast<double>(mc.wire))},
                   {"collectives", eo}});
  }
  predicted["communication"]["stages"] = pcs;
  measured["communication"] = {{"wire_bytes_per_gpu_per_step", busiest_wire}, {"stages", mcs}};
  err["communication"] = {{"stages", ecs}};

  // Time: per-stage forward/backward times from the executed actions (a chunk action counts v
  // times for a whole stage), the simulator run with those costs, against the measured step.
  const Count v = s.parallel.virtual_stages;
  double fwd = 0, bwd = 0, bwd_w = 0;
  Count nf = 0, nb = 0, nw = 0;
  Seconds step = 0, busy_sum = 0;
  std::map<int, Seconds> busy;
  for (const backend::RankMeasurement& r : m.ranks) {
    step = std::max(step, r.step_seconds);
    Seconds b = 0;
    for (const backend::ExecutedAction& a : r.actions) {
      b += a.seconds;
      switch (a.action.op) {
        case sim::Op::forward:
          fwd += a.seconds;
          ++nf;
          break;
        case sim::Op::backward_weight:
          bwd_w += a.seconds;
          ++nw;
          break;
        default:
          bwd += a.seconds;
          ++nb;
      }
    }
    busy[r.coords.pp] = std::max(busy[r.coords.pp], b);
  }
  for (const auto& [st, b] : busy) busy_sum += b;
  sim::CostOverride costs;
  costs.forward_seconds = nf ? fwd / static_cast<double>(nf) * static_cast<double>(v) : 0;
  costs.backward_seconds = nb ? bwd / static_cast<double>(nb) * static_cast<double>(v) : 0;
  if (nw) costs.backward_weight_seconds = bwd_w / static_cast<double>(nw) * static_cast<double>(v);
  sim::SimOptions so;
  so.costs = costs;
  so.exposed_communication = false;
  const sim::SimResult sr = sim::simulate(s, e, so);
  const bool whole = static_cast<Count>(busy.size()) == s.parallel.pp;
  const double measured_bubble =
      whole && step > 0 ? 1.0 - busy_sum / (static_cast<double>(pp) * step) : 0.0;
  predicted["time"]["simulated_step_seconds"] = sr.step_seconds;
  predicted["time"]["simulated_bubble_fraction"] = sr.bubble_fraction;
  predicted["time"]["costs"] = {
      {"forward_seconds", costs.forward_seconds},
      {"backward_seconds", costs.backward_seconds},
      {"backward_weight_seconds",
       costs.backward_weight_seconds ? json(*costs.backward_weight_seconds) : json(nullptr)}};
  Seconds opt = 0;
  for (const auto& r : m.ranks) opt = std::max(opt, r.optimizer_seconds);
  measured["time"] = {
      {"step_seconds", step},
      {"compute_seconds",
       busy.empty() ? 0.0
                    : std::max_element(busy.begin(), busy.end(),
                                       [](auto& a, auto& b) { return a.second < b.second; })
                          ->second},
      {"bubble_fraction", measured_bubble},
      {"optimizer_seconds", opt}};
  // The simulator's step excludes the optimizer and DP communication (a cost override replaces
  // the whole cost model): compare it with the measured step less the optimizer.
  err["time"] = {{"simulated_step_seconds", rel(sr.step_seconds, step - opt)}};
  if (whole) err["time"]["bubble_fraction"] = rel(sr.bubble_fraction, measured_bubble);
  // The planner's analytic time is for the scenario's GPU: compared only on that device.
  if (o.device == "cuda") {
    err["time"]["step_seconds"] = rel(e.time.step_seconds, step);
  }
  t << fmt::format("\nTime (ms)                 predicted   measured   rel. error\n");
  const json& st_err = err["time"]["simulated_step_seconds"];
  t << fmt::format("  simulated step, with measured costs {:>10.3f} {:>10.3f}   {}\n",
                   sr.step_seconds * 1e3, (step - opt) * 1e3,
                   st_err.is_null() ? std::string("n/a") : pct(st_err.get<double>()));
  t << "    (the simulator run with the forward/backward times measured here, without the\n"
       "     optimizer step; compared with the measured step less the optimizer)\n";
  if (o.device == "cuda") {
    t << fmt::format("  planner step ({})  {:>10.3f} {:>10.3f}\n", s.cluster.gpu.name,
                     e.time.step_seconds * 1e3, step * 1e3);
  } else {
    t << fmt::format("  planner step ({}, analytic) {:>10.3f} {:>10.3f}   not comparable\n",
                     s.cluster.gpu.name, e.time.step_seconds * 1e3, step * 1e3);
    t << fmt::format(
        "    (the planner's time is for a {}; the measured time is this CPU's: no error is "
        "computed)\n",
        s.cluster.gpu.name);
  }
  t << (o.emulate_rank >= 0 && ranks_of(s) > 1
            ? "\nLoss per step (emulated collectives move no data: not the model's loss):"
            : "\nLoss per step:");
  for (double l : m.losses) t << fmt::format(" {:.6f}", l);
  t << "\n";

  json doc = {{"schema", "distplan.validate/v1"},
              {"scenario", to_json(s)},
              {"device", o.device},
              {"steps", o.steps},
              {"ranks", ranks_of(s)},
              {"emulate_rank", o.emulate_rank >= 0 ? json(o.emulate_rank) : json(nullptr)},
              {"predicted", predicted},
              {"measured", measured},
              {"relative_error", err},
              {"losses", m.losses},
              {"skipped_steps", m.skipped}};
  return {doc, t.str()};
}

void install_validate(CLI::App& app) {
  auto opts = std::make_shared<ValidateOptions>();
  auto* cmd = app.add_subcommand(
      "validate",
      "Run the layout for real and compare measured memory, traffic and time with "
      "the prediction");
  add_common_options(*cmd, opts->common, /*input_optional=*/true);
  cmd->add_option("--device", opts->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--steps", opts->steps, "Training steps (the last one is measured)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--emulate-rank", opts->emulate_rank,
                  "Run only this rank of the layout in this process (collectives emulated)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout", opts->timeout_seconds,
                  "Seconds before the run is stopped as hung (finite, > 0, at most a week)")
      ->check(CLI::Validator(
          [](const std::string& v) {
            double x = 0;
            try {
              std::size_t used = 0;
              x = std::stod(v, &used);
              if (used != v.size()) return std::string("not a number");
            } catch (const std::exception&) {
              return std::string("not a number");
            }
            if (!std::isfinite(x) || x <= 0 || x > kMaxTimeoutSeconds)
              return fmt::format("must be finite, positive and at most {} s (a week)",
                                 kMaxTimeoutSeconds);
            return std::string();
          },
          "SECONDS"));
  cmd->add_option("--trace", opts->trace_path,
                  "Write the executed timeline of the measured step (one rank per stage) as a "
                  "Chrome / Perfetto trace to this file")
      ->check(non_empty_path());
  cmd->add_flag("--force", opts->force,
                "Run even when the local ranks' predicted memory or their number exceeds what "
                "this host has (docs/trust.md)");
  cmd->add_option("--rank-worker-out", opts->rank_worker_out)->group("");
  cmd->callback([opts] {
    const json doc = read_document(opts->common);
    const Scenario s = read_scenario(opts->common, doc);
    if (!opts->rank_worker_out.empty()) {
      run_rank_worker(s, *opts);
      return;
    }
    refuse_unvalidated_levers(s);
    backend::check_supported(s);
    if (opts->emulate_rank >= ranks_of(s))
      throw InputError("", fmt::format("--emulate-rank {} is not a rank of the layout (0..{})",
                                       opts->emulate_rank, ranks_of(s) - 1));
    if (opts->device == "cuda" && !backend::cuda_available())
      throw std::runtime_error("validate: --device cuda needs a CUDA build and a visible GPU");
    const Estimate e = estimate(s);
    check_host_resources(s, e, *opts);
    // The trace file is opened before the run, so a path that cannot be written fails at once.
    std::ofstream trace;
    if (!opts->trace_path.empty()) {
      trace.open(opts->trace_path);
      if (!trace) throw InputError("", "--trace: cannot write '" + opts->trace_path + "'");
    }
    BackendResult br;
    try {
      br = run_backend(s, to_json(s), *opts);
    } catch (...) {
      if (trace.is_open()) remove_partial_output(trace, opts->trace_path);
      throw;
    }
    const Report r = compare(s, e, br, *opts);
    if (trace.is_open()) {
      if (br.fits) {
        trace << backend::timeline_trace_json(br.m);
        trace.close();
        if (trace.fail()) {
          remove_partial_output(trace, opts->trace_path);
          throw std::runtime_error("cannot write trace file '" + opts->trace_path + "'");
        }
      } else {
        remove_partial_output(trace, opts->trace_path);  // out of memory: no timeline
      }
    }
    if (opts->common.format == Format::table) {
      std::cout << r.table;
    } else {
      write_json(r.doc);
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(validate, 60, install_validate);

}  // namespace distplan::cli
