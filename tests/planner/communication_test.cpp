#include <gtest/gtest.h>

#include <algorithm>

#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

const Collective* find(const Estimate& e, Group g, CollectiveOp op, Traffic what) {
  for (const auto& c : e.communication.collectives) {
    if (c.group == g && c.op == op && c.purpose == what) return &c;
  }
  return nullptr;
}

TEST(Communication, RingFactorsFollowNcclTests) {
  for (Count n : {2, 4, 8, 64, 1024}) {
    const Bytes S = Bytes{1} << 30;
    EXPECT_EQ(ring_wire_bytes(CollectiveOp::all_reduce, S, n), 2 * (n - 1) * S / n);
    EXPECT_EQ(ring_wire_bytes(CollectiveOp::reduce_scatter, S, n), (n - 1) * S / n);
    EXPECT_EQ(ring_wire_bytes(CollectiveOp::all_gather, S, n), (n - 1) * S / n);
    EXPECT_EQ(ring_wire_bytes(CollectiveOp::send_recv, S, n), S);
  }
}

// NCCL's double binary tree (NCCL 2.4+) reduces up and broadcasts down a tree of depth
// ceil(log2 n): 2*ceil(log2 16) = 8 latency steps for 16 ranks where the ring takes 2*(16-1) = 30,
// with the same bus bytes. Inside a node the ring's steps stay.
TEST(Communication, InterNodeAllReduceLatencyFollowsTheTree) {
  const double alpha = 2e-5;
  json doc = {
      {"model", "llama2-7b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}, {"inter_node_latency", alpha}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 64}, {"framework", "generic"}}},
      {"parallel", {{"zero_stage", 0}}}};
  auto dp_all_reduce = [](const Estimate& e) {
    for (const auto& c : e.communication.collectives)
      if (c.group == Group::dp && c.op == CollectiveOp::all_reduce) return c;
    ADD_FAILURE() << "no dp all-reduce";
    return Collective{};
  };
  const Collective tree = dp_all_reduce(estimate(testing::scenario(doc)));
  doc["assumptions"]["tree_all_reduce"] = false;
  const Collective ring = dp_all_reduce(estimate(testing::scenario(doc)));
  ASSERT_EQ(tree.link, Link::inter_node);
  EXPECT_EQ(tree.wire_bytes_per_gpu_per_step, ring.wire_bytes_per_gpu_per_step);
  const double calls = static_cast<double>(tree.calls_per_step);
  EXPECT_NEAR(ring.seconds_per_step - tree.seconds_per_step, calls * (30 - 8) * alpha,
              1e-9 * ring.seconds_per_step);
}

TEST(Communication, Zero0AllReducesEveryGradientOncePerStep) {
  json doc = {
      {"model", "llama2-7b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 16}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 64}, {"framework", "generic"}}},
      {"parallel", {{"zero_stage", 0}}}};
  const Estimate e = estimate(testing::scenario(doc));
  Bytes reduced = 0;
  for (const auto& c : e.communication.collectives) {
    if (c.group == Group::dp) {
      EXPECT_EQ(c.op, CollectiveOp::all_reduce);
      EXPECT_EQ(c.link, Link::inter_node);  // 16 ranks over two 8-GPU nodes
      EXPECT_EQ(c.wire_bytes_per_gpu_per_step,
                ring_wire_bytes(CollectiveOp::all_reduce, c.bytes_per_call, 16) * c.calls_per_step);
      reduced += c.bytes_per_call * c.calls_per_step;
    }
  }
  EXPECT_EQ(reduced, e.memory.stages[0].gradients_bytes);
}

TEST(Communication, Zero3GathersParametersTwicePerMicrobatch) {
  json doc = {
      {"model", "llama2-7b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 8}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 64}, {"framework", "generic"}}},
      {"parallel", {{"zero_stage", 3}}}};
  const Estimate e = estimate(testing::scenario(doc));
  const Collective* ag =
      find(e, Group::dp, CollectiveOp::all_gather,
           unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::layers));
  const Collective* rs = find(e, Group::dp, CollectiveOp::reduce_scatter,
                              unit_traffic(UnitTraffic::gradients, ParamUnit::layers));
  ASSERT_NE(ag, nullptr);
  ASSERT_NE(rs, nullptr);
  EXPECT_EQ(ag->calls_per_step, 2 * 32 * e.num_microbatches);
  EXPECT_EQ(rs->calls_per_step, 32 * e.num_microbatches);
  EXPECT_EQ(ag->link, Link::intra_node);
}

TEST(Communication, TensorParallelAllReducesFourTimesPerLayerPerMicrobatch) {
  json doc = testing::default_doc();
  doc["parallel"]["sequence_parallel"] = false;
  const Scenario s = testing::scenario(doc);
  const Estimate e = estimate(s);
  // The busiest GPU is on the last stage (LM head collectives); it holds 20 layers.
  const Collective* ar = find(e, Group::tp, CollectiveOp::all_reduce, Traffic::layer_activations);
  ASSERT_NE(ar, nullptr);
  EXPECT_EQ(ar->calls_per_step, 4 * 20 * e.num_microbatches);
  EXPECT_EQ(ar->bytes_per_call, Bytes{4096} * 8192 * 2);  // b*s*h in bf16
  EXPECT_EQ(ar->link, Link::intra_node);
}

TEST(Communication, SequenceParallelTradesAllReduceForGatherAndScatter) {
  const Estimate e = estimate(testing::scenario(testing::default_doc()));
  EXPECT_EQ(find(e, Group::tp, CollectiveOp::all_reduce, Traffic::layer_activations), nullptr);
  const Collective* ag = find(e, Group::tp, CollectiveOp::all_gather, Traffic::layer_activations);
  const Collective* rs =
      find(e, Group::tp, CollectiveOp::reduce_scatter, Traffic::layer_activations);
  ASSERT_NE(ag, nullptr);
  ASSERT_NE(rs, nullptr);
  // Same bytes on the wire as the all-reduces they replace, plus the backward re-gathers.
  EXPECT_EQ(rs->calls_per_step, 4 * 20 * e.num_microbatches);
  EXPECT_EQ(ag->calls_per_step, 6 * 20 * e.num_microbatches);
}

TEST(Communication, PipelineSendsOneActivationPerMicrobatchPerBoundary) {
  const Estimate e = estimate(testing::scenario(testing::default_doc()));
  const Collective* fw = find(e, Group::pp, CollectiveOp::send_recv, Traffic::activations_forward);
  const Collective* bw = find(e, Group::pp, CollectiveOp::send_recv, Traffic::gradients_backward);
  // The busiest GPU is the last stage: it sends gradients back, and no activations forward.
  EXPECT_EQ(fw, nullptr);
  ASSERT_NE(bw, nullptr);
  EXPECT_EQ(bw->calls_per_step, e.num_microbatches);
  EXPECT_EQ(bw->bytes_per_call, Bytes{4096} * 8192 * 2 / 8);  // sequence parallel: 1/t
}

TEST(Communication, LinksFollowMegatronRankOrder) {
  json doc = testing::default_doc();  // tp 8, dp 2, pp 4 on 8-GPU nodes
  const Scenario s = testing::scenario(doc);
  EXPECT_EQ(group_link(s, Group::tp), Link::intra_node);
  EXPECT_EQ(group_link(s, Group::dp), Link::inter_node);
  EXPECT_EQ(group_link(s, Group::pp), Link::inter_node);
  doc["parallel"] = {{"tp", 4}, {"pp", 4}, {"dp", 4}};
  const Scenario t = testing::scenario(doc);
  EXPECT_EQ(group_link(t, Group::tp), Link::intra_node);
  EXPECT_EQ(group_link(t, Group::dp), Link::inter_node);  // 4*4 = 16 ranks span two nodes
  doc["parallel"] = {{"tp", 2}, {"pp", 16}, {"dp", 2}};
  EXPECT_EQ(group_link(testing::scenario(doc), Group::dp), Link::intra_node);
}

TEST(Communication, TiedEmbeddingsSyncAcrossFirstAndLastStage) {
  json doc = {
      {"model", "gpt3-1.3b"},
      {"cluster", {{"gpu", "a100-80gb"}, {"num_gpus", 2}}},
      {"training", {{"seq_length", 2048}, {"global_batch_size", 8}, {"framework", "generic"}}},
      {"parallel", {{"pp", 2}}}};
  const Estimate e = estimate(testing::scenario(doc));
  const Collective* c =
      find(e, Group::embedding, CollectiveOp::all_reduce, Traffic::tied_embedding_gradients);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->calls_per_step, 1);
  EXPECT_EQ(c->bytes_per_call, e.padded_vocab_size * 2048 * 2);
}

}  // namespace
}  // namespace distplan

namespace distplan {
namespace {

TEST(Communication, EveryStageKnowsItsWireBytesAndTheBusiestIsListed) {
  const Scenario s = testing::scenario(testing::default_doc());
  const Estimate e = estimate(s);
  Bytes busiest = 0;
  for (std::size_t st = 0; st < e.stage_costs.size(); ++st) {
    Bytes sum = 0;
    for (const Collective& c : stage_communication(s, static_cast<int>(st))) {
      sum += c.wire_bytes_per_gpu_per_step;
    }
    EXPECT_EQ(e.stage_costs[st].wire_bytes_per_step, sum) << "stage " << st;
    busiest = std::max(busiest, sum);
  }
  EXPECT_EQ(e.communication.wire_bytes_per_gpu_per_step, busiest);
}

}  // namespace
}  // namespace distplan
