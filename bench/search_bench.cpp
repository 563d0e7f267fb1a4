// Layout search throughput: layouts estimated per second, one thread and all threads.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include "distplan/planner/scenario_json.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"

namespace {

using namespace distplan;

search::Request request(const char* model, int gpus, int batch, int seq) {
  nlohmann::json doc = {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
      {"training", {{"seq_length", seq}, {"global_batch_size", batch}}},
      {"search", {{"simulate_top", 0}, {"suggest", false}}}};
  return search::request_from_json(doc);
}

// Llama-3.1-405B on 16,384 H100s, global batch 2048: the target case.
void BM_Search_Llama405B16k(benchmark::State& state) {
  search::Request r = request("llama3.1-405b", 16384, 2048, 8192);
  r.options.threads = static_cast<int>(state.range(0));
  std::uint64_t evaluated = 0;
  for (auto _ : state) {
    const search::Result res = search::run(r.space, r.options);
    evaluated += res.evaluated;
    benchmark::DoNotOptimize(res.plans.data());
  }
  state.counters["layouts_per_second"] =
      benchmark::Counter(static_cast<double>(evaluated), benchmark::Counter::kIsRate);
  state.SetItemsProcessed(static_cast<std::int64_t>(evaluated));
}
BENCHMARK(BM_Search_Llama405B16k)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// Counting the 405B space before the search runs (search::run's guard against huge spaces,
// docs/trust.md): its cost next to BM_Search_Llama405B16k's.
void BM_Search_CountLayouts405B16k(benchmark::State& state) {
  const search::Request r = request("llama3.1-405b", 16384, 2048, 8192);
  std::uint64_t n = 0;
  for (auto _ : state) n += search::count_layouts(r.space);
  benchmark::DoNotOptimize(n);
}
BENCHMARK(BM_Search_CountLayouts405B16k)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same search as `distplan search` runs it: the best 16 and every feasible layout within 10 %
// of the best analytic step are re-ranked by simulation (target: under 1 s with all threads).
void BM_Search_Llama405B16kSimulated(benchmark::State& state) {
  search::Request r = request("llama3.1-405b", 16384, 2048, 8192);
  r.options.simulate_top = 16;
  r.options.simulate_within = 0.10;
  r.options.threads = static_cast<int>(state.range(0));
  std::int64_t simulated = 0;
  for (auto _ : state) {
    const search::Result res = search::run(r.space, r.options);
    simulated += res.simulated;
    benchmark::DoNotOptimize(res.plans.data());
  }
  state.counters["simulated"] =
      benchmark::Counter(static_cast<double>(simulated), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Search_Llama405B16kSimulated)
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Llama-2-70B on 64 H100s, global batch 512 (the default scenario's cluster).
void BM_Search_Llama70B64(benchmark::State& state) {
  search::Request r = request("llama2-70b", 64, 512, 4096);
  r.options.threads = 1;
  std::uint64_t evaluated = 0;
  for (auto _ : state) {
    const search::Result res = search::run(r.space, r.options);
    evaluated += res.evaluated;
    benchmark::DoNotOptimize(res.plans.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(evaluated));
}
BENCHMARK(BM_Search_Llama70B64)->Unit(benchmark::kMillisecond)->UseRealTime();

// Llama-3.1-8B on 64 H100s, global batch 256: most layouts fit, so ranking (not memory) decides.
void BM_Search_Llama8B64(benchmark::State& state) {
  search::Request r = request("llama3.1-8b", 64, 256, 4096);
  r.options.threads = 1;
  std::uint64_t evaluated = 0;
  for (auto _ : state) {
    const search::Result res = search::run(r.space, r.options);
    evaluated += res.evaluated;
    benchmark::DoNotOptimize(res.plans.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(evaluated));
}
BENCHMARK(BM_Search_Llama8B64)->Unit(benchmark::kMillisecond)->UseRealTime();

// Without the lean path and the bound: every fitting layout estimated in full.
void BM_Search_Llama405B16kNoLeanPath(benchmark::State& state) {
  search::Request r = request("llama3.1-405b", 16384, 2048, 8192);
  r.options.threads = 1;
  r.options.fast_memory = false;
  std::uint64_t evaluated = 0;
  for (auto _ : state) {
    const search::Result res = search::run(r.space, r.options);
    evaluated += res.evaluated;
    benchmark::DoNotOptimize(res.plans.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(evaluated));
}
BENCHMARK(BM_Search_Llama405B16kNoLeanPath)->Unit(benchmark::kMillisecond)->UseRealTime();

// One estimate() of one layout (the slow path every layout would take without the fast one).
void BM_Search_EstimateOne(benchmark::State& state) {
  search::Request r = request("llama2-70b", 64, 512, 4096);
  search::Layout l;
  l.tp = 8;
  l.pp = 4;
  l.dp = 2;
  l.zero_stage = 1;
  l.sequence_parallel = true;
  l.recompute = Recompute::selective;
  const Scenario s = search::make_scenario(r.space.base, l);
  for (auto _ : state) benchmark::DoNotOptimize(search::evaluate(s));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Search_EstimateOne);

}  // namespace

BENCHMARK_MAIN();
