// Runs the built `distplan` binary as a child process and captures what it writes, for tests that
// hold the CLI's contract (exit codes, one JSON error on stderr, nothing on stdout, time bounds).
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace distplan::testing {

struct CliResult {
  int exit_code = -1;  // -1: killed by a signal or by the time-out
  int signal = 0;      // the signal that ended the child, if any
  bool timed_out = false;
  std::string out;
  std::string err;
  std::chrono::duration<double> elapsed{0};  // seconds from spawn to exit
};

/// Runs `distplan args...` with `stdin_text` on its standard input (empty: /dev/null contents)
/// and kills it after `limit`.
CliResult run_cli(const std::vector<std::string>& args, const std::string& stdin_text = {},
                  std::chrono::duration<double> limit = std::chrono::seconds(60),
                  const std::vector<std::string>& env = {});

/// A fresh directory under the system temp dir, removed when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Writes `bytes` to `name` inside the directory and returns its path.
  std::filesystem::path write(const std::string& name, const std::string& bytes) const;

 private:
  std::filesystem::path path_;
};

/// Text of a file in the source tree (relative to the repository root).
std::string read_source_file(const std::string& relative);

/// Wall-time budget for one CLI call on bad input: 1 s, scaled by DISTPLAN_TEST_TIME_SCALE for
/// builds that are slow by design (sanitizers, Debug).
std::chrono::duration<double> bad_input_budget();

}  // namespace distplan::testing
