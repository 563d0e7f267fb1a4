// Starts the backend worker on `ranks` MPI ranks (mpirun on this host) for one scenario file and
// reads back its measurement. On failure the test fails with the command and the tail of the
// ranks' output, where a sanitizer or a refusal names the cause.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/measurement_json.h"

namespace distplan::backend::testing_support {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `args`: the worker's options after the scenario path (steps, learning rate, dumps).
inline Measurement run_worker(const nlohmann::json& doc, const std::string& name, int ranks,
                              const std::string& args, int timeout_s = 180) {
  const std::string in = ::testing::TempDir() + "/" + name + ".json";
  std::ofstream(in) << doc.dump();
  const std::string out = ::testing::TempDir() + "/" + name + ".out.json";
  const std::string log = out + ".log";
  std::ostringstream cmd;
  cmd << "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
         "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
      << "timeout " << timeout_s << " mpirun -np " << ranks << " --oversubscribe "
      << DISTPLAN_BACKEND_WORKER << " " << in << " " << args << " --out " << out << " > " << log
      << " 2>&1";
  const int rc = std::system(cmd.str().c_str());
  if (rc != 0) {
    const std::string text = read_text(log);
    ADD_FAILURE() << cmd.str() << "\nexit status " << rc
                  << "; the ranks printed (last 4000 chars):\n"
                  << text.substr(text.size() > 4000 ? text.size() - 4000 : 0);
  }
  return measurement_from_json(nlohmann::json::parse(read_text(out)));
}

}  // namespace distplan::backend::testing_support
