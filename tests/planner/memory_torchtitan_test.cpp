// torchtitan's per-op selective activation checkpointing (parallel.recompute "selective_op"):
// hand counts of what one Llama 3 8B layer keeps and re-runs under torchtitan's save-list rule,
// and torchtitan's published peak memory of Llama 3.1 8B under FSDP2
// (data/reference/torchtitan_llama3_8b_memory.json) within its tolerance. The table is written
// into docs/memory.md (DISTPLAN_WRITE_DOCS=1 rewrites it; the test fails when the text drifts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/selective_op.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

Scenario llama3_8b(Count tp, bool sp) {
  json d = testing::reference("torchtitan_llama3_8b_memory.json")["scenario"];
  d["training"]["global_batch_size"] = 16;
  d["cluster"]["num_gpus"] = 8 * tp;
  d["parallel"]["dp"] = 8;
  d["parallel"]["tp"] = tp;
  d["parallel"]["sequence_parallel"] = sp;
  return testing::scenario(d);
}

TEST(SelectiveOp, Llama3LayerKeepsTheOddMatmulsAttentionAndInput) {
  const Scenario s = llama3_8b(1, false);
  const LayerTable t = build_layer_table(s.model, s.training);
  // Per token, bf16: the block input 4096, wq 4096 (mm 1), wv 1024 (mm 3), the flash output 4096
  // and its fp32 log-sum-exp (32 heads), w1 14336 (mm 5), w2 4096 (mm 7); wk, wo, w3 (mm 2, 4, 6)
  // are recomputed.
  const Bytes per_token = (4096 + 4096 + 1024 + 4096 + 14336 + 4096) * 2 + 32 * 4;
  const Count tokens = 2 * 8192;
  EXPECT_EQ(selective_op_kept_bytes(t, s.model, s.training, 1, false), tokens * per_token);
  const LayerActivation a =
      layer_activation(t, s.model, s.training, 1, false, Recompute::selective_op);
  EXPECT_EQ(a.kept, tokens * per_token);
  // The recomputed layer rebuilds everything the layer saves without recompute.
  EXPECT_EQ(a.working, layer_activation(t, s.model, s.training, 1, false, Recompute::none).kept);
  EXPECT_LT(a.kept, a.working);
}

TEST(SelectiveOp, TensorParallelKeepsShardsAndReduceScatterOutputs) {
  const Scenario s = llama3_8b(2, true);
  const LayerTable t = build_layer_table(s.model, s.training);
  // tp 2 with sequence parallelism: column outputs halve, row-parallel partial sums stay
  // h wide, both reduce-scatter outputs (wo, w2) are saved at h/2, the input is split.
  const Bytes per_token =
      (4096 / 2 + 4096 / 2 + 1024 / 2 + 4096 / 2 + 14336 / 2 + 4096 + 2 * (4096 / 2)) * 2 +
      32 / 2 * 4;
  EXPECT_EQ(selective_op_kept_bytes(t, s.model, s.training, 2, true), 2 * 8192 * per_token);
}

TEST(SelectiveOp, RecomputesWkWoW3AndTheCheapOps) {
  const Scenario s = llama3_8b(1, false);
  const LayerTable t = build_layer_table(s.model, s.training);
  const auto share = selective_op_recompute_share(t);
  for (int i = 0; i < t.num_ops; ++i) {
    const LayerOp& op = t.ops[i];
    double want = 1.0;                                        // norms, SwiGLU, residual adds
    if (op.name == "qkv") want = 1024.0 / (4096 + 2 * 1024);  // wk of wq, wk, wv
    if (op.name == "attention") want = 0.0;                   // flash SDPA saved
    if (op.name == "attention_out") want = 1.0;               // wo: mm 4
    if (op.name == "mlp_in") want = 0.5;                      // w3 of w1, w3
    if (op.name == "mlp_out") want = 0.0;                     // w2: mm 7
    EXPECT_DOUBLE_EQ(share[i], want) << op.name;
  }
  // Recomputed forward FLOPs: wk + wo + w3 = 2 h (kvh + h + f) per token.
  const LayerFlops f = layer_flops(t, 2, 8192);
  EXPECT_DOUBLE_EQ(f.selective_op_recompute, 2.0 * 8192 * 2.0 * 4096 * (1024 + 4096 + 14336));
  // Full recompute re-runs more, Megatron's selective (nothing under flash) less.
  EXPECT_LT(f.selective_op_recompute, f.forward);
}

void check_block(const std::string& file, const std::string& begin, const std::string& end,
                 const std::string& want) {
  testing::check_doc_block(file, begin, end, want, "SelectiveOp.*");
}

TEST(SelectiveOp, TorchtitanLlama3_8bPeakReservedWithinTolerance) {
  const json ref = testing::reference("torchtitan_llama3_8b_memory.json");
  const double tol = ref["tolerance"];
  const double unit = ref["unit_bytes"];
  std::string md =
      "| GPUs | measured GiB (max reserved) | predicted allocator reserved GiB | error | "
      "predicted allocated GiB | of it activations GiB |\n|---:|---:|---:|---:|---:|---:|\n";
  for (const json& c : ref["cases"]) {
    json d = ref["scenario"];
    d["cluster"]["num_gpus"] = c["num_gpus"];
    d["parallel"]["dp"] = c["num_gpus"];
    d["training"]["global_batch_size"] = c["global_batch_size"];
    const Scenario s = testing::scenario(d);
    const Estimate e = estimate(s);
    const StageMemory& st = e.memory.stages.at(static_cast<size_t>(e.memory.peak_stage));
    // torchtitan logs the caching allocator's peak.
    const auto reserved = static_cast<double>(testing::allocator_reserved_bytes(s, st));
    const double measured = c["measured_gib"].get<double>() * unit;
    const double err = (reserved - measured) / measured;
    EXPECT_LE(std::abs(err), tol) << c["num_gpus"] << " GPUs: " << reserved / unit << " GiB";
    md += fmt::format("| {} | {} | {:.2f} | {:+.1f} % | {:.2f} | {:.2f} |\n",
                      c["num_gpus"].get<Count>(), c["measured_gib"].get<double>(), reserved / unit,
                      100 * err, static_cast<double>(st.allocated_bytes) / unit,
                      static_cast<double>(st.activations_bytes) / unit);
  }
  check_block("docs/memory.md", "<!-- memory-fidelity:torchtitan -->\n", "<!-- end -->", md);
}

// torchtitan's FSDP under a pipeline (docs/memory.md, "FSDP under a pipeline"): the default
// reshard policy keeps units gathered after the forward when pipelining, and the pipeline stage
// turns off resharding after backward and gradient reduction until the last micro-batch, so a
// stage holds its whole gathered bf16 copy and an unsharded fp32 gradient. Hand count for
// Llama-3.1-8B, pp 2, dp 8: stage 0 holds the embedding and 16 layers.
TEST(MemoryTorchtitan, FsdpUnderAPipelineKeepsUnitsGatheredAndGradientsUnsharded) {
  json d = {
      {"model", "llama3.1-8b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 32}, {"framework", "torchtitan"}}},
      {"parallel", {{"pp", 2}, {"dp", 8}, {"zero_stage", 3}, {"recompute", "full"}}}};
  const Count layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
  const Count p = 16 * layer + Count{128256} * 4096;  // every unit divides by 8: no padding
  const StageMemory st = estimate(testing::scenario(d)).memory.stages.at(0);
  EXPECT_EQ(st.weights_bytes, 4 * p / 8 + 2 * p);  // fp32 shard (the master) + gathered bf16
  EXPECT_EQ(st.gradients_bytes, 4 * p);            // unsharded fp32 accumulation
  EXPECT_EQ(st.optimizer_bytes, 8 * p / 8);        // Adam's m and v, sharded
  // Without a pipeline FSDP2 reshards after each forward and reduce-scatters each backward.
  d["parallel"] = {{"pp", 1}, {"dp", 16}, {"zero_stage", 3}, {"recompute", "full"}};
  const StageMemory flat = estimate(testing::scenario(d)).memory.stages.at(0);
  const Count all = 32 * layer + 2 * Count{128256} * 4096 + 4096;
  EXPECT_EQ(flat.gradients_bytes, 4 * all / 16);
  EXPECT_EQ(flat.weights_bytes, 4 * all / 16);
}

}  // namespace
}  // namespace distplan
