// Layout search throughput: layouts bounded per second, and the whole search (bounding, then the
// schedule walks of the candidates that can rank), one thread and all threads.
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
      {"search", {{"suggest", false}}}};
  return search::request_from_json(doc);
}

// Llama-3.1-405B on 16,384 H100s, global batch 2048: the target case.
void BM_Search_Llama405B16k(benchmark::State& state) {
  search::Request r = request("llama3.1-405b", 16384, 2048, 8192);
  r.options.threads = static_cast<int>(state.range(0));
  std::uint64_t evaluated = 0, walked = 0;
  for (auto _ : state) {
    const search::Result res = search::run(r.space, r.options);
    evaluated += res.evaluated;
    walked += res.walked;
    benchmark::DoNotOptimize(res.plans.data());
  }
  state.counters["layouts_per_second"] =
      benchmark::Counter(static_cast<double>(evaluated), benchmark::Counter::kIsRate);
  state.counters["walked"] =
      benchmark::Counter(static_cast<double>(walked), benchmark::Counter::kAvgIterations);
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

// One layout planned as the search plans a candidate: estimate() and the schedule walk.
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
