// Byte counts that do not fit 64 bits (issue 29, item 1): every accepted scenario's figures are
// exact (each stage's total is the sum of its categories, computed here in 128-bit integers, and
// nothing is negative); what cannot be represented is refused at a field with the bound stated.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <string>

#include "distplan/planner/checked.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"

namespace distplan {
namespace {

using nlohmann::json;

// The issue's reproducer: 65,536 experts, all of them routed per token, over 4 Mi tokens.
json moe_reproducer() {
  return json::parse(R"({
    "model": {"num_layers": 1, "hidden_size": 1048576, "num_attention_heads": 1,
              "ffn_hidden_size": 1, "vocab_size": 1, "mlp": "swiglu", "norm": "rmsnorm",
              "position_embedding": "rotary",
              "moe": {"num_experts": 65536, "top_k": 65536, "expert_ffn_hidden_size": 1}},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
    "training": {"seq_length": 4194304, "global_batch_size": 8, "micro_batch_size": 8,
                 "framework": "generic"}})");
}

// The figures of an accepted estimate, checked in 128-bit arithmetic: each stage's total is the
// sum of its categories, the peak the largest total, fits the reserved peak against capacity,
// every collective's wire bytes its calls times one call's ring bytes.
void expect_exact(const Estimate& e, const std::string& label) {
  using Wide = __int128;
  Wide peak = 0;
  for (const StageMemory& st : e.memory.stages) {
    const Wide sum = Wide{st.weights_bytes} + st.gradients_bytes + st.optimizer_bytes +
                     st.activations_bytes + st.buffers_bytes + st.transient_bytes +
                     st.runtime_bytes;
    EXPECT_TRUE(sum == Wide{st.total_bytes}) << label << " stage " << st.stage;
    for (Bytes b :
         {st.weights_bytes, st.gradients_bytes, st.optimizer_bytes, st.activations_bytes,
          st.buffers_bytes, st.transient_bytes, st.runtime_bytes, st.allocated_bytes,
          st.reserved_bytes, st.activation_bytes_per_microbatch, st.host_bytes, st.nvme_bytes})
      EXPECT_GE(b, 0) << label << " stage " << st.stage;
    EXPECT_GE(st.reserved_bytes, st.allocated_bytes) << label;
    if (sum > peak) peak = sum;
  }
  EXPECT_TRUE(peak == Wide{e.memory.peak_bytes}) << label;
  EXPECT_EQ(e.memory.fits, e.memory.peak_reserved_bytes <= e.memory.capacity_bytes) << label;
  Wide wire = 0;
  for (const Collective& c : e.communication.collectives) {
    EXPECT_GT(c.bytes_per_call, 0) << label;
    const Wide one = Wide{ring_wire_bytes(c.op, c.bytes_per_call, c.group_size)};
    EXPECT_TRUE(one * c.calls_per_step == Wide{c.wire_bytes_per_gpu_per_step}) << label;
    wire += c.wire_bytes_per_gpu_per_step;
  }
  EXPECT_TRUE(wire == Wide{e.communication.wire_bytes_per_gpu_per_step}) << label;
  EXPECT_GE(e.offload.pcie_bytes_per_gpu_per_step, 0) << label;
}

TEST(Overflow, TheMoeReproducerIsRefusedWithItsBound) {
  try {
    const Estimate e = estimate(scenario_from_json(moe_reproducer()));
    FAIL() << "planned: peak " << e.memory.peak_bytes << " bytes, fits " << e.memory.fits;
  } catch (const InputError& x) {
    EXPECT_EQ(x.path(), "/training/seq_length") << x.what();
    EXPECT_NE(std::string(x.what()).find("1e+18"), std::string::npos) << x.what();
    EXPECT_NE(std::string(x.what()).find("routed"), std::string::npos) << x.what();
  }
}

TEST(Overflow, AcceptedScenariosNearTheBoundsAreExact) {
  // Grow the tokens, the routed copies and the experts of dense and MoE models (thin dense parts,
  // as the reproducer, so the routed copies dominate) by powers until the planner refuses them:
  // every scenario it accepts on the way is planned exactly.
  int accepted = 0, refused = 0;
  for (Count top_k : {Count{0}, Count{1}, Count{256}, Count{65536}}) {
    for (Count hidden : {Count{64}, Count{4096}, Count{1} << 20}) {
      for (int log_seq = 10; log_seq <= 22; log_seq += 3) {
        for (Count mb : {Count{1}, Count{8}}) {
          json j = moe_reproducer();
          j["model"]["hidden_size"] = hidden;
          if (top_k == 0) {
            j["model"].erase("moe");
          } else {
            j["model"]["moe"]["top_k"] = top_k;
          }
          j["training"]["seq_length"] = Count{1} << log_seq;
          j["training"]["micro_batch_size"] = mb;
          j["training"]["global_batch_size"] = 4 * mb;
          j["parallel"] = {{"zero_stage", 2}, {"dp", 1}};
          const std::string label = "top_k " + std::to_string(top_k) + " h " +
                                    std::to_string(hidden) + " s 2^" + std::to_string(log_seq) +
                                    " b " + std::to_string(mb);
          try {
            expect_exact(estimate(scenario_from_json(j)), label);
            ++accepted;
          } catch (const InputError& x) {
            EXPECT_FALSE(x.path().empty()) << label << ": " << x.what();
            ++refused;
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(refused, 2);
}

TEST(Overflow, CheckedSumsRefuseAtTheirField) {
  constexpr Bytes kMax = std::numeric_limits<Bytes>::max();
  EXPECT_EQ(add_bytes(kMax - 1, 1, "/x", "y"), kMax);
  EXPECT_EQ(mul_bytes(kMax / 2, 2, "/x", "y"), kMax - 1);
  try {
    (void)add_bytes(kMax, 1, "/training/seq_length", "the memory of one GPU");
    FAIL() << "wrapped";
  } catch (const InputError& x) {
    EXPECT_EQ(x.path(), "/training/seq_length");
    EXPECT_NE(std::string(x.what()).find("9.2e18"), std::string::npos) << x.what();
  }
  EXPECT_THROW((void)mul_bytes(kMax / 2 + 1, 2, "/x", "y"), InputError);
  EXPECT_THROW((void)mul_bytes(-kMax, 2, "/x", "y"), InputError);
}

}  // namespace
}  // namespace distplan
