// Large but valid scenarios: figures of a 10^13-parameter model come out exact, with no overflow
// of the 64-bit byte counts (units.h; docs/trust.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distplan::testing {
namespace {

using nlohmann::json;

// Parameters of one GPT layer with LayerNorm (scale and shift), multi-head attention, a GeLU MLP
// and no linear biases, from the architecture (Vaswani et al. 2017; Megatron-LM's GPT):
//   2 norms: 2·2h;  QKV: h·3h;  attention output: h·h;  MLP: h·f + f·h.
std::int64_t gpt_layer_parameters(std::int64_t h, std::int64_t f) {
  return 2 * 2 * h + 3 * h * h + h * h + 2 * h * f;
}

TEST(LargeScenario, TenTrillionParameterModelComputesExactly) {
  const std::int64_t L = 3200, h = 16384, a = 128, f = 65536, V = 65536, pp = 32;
  const std::int64_t per_layer = gpt_layer_parameters(h, f);
  // Rotary positions (no position table), untied input embedding and LM head, a final LayerNorm.
  const std::int64_t total = L * per_layer + 2 * V * h + 2 * h;
  ASSERT_GT(total, std::int64_t{10'000'000'000'000});  // 1.03e13

  json doc = json::parse(read_source_file("data/scenarios/default.json"));
  doc["model"] = {{"num_layers", L},          {"hidden_size", h},
                  {"num_attention_heads", a}, {"ffn_hidden_size", f},
                  {"vocab_size", V},          {"mlp", "gelu"},
                  {"norm", "layernorm"},      {"position_embedding", "rotary"},
                  {"tied_embeddings", false}, {"bias", false}};
  doc["cluster"]["num_gpus"] = pp;
  doc["training"] = {
      {"seq_length", 2048},    {"global_batch_size", 64},
      {"micro_batch_size", 1}, {"precision", "bf16"},
      {"optimizer", "adamw"},  {"framework", "generic"}};  // the textbook bytes the test counts
  doc["parallel"] = {
      {"tp", 1},           {"pp", pp}, {"dp", 1}, {"zero_stage", 0}, {"recompute", "none"},
      {"schedule", "1f1b"}};
  const CliResult r = run_cli({"plan", "-"}, doc.dump());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = json::parse(r.out);

  EXPECT_EQ(plan["model_summary"]["parameters"].get<std::int64_t>(), total);
  const json& stages = plan["memory"]["stages"];
  ASSERT_EQ(stages.size(), static_cast<std::size_t>(pp));
  const std::int64_t layers_per_stage = L / pp;
  std::int64_t sum = 0, peak = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    SCOPED_TRACE(i);
    const json& st = stages[i];
    const std::int64_t expected = layers_per_stage * per_layer + (i == 0 ? V * h : 0) +
                                  (i + 1 == stages.size() ? V * h + 2 * h : 0);
    const auto params = st["parameters"].get<std::int64_t>();
    EXPECT_EQ(params, expected);
    // ZeRO's mixed-precision Adam (Rajbhandari et al. 2020, §3.1): bf16 weights and gradients,
    // 12 bytes of fp32 master weights and moments per parameter; ZeRO-0 shards none of them.
    EXPECT_EQ(st["weights_bytes"].get<std::int64_t>(), 2 * expected);
    EXPECT_EQ(st["gradients_bytes"].get<std::int64_t>(), 2 * expected);
    EXPECT_EQ(st["optimizer_bytes"].get<std::int64_t>(), 12 * expected);
    std::int64_t categories = 0;
    for (const char* k : {"weights_bytes", "gradients_bytes", "optimizer_bytes",
                          "activations_bytes", "buffers_bytes", "runtime_bytes"}) {
      EXPECT_GE(st[k].get<std::int64_t>(), 0) << k;
      categories += st[k].get<std::int64_t>();
    }
    EXPECT_EQ(st["total_bytes"].get<std::int64_t>(), categories);
    sum += params;
    peak = std::max(peak, categories);
  }
  EXPECT_EQ(sum, total);
  EXPECT_EQ(plan["memory"]["peak_bytes"].get<std::int64_t>(), peak);
  EXPECT_FALSE(plan["memory"]["fits"].get<bool>());
  // Model FLOPs: at least the 6·N·tokens of the dense matmuls (Kaplan et al. 2020), finite.
  const double flops = plan["compute"]["model_flops_per_step"].get<double>();
  EXPECT_GE(flops, 6.0 * static_cast<double>(total) * 64 * 2048);
  EXPECT_GT(plan["time"]["step_seconds"].get<double>(), 0.0);
}

TEST(LargeScenario, OneTrillionParametersOnOneGpuStaysExact) {
  // Everything on one GPU: 16 bytes per parameter of model state, ~1.6e13 bytes, no overflow.
  const std::int64_t L = 320, h = 16384, f = 65536, V = 65536;
  const std::int64_t total = L * gpt_layer_parameters(h, f) + 2 * V * h + 2 * h;
  json doc = json::parse(read_source_file("data/scenarios/default.json"));
  doc["model"] = {{"num_layers", L},
                  {"hidden_size", h},
                  {"num_attention_heads", 128},
                  {"ffn_hidden_size", f},
                  {"vocab_size", V},
                  {"mlp", "gelu"},
                  {"norm", "layernorm"},
                  {"position_embedding", "rotary"},
                  {"bias", false},
                  {"tied_embeddings", false}};
  doc["cluster"]["num_gpus"] = 1;
  doc["training"]["global_batch_size"] = 8;
  doc["training"]["framework"] = "generic";  // the textbook 16 bytes per parameter
  doc["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
  const CliResult r = run_cli({"plan", "-"}, doc.dump());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = json::parse(r.out);
  const json& st = plan["memory"]["stages"][0];
  EXPECT_EQ(st["parameters"].get<std::int64_t>(), total);
  EXPECT_EQ(st["weights_bytes"].get<std::int64_t>() + st["gradients_bytes"].get<std::int64_t>() +
                st["optimizer_bytes"].get<std::int64_t>(),
            16 * total);
}

}  // namespace
}  // namespace distplan::testing
