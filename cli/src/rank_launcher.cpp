// Launcher selection and command lines for the ranks of `distplan validate` (rank_launcher.h).
#include "rank_launcher.h"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "distplan/planner/error.h"

namespace distplan::cli {
namespace {

namespace fs = std::filesystem;

// `env` when set (it must then be an executable file), else the first of `names` on PATH.
std::string find_program(const char* env, std::initializer_list<const char*> names) {
  if (const char* e = std::getenv(env); e && *e) {
    std::error_code ec;
    if (!fs::is_regular_file(e, ec) || ::access(e, X_OK) != 0) {
      throw std::runtime_error(fmt::format(
          "validate: {} is '{}', which is not an executable file; set it to the launcher's "
          "path, unset it to search PATH, or use --emulate-rank",
          env, e));
    }
    return e;
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    for (const char* name : names) {
      const fs::path p = fs::path(dir) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return {};
}

}  // namespace

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

LaunchCommand make_launch_command(const LaunchRequest& r) {
  if (r.launcher != "auto" && r.launcher != "mpirun" && r.launcher != "srun")
    throw InputError("", "--launcher must be auto, mpirun or srun, not '" + r.launcher + "'");
  const char* job = std::getenv("SLURM_JOB_ID");
  const bool in_slurm = job != nullptr && *job != '\0';
  std::string kind = r.launcher;
  std::string srun;
  if (kind == "auto") {
    kind = "mpirun";
    // A hostfile names the hosts: mpirun places the ranks even inside an allocation.
    if (in_slurm && r.hostfile.empty()) {
      srun = find_program("DISTPLAN_SRUN", {"srun"});
      if (!srun.empty()) kind = "srun";
    }
  }
  LaunchCommand c;
  c.launcher = kind;
  const std::vector<std::string> extra = split_words(r.extra_args);
  if (kind == "srun") {
    if (!r.hostfile.empty())
      throw InputError("",
                       "--hostfile is an mpirun option; srun places the ranks on the "
                       "allocation's nodes (use --launcher mpirun to use a hostfile)");
    if (srun.empty()) srun = find_program("DISTPLAN_SRUN", {"srun"});
    if (srun.empty())
      throw std::runtime_error(
          "validate: --launcher srun but no srun was found (set "
          "DISTPLAN_SRUN or PATH)");
    c.local = false;
    c.argv = {srun, fmt::format("--ntasks={}", r.ranks), "--kill-on-bad-exit=1"};
  } else {
    const std::string mpirun = find_program("DISTPLAN_MPIRUN", {"mpirun", "mpiexec"});
    if (mpirun.empty())
      throw std::runtime_error(fmt::format(
          "validate: the layout needs {} ranks and no mpirun was found (set DISTPLAN_MPIRUN or "
          "PATH), or use --emulate-rank",
          r.ranks));
    c.argv = {mpirun, "-np", std::to_string(r.ranks)};
    if (r.hostfile.empty()) {
      c.argv.push_back("--oversubscribe");  // local ranks may outnumber cores (CPU device)
    } else {
      if (!std::ifstream(r.hostfile))
        throw InputError("", "--hostfile: cannot read '" + r.hostfile + "'");
      c.local = false;
      c.argv.insert(c.argv.end(), {"--hostfile", fs::absolute(r.hostfile).string()});
    }
  }
  c.argv.insert(c.argv.end(), extra.begin(), extra.end());
  c.argv.insert(c.argv.end(), r.program.begin(), r.program.end());
  return c;
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 3; ++k)
      v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k)
      out.push_back(k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63u] : '=');
  }
  return out;
}

std::string base64_decode(std::string_view text) {
  std::array<int, 256> value{};
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<unsigned char>(kAlphabet[i])] = i;
  if (text.size() % 4 != 0)
    throw InputError("", "--scenario-base64: length is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    std::uint32_t v = 0;
    int pad = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char ch = text[i + k];
      const bool last_group = i + 4 == text.size();
      if (ch == '=' && last_group && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++pad;
        v <<= 6;
        continue;
      }
      const int d = value[static_cast<unsigned char>(ch)];
      if (d < 0 || pad > 0)
        throw InputError("", fmt::format("--scenario-base64: invalid character at {}", i + k));
      v = (v << 6) | static_cast<std::uint32_t>(d);
    }
    for (int k = 0; k < 3 - pad; ++k) out.push_back(static_cast<char>((v >> (16 - 8 * k)) & 255u));
  }
  return out;
}

}  // namespace distplan::cli
