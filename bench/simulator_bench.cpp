// Speed of the simulator's engine. Targets (docs/simulator.md): >= 10 million events/s on one
// core, and a 1F1B step with p = 64, m = 4096 in under 100 ms.
#include <benchmark/benchmark.h>

#include "distplan/simulator/engine.h"
#include "distplan/simulator/schedule.h"
#include "distplan/simulator/simulate.h"

namespace {

using namespace distplan;

Scenario pipeline(Count p, Count m, Schedule kind, Count v = 1) {
  Scenario s;
  s.parallel.pp = p;
  s.parallel.dp = 1;
  s.parallel.schedule = kind;
  s.parallel.virtual_stages = v;
  s.training.micro_batch_size = 1;
  s.training.global_batch_size = m;
  s.cluster.num_gpus = p;
  s.cluster.gpus_per_node = 8;
  return s;
}

Estimate costs_estimate(Count p) {
  Estimate e;
  StageCosts c;
  c.forward = 1e-3;
  c.backward_input = 1.2e-3;
  c.backward_weight = 0.8e-3;
  c.p2p = 5e-5;
  c.grad_reduce = 0.02;
  c.optimizer = 0.005;
  e.stage_costs.assign(static_cast<std::size_t>(p), c);
  e.memory.stages.resize(static_cast<std::size_t>(p));
  for (auto& st : e.memory.stages) st.activation_bytes_per_microbatch = 1 << 28;
  return e;
}

// The heap alone: a steady population of `range(0)` pending events, one pop and one push each.
void BM_EventQueue_PushPop(benchmark::State& state) {
  const auto pending = static_cast<std::size_t>(state.range(0));
  sim::EventQueue q;
  q.reserve(pending + 1);
  double t = 0;
  for (std::size_t i = 0; i < pending; ++i) q.push(t + static_cast<double>(i % 17), 0, 0, 0);
  for (auto _ : state) {
    const sim::Event e = q.pop();
    q.push(e.time + 1.0 + static_cast<double>(e.seq % 7), 0, e.target, e.payload);
    benchmark::DoNotOptimize(e);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EventQueue_PushPop)->Arg(64)->Arg(256);

// A whole step: events per second and time per step. range(0) = p, range(1) = m.
void simulate_step(benchmark::State& state, Schedule kind, bool exposed) {
  const Count p = state.range(0), m = state.range(1);
  const Scenario s = pipeline(p, m, kind);
  const Estimate e = costs_estimate(p);
  sim::SimOptions o;
  o.exposed_communication = exposed;
  std::uint64_t events = 0;
  for (auto _ : state) {
    const sim::SimResult r = sim::simulate(s, e, o);
    events += r.events;  // the main run (the zero-communication rerun is not counted)
    benchmark::DoNotOptimize(r.step_seconds);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events));
  state.counters["events_per_step"] =
      static_cast<double>(events) / static_cast<double>(state.iterations());
}

void BM_Simulate_1F1B(benchmark::State& state) {
  simulate_step(state, Schedule::one_f_one_b, false);
}
void BM_Simulate_1F1BWithExposedComm(benchmark::State& state) {
  simulate_step(state, Schedule::one_f_one_b, true);
}
void BM_Simulate_ZbH1(benchmark::State& state) {
  simulate_step(state, Schedule::zb_h1, false);
}
BENCHMARK(BM_Simulate_1F1B)->Args({8, 64})->Args({64, 4096})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Simulate_1F1BWithExposedComm)->Args({64, 4096})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Simulate_ZbH1)->Args({64, 4096})->Unit(benchmark::kMillisecond);

// Generating the program alone (part of each simulate() call above).
void BM_Schedule_Make1F1B(benchmark::State& state) {
  const Count p = state.range(0), m = state.range(1);
  for (auto _ : state) {
    auto prog = sim::make_1f1b(p, m);
    benchmark::DoNotOptimize(prog.programs.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * p * m);
}
BENCHMARK(BM_Schedule_Make1F1B)->Args({64, 4096})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
