// The public corpus of measured runs (data/reference/runs_*.json, docs/fidelity.md): every run is
// planned or refused at a named field, the runs that ran are not said to overflow memory, and
// the step-time errors stay within bounds overall and per group (kind, GPU, framework). The bounds
// are the errors the model reaches today plus a margin, so a change that makes it worse fails.
#include <gtest/gtest.h>

#include <set>

#include "distplan/planner/interval.h"
#include "distplan/planner/presets.h"
#include "fidelity_corpus.h"

namespace distplan {
namespace {

using testing::CorpusRun;

const std::vector<CorpusRun>& runs() {
  static const std::vector<CorpusRun> r = testing::corpus_runs();
  return r;
}

TEST(FidelityCorpus, EveryRunNamesItsSourceInputsAndConventions) {
  std::set<std::string> ids;
  for (const std::string& file : testing::corpus_files()) {
    const nlohmann::json doc = testing::reference(file);
    for (const nlohmann::json& r : doc["runs"]) {
      const std::string id = r.at("id");
      EXPECT_TRUE(ids.insert(id).second) << "duplicate run id " << id;
      EXPECT_FALSE(r.at("source").at("table").get<std::string>().empty()) << id;
      EXPECT_FALSE(r.at("quote").get<std::string>().empty()) << id;
      EXPECT_FALSE(r.at("hardware").get<std::string>().empty()) << id;
      EXPECT_FALSE(r.at("inputs").get<std::string>().empty()) << id;
      EXPECT_FALSE(r.at("framework").get<std::string>().empty()) << id;
      const nlohmann::json& m = r.at("measured");
      EXPECT_GT(m.at("tokens_per_second_per_gpu").get<double>(), 0) << id;
      EXPECT_FALSE(m.at("metric").get<std::string>().empty()) << id;
      if (m.contains("peak_memory")) {
        const nlohmann::json& pm = m["peak_memory"];
        EXPECT_TRUE(pm.at("unit") == "GiB" || pm.at("unit") == "GB") << id;
        EXPECT_FALSE(pm.at("kind").get<std::string>().empty()) << id;
        EXPECT_FALSE(pm.at("definition").get<std::string>().empty()) << id;
      }
      // A new scenario states its framework (the default changes over time).
      EXPECT_TRUE(r.at("scenario").at("training").contains("framework")) << id;
    }
  }
  EXPECT_GE(ids.size(), 60u);
}

TEST(FidelityCorpus, EveryRunIsPlannedOrRefusedAtAField) {
  int planned = 0;
  for (const CorpusRun& r : runs()) {
    if (r.predicted) {
      ++planned;
      EXPECT_GT(*r.predicted, 0) << r.id;
    } else {
      EXPECT_FALSE(r.refused_reason.empty()) << r.id;
      EXPECT_FALSE(r.refused_path.empty()) << r.id << ": refused without a field";
    }
  }
  EXPECT_GE(planned, 50) << "runs planned";
}

}  // namespace
}  // namespace distplan

namespace distplan {
namespace {

const std::vector<CorpusRun>& planned() {
  static const std::vector<CorpusRun> r = [] {
    std::vector<CorpusRun> out;
    for (const CorpusRun& c : runs())
      if (c.predicted) out.push_back(c);
    return out;
  }();
  return r;
}

TEST(FidelityCorpus, ErrorsStayWithinTheirBounds) {
  // Measured on this corpus (the schedule walk) when the bounds were set: 63 runs, overall
  // 14.2 %, dense 8.8 %, FP8 15.1 %, CP 17.4 %, MoE 34.7 % (docs/fidelity.md). Since the previous
  // bounds (53 runs, 11.4 %), runs refused before are planned: the FP8 MoE runs (Qwen3 30B-A3B
  // and 235B-A22B: -47 % and -38 % on H100, +18 % and +25 % on Blackwell) and gpt-oss (+38 %,
  // +59 %, its small experts), which the time model does not yet price well; Nemotron-4 340B at
  // 12 chunks per stage moved by -2 % and -3 % with per-chunk costs. The targets are 8 % overall
  // and 12 % per group; the bounds guard against drift from here.
  // Reset for 64 runs (overall 15.1 %, FP8 16.8 %, MoE 37.9 %; the other 63 unchanged): DeepSeek-V3
  // on 256 B200 (Megatron-Bridge, MXFP8, ep 32 over four nodes), refused before at /model/mla and
  // /model/mtp_layers, plans at -70 %: 48 of its 66 s are the exposed expert all-to-alls at the
  // NIC's bandwidth, which Megatron-Bridge overlaps and deduplicates per node (HybridEP) and the
  // time model does not (docs/moe.md, "What is refused").
  const testing::GroupError all = testing::overall_error(runs());
  EXPECT_LE(all.mape, 0.155) << testing::render_corpus(runs());
  const std::map<std::string, double> bound = {
      {"dense", 0.09}, {"FP8", 0.175}, {"CP", 0.18}, {"MoE", 0.39}};
  for (const auto& g : testing::group_errors(runs(), [](const CorpusRun& r) { return r.kinds; })) {
    EXPECT_LE(g.mape, bound.at(g.name)) << g.name;
  }
}

TEST(FidelityCorpus, RunsThatRanFitInMemory) {
  // Nemotron-4 340B fits on 80 GB H100s at tp 8 x pp 8 x dp 2 only with NeMo's bf16 gradient
  // buffer and bf16 optimizer states (docs/memory.md); every dense, FP8 and CP run ran.
  // A run whose source leaves the schedule's inputs open is checked only where its assumed
  // inputs fit: the Llama 3 paper's 405B at 8k ran its own interleaved schedule (its number of
  // contiguous micro-batches tuned for memory, sec. 3.3.2), which distplan does not model;
  // Megatron-LM's interleaved 1F1B with the assumed 2 chunks keeps 22 micro-batches in flight
  // and needs about 105 GiB there.
  int checked = 0;
  std::vector<std::string> open_inputs;
  for (const CorpusRun& r : planned()) {
    if (std::find(r.kinds.begin(), r.kinds.end(), "MoE") != r.kinds.end()) continue;
    if (!r.fits && r.inputs_assumed) {
      open_inputs.push_back(r.id);
      continue;
    }
    EXPECT_TRUE(r.fits) << r.id << " ran, but the plan says it does not fit";
    ++checked;
  }
  EXPECT_GE(checked, 45);
  EXPECT_LE(open_inputs.size(), 1u) << "runs with assumed inputs that do not fit";
}

TEST(FidelityCorpus, PresetsCarryTheFits) {
  for (const testing::PresetFit& f : testing::preset_fits()) {
    const GpuSpec g = *find_gpu_preset(f.gpu);
    const double shipped =
        f.parameter == "compute_efficiency" ? g.gemm_efficiency : g.fp8_gemm_efficiency;
    EXPECT_NEAR(shipped, f.value, 0.005) << f.gpu << " " << f.parameter;
    ASSERT_TRUE(f.leave_one_out.has_value()) << f.gpu << " " << f.parameter;
    // A fit that does not carry over to its own held-out runs is not physics.
    EXPECT_LT(*f.leave_one_out, 0.20) << f.gpu << " " << f.parameter;
  }
}

TEST(FidelityCorpus, IntervalsCoverTheMeasuredRunsAsStated) {
  // The 90 % intervals, built from these residuals, must contain about 90 % of the measured runs
  // (in-sample, so at least 80 %), and bracket a run's measurement from its own prediction.
  int inside = 0;
  for (const std::string& file : testing::corpus_files()) {
    const nlohmann::json doc = testing::reference(file);
    for (const nlohmann::json& r : doc["runs"]) {
      Scenario s;
      try {
        s = testing::scenario(r["scenario"]);
      } catch (const InputError&) {
        continue;
      }
      const Estimate e = sim::plan(s);
      const ThroughputInterval ti =
          throughput_interval(s, e.time.tokens_per_second, testing::planner());
      EXPECT_LT(ti.low, ti.high);
      EXPECT_DOUBLE_EQ(ti.confidence, 0.9);
      const double measured = r["measured"]["tokens_per_second_per_gpu"].get<double>() *
                              static_cast<double>(s.cluster.num_gpus);
      inside += measured >= ti.low && measured <= ti.high;
    }
  }
  EXPECT_GE(inside, static_cast<int>(0.8 * static_cast<double>(planned().size())));
}

TEST(FidelityCorpus, IntervalFilesAreTheCorpusFiles) {
  // interval.cpp plans the same files the tests read: a run added to one is in the other.
  for (const std::string& file : testing::corpus_files()) {
    EXPECT_TRUE(embedded_data_file("reference/" + file).has_value()) << file;
  }
}

}  // namespace
}  // namespace distplan
