// Framework memory profiles, the runtime and the caching allocator (docs/memory.md, "Framework
// profiles", "Runtime and allocator"): hand counts of each term, the allocator's rules against
// PyTorch's constants, and published peak memory (data/reference/zero_bubble_table12_memory.json)
// within its tolerance. The measured-beside-predicted table is written into docs/memory.md
// (DISTPLAN_WRITE_DOCS=1 rewrites it; a test fails when the committed text drifts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/framework.h"
#include "distplan/planner/memory_terms.h"
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
  // NCCL on stage 0 of tp 2, pp 2, dp 2 (8 GPUs): communicators for the tp, dp and pipeline
  // groups (2 ranks each: a ring and a tree receive connection), the model-parallel group (tp x
  // pp = 4 ranks) and the world group (8 ranks), these two with a ring and two tree receive
  // connections; each connection on 16 channels of 10 MiB (4 MiB + 512 KiB + 4.6875 MiB, rounded
  // up to 2 MiB), plus 224 MiB per communicator. Tied embeddings are off in small_doc.
  const Bytes pair = 224 * kMiB + 2 * 16 * 10 * kMiB;
  const Bytes group = 224 * kMiB + 3 * 16 * 10 * kMiB;
  const Bytes nccl = 3 * pair + 2 * group;
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
  json d = small_doc("torchtitan");
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
  // The bucket lives inside the backward; the optimizer step's fp32 gradient upcast comes after
  // it and would stand in for a smaller backward transient: left out, the bucket's bytes show.
  d["assumptions"]["framework_profile"] = {{"optimizer_step_upcast", false}};
  const StageMemory ds = estimate(testing::scenario(d)).memory.stages[0];
  d["assumptions"]["framework_profile"] = {{"optimizer_step_upcast", false},
                                           {"reduce_bucket_elements", 0}};
  const StageMemory none = estimate(testing::scenario(d)).memory.stages[0];
  // reduce_bucket_size 5e8 elements in bf16, double-buffered with overlap_comm (the default
  // assumptions.overlap_grad_reduce; stage_1_and_2.py backward_prologue), one buffer without.
  EXPECT_EQ(ds.transient_bytes - none.transient_bytes, Bytes{500'000'000} * 2 * 2);
  d["assumptions"]["overlap_grad_reduce"] = false;
  d["assumptions"]["framework_profile"] = {{"optimizer_step_upcast", false}};
  const StageMemory one = estimate(testing::scenario(d)).memory.stages[0];
  d["assumptions"]["framework_profile"] = {{"optimizer_step_upcast", false},
                                           {"reduce_bucket_elements", 0}};
  EXPECT_EQ(one.transient_bytes - estimate(testing::scenario(d)).memory.stages[0].transient_bytes,
            Bytes{500'000'000} * 2);
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
  for (const char* f : {"generic", "megatron", "deepspeed", "torchtitan"}) {
    json d = small_doc(f);
    if (std::string(f) == "torchtitan") {
      // What torchtitan runs of the layout: FSDP2 (ZeRO-3), tensor parallelism with sp.
      d["parallel"]["zero_stage"] = 3;
      d["parallel"]["sequence_parallel"] = true;
    }
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
      "allocator reserved GiB | error | peak stage |\n|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const json& c : ref["cases"]) {
    json d = ref["scenario"];
    const Count m = c["microbatches"];
    d["training"]["global_batch_size"] = m * d["training"]["micro_batch_size"].get<Count>();
    const Scenario s = testing::scenario(d);
    const Estimate e = estimate(s);
    const double measured = c["measured_gb"].get<double>() * unit;
    const auto alloc = static_cast<double>(e.memory.peak_allocated_bytes);
    // report_memory's max_memory_reserved: the allocator's, without the CUDA context and NCCL.
    Bytes allocator_reserved = 0;
    for (const StageMemory& st : e.memory.stages)
      allocator_reserved = std::max(allocator_reserved, testing::allocator_reserved_bytes(s, st));
    const auto reserved = static_cast<double>(allocator_reserved);
    const double ea = (alloc - measured) / measured, er = (reserved - measured) / measured;
    EXPECT_LE(std::abs(ea), tol) << "m=" << m << " allocated " << alloc / unit;
    EXPECT_LE(std::abs(er), tol) << "m=" << m << " reserved " << reserved / unit;
    md += fmt::format("| {} | {} | {:.2f} | {:+.1f} % | {:.2f} | {:+.1f} % | {} |\n", m,
                      c["measured_gb"].get<double>(), alloc / unit, 100 * ea, reserved / unit,
                      100 * er, e.memory.peak_stage);
  }
  check_block("docs/memory.md", "<!-- memory-fidelity:zero-bubble -->\n", "<!-- end -->", md);
}

// NCCL's memory per communicator (docs/memory.md, "NCCL communicators") against NCCL's own
// allocation log and a measured per-communicator figure (data/reference/
// nccl_communicator_memory.json). The 2-rank figure is the one the profile's
// nccl_communicator_bytes is fitted to; the 4-rank figure checks the connection count.
TEST(NcclMemory, ConnectionsAndCommunicatorsMatchMeasurements) {
  const json ref = testing::reference("nccl_communicator_memory.json");
  for (Framework f : {Framework::megatron, Framework::deepspeed, Framework::torchtitan}) {
    const FrameworkProfile fw = framework_profile(f);
    EXPECT_EQ(nccl_connection_bytes(fw), ref["buffer_allocation_bytes"].get<Bytes>());
    EXPECT_EQ(fw.nccl_channels, ref["channels"].get<Count>());
    for (const json& c : ref["communicators"]) {
      const auto predicted = static_cast<double>(nccl_communicator_bytes(fw, c["ranks"]));
      const double measured = c["measured_mib"].get<double>() * static_cast<double>(kMiB);
      EXPECT_LE(std::abs(predicted - measured) / measured, ref["tolerance"].get<double>())
          << c["ranks"] << " ranks: " << predicted / static_cast<double>(kMiB) << " MiB";
    }
  }
  // A communicator of one rank connects nothing.
  EXPECT_EQ(nccl_communicator_bytes(framework_profile(Framework::megatron), 1), 0);
}

// Which process groups hold a communicator, per framework, on BLOOM-176B's stage 0 (tp 8,
// pp 12, dp 4, tied embeddings): a hand count of the groups each framework's code runs a
// collective or a send/receive in (framework.cpp gives the sources).
TEST(NcclMemory, EachFrameworkCountsItsProcessGroups) {
  MemoryLayout l;
  l.tp = 8;
  l.pp = 12;
  l.dp = 4;
  const FrameworkProfile ds = framework_profile(Framework::deepspeed);
  const Bytes pair = nccl_communicator_bytes(ds, 2), group = nccl_communicator_bytes(ds, 8);
  ASSERT_EQ(pair, (224 + 2 * 16 * 10) * kMiB);
  ASSERT_EQ(group, (224 + 3 * 16 * 10) * kMiB);
  // DeepSpeed: the model's tp group, its own dp, pipeline, slice (tp-sized) and model-parallel
  // (96 ranks) groups, the world; pairs: the next stage and the tied last stage.
  EXPECT_EQ(nccl_buffer_bytes(ds, l, true, 0), 6 * group + 2 * pair);
  // A middle stage: no tied pair, two neighbours.
  EXPECT_EQ(nccl_buffer_bytes(ds, l, true, 5), 6 * group + 2 * pair);
  // Megatron-LM: tp, dp, the pipeline group (batched p2p), model-parallel, world, tied pair.
  const FrameworkProfile mg = framework_profile(Framework::megatron);
  EXPECT_EQ(nccl_buffer_bytes(mg, l, true, 0), 5 * group + pair);
  // FSDP2 over one mesh dimension: the data-parallel group is the world group.
  MemoryLayout flat;
  flat.dp = 8;
  EXPECT_EQ(nccl_buffer_bytes(framework_profile(Framework::torchtitan), flat, false, 0), group);
  // Hybrid sharding over 2 x 4: a 4-rank shard group and a 2-rank replicate group.
  flat.zero_stage = 3;
  flat.shard = 4;
  EXPECT_EQ(nccl_buffer_bytes(framework_profile(Framework::torchtitan), flat, false, 0),
            group + pair);
}

}  // namespace
}  // namespace distplan
