// The public corpus of measured training runs (data/reference/runs_*.json): each run's scenario
// planned as `distplan plan` plans it, its predicted tokens/s per GPU beside the measured, the
// errors grouped by kind (dense, FP8, CP, MoE), GPU and framework, and the runs distplan refuses
// with the field and the reason. Shared by tests/planner/fidelity_test.cpp (which writes the
// section of docs/fidelity.md) and tests/planner/fidelity_corpus_test.cpp (which bounds it).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "distplan/planner/calibrate.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "test_util.h"

namespace distplan::testing {

/// The files of the corpus, one per source family.
inline const std::vector<std::string>& corpus_files() {
  static const std::vector<std::string> files = {"runs_torchtitan.json",      "runs_megatron.json",
                                                 "runs_megatron_bridge.json", "runs_deepspeed.json",
                                                 "runs_llm_foundry.json",     "runs_llama3.json",
                                                 "runs_zero_bubble.json"};
  return files;
}

struct CorpusRun {
  std::string file, id, framework;  // framework: the run's software family (a label)
  std::string gpu;                  // the GPU preset
  std::vector<std::string> kinds;   // dense, FP8, CP, MoE
  double measured = 0;              // tokens/s per GPU
  std::optional<double> predicted;  // none when refused
  std::string refused_path, refused_reason;
  bool inputs_assumed = false;  // the source leaves some inputs open (listed in the run)
  // Memory where the source gives it: the figure in bytes, its convention, the planner's figure
  // under the same convention, and whether the planner says the run fits.
  std::optional<double> measured_memory_bytes, predicted_memory_bytes;
  std::string memory_kind;
  bool fits = true;
  [[nodiscard]] double error() const { return (*predicted - measured) / measured; }
};

inline std::string gpu_of(const nlohmann::json& scenario) {
  const nlohmann::json& g = scenario["cluster"]["gpu"];
  return g.is_string() ? g.get<std::string>() : g.value("preset", std::string("custom"));
}

// The kinds a run belongs to, from its scenario (a run can be FP8 and CP at once).
inline std::vector<std::string> kinds_of(const Scenario& s) {
  std::vector<std::string> k;
  if (s.training.fp8 != Fp8Recipe::none) k.push_back("FP8");
  if (s.parallel.cp > 1) k.push_back("CP");
  if (s.model.moe.enabled()) k.push_back("MoE");
  if (k.empty()) k.push_back("dense");
  return k;
}

inline std::vector<CorpusRun> compute_corpus_runs() {
  std::vector<CorpusRun> out;
  for (const std::string& file : corpus_files()) {
    const nlohmann::json doc = reference(file);
    for (const nlohmann::json& r : doc["runs"]) {
      CorpusRun c;
      c.file = file;
      c.id = r["id"];
      c.framework = r["framework"];
      c.gpu = gpu_of(r["scenario"]);
      c.measured = r["measured"]["tokens_per_second_per_gpu"];
      c.inputs_assumed = r.contains("inputs_assumed");
      if (r["measured"].contains("peak_memory")) {
        const auto& pm = r["measured"]["peak_memory"];
        const double v = pm["value"];
        c.measured_memory_bytes = pm["unit"] == "GiB" ? v * 1073741824.0 : v * 1e9;
        c.memory_kind = pm["kind"];
      }
      try {
        const Scenario s = scenario(r["scenario"]);
        c.kinds = kinds_of(s);
        const Estimate e = sim::plan(s);  // what `distplan plan` reports: the schedule walk
        c.predicted = e.time.tokens_per_second / static_cast<double>(s.cluster.num_gpus);
        c.fits = e.memory.fits;
        if (c.measured_memory_bytes) {
          // torch.cuda.max_memory_reserved() (torchtitan's figure) is the allocator's reserve
          // without the CUDA context and NCCL outside it; nvidia-smi sees the whole device.
          const StageMemory& st = e.memory.stages[static_cast<std::size_t>(e.memory.peak_stage)];
          c.predicted_memory_bytes = static_cast<double>(
              c.memory_kind == "reserved" ? allocator_reserved_bytes(s, st) : st.reserved_bytes);
        }
      } catch (const InputError& e) {
        c.refused_path = e.path();
        c.refused_reason = e.what();
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

/// The planned corpus, once per test process.
inline const std::vector<CorpusRun>& corpus_runs() {
  static const std::vector<CorpusRun> runs = compute_corpus_runs();
  return runs;
}

struct GroupError {
  std::string name;
  int runs = 0;
  double mape = 0, bias = 0;  // mean |error|, mean signed error
};

/// MAPE of the planned runs matching `in`, by group key.
template <typename Key>
std::vector<GroupError> group_errors(const std::vector<CorpusRun>& runs, Key keys) {
  std::map<std::string, GroupError> g;
  for (const CorpusRun& r : runs) {
    if (!r.predicted) continue;
    for (const std::string& k : keys(r)) {
      GroupError& e = g[k];
      e.name = k;
      ++e.runs;
      e.mape += std::abs(r.error());
      e.bias += r.error();
    }
  }
  std::vector<GroupError> out;
  for (auto& [k, e] : g) {
    e.mape /= e.runs;
    e.bias /= e.runs;
    out.push_back(e);
  }
  return out;
}

inline GroupError overall_error(const std::vector<CorpusRun>& runs) {
  const auto all =
      group_errors(runs, [](const CorpusRun&) { return std::vector<std::string>{"all"}; });
  return all.empty() ? GroupError{"all"} : all.front();
}

inline std::string gib(double bytes) {
  return fmt::format("{:.1f}", bytes / 1073741824.0);
}

/// The corpus section of docs/fidelity.md.
inline std::string render_corpus(const std::vector<CorpusRun>& runs) {
  std::string md =
      "\n## Published runs (`data/reference/runs_*.json`)\n\n"
      "Measured training runs from their sources (torchtitan's benchmarks, Megatron-LM, NeMo and "
      "Megatron-Bridge performance tables, DeepSpeed and BigScience logs, llm-foundry, the Llama "
      "3 paper, Zero Bubble), each translated into a scenario with the hardware as it ran, the "
      "framework and its settings; each file names every run's source, the row it comes from, "
      "which inputs are stated, inferred or assumed, and the convention of the measured "
      "figures. Predicted: what `distplan plan` reports (`time.tokens_per_second` / GPUs: the "
      "schedule walk over the op costs, the shipped presets, no calibration). Throughput is tokens "
      "per second per GPU; where the "
      "source gives TFLOP/s or step times the file converts them with the source's own FLOP "
      "count or batch. Memory is in GiB (2^30 bytes): `reserved` is torch.cuda's "
      "max_memory_reserved (compared with the planner's allocator reserve less the CUDA context "
      "and NCCL), `device` nvidia-smi's (the planner's whole-device reserved peak); GB figures "
      "are read as 10^9 bytes. Runs marked * leave inputs open that the file assumes (listed "
      "there).\n\n";
  md +=
      "| run | framework | GPU | kind | measured tokens/s/GPU | predicted | error | memory "
      "measured / predicted (GiB) |\n|---|---|---|---|---:|---:|---:|---|\n";
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " + ") + x;
    return s;
  };
  for (const CorpusRun& r : runs) {
    if (!r.predicted) continue;
    std::string mem = "–";
    if (r.measured_memory_bytes) {
      mem = fmt::format("{} / {} ({})", gib(*r.measured_memory_bytes),
                        gib(*r.predicted_memory_bytes), r.memory_kind);
    }
    if (!r.fits) mem += ", **does not fit**";
    md += fmt::format("| `{}`{} | {} | {} | {} | {:.1f} | {:.1f} | {:+.1f} % | {} |\n", r.id,
                      r.inputs_assumed ? "*" : "", r.framework, r.gpu, join(r.kinds), r.measured,
                      *r.predicted, 100 * r.error(), mem);
  }
  const GroupError all = overall_error(runs);
  md += fmt::format(
      "\n{} runs planned, MAPE {:.1f} % (mean signed error {:+.1f} %).\n\n"
      "| group | runs | MAPE | mean signed error |\n|---|---:|---:|---:|\n",
      all.runs, 100 * all.mape, 100 * all.bias);
  auto rows = [&](const std::vector<GroupError>& gs, const std::string& label) {
    for (const GroupError& g : gs) {
      md += fmt::format("| {} {} | {} | {:.1f} % | {:+.1f} % |\n", label, g.name, g.runs,
                        100 * g.mape, 100 * g.bias);
    }
  };
  rows(group_errors(runs, [](const CorpusRun& r) { return r.kinds; }), "kind");
  rows(group_errors(runs, [](const CorpusRun& r) { return std::vector{r.gpu}; }), "GPU");
  rows(group_errors(runs, [](const CorpusRun& r) { return std::vector{r.framework}; }),
       "framework");
  md +=
      "\n### Refused\n\nRuns whose model or layout distplan does not model yet, with the field "
      "and the reason `distplan plan` gives (exit 2):\n\n| run | GPU | field | reason |\n"
      "|---|---|---|---|\n";
  for (const CorpusRun& r : runs) {
    if (r.predicted) continue;
    std::string reason = r.refused_reason;
    std::replace(reason.begin(), reason.end(), '|', '/');
    std::replace(reason.begin(), reason.end(), '\n', ' ');
    md += fmt::format("| `{}` | {} | `{}` | {} |\n", r.id, r.gpu, r.refused_path, reason);
  }
  return md;
}

}  // namespace distplan::testing

namespace distplan::testing {

/// One fit of a GPU preset's figure on the corpus runs of that GPU (docs/fidelity.md, "Fits").
struct PresetFit {
  std::string gpu, parameter, runs_of;
  int runs = 0;
  double value = 0, mape_before = 0, mape_after = 0;
  std::optional<double> leave_one_out;
};

/// The calibration machinery (planner/src/calibrate.cpp) on the corpus: per GPU preset, the GEMM
/// ceiling on its bf16 dense and CP runs, the FP8 ceiling on its FP8 runs, each alone.
inline std::vector<PresetFit> compute_preset_fits() {
  struct Want {
    std::string gpu, parameter, runs_of;
  };
  const std::vector<Want> wants = {{"h100-sxm-80gb", "compute_efficiency", "bf16"},
                                   {"h100-sxm-80gb", "fp8_compute_efficiency", "FP8"},
                                   {"h100-sxm-96gb", "compute_efficiency", "bf16"},
                                   {"h100-sxm-96gb", "fp8_compute_efficiency", "FP8"},
                                   {"b200-192gb", "fp8_compute_efficiency", "FP8"},
                                   {"gb200-nvl72", "fp8_compute_efficiency", "FP8"}};
  std::vector<PresetFit> out;
  for (const Want& w : wants) {
    std::vector<CalibrationRun> runs;
    for (const std::string& file : corpus_files()) {
      const nlohmann::json doc = reference(file);
      for (const nlohmann::json& r : doc["runs"]) {
        if (gpu_of(r["scenario"]) != w.gpu || r.contains("inputs_assumed")) continue;
        Scenario s;
        try {
          s = scenario(r["scenario"]);
        } catch (const InputError&) {
          continue;
        }
        const bool fp8 = s.training.fp8 != Fp8Recipe::none;
        if (s.model.moe.enabled() || fp8 != (w.runs_of == "FP8")) continue;
        const double tps = r["measured"]["tokens_per_second_per_gpu"];
        const double step =
            static_cast<double>(s.training.global_batch_size * s.training.seq_length) /
            (tps * static_cast<double>(s.cluster.num_gpus));
        runs.push_back({s, step, "", "", r["id"]});
      }
    }
    CalibrationOptions o;
    o.step_seconds = sim::plan_step_seconds;  // fits match the plan's step (the walk)
    o.parameters = {w.parameter};
    const CalibrationResult c = calibrate(runs, o);
    out.push_back({w.gpu, w.parameter, w.runs_of, static_cast<int>(c.runs), c.values.at(0),
                   c.mape_before, c.mape_after, c.leave_one_out_mape});
  }
  return out;
}

/// The fits, computed once per test process (the doc test and the preset test share them).
inline const std::vector<PresetFit>& preset_fits() {
  static const std::vector<PresetFit> fits = compute_preset_fits();
  return fits;
}

}  // namespace distplan::testing

namespace distplan::testing {

/// The "Fits" and "Prediction intervals" sections of docs/fidelity.md.
inline std::string render_fits(const std::vector<PresetFit>& fits) {
  std::string md =
      "\n## Fits\n\n"
      "The GPU presets' GEMM ceilings are fitted on the corpus runs of that GPU with distplan's "
      "calibration machinery (`calibrate()`, docs/calibration.md: Levenberg-Marquardt on the "
      "relative step-time errors), one parameter at a time: `compute_efficiency` (the bf16 "
      "ceiling) on the GPU's dense and CP runs, `fp8_compute_efficiency` on its FP8 runs; runs "
      "with assumed inputs and MoE runs are left out. The presets carry the fitted values "
      "(`FidelityCorpus.PresetsCarryTheFits` refits and compares); MAPE before is with the preset "
      "as shipped, leave-one-out refits without each run and predicts it. Everything else "
      "(kernel fusion, power, FP8 casts, SDPA kernels, communication) is physics with its source, "
      "not fitted.\n\n"
      "| GPU preset | parameter | runs | fitted | MAPE before | after | leave-one-out |\n"
      "|---|---|---:|---:|---:|---:|---:|\n";
  for (const PresetFit& f : fits) {
    md += fmt::format("| `{}` | `{}` ({}) | {} | {:.3f} | {:.1f} % | {:.1f} % | {} |\n", f.gpu,
                      f.parameter, f.runs_of, f.runs, f.value, 100 * f.mape_before,
                      100 * f.mape_after,
                      f.leave_one_out ? fmt::format("{:.1f} %", 100 * *f.leave_one_out) : "–");
  }
  md +=
      "\n## Prediction intervals\n\n"
      "`distplan plan` (JSON `time.tokens_per_second_interval`, and the table) and `distplan "
      "search` report tokens/s with a 90 % prediction interval: the range the measured "
      "throughput of a run like this one is expected in, 9 times out of 10, given how far the "
      "planner's predictions fell from the published runs of the same kind (MoE, CP, FP8, "
      "dense; all planned runs when a kind has fewer than 5). With r = ln(measured / predicted) "
      "over those n runs (mean m, standard deviation sd), the interval is predicted · exp(m ± "
      "t(0.95, n-1) · sd · sqrt(1 + 1/n)), the normal-theory prediction interval for one new "
      "run. It is not centred on the prediction when the kind's runs are biased, it widens "
      "with the scatter, and it says nothing about scenarios unlike the corpus (other GPUs, "
      "frameworks or scales): read it as the planner's track record on published runs, not as "
      "a guarantee (planner/src/interval.cpp).\n";
  return md;
}

}  // namespace distplan::testing
