// Prediction intervals from the corpus residuals (interval.h; docs/fidelity.md).
#include "distplan/planner/interval.h"

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"

namespace distplan {

std::string_view to_string(RunKind v) noexcept {
  switch (v) {
    case RunKind::dense:
      return "dense";
    case RunKind::fp8:
      return "FP8";
    case RunKind::cp:
      return "CP";
    case RunKind::moe:
      return "MoE";
  }
  return "?";
}

RunKind run_kind(const Scenario& s) noexcept {
  if (s.model.moe.enabled()) return RunKind::moe;
  if (s.parallel.cp > 1) return RunKind::cp;
  if (s.training.fp8 != Fp8Recipe::none) return RunKind::fp8;
  return RunKind::dense;
}

namespace {

// The corpus files (tests/planner/fidelity_corpus.h lists the same; a test checks they agree).
constexpr std::array<std::string_view, 7> kCorpusFiles = {
    "reference/runs_torchtitan.json",      "reference/runs_megatron.json",
    "reference/runs_megatron_bridge.json", "reference/runs_deepspeed.json",
    "reference/runs_llm_foundry.json",     "reference/runs_llama3.json",
    "reference/runs_zero_bubble.json"};

struct Residual {
  RunKind kind;
  double log_error;
};

std::vector<Residual> corpus_residuals(const PlanFunction& plan) {
  std::vector<Residual> out;
  for (std::string_view file : kCorpusFiles) {
    const auto text = embedded_data_file(std::string(file));
    if (!text) continue;
    const nlohmann::json doc = nlohmann::json::parse(*text);
    for (const nlohmann::json& r : doc.at("runs")) {
      try {
        const Scenario s = scenario_from_json(r.at("scenario"));
        const Estimate e = plan(s);
        const double predicted = e.time.tokens_per_second / static_cast<double>(s.cluster.num_gpus);
        const double measured = r.at("measured").at("tokens_per_second_per_gpu").get<double>();
        if (predicted > 0 && measured > 0) {
          out.push_back({run_kind(s), std::log(measured / predicted)});
        }
      } catch (const InputError&) {
        // Refused runs (docs/fidelity.md lists them) say nothing about the planned ones.
      }
    }
  }
  return out;
}

// One-sided 95 % quantile of Student's t with `df` degrees of freedom: the table to 30, then
// the Cornish-Fisher expansion around the normal's 1.6449 (Abramowitz & Stegun 26.7.5).
double t95(int df) {
  static constexpr std::array<double, 30> table = {
      6.3138, 2.9200, 2.3534, 2.1318, 2.0150, 1.9432, 1.8946, 1.8595, 1.8331, 1.8125,
      1.7959, 1.7823, 1.7709, 1.7613, 1.7531, 1.7459, 1.7396, 1.7341, 1.7291, 1.7247,
      1.7207, 1.7171, 1.7139, 1.7109, 1.7081, 1.7056, 1.7033, 1.7011, 1.6991, 1.6973};
  if (df >= 1 && df <= 30) return table[static_cast<std::size_t>(df - 1)];
  const double z = 1.6449, n = static_cast<double>(df);
  return z + (z * z * z + z) / (4 * n) +
         (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * n * n);
}

constexpr int kMinRuns = 5;

}  // namespace

ThroughputInterval throughput_interval(const Scenario& s, double predicted_tokens_per_second,
                                       const PlanFunction& plan) {
  static const std::vector<Residual> residuals = corpus_residuals(plan);
  ThroughputInterval out;
  out.kind = run_kind(s);
  std::vector<double> x;
  for (const Residual& r : residuals) {
    if (r.kind == out.kind) x.push_back(r.log_error);
  }
  if (static_cast<int>(x.size()) < kMinRuns) {
    out.pooled = true;
    x.clear();
    for (const Residual& r : residuals) x.push_back(r.log_error);
  }
  out.runs = static_cast<int>(x.size());
  if (out.runs < 2 || !(predicted_tokens_per_second > 0)) {
    out.low = out.high = predicted_tokens_per_second;
    return out;
  }
  double mean = 0;
  for (double v : x) mean += v;
  mean /= out.runs;
  double ss = 0;
  for (double v : x) ss += (v - mean) * (v - mean);
  const double n = static_cast<double>(out.runs);
  const double sd = std::sqrt(ss / (n - 1));
  const double half = t95(out.runs - 1) * sd * std::sqrt(1 + 1 / n);
  out.mean_log_error = mean;
  out.low = predicted_tokens_per_second * std::exp(mean - half);
  out.high = predicted_tokens_per_second * std::exp(mean + half);
  return out;
}

}  // namespace distplan
