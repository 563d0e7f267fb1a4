// Context parallelism: bytes by hand and against the published volumes of each exchange, memory
// and ZeRO sharding over dp·cp, links from the rank order, and refusals.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/report.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// Llama-3.1-8B (h 4096, 32 heads, 8 KV heads of 128) at `seq` tokens, one micro-batch of one.
json cp_doc(Count tp, Count cp, Count dp, const char* comm, Count seq = 32768) {
  return {{"model", "llama3.1-8b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", tp * cp * dp}}},
          {"training", {{"seq_length", seq}, {"global_batch_size", 4 * dp}}},
          {"parallel", {{"tp", tp}, {"cp", cp}, {"dp", dp}, {"cp_comm", comm}, {"zero_stage", 1}}}};
}

const Collective& find(const Estimate& e, Group g, CollectiveOp op, Traffic what) {
  for (const Collective& c : e.communication.collectives) {
    if (c.group == g && c.op == op && c.purpose == what) return c;
  }
  static const Collective none;
  ADD_FAILURE() << "no " << to_string(what);
  return none;
}

TEST(ContextParallel, RingSendsTheKvChunkCpMinusOneTimesEachWay) {
  // Ring attention (Liu et al. 2023; Transformer Engine AttnFuncWithCPAndKVP2P): per layer and
  // micro-batch, cp - 1 sends of the local K and V forward, and of K, V and their gradients
  // backward. Local K and V by hand: s/cp tokens x 2 x 8 heads x 128 x 2 bytes.
  const Estimate e = estimate(testing::scenario(cp_doc(1, 4, 2, "p2p")));
  const Bytes kv = (32768 / 4) * 2 * 8 * 128 * 2;
  const Count layers_x_mb = 32 * 4;
  const Collective& f = find(e, Group::cp, CollectiveOp::send_recv, Traffic::cp_ring_kv);
  EXPECT_EQ(f.bytes_per_call, kv);
  EXPECT_EQ(f.calls_per_step, 3 * 2 * layers_x_mb);
  const Collective& g = find(e, Group::cp, CollectiveOp::send_recv, Traffic::cp_ring_kv_gradients);
  EXPECT_EQ(g.calls_per_step, 3 * layers_x_mb);
  EXPECT_EQ(g.wire_bytes_per_gpu_per_step, 3 * layers_x_mb * kv);
}

TEST(ContextParallel, AllGatherMovesTheWholeSequencesKeysAndValues) {
  // Llama 3 (Grattafiori et al. 2024, sec. 3.3.2): K and V all-gathered (forward and backward),
  // their gradients reduce-scattered; a ring moves (cp-1)/cp of the s-token buffer per rank.
  const Estimate e = estimate(testing::scenario(cp_doc(1, 4, 2, "all_gather")));
  const Bytes kv_full = 32768 * 2 * 8 * 128 * 2;
  const Collective& g = find(e, Group::cp, CollectiveOp::all_gather, Traffic::cp_kv);
  EXPECT_EQ(g.bytes_per_call, kv_full);
  EXPECT_EQ(g.wire_bytes_per_gpu_per_step, 2 * 32 * 4 * kv_full * 3 / 4);
  const Collective& r = find(e, Group::cp, CollectiveOp::reduce_scatter, Traffic::cp_kv_gradients);
  EXPECT_EQ(r.calls_per_step, 32 * 4);
}

TEST(ContextParallel, UlyssesForwardVolumeIsFourNhOverP) {
  // DeepSpeed-Ulysses (Jacobs et al. 2023, sec. 3.2): with multi-head attention the forward
  // all-to-alls of q, k, v and the output send 4·N·h/P elements per GPU per layer (N tokens, P
  // ranks), of which 1/P stays on the GPU. A multi-head model (kv heads = heads) makes it exact.
  // The backward mirrors it with dO, dQ, dK and dV (DeepSpeed's _SeqAllToAll backward;
  // Transformer Engine >= 2.9's AttnFuncWithCPAndQKVOA2A, which saves the head-sharded output
  // instead of exchanging it again): 4·N·h/P, so the step's all-to-alls are twice the forward's.
  json doc = cp_doc(1, 4, 2, "a2a");
  doc["model"] = {{"preset", "llama3.1-8b"}, {"num_kv_heads", 32}};
  const Estimate e = estimate(testing::scenario(doc));
  const double N = 32768, h = 4096, P = 4;
  Bytes step = 0;
  for (const Collective& c : e.communication.collectives) {
    if (c.group != Group::cp) continue;
    EXPECT_EQ(c.op, CollectiveOp::all_to_all);
    step += c.wire_bytes_per_gpu_per_step;
  }
  // Forward 4 and backward 4 tensors of N·h/P elements each.
  const double per_layer_mb = static_cast<double>(step) / 2.0 / (32 * 4);
  EXPECT_DOUBLE_EQ(per_layer_mb, 4 * N * h / P * (P - 1) / P * 2);
}

TEST(ContextParallel, QueriesAreHeadsTimesHeadDimWide) {
  // An explicit head_dim (Qwen3's shapes: heads × head_dim ≠ hidden; here 32 heads of 256 over
  // h = 4096): the queries, the attention output, their all-to-alls and buffers are
  // q = s/cp × 32 × 256 × 2 bytes, not s/cp × h (issue 29, item 4). Per layer and micro-batch:
  // q and the output forward, dO and dQ backward (TE >= 2.9), and under a2a the head-sharded
  // output saved for the backward.
  const Count cp = 4, layers = 32, mbs = 4;
  const Bytes q = (32768 / cp) * 32 * 256 * 2, kv = (32768 / cp) * 2 * 8 * 256 * 2;
  auto plan = [&](const char* comm) {
    json doc = cp_doc(1, cp, 2, comm);
    doc["model"] = {{"preset", "llama3.1-8b"}, {"head_dim", 256}, {"vocab_size", 1024}};
    doc["parallel"]["zero_stage"] = 3;  // the buffers above the logits workspace (as below)
    return estimate(testing::scenario(doc));
  };
  const Estimate a2a = plan("a2a"), p2p = plan("p2p");
  const Collective& qo =
      find(a2a, Group::cp, CollectiveOp::all_to_all, Traffic::cp_a2a_queries_outputs);
  EXPECT_EQ(qo.bytes_per_call, q);
  EXPECT_EQ(qo.calls_per_step, 4 * layers * mbs);
  const Collective& k = find(a2a, Group::cp, CollectiveOp::all_to_all, Traffic::cp_a2a_kv);
  EXPECT_EQ(k.bytes_per_call, kv / 2);
  EXPECT_EQ(k.calls_per_step, 4 * layers * mbs);
  const StageMemory &x = a2a.memory.stages[0], &y = p2p.memory.stages[0];
  EXPECT_EQ(x.activation_bytes_per_microbatch - y.activation_bytes_per_microbatch, layers * q);
  EXPECT_EQ(x.buffers_bytes - y.buffers_bytes, 2 * q + kv - std::max(2 * kv + 2 * q, 4 * kv));
}

TEST(ContextParallel, ActivationsAndTimeFallWithCp) {
  json a = cp_doc(1, 1, 8, "p2p"), b = cp_doc(1, 4, 2, "p2p");
  a["training"]["global_batch_size"] = b["training"]["global_batch_size"] = 32;
  const Estimate one = estimate(testing::scenario(a));
  const Estimate four = estimate(testing::scenario(b));
  // Saved activations per layer are per token with flash attention: exactly a quarter.
  EXPECT_EQ(one.memory.stages[0].activation_bytes_per_microbatch,
            4 * four.memory.stages[0].activation_bytes_per_microbatch);
  // The model's FLOPs do not change; each rank's share does (balanced causal attention).
  EXPECT_EQ(one.compute.model_flops_per_step, four.compute.model_flops_per_step);
  const double f1 = one.stage_costs[0].forward, f4 = four.stage_costs[0].forward;
  EXPECT_LT(f4, 0.3 * f1);
  EXPECT_GT(f4, 0.25 * f1 - 1e-3);
}

TEST(ContextParallel, ZeroShardsOverDataAndContextRanks) {
  // Megatron-Core's distributed optimizer shards over the data-and-context-parallel group: the
  // optimizer partition of dp = 2, cp = 4 equals that of dp = 8 without cp.
  const Estimate a = estimate(testing::scenario(cp_doc(1, 4, 2, "p2p")));
  const Estimate b = estimate(testing::scenario(cp_doc(1, 1, 8, "p2p")));
  EXPECT_EQ(a.memory.stages[0].optimizer_bytes, b.memory.stages[0].optimizer_bytes);
  const Collective& rs = find(a, Group::dp, CollectiveOp::reduce_scatter,
                              unit_traffic(UnitTraffic::gradients, ParamUnit::layers));
  EXPECT_EQ(rs.group_size, 8);
}

TEST(ContextParallel, LinksFollowTheRankOrderTpCpDpPp) {
  // tp 4 x cp 2 spans 8 ranks: one node of 8; the dp group (cp and dp ranks) spans 16: two nodes.
  const Scenario s = testing::scenario(cp_doc(4, 2, 2, "p2p"));
  EXPECT_EQ(group_link(s, Group::cp), Link::intra_node);
  EXPECT_EQ(group_link(s, Group::dp), Link::inter_node);
  const Scenario t = testing::scenario(cp_doc(8, 2, 1, "p2p"));
  EXPECT_EQ(group_link(t, Group::tp), Link::intra_node);
  EXPECT_EQ(group_link(t, Group::cp), Link::inter_node);
}

TEST(ContextParallel, BuffersHoldEachVariantsExchange) {
  // By hand, local K and V kv = s/cp x 2 x 8 x 128 x 2 bytes, local q (and output) q = s/cp x
  // 4096 x 2: p2p max(2 kv + 2 q, 4 kv); all_gather 2 cp kv; a2a 2 q + kv. They sit on top of
  // the ZeRO-3 gathered units (larger than the logits workspace with a small vocabulary), so the
  // variants' buffers differ by exactly the difference of their exchanges.
  const Count cp = 4;
  const Bytes kv = (32768 / cp) * 2 * 8 * 128 * 2, q = (32768 / cp) * 4096 * 2;
  auto cp_ws = [&](const char* comm) {
    json doc = cp_doc(1, cp, 2, comm);
    doc["parallel"]["zero_stage"] = 3;  // zero_ws + cp_ws exceeds the logits workspace here
    doc["model"] = {{"preset", "llama3.1-8b"}, {"vocab_size", 1024}};
    return estimate(testing::scenario(doc)).memory.stages[0].buffers_bytes;
  };
  const Bytes p2p = cp_ws("p2p"), ag = cp_ws("all_gather"), a2a = cp_ws("a2a");
  EXPECT_EQ(ag - p2p, 2 * cp * kv - std::max(2 * kv + 2 * q, 4 * kv));
  EXPECT_EQ(a2a - p2p, 2 * q + kv - std::max(2 * kv + 2 * q, 4 * kv));
}

TEST(ContextParallel, RefusesWhatIsNotModelled) {
  auto refused = [](json doc, const std::string& path) {
    try {
      (void)testing::scenario(doc);
    } catch (const InputError& err) {
      EXPECT_EQ(err.path(), path) << err.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << doc.dump();
  };
  json standard = cp_doc(1, 2, 1, "p2p");
  standard["training"]["attention"] = "standard";
  refused(standard, "/parallel/cp");
  refused(cp_doc(1, 4, 1, "p2p", 4100), "/parallel/cp");      // 2·cp does not divide the sequence
  refused(cp_doc(2, 8, 1, "a2a"), "/parallel/cp");            // 4 KV heads per TP rank, cp 8
  refused(cp_doc(1, 3, 1, "a2a", 3 * 4096), "/parallel/cp");  // 3 does not divide 32 heads
  json bad = cp_doc(1, 2, 1, "ring");
  refused(bad, "/parallel/cp_comm");
  json gpus = cp_doc(1, 2, 2, "p2p");
  gpus["cluster"]["num_gpus"] = 6;
  refused(gpus, "/parallel");
}

// README's long-context example: its scenario block, planned, prints its table block.
// DISTPLAN_WRITE_DOCS=1 rewrites the table.
TEST(ContextParallel, ReadmeExampleIsWhatThePlannerPrints) {
  const Scenario s = scenario_from_text(testing::readme_scenario("long-context"));
  const std::string want = testing::plan_table(s);
  testing::check_readme_table("long-context", want, "ContextParallel.ReadmeExample*");
  EXPECT_EQ(s.parallel.cp, 4);
  EXPECT_TRUE(sim::plan(s).memory.fits);
}

}  // namespace
}  // namespace distplan
