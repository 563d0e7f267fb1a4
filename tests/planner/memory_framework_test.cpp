// Framework memory profiles, the runtime and the caching allocator (docs/memory.md, "Framework
// profiles", "Runtime and allocator"): hand counts of each term, the allocator's rules against
// PyTorch's constants, and published peak memory (data/reference/zero_bubble_table12_memory.json)
// within its tolerance. The measured-beside-predicted table is written into docs/memory.md
// (DISTPLAN_WRITE_DOCS=1 rewrites it; a test fails when the committed text drifts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/framework.h"
#include "distplan/planner/scenario_json.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;
constexpr Bytes kMiB = Bytes{1} << 20;
constexpr Bytes kGiB = Bytes{1} << 30;

json small_doc(const char* framework) {
  json d = testing::default_doc();
  d["model"] = {{"num_layers", 4},    {"hidden_size", 1024},     {"num_attention_heads", 16},
                {"num_kv_heads", 16}, {"ffn_hidden_size", 4096}, {"vocab_size", 32000},
                {"mlp", "gelu"},      {"norm", "layernorm"},     {"position_embedding", "rotary"}};
  d["training"] = {{"seq_length", 2048},  {"global_batch_size", 8}, {"micro_batch_size", 1},
                   {"precision", "bf16"}, {"attention", "flash"},   {"framework", framework}};
  d["cluster"] = {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 8}};
  d["parallel"] = {{"tp", 2}, {"pp", 2}, {"dp", 2}, {"zero_stage", 1}};
  return d;
}

TEST(MemoryFramework, AllocatorRoundsAsPyTorchsCachingAllocator) {
  // c10/cuda/CUDACachingAllocator.cpp: round_size, get_allocation_size, should_split.
  EXPECT_EQ(allocator::block_bytes(1), 512);
  EXPECT_EQ(allocator::block_bytes(513), 1024);
  EXPECT_EQ(allocator::segment_bytes(1), 2 * kMiB);               // small pool
  EXPECT_EQ(allocator::segment_bytes(kMiB), 2 * kMiB);            // largest small request
  EXPECT_EQ(allocator::segment_bytes(kMiB + 1), 20 * kMiB);       // (1, 10) MiB: 20 MiB segment
  EXPECT_EQ(allocator::segment_bytes(10 * kMiB), 10 * kMiB);      // own segment from 10 MiB
  EXPECT_EQ(allocator::segment_bytes(10 * kMiB + 1), 12 * kMiB);  // rounded up to 2 MiB
  EXPECT_TRUE(allocator::splits(2 * kMiB, 4096));                 // small: >= 512 B remain
  EXPECT_FALSE(allocator::splits(20 * kMiB, 19 * kMiB));          // large: only > 1 MiB remains
  EXPECT_TRUE(allocator::splits(20 * kMiB, 18 * kMiB));
}

TEST(MemoryFramework, GenericKeepsTheFlatReserve) {
  const Scenario s = testing::scenario(small_doc("generic"));
  EXPECT_EQ(s.cluster.runtime_reserve_bytes, 2 * kGiB);
  EXPECT_EQ(s.training.grad_accumulation_dtype, DType::bf16);
  const Estimate e = estimate(s);
  for (const StageMemory& st : e.memory.stages) {
    EXPECT_EQ(st.runtime_bytes, 2 * kGiB);
    EXPECT_EQ(st.transient_bytes, 0);
    EXPECT_EQ(st.reserved_bytes, st.total_bytes);
    EXPECT_EQ(st.allocated_bytes, st.total_bytes - st.runtime_bytes);
  }
  EXPECT_EQ(e.memory.peak_reserved_bytes, e.memory.peak_bytes);
}

TEST(MemoryFramework, MegatronHandCount) {
  const Scenario s = testing::scenario(small_doc("megatron"));
  // Megatron-LM forces fp32 gradient accumulation under bf16.
  EXPECT_EQ(s.training.grad_accumulation_dtype, DType::fp32);
  EXPECT_EQ(s.cluster.runtime_reserve_bytes, ClusterSpec::kRuntimeFromProfile);
  const Estimate e = estimate(s);
  const StageMemory& st = e.memory.stages[0];
  // NCCL: tp ring (1 peer of 2 ranks), dp ring (1 peer), the next pipeline stage: 3 connections
  // x 16 channels x 4 MiB; the CUDA context 512 MiB; the cuBLAS workspace 32 MiB.
  const Bytes nccl = 3 * 16 * 4 * kMiB;
  EXPECT_EQ(st.runtime_bytes, 512 * kMiB + nccl + 32 * kMiB);
  // Flash attention: the largest saved tensor is the MLP's 4h-wide GeLU input, split by tp:
  // 2048 x 4096 / 2 elements; two gradients of that size in bf16.
  EXPECT_EQ(st.transient_bytes, 2 * (2048 * 4096 / 2) * 2);
  EXPECT_EQ(st.allocated_bytes, st.weights_bytes + st.gradients_bytes + st.optimizer_bytes +
                                    st.activations_bytes + st.buffers_bytes + st.transient_bytes +
                                    32 * kMiB);
  // Reserved: segments of the states, the workspace and the churn with 5 % fragmentation, plus
  // the runtime outside the allocator.
  auto seg = [](Bytes b) { return allocator::segment_bytes(b); };
  const Bytes churn = st.activations_bytes + st.buffers_bytes + st.transient_bytes;
  EXPECT_EQ(st.reserved_bytes, seg(st.weights_bytes) + seg(st.gradients_bytes) +
                                   seg(st.optimizer_bytes) + seg(32 * kMiB) +
                                   seg(static_cast<Bytes>(static_cast<double>(churn) * 1.05)) +
                                   512 * kMiB + nccl);
  EXPECT_GT(st.reserved_bytes, st.allocated_bytes);
}

TEST(MemoryFramework, Fsdp2ShardedFp32ParamsAreTheMaster) {
  json d = small_doc("fsdp2");
  d["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 8}, {"zero_stage", 3}};
  const Scenario s = testing::scenario(d);
  const Estimate e = estimate(s);
  const StageMemory& st = e.memory.stages[0];
  const Count shard = st.optimizer_bytes / 8;  // Adam m and v only
  EXPECT_EQ(st.optimizer_bytes, shard * 8);
  EXPECT_EQ(st.weights_bytes, shard * 4);    // sharded fp32 parameters
  EXPECT_EQ(st.gradients_bytes, shard * 4);  // sharded fp32 gradients
  // The same layout under the generic profile: a bf16 shard plus a 12-byte optimizer.
  d["training"]["framework"] = "generic";
  const StageMemory g = estimate(testing::scenario(d)).memory.stages[0];
  EXPECT_EQ(g.weights_bytes + g.optimizer_bytes, shard * (2 + 12));
}

TEST(MemoryFramework, DeepSpeedCountsItsReduceBucket) {
  json d = small_doc("deepspeed");
  d["parallel"] = {{"tp", 1}, {"pp", 1}, {"dp", 8}, {"zero_stage", 2}};
  const StageMemory ds = estimate(testing::scenario(d)).memory.stages[0];
  d["assumptions"]["framework_profile"] = {{"reduce_bucket_elements", 0}};
  const StageMemory none = estimate(testing::scenario(d)).memory.stages[0];
  // reduce_bucket_size 5e8 elements in bf16.
  EXPECT_EQ(ds.transient_bytes - none.transient_bytes, Bytes{500'000'000} * 2);
}

TEST(MemoryFramework, ExplicitReserveReplacesTheRuntimeTerms) {
  json d = small_doc("megatron");
  d["cluster"]["runtime_reserve_bytes"] = 3 * kGiB;
  const StageMemory st = estimate(testing::scenario(d)).memory.stages[0];
  EXPECT_EQ(st.runtime_bytes, 3 * kGiB);
  EXPECT_EQ(st.total_bytes, st.allocated_bytes + 3 * kGiB);
}

TEST(MemoryFramework, FitsComparesReservedBytes) {
  json d = small_doc("megatron");
  const Estimate e = estimate(testing::scenario(d));
  ASSERT_LT(e.memory.peak_allocated_bytes + kMiB, e.memory.peak_reserved_bytes);
  // A custom GPU whose capacity lies between the allocated and reserved peaks does not fit.
  d["cluster"]["gpu"] = {{"preset", "h100-sxm-80gb"},
                         {"memory_bytes", e.memory.peak_reserved_bytes - 1}};
  const Estimate small = estimate(testing::scenario(d));
  EXPECT_EQ(small.memory.peak_reserved_bytes, e.memory.peak_reserved_bytes);
  EXPECT_FALSE(small.memory.fits);
  d["cluster"]["gpu"]["memory_bytes"] = e.memory.peak_reserved_bytes;
  EXPECT_TRUE(estimate(testing::scenario(d)).memory.fits);
}

TEST(MemoryFramework, EchoedScenarioRoundTrips) {
  for (const char* f : {"generic", "megatron", "deepspeed", "fsdp2"}) {
    json d = small_doc(f);
    d["assumptions"]["framework_profile"] = {{"allocator_fragmentation", 0.2}};
    const Scenario s = testing::scenario(d);
    EXPECT_DOUBLE_EQ(s.assumptions.framework_profile.allocator_fragmentation, 0.2);
    const Scenario again = testing::scenario(to_json(s));
    EXPECT_EQ(again, s) << f;
    EXPECT_EQ(estimate(again), estimate(s)) << f;
  }
}

TEST(MemoryFramework, BadProfileFieldNamesItsPath) {
  json d = small_doc("megatron");
  d["assumptions"]["framework_profile"] = {{"allocator_fragmentation", -1}};
  try {
    (void)testing::scenario(d);
    FAIL() << "accepted a negative fragmentation";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/assumptions/framework_profile/allocator_fragmentation");
  }
  d["assumptions"]["framework_profile"] = {{"nccl_chanels", 4}};
  EXPECT_THROW((void)testing::scenario(d), InputError);
  d = small_doc("megatron");
  d["training"]["framework"] = "jax";
  EXPECT_THROW((void)testing::scenario(d), InputError);
}

// Published peak memory ----------------------------------------------------------------------

void check_block(const std::string& file, const std::string& begin, const std::string& end,
                 const std::string& want) {
  testing::check_doc_block(file, begin, end, want, "MemoryFramework.*");
}

TEST(MemoryFramework, ZeroBubbleTable12PeakMemoryWithinTolerance) {
  const json ref = testing::reference("zero_bubble_table12_memory.json");
  const double tol = ref["tolerance"];
  const double unit = ref["unit_bytes"];
  std::string md =
      "| m | measured (paper, GB read as GiB) | predicted allocated GiB | error | predicted "
      "reserved GiB | error | peak stage |\n|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const json& c : ref["cases"]) {
    json d = ref["scenario"];
    const Count m = c["microbatches"];
    d["training"]["global_batch_size"] = m * d["training"]["micro_batch_size"].get<Count>();
    const Estimate e = estimate(testing::scenario(d));
    const double measured = c["measured_gb"].get<double>() * unit;
    const auto alloc = static_cast<double>(e.memory.peak_allocated_bytes);
    const auto reserved = static_cast<double>(e.memory.peak_reserved_bytes);
    const double ea = (alloc - measured) / measured, er = (reserved - measured) / measured;
    EXPECT_LE(std::abs(ea), tol) << "m=" << m << " allocated " << alloc / unit;
    EXPECT_LE(std::abs(er), tol) << "m=" << m << " reserved " << reserved / unit;
    md += fmt::format("| {} | {} | {:.2f} | {:+.1f} % | {:.2f} | {:+.1f} % | {} |\n", m,
                      c["measured_gb"].get<double>(), alloc / unit, 100 * ea, reserved / unit,
                      100 * er, e.memory.peak_stage);
  }
  check_block("docs/memory.md", "<!-- memory-fidelity:zero-bubble -->\n", "<!-- end -->", md);
}

}  // namespace
}  // namespace distplan
