// MoE layouts the planner now plans (docs/moe.md, "Plan"): expert tensor parallelism with its
// token gathers and reduce-scatters, experts under ZeRO-3 / FSDP gathered per layer over the
// expert data-parallel group, and FP8 expert GEMMs with their cached fp8 weights; each against
// hand counts from the model's shapes (Mixtral-8x7B: hidden 4096, experts of 14336, 8 experts,
// top-2, 32 layers, vocab 32000).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/validate.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

json mixtral(int gpus, json parallel, int batch, json training = json::object()) {
  json t = {{"seq_length", 4096},     {"global_batch_size", batch},        {"micro_batch_size", 1},
            {"precision", "bf16"},    {"grad_accumulation_dtype", "fp32"}, {"optimizer", "adam"},
            {"framework", "megatron"}};
  for (const auto& [k, v] : training.items()) t[k] = v;
  return {{"model", "mixtral-8x7b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
          {"training", t},
          {"parallel", std::move(parallel)}};
}

Scenario planned(const json& doc) {
  Scenario s = testing::scenario(doc);
  validate_scenario(s);
  return s;
}

const Collective* find(const std::vector<Collective>& cs, Group g, CollectiveOp op, Traffic what) {
  for (const Collective& c : cs)
    if (c.group == g && c.op == op && c.purpose == what) return &c;
  return nullptr;
}

constexpr Count kExpert = 176160768;     // 3·4096·14336
constexpr Count kDenseLayer = 41984000;  // attention, norms, router (moe_plan_test.cpp)

// 16 GPUs, tp = 2 with sequence parallelism, dp = 8, ep = 4, etp = 2: an expert group is two
// ranks that each hold half of the layer's 8/4 = 2 experts' FFNs (edp = 16 / 8 = 2). Each GPU
// routes b·s/tp = 2048 tokens, sends 2048·2 copies in the all-to-all (33,554,432 bytes in bf16)
// and the etp pair gathers what both received: 2·33,554,432 bytes, all-gathered forward and
// reduce-scattered back (Megatron-Core MoEAlltoAllTokenDispatcher), the converse backward.
TEST(MoeEtp, GathersAndReduceScattersByHand) {
  const json doc = mixtral(
      16, {{"tp", 2}, {"pp", 1}, {"dp", 8}, {"ep", 4}, {"etp", 2}, {"sequence_parallel", true}},
      16);
  const Scenario s = planned(doc);
  const Estimate e = estimate(s);
  const MoeLayerPlan x = moe_layer_plan(s);
  EXPECT_EQ(x.tokens, 2048);
  EXPECT_EQ(x.routed, 2048 * 2 * 2);  // the pair's copies, on both ranks
  EXPECT_EQ(x.expert_params, 2 * kExpert / 2);
  const auto& cs = e.communication.collectives;
  const Count m = 16 / 8;  // micro-batches per step
  for (auto [op, what] :
       {std::pair{CollectiveOp::all_gather, Traffic::expert_tokens_forward},
        {CollectiveOp::reduce_scatter, Traffic::expert_outputs_forward},
        {CollectiveOp::all_gather, Traffic::expert_output_gradients_backward},
        {CollectiveOp::reduce_scatter, Traffic::expert_token_gradients_backward}}) {
    const Collective* c = find(cs, Group::etp, op, what);
    ASSERT_NE(c, nullptr) << to_string(what);
    EXPECT_EQ(c->group_size, 2);
    EXPECT_EQ(c->link, Link::intra_node);
    EXPECT_EQ(c->bytes_per_call, 2 * 33554432) << to_string(what);
    EXPECT_EQ(c->calls_per_step, 32 * m) << to_string(what);
    EXPECT_EQ(c->wire_bytes_per_gpu_per_step, 33554432 * 32 * m) << to_string(what);
  }
  EXPECT_EQ(
      find(cs, Group::ep, CollectiveOp::all_to_all, Traffic::dispatch_forward)->bytes_per_call,
      33554432);
  EXPECT_EQ(find(cs, Group::edp, CollectiveOp::all_reduce,
                 unit_traffic(UnitTraffic::gradients, ParamUnit::experts))
                ->group_size,
            2);
  // The gathers sit on the critical path with the all-to-alls.
  EXPECT_GT(e.stage_costs[0].ep_communication, 0);
  // etp with biased experts (gpt-oss) is refused at the field.
  json biased = doc;
  biased["model"] = {{"preset", "mixtral-8x7b"}, {"bias", true}};
  try {
    validate_scenario(testing::scenario(biased));
    ADD_FAILURE() << "accepted";
  } catch (const InputError& err) {
    EXPECT_EQ(err.path(), "/parallel/etp");
  }
}

// ZeRO-3 of the experts over edp: 32 GPUs, dp = 32, ep = 8 (edp = 4). Weights are shards:
// dense units over 32 ranks, each layer's expert unit over 4. Each layer's experts are gathered
// forward and backward per micro-batch; the gathered window (the current layer and one
// prefetched) holds two layers' dense parts and experts.
TEST(MoeZero3, ExpertsShardedAndGatheredOverEdpByHand) {
  const json doc =
      mixtral(32, {{"tp", 1}, {"pp", 1}, {"dp", 32}, {"ep", 8}, {"zero_stage", 3}}, 32);
  const Scenario s = planned(doc);
  const Estimate e = estimate(s);
  const StageMemory& sm = e.memory.stages[0];
  constexpr Count kEmbedding = 131072000, kHead = 131072000 + 4096;
  const Count dense = kEmbedding + kHead + 32 * kDenseLayer;  // 1,605,636,096
  EXPECT_EQ(sm.weights_bytes, 2 * (dense / 32 + 32 * kExpert / 4));
  EXPECT_EQ(sm.gradients_bytes, 4 * (dense / 32 + 32 * kExpert / 4));
  EXPECT_EQ(sm.optimizer_bytes, 12 * (dense / 32 + 32 * kExpert / 4));
  // Gathered: 2 x (layer dense part + experts) in bf16, beside one unit's fp32 gradient (the
  // expert unit, the largest).
  EXPECT_EQ(sm.buffers_bytes, 2 * 2 * (kDenseLayer + kExpert) + 4 * kExpert);
  const auto& cs = e.communication.collectives;
  const Collective* g =
      find(cs, Group::edp, CollectiveOp::all_gather,
           unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::experts));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->group_size, 4);
  EXPECT_EQ(g->bytes_per_call, 2 * kExpert);
  EXPECT_EQ(g->calls_per_step, 2 * 32 * 1);
  const Collective* r = find(cs, Group::edp, CollectiveOp::reduce_scatter,
                             unit_traffic(UnitTraffic::gradients, ParamUnit::experts));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->bytes_per_call, 4 * kExpert);
  EXPECT_GT(e.stage_costs[0].zero3_gather, 0);
}

// FP8 (current scaling): each layer caches its linear weights in fp8 twice (row- and
// column-wise) with 3 fp32 scales per linear (fp8.h); a MoE layer's routed experts too, its
// one local expert's two GEMM weights at ep = 8. The experts keep their inputs in fp8.
TEST(MoeFp8, CachedExpertWeightsAndFp8InputsByHand) {
  const json par = {{"tp", 1}, {"pp", 1}, {"dp", 8}, {"ep", 8}, {"zero_stage", 1}};
  const Scenario bf16 = planned(mixtral(8, par, 8));
  const Scenario fp8 =
      planned(mixtral(8, par, 8, {{"precision", "fp8"}, {"fp8_recipe", "current"}}));
  const Estimate eb = estimate(bf16), ef = estimate(fp8);
  // qkv 4096·6144 and attention_out 4096·4096, and the expert's 176,160,768: two bytes each,
  // plus 12 bytes of scales per linear (2 dense, 2 expert GEMMs).
  const Count linear = 4096 * 6144 + 4096 * 4096 + kExpert;
  EXPECT_EQ(ef.memory.stages[0].weights_bytes - eb.memory.stages[0].weights_bytes,
            32 * (2 * linear + 4 * 12));
  // The experts' GEMM inputs: 4096 tokens · top-2 copies, h and f in one byte, the activation's
  // 2f input in bf16.
  const MoeLayerPlan x = moe_layer_plan(fp8);
  EXPECT_EQ(x.activation.experts, 8192 * (4096 + 14336) + 8192 * 2 * 14336 * 2);
  EXPECT_EQ(moe_layer_plan(bf16).activation.experts, 8192 * (4096 + 3 * 14336) * 2);
  // The grouped GEMMs run at the fp8 rate: the step is faster.
  EXPECT_LT(ef.stage_costs[0].forward, eb.stage_costs[0].forward);
}

}  // namespace
}  // namespace distplan
