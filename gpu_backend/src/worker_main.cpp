// One rank of a backend run. Under mpirun every rank trains its part; rank 0 gathers every rank's
// measurement and writes distplan.measurement/v1 JSON to --out (or stdout).
//   distplan-backend-worker SCENARIO.json [--steps K] [--out FILE] [--emulate-rank R] [--lr X]
//   [--repeat-batch] [--dump-gradients DIR] [--dump-weights DIR]
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/measurement_json.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"

int main(int argc, char** argv) {
  using namespace distplan;
  std::string input, out;
  backend::RunOptions opts;
  bool emulate = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      opts.steps = std::atoll(argv[++i]);
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--lr" && i + 1 < argc) {
      opts.learning_rate = std::strtof(argv[++i], nullptr);
    } else if (a == "--repeat-batch") {
      opts.repeat_batch = true;
    } else if (a == "--dump-gradients" && i + 1 < argc) {
      opts.dump_gradients = argv[++i];
    } else if (a == "--dump-weights" && i + 1 < argc) {
      opts.dump_weights = argv[++i];
    } else if (a == "--emulate-rank" && i + 1 < argc) {
      emulate = true;
      opts.emulate_rank = std::atoi(argv[++i]);
    } else {
      input = a;
    }
  }
  try {
    std::ifstream f(input);
    if (!f) throw InputError("", "cannot read " + input);
    std::stringstream ss;
    ss << f.rdbuf();
    const nlohmann::json doc = parse_json_text(ss.str());
    const Scenario s = scenario_for_training(doc, {"costs"});
    backend::Measurement m;
    bool root = true;
    if (emulate) {
      opts.comm = backend::CommBackend::emulated;
      m = backend::run(s, opts);
    } else {
      backend::mpi_init_if_needed();
      opts.comm = backend::CommBackend::mpi;
      m = backend::run(s, opts);
      // Gather every rank's measurement on rank 0.
      auto groups_json = backend::to_json(m.ranks.front()).dump();
      auto all = backend::gather_measurements(groups_json);
      root = !all.empty();
      if (root) {
        m.ranks.clear();
        for (const auto& r : all)
          m.ranks.push_back(backend::rank_measurement_from_json(nlohmann::json::parse(r)));
      }
    }
    if (root) {
      const std::string text = backend::to_json(m).dump(1) + "\n";
      if (out.empty()) {
        std::cout << text;
      } else {
        std::ofstream(out) << text;
      }
    }
    backend::mpi_finalize_if_initialised();
    return 0;
  } catch (const InputError& e) {
    std::cerr << "{\"error\": {\"code\": \"invalid_input\", \"path\": \"" << e.path()
              << "\", \"message\": \"" << e.what() << "\"}}\n";
    backend::mpi_finalize_if_initialised();
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
