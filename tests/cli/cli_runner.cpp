#include "cli_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#ifndef DISTPLAN_CLI_PATH
#error "DISTPLAN_CLI_PATH must name the distplan binary"
#endif
#ifndef DISTPLAN_TEST_TIME_SCALE
#define DISTPLAN_TEST_TIME_SCALE 1
#endif

namespace distplan::testing {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

TempDir::TempDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "distplan-cli-XXXXXX").string();
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::filesystem::path TempDir::write(const std::string& name, const std::string& bytes) const {
  const auto p = path_ / name;
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
  return p;
}

std::string read_source_file(const std::string& relative) {
  const auto p = std::filesystem::path(DISTPLAN_SOURCE_DIR) / relative;
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::chrono::duration<double> bad_input_budget() {
  return std::chrono::duration<double>(1.0 * DISTPLAN_TEST_TIME_SCALE);
}

CliResult run_cli(const std::vector<std::string>& args, const std::string& stdin_text,
                  std::chrono::duration<double> limit, const std::vector<std::string>& env) {
  TempDir dir;
  const auto in = dir.write("stdin", stdin_text);
  const auto out = dir.path() / "stdout";
  const auto err = dir.path() / "stderr";

  std::vector<std::string> argv_s{DISTPLAN_CLI_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = env;

  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    const int fin = ::open(in.c_str(), O_RDONLY);
    const int fout = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int ferr = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fin < 0 || fout < 0 || ferr < 0) ::_exit(126);
    ::dup2(fin, 0);
    ::dup2(fout, 1);
    ::dup2(ferr, 2);
    for (auto& e : env_s) ::putenv(e.data());
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  CliResult r;
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() - start > limit) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  r.elapsed = std::chrono::steady_clock::now() - start;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace distplan::testing
