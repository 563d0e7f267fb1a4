// DeepSpeed's BF16_Optimizer and pipeline engine as memory sees them (docs/memory.md, "Framework
// profiles"): hand counts of the compute-dtype gradients kept beside the fp32 ones, the fp32
// upcast of the largest gradient, and the pipeline engine's output buffers; and BLOOM-176B's
// peak memory published in BigScience's chronicles (data/reference/bloom176b_chronicle_memory.
// json), whose table this test writes into docs/memory.md (DISTPLAN_WRITE_DOCS=1 rewrites it).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "distplan/planner/estimate.h"
#include "distplan/planner/framework.h"
#include "distplan/planner/scenario_json.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

json bloom_doc(Count tp, Count dp) {
  json d = testing::reference("bloom176b_chronicle_memory.json")["scenario"];
  // BLOOM's DeepSpeed (commit 15293139f, 2022) ran BF16_Optimizer with fp32 gradients at ZeRO-1;
  // DeepSpeed v0.18.0 picks it for bf16 ZeRO-1 when data_types.grad_accum_dtype is fp32
  // (runtime/engine.py _do_optimizer_sanity_check), its default being the model's dtype.
  d["training"]["grad_accumulation_dtype"] = "fp32";
  d["parallel"]["tp"] = tp;
  d["parallel"]["dp"] = dp;
  return d;
}

StageMemory stage(const json& d, int st) {
  return estimate(testing::scenario(d)).memory.stages.at(static_cast<size_t>(st));
}

TEST(MemoryDeepSpeed, Bf16OptimizerKeepsBf16GradientsBesideFp32) {
  // BF16_Optimizer: fp32 flat gradients (4 bytes) plus the bf16 .grad kept until the next
  // backward (2 bytes), both unsharded: 6 bytes per parameter instead of 4.
  json d = bloom_doc(8, 4);
  const StageMemory on = stage(d, 0);
  d["assumptions"]["framework_profile"]["keeps_compute_dtype_gradients"] = false;
  const StageMemory off = stage(d, 0);
  EXPECT_EQ(on.gradients_bytes * 4, off.gradients_bytes * 6);
  EXPECT_EQ(on.weights_bytes, off.weights_bytes);
  EXPECT_EQ(on.optimizer_bytes, off.optimizer_bytes);
  // bf16 gradients (DeepSpeed's default) at ZeRO-1: the ZeRO optimizer, not BF16_Optimizer, so
  // no extra copy, and 2 bytes per parameter.
  d = bloom_doc(8, 4);
  d["training"].erase("grad_accumulation_dtype");
  const StageMemory z1 = stage(d, 0);
  EXPECT_EQ(z1.gradients_bytes * 4, off.gradients_bytes * 2);
  d["assumptions"]["framework_profile"]["keeps_compute_dtype_gradients"] = false;
  EXPECT_EQ(z1.gradients_bytes, stage(d, 0).gradients_bytes);
}

// Issue 29 item 6: DeepSpeed keeps bf16 gradients by default (data_types.grad_accum_dtype is the
// model's dtype, runtime/engine.py get_data_types), so ZeRO-2/3 gradients and the unit-gradient
// buffer are bf16, and the ZeRO optimizer's step upcasts the partition to fp32
// (stage_1_and_2.py step: flatten(averaged_gradients).to(fp32)).
TEST(MemoryDeepSpeed, ZeroOptimizerKeepsBf16GradientsAndUpcastsThePartitionAtTheStep) {
  json d = {
      {"model", "llama3.1-8b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 8}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 32}, {"framework", "deepspeed"}}},
      {"parallel", {{"dp", 8}, {"zero_stage", 2}, {"recompute", "full"}}}};
  const Scenario s = testing::scenario(d);
  EXPECT_EQ(s.training.grad_accumulation_dtype, DType::bf16);
  // Llama-3.1-8B by hand: layers of 4096^2 (q, o) + 2 x 4096 x 1024 (k, v) + 3 x 4096 x 14336
  // (SwiGLU) + 2 x 4096 (norms); embedding and LM head 128256 x 4096; final norm 4096. Every
  // unit divides by 8, so the partition is exactly an eighth of the model.
  const Count layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
  const Count model = 32 * layer + 2 * Count{128256} * 4096 + 4096;
  const StageMemory st = estimate(s).memory.stages.at(0);
  EXPECT_EQ(st.gradients_bytes, 2 * model / 8);                     // bf16 partition
  EXPECT_EQ(st.transient_bytes, 4 * model / 8 - st.working_bytes);  // fp32 copy at the step
  // With fp32 accumulation asked for, the ZeRO optimizer accumulates in fp32 and needs no copy.
  d["training"]["grad_accumulation_dtype"] = "fp32";
  const StageMemory fp32 = estimate(testing::scenario(d)).memory.stages.at(0);
  EXPECT_EQ(fp32.gradients_bytes, 4 * model / 8);
  EXPECT_LT(fp32.transient_bytes, st.transient_bytes);
}

TEST(MemoryDeepSpeed, PipelineEngineKeepsEachInflightOutputPartitionedOverTp) {
  // pipe_buffers['outputs']: one stage output per in-flight micro-batch, split over the TP group
  // (PartitionedTensor): stage 0 of 12 holds 12 micro-batches of 2 x 2048 tokens x 14336 x bf16
  // / 8; the last stage sends nothing.
  json d = bloom_doc(8, 4);
  const StageMemory first = stage(d, 0), last = stage(d, 11);
  d["assumptions"]["framework_profile"]["pipeline_output_buffers"] = false;
  const StageMemory first_off = stage(d, 0), last_off = stage(d, 11);
  EXPECT_EQ(first.activations_bytes - first_off.activations_bytes,
            Bytes{12} * 2 * 2048 * 14336 * 2 / 8);
  EXPECT_EQ(first.activation_bytes_per_microbatch - first_off.activation_bytes_per_microbatch,
            Bytes{2} * 2048 * 14336 * 2 / 8);
  EXPECT_EQ(last.activations_bytes, last_off.activations_bytes);
}

TEST(MemoryDeepSpeed, UpcastOfTheLargestGradientAfterTheBackward) {
  // update_hp_grads upcasts one bf16 gradient at a time: on stage 0 the word embedding's,
  // 250880 x 14336 / 8 elements x 4 bytes, once the recompute working set is freed. The ZeRO-1
  // reduce bucket does not exist under BF16_Optimizer (it all-reduces its flat fp32 buffer).
  json d = bloom_doc(8, 4);
  const StageMemory st = stage(d, 0);
  const Bytes upcast = Bytes{4} * 250880 * 14336 / 8;
  EXPECT_EQ(st.transient_bytes, upcast - st.working_bytes);
  // Layers only (stage 1): the MLP's first linear, 57344 x 14336 / 8 elements, is smaller than
  // the working set there, so the backward's own transient stays.
  const StageMemory mid = stage(d, 1);
  d["assumptions"]["framework_profile"]["gradient_upcast_transient"] = false;
  EXPECT_EQ(mid.transient_bytes, stage(d, 1).transient_bytes);
  EXPECT_GT(mid.working_bytes, Bytes{4} * 57344 * 14336 / 8);
}

// BLOOM-176B, BigScience's chronicle: nvidia-smi on the first node (stage 0).
TEST(MemoryDeepSpeed, Bloom176bChroniclePeakMemory) {
  const json ref = testing::reference("bloom176b_chronicle_memory.json");
  const double tol = ref["tolerance"];
  const double unit = ref["unit_bytes"];
  std::string md =
      "| TP / PP / DP | measured (nvidia-smi, GB read as 1000 MiB) GiB | predicted reserved GiB "
      "| error | error if GB = GiB | bf16 grads GiB | pipe outputs GiB | transient GiB | NCCL GiB "
      "| peak stage |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const json& c : ref["cases"]) {
    const Count tp = c["tp"], dp = c["dp"];
    json d = bloom_doc(tp, dp);
    const Scenario s = testing::scenario(d);
    const Estimate e = estimate(s);
    const StageMemory& st = e.memory.stages.at(0);
    const FrameworkProfile& fw = s.assumptions.framework_profile;
    const auto nccl =
        static_cast<double>(st.runtime_bytes - fw.cuda_context_bytes - fw.cublas_workspace_bytes);
    const double measured = c["measured_gb"].get<double>() * unit;
    const auto reserved = static_cast<double>(st.reserved_bytes);
    const double err = (reserved - measured) / measured;
    const double err_gib = (reserved - c["measured_gb"].get<double>() * kGiB) /
                           (c["measured_gb"].get<double>() * kGiB);
    EXPECT_LE(std::abs(err), tol) << "tp " << tp << ": " << reserved / kGiB << " GiB";
    // The terms the deepspeed profile adds, from the plan's own figures.
    const double grads_bf16 = static_cast<double>(st.gradients_bytes) / 3.0;  // 2 of 6 bytes
    const double outputs = 12.0 * 2 * 2048 * 14336 * 2 / static_cast<double>(tp);
    md += fmt::format(
        "| {} / 12 / {} | {:.2f} | {:.2f} | {:+.1f} % | {:+.1f} % | {:.2f} | {:.2f} | {:.2f} | "
        "{:.2f} | {} |\n",
        tp, dp, measured / kGiB, reserved / kGiB, 100 * err, 100 * err_gib, grads_bf16 / kGiB,
        outputs / kGiB, static_cast<double>(st.transient_bytes) / kGiB, nccl / kGiB,
        e.memory.peak_stage);
  }
  testing::check_doc_block("docs/memory.md", "<!-- memory-fidelity:bloom -->\n", "<!-- end -->", md,
                           "MemoryDeepSpeed.*");
}

}  // namespace
}  // namespace distplan
