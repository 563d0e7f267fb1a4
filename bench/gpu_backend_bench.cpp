// GPU backend benchmarks on the CPU oracle: the matrix product, attention and norm ops at a small
// transformer's shapes (items = FLOPs or elements), and one training step of the tiny test model
// (items = tokens).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::backend {
namespace {

std::vector<float> random(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// y (N,O) = x (N,I) W^T: 2*N*I*O FLOPs.
void BM_CpuOps_LinearForward(benchmark::State& state) {
  const Count n = state.range(0), i = state.range(1), o = state.range(2);
  const auto x = random(static_cast<std::size_t>(n * i), 1);
  const auto w = random(static_cast<std::size_t>(o * i), 2);
  std::vector<float> y(static_cast<std::size_t>(n * o));
  for (auto _ : state) {
    cpu::linear_forward(x.data(), w.data(), static_cast<const float*>(nullptr), y.data(), n, i, o);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * n * i * o);
  state.SetLabel("items = FLOPs");
}
BENCHMARK(BM_CpuOps_LinearForward)->Args({512, 256, 1024})->Args({1024, 1024, 1024});

// Causal attention with materialised probabilities: items = score entries (b*a*s*s/2).
void BM_CpuOps_AttentionForward(benchmark::State& state) {
  const Count s = state.range(0), b = 1, a = 8, d = 32;
  const auto q = random(static_cast<std::size_t>(s * b * a * d), 3);
  const auto k = random(q.size(), 4), v = random(q.size(), 5);
  std::vector<float> out(q.size()), probs(static_cast<std::size_t>(b * a * s * s));
  for (auto _ : state) {
    cpu::attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), s, b, a, a, d);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * b * a * s * s / 2);
}
BENCHMARK(BM_CpuOps_AttentionForward)->Arg(128)->Arg(256);

// LayerNorm forward: items = elements.
void BM_CpuOps_LayernormForward(benchmark::State& state) {
  const Count n = 2048, c = state.range(0);
  const auto x = random(static_cast<std::size_t>(n * c), 6), g = random(c, 7), bb = random(c, 8);
  std::vector<float> y(x.size()), mean(n), rstd(n);
  for (auto _ : state) {
    cpu::layernorm_forward(x.data(), g.data(), bb.data(), y.data(), mean.data(), rstd.data(), n, c,
                           1e-5);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n * c);
}
BENCHMARK(BM_CpuOps_LayernormForward)->Arg(256)->Arg(1024);

// One measured training step of the test suite's tiny GPT (4 layers, hidden 64, vocab 512, s 32,
// 4 micro-batches) on one rank: items = tokens per step.
void BM_Trainer_TinyGptStep(benchmark::State& state) {
  const Scenario s = scenario_from_text(R"({
    "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
              "vocab_size": 512, "mlp": "gelu", "norm": "layernorm", "position_embedding": "learned",
              "max_position_embeddings": 32, "tied_embeddings": false, "bias": true},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
    "training": {"seq_length": 32, "global_batch_size": 4, "micro_batch_size": 1,
                 "precision": "fp32", "optimizer": "adamw"},
    "parallel": {"tp": 1, "pp": 1, "dp": 1}})");
  RunOptions o;
  o.steps = 1;
  o.comm = CommBackend::emulated;
  for (auto _ : state) {
    const Measurement m = run(s, o);
    benchmark::DoNotOptimize(m.losses.data());
  }
  state.SetItemsProcessed(state.iterations() * s.training.global_batch_size *
                          s.training.seq_length);
  state.SetLabel("items = tokens");
}
BENCHMARK(BM_Trainer_TinyGptStep)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace distplan::backend
BENCHMARK_MAIN();
