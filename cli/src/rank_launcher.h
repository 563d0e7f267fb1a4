// How `distplan validate` starts the ranks of a multi-rank layout: mpirun (local, or on the hosts
// of a --hostfile) or srun inside a Slurm allocation, with extra launcher arguments, each rank
// being this executable in rank-worker mode. Nothing here assumes a file system shared between
// hosts: the scenario travels on the command line (base64) and rank 0 prints the gathered
// measurement on its standard output, which the launcher forwards (docs/gpu_backend.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace distplan::cli {

/// Line prefixes a rank prints on its standard output for the launcher: the gathered measurement
/// (rank 0, one line of JSON) and an out-of-memory result (any rank).
inline constexpr std::string_view kMeasurementLine = "DISTPLAN-MEASUREMENT ";
inline constexpr std::string_view kOutOfMemoryLine = "DISTPLAN-OUT-OF-MEMORY ";

struct LaunchRequest {
  std::string launcher = "auto";  // auto | mpirun | srun
  std::string hostfile;           // mpirun --hostfile
  std::string extra_args;         // whitespace-separated, inserted before the program
  long long ranks = 1;
  std::vector<std::string> program;  // one rank's command line
};

struct LaunchCommand {
  std::string launcher;           // "mpirun" or "srun"
  bool local = true;              // every rank on this host (mpirun without a hostfile)
  std::vector<std::string> argv;  // argv[0] is the launcher's path
};

/// Chooses the launcher (auto: srun inside a Slurm allocation, SLURM_JOB_ID set, when srun is
/// found; else mpirun) and builds its command line. mpirun: DISTPLAN_MPIRUN or PATH (mpirun,
/// mpiexec); srun: DISTPLAN_SRUN or PATH. InputError for options that do not fit together
/// (--hostfile with srun, an unreadable hostfile, an unknown launcher); runtime_error when the
/// launcher is not found.
[[nodiscard]] LaunchCommand make_launch_command(const LaunchRequest& r);

/// Splits on whitespace (no quoting: one launcher argument per word).
[[nodiscard]] std::vector<std::string> split_words(const std::string& s);

/// RFC 4648 base64 (standard alphabet, padded). decode throws InputError on malformed text.
[[nodiscard]] std::string base64_encode(std::string_view bytes);
[[nodiscard]] std::string base64_decode(std::string_view text);

}  // namespace distplan::cli
