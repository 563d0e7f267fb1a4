// Planner speed: one full estimate (memory, communication, FLOPs, costs, time) per iteration.
// Target (issue: planner core): at least 1,000,000 estimates per second on one core.
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/scenario_json.h"

namespace {

using distplan::default_scenario;

void BM_Estimate_Llama70bOn64(benchmark::State& state) {
  const distplan::Scenario s = default_scenario();
  for (auto _ : state) {
    distplan::Estimate e = distplan::estimate(s);
    benchmark::DoNotOptimize(e);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Estimate_Llama70bOn64);

// The same with the per-thread op-cost memo missing every time (micro-batch 1 and 2 alternate):
// the full cost of the op-level model, as a search pays it when the micro-batch or tp changes.
void BM_Estimate_Llama70bOn64_ColdOpCosts(benchmark::State& state) {
  distplan::Scenario a = default_scenario();
  distplan::Scenario b = a;
  b.training.micro_batch_size = 2;
  bool flip = false;
  for (auto _ : state) {
    distplan::Estimate e = distplan::estimate(flip ? b : a);
    flip = !flip;
    benchmark::DoNotOptimize(e);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Estimate_Llama70bOn64_ColdOpCosts);

// Deeper pipelines cost more per estimate: one pass per stage.
void BM_Estimate_PipelineDepth(benchmark::State& state) {
  distplan::Scenario s = default_scenario();
  s.parallel.pp = state.range(0);
  s.parallel.dp = 1;
  s.parallel.tp = 8;
  s.cluster.num_gpus = 8 * s.parallel.pp;
  s.parallel.fsdp_shard_size = 1;
  s.training.global_batch_size = 512;
  for (auto _ : state) {
    distplan::Estimate e = distplan::estimate(s);
    benchmark::DoNotOptimize(e);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Estimate_PipelineDepth)->Arg(1)->Arg(4)->Arg(16)->Arg(80);

void BM_ScenarioFromText(benchmark::State& state) {
  for (auto _ : state) {
    auto s = distplan::scenario_from_text(distplan::default_scenario_text());
    benchmark::DoNotOptimize(s);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ScenarioFromText);

// The plan document (distplan.plan/v1) of one estimate: what `distplan plan` and the Python
// module's plan()/plan_many() build after estimating.
void BM_PlanToJson(benchmark::State& state) {
  const distplan::Scenario s = default_scenario();
  const distplan::Estimate e = distplan::estimate(s);
  for (auto _ : state) {
    auto j = distplan::plan_to_json(s, e);
    benchmark::DoNotOptimize(j);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PlanToJson);

}  // namespace

BENCHMARK_MAIN();
