// distplan validate: runs the planner, the GPU backend and the simulator (with the costs measured
// in this run) on one scenario and puts predicted and measured side by side
// (distplan.validate/v1, docs/gpu_backend.md "distplan validate").
//
// A layout with several ranks runs under mpirun (local, or the hosts of --hostfile) or srun (inside
// a Slurm allocation), started here (rank_launcher.h): this same executable is launched once per
// rank in rank-worker mode with the scenario on its command line; rank 0 gathers every rank's
// measurement through MPI and prints it on its standard output, which the launcher forwards, so no
// shared file system is needed. A rank that crashes or hangs stops the whole job: the launcher's
// own abort, or --timeout, after which every rank is killed and the command exits 1 with a
// message. `--rank-worker` alone is the public form for the user's own launcher: rank 0 then
// prints the comparison itself.
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
#include <optional>
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
#include "distplan/gpu_backend/validation_report.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "distplan/simulator/simulate.h"
#include "rank_launcher.h"

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
  bool rank_worker = false;  // --rank-worker: this process is one rank of an MPI job
  std::string
      rank_worker_job;  // hidden: started by this command's launcher (prints the measurement)
  std::string scenario_base64;    // hidden: the scenario, from the launcher's command line
  std::string launcher = "auto";  // --launcher auto|mpirun|srun
  std::string hostfile;           // --hostfile (mpirun)
  std::string launcher_args;      // --launcher-args "..." (whitespace-separated)
  std::string trace_path;         // --trace: the executed timeline as a Chrome / Perfetto trace
  bool force = false;             // --force: run even when the host looks too small
  bool tf32 = false;              // --tf32: fp32 GEMMs on TF32 tensor cores (CUDA)
};

// --timeout bound: a week. Beyond it a run is not "hung" but unbounded (docs/trust.md).
constexpr double kMaxTimeoutSeconds = 7.0 * 24 * 3600;
// Local ranks per host core accepted without --force: the CPU backend's ranks mostly wait on each
// other, so some oversubscription is normal (tests run 8 ranks on 2 cores); far more only thrashes.
constexpr Count kMaxRanksPerCore = 8;
// Share of the host's physical memory the ranks' predicted bytes may take without --force.
constexpr double kMaxHostMemoryShare = 0.8;

using backend::ranks_of;  // the layout's ranks (validation_report.h)

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

struct BackendResult {
  bool fits = true;
  std::string oom_message;
  backend::Measurement m;
};

// True when every rank runs on this host: mpirun without a hostfile, outside a Slurm allocation
// (or with --launcher mpirun).
bool launches_locally(const ValidateOptions& o) {
  if (o.rank_worker || !o.hostfile.empty() || o.launcher == "srun") return false;
  const char* job = std::getenv("SLURM_JOB_ID");
  return o.launcher == "mpirun" || job == nullptr || *job == '\0';
}

// ---- one rank of an MPI job (--rank-worker) -----------------------------------------------------
// Rank 0 returns every rank's measurement, gathered through MPI; the other ranks return nothing.
// Out of memory on any rank: it prints the marker line for the launcher and stops the job.
std::optional<BackendResult> run_rank_worker(const Scenario& s, const ValidateOptions& o) {
  if (!backend::mpi_available())
    throw std::runtime_error("validate: --rank-worker needs a build with MPI");
  backend::mpi_init_if_needed();
  const int rank = backend::mpi_world_rank();
  maybe_inject_fault(rank);
  backend::RunOptions ro;
  ro.steps = o.steps;
  ro.comm = backend::CommBackend::mpi;
  ro.device = device_of(o.device);
  ro.capacity_bytes = tracked_capacity(estimate(s));
  ro.tf32 = o.tf32;
  BackendResult br;
  try {
    br.m = backend::run(s, ro);
  } catch (const backend::OutOfMemory& e) {
    // A measured result: tell the launcher, then stop every rank.
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::cout << kOutOfMemoryLine << msg << std::endl;
    std::cerr << "validate: rank " << rank << " ran out of memory: " << msg << std::endl;
    backend::mpi_abort(3);
  }
  const auto all = backend::gather_measurements(backend::to_json(br.m.ranks.front()).dump());
  backend::mpi_finalize_if_initialised();
  if (all.empty()) return std::nullopt;
  br.m.ranks.clear();
  for (const auto& r : all)
    br.m.ranks.push_back(backend::rank_measurement_from_json(json::parse(r)));
  return br;
}

// ---- launching mpirun
// -----------------------------------------------------------------------------
void set_default_env(const char* name, const char* value) {
  if (std::getenv(name) == nullptr) ::setenv(name, value, 0);
}

struct LaunchResult {
  bool timed_out = false;
  int exit_code = 0;
  std::string out;  // the launcher's standard output (rank 0's measurement line)
  std::string log;  // its standard error
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

// Runs argv in its own process group with stdout to `out_path` and stderr to `log_path`; after
// `timeout` seconds, or
// on SIGTERM/SIGINT/SIGHUP to this process, the whole group is terminated (SIGTERM, then SIGKILL
// 3 s later). After a signal, `folder` is removed and this process ends by the same signal.
LaunchResult launch(const std::vector<std::string>& args, const std::string& out_path,
                    const std::string& log_path, double timeout, TempFolder& folder) {
  const StopSignals guard;
  g_stop_signal = 0;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("validate: fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) ::dup2(out, 1);
    if (err >= 0) ::dup2(err, 2);
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
  auto slurp = [](const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.log = slurp(log_path);
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
  if (!one && !launches_locally(o)) return;  // the ranks run on other hosts
  const Count ranks = one ? 1 : ranks_of(s);
  const Count per_stage = s.parallel.tp * s.parallel.cp * s.parallel.dp;
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
    ro.tf32 = o.tf32;
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
  TempFolder folder{fs::temp_directory_path() /
                    ("distplan-validate-" + std::to_string(::getpid()))};
  const fs::path dir = folder.path;
  fs::create_directories(dir);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  // The scenario travels on the command line, the measurement on rank 0's standard output: the
  // ranks need no file of this host. The job name (this folder) marks the ranks' command lines.
  LaunchRequest req;
  req.launcher = o.launcher;
  req.hostfile = o.hostfile;
  req.extra_args = o.launcher_args;
  req.ranks = ranks;
  req.program = {self,         "validate",          "--rank-worker",           "--rank-worker-job",
                 dir.string(), "--scenario-base64", base64_encode(doc.dump()), "--device",
                 o.device,     "--steps",           std::to_string(o.steps)};
  if (o.tf32) req.program.push_back("--tf32");
  // Linux limits one argument to 32 pages (MAX_ARG_STRLEN); a scenario is a few KiB.
  if (req.program[6].size() > 100000)
    throw std::runtime_error(fmt::format(
        "validate: the scenario is {} bytes of base64, too long for a command line; start the "
        "ranks with your own launcher (--rank-worker)",
        req.program[6].size()));
  const LaunchCommand lc = make_launch_command(req);
  // Open MPI refuses root without these; shared memory between local ranks (TOOLCHAIN.md).
  if (::geteuid() == 0) {
    set_default_env("OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default_env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  set_default_env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
  if (lc.local) set_default_env("OMPI_MCA_rmaps_base_oversubscribe", "1");
  const LaunchResult lr = launch(lc.argv, (dir / "ranks.out").string(),
                                 (dir / "launcher.log").string(), o.timeout_seconds, folder);
  // Rank 0's measurement line, or an out-of-memory marker of any rank.
  std::optional<std::string> measurement;
  std::string other_output;
  {
    std::istringstream lines(lr.out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(kOutOfMemoryLine, 0) == 0) {
        br.fits = false;
        br.oom_message = line.substr(kOutOfMemoryLine.size());
      } else if (line.rfind(kMeasurementLine, 0) == 0) {
        measurement = line.substr(kMeasurementLine.size());
      } else {
        other_output += line + '\n';
      }
    }
  }
  if (!br.fits) return br;
  const std::string output = tail(other_output + lr.log, 2000);
  if (lr.timed_out) {
    throw std::runtime_error(fmt::format(
        "validate: the {} ranks did not finish within {} s (a rank hangs); every rank was "
        "stopped. {} output: {}",
        ranks, o.timeout_seconds, lc.launcher, output));
  }
  if (lr.exit_code != 0 || !measurement) {
    throw std::runtime_error(
        fmt::format("validate: a rank failed ({} exit code {}{}); every rank was stopped. {} "
                    "output: {}",
                    lc.launcher, lr.exit_code, measurement ? "" : ", no measurement from rank 0",
                    lc.launcher, output));
  }
  br.m = backend::measurement_from_json(json::parse(*measurement));
  return br;
}

// How the run was made, for the comparison (validation_report.h).
backend::ValidationSettings settings_of(const ValidateOptions& o) {
  backend::ValidationSettings v;
  v.device = o.device;
  v.steps = o.steps;
  v.emulate_rank = o.emulate_rank;
  v.local_ranks = launches_locally(o);
  v.host_cores = std::thread::hardware_concurrency();
  return v;
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
  cmd->add_option("--launcher", opts->launcher,
                  "How to start the ranks of a multi-rank layout: auto (srun inside a Slurm "
                  "allocation, else mpirun), mpirun or srun")
      ->check(CLI::IsMember({"auto", "mpirun", "srun"}));
  cmd->add_option("--hostfile", opts->hostfile,
                  "mpirun's hostfile: the ranks run on its hosts (no shared file system needed)")
      ->check(non_empty_path());
  cmd->add_option("--launcher-args", opts->launcher_args,
                  "Extra launcher arguments, whitespace-separated, before the program "
                  "(write --launcher-args=\"--mca btl tcp,self\")");
  cmd->add_flag("--tf32", opts->tf32,
                "CUDA: fp32 GEMMs on TF32 tensor cores (inputs rounded to 10 mantissa bits, fp32 "
                "accumulation)");
  cmd->add_flag("--rank-worker", opts->rank_worker,
                "Run as one rank of an MPI job started by your own launcher (one process per "
                "rank, world size = tp*cp*dp*pp); rank 0 prints the comparison");
  cmd->add_option("--rank-worker-job", opts->rank_worker_job)->group("");
  cmd->add_option("--scenario-base64", opts->scenario_base64)->group("");
  cmd->callback([opts] {
    json doc;
    if (!opts->scenario_base64.empty()) {
      try {
        doc = json::parse(base64_decode(opts->scenario_base64));
      } catch (const json::exception& e) {
        throw InputError("", std::string("--scenario-base64: not JSON: ") + e.what());
      }
    } else {
      doc = read_document(opts->common);
    }
    const Scenario s = read_scenario(opts->common, doc);
    if (opts->rank_worker && opts->emulate_rank >= 0)
      throw InputError("",
                       "--rank-worker runs one rank of an MPI job; --emulate-rank runs one "
                       "rank alone: use one of them");
    std::optional<BackendResult> worker;
    if (opts->rank_worker) {
      worker = run_rank_worker(s, *opts);
      if (!worker) return;  // not rank 0
      if (!opts->rank_worker_job.empty()) {
        // Started by this command's launcher: hand the measurement over on standard output.
        std::cout << kMeasurementLine << backend::to_json(worker->m).dump() << std::endl;
        return;
      }
    }
    refuse_unvalidated_levers(s);
    backend::check_supported_on(s, device_of(opts->device));
    if (opts->emulate_rank >= ranks_of(s))
      throw InputError("", fmt::format("--emulate-rank {} is not a rank of the layout (0..{})",
                                       opts->emulate_rank, ranks_of(s) - 1));
    if (opts->device == "cuda" && !worker && !backend::cuda_available())
      throw std::runtime_error("validate: --device cuda needs a CUDA build and a visible GPU");
    const Estimate e = sim::plan(s);
    check_host_resources(s, e, *opts);
    // The trace file is opened before the run, so a path that cannot be written fails at once.
    std::ofstream trace;
    if (!opts->trace_path.empty()) {
      trace.open(opts->trace_path);
      if (!trace) throw InputError("", "--trace: cannot write '" + opts->trace_path + "'");
    }
    BackendResult br;
    try {
      br = worker ? std::move(*worker) : run_backend(s, to_json(s), *opts);
    } catch (...) {
      if (trace.is_open()) remove_partial_output(trace, opts->trace_path);
      throw;
    }
    const backend::ValidationReport r =
        backend::compare(s, e, br.fits ? &br.m : nullptr, br.oom_message, settings_of(*opts));
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
      std::cout << backend::to_table(r);
    } else {
      write_json(backend::to_json(r));
    }
  });
}

}  // namespace

DISTPLAN_REGISTER_COMMAND(validate, 60, install_validate);

}  // namespace distplan::cli
