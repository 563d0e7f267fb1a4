// ZeRO-Offload / ZeRO-Infinity: distplan's GPU and host bytes held against DeepSpeed's model-state
// estimators (data/reference/deepspeed_offload_estimators.json), the offload traffic by hand, and
// the refusals of what is not modelled.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/report.h"
#include "test_util.h"

namespace distplan {
namespace {

using nlohmann::json;

// DeepSpeed's estimators as its code computes them (the reference file's "code" formulas):
// returns {cpu, gpu} bytes. An independent oracle: DeepSpeed's own arithmetic, not distplan's.
struct DsBytes {
  double cpu = 0, gpu = 0;
};
DsBytes ds_zero2(double P, double gpn, double nodes, bool offload, double f) {
  const double gpus = gpn * nodes;
  if (offload) return {P * std::max(4 * gpus, 16.0) * f, 2 * P};
  return {P * 4 * gpn * f, 2 * P + std::floor(18 * P / gpus)};
}
DsBytes ds_zero3(double P, double L, double gpn, double nodes, bool off_opt, bool off_param,
                 bool zero_init, double f) {
  const double gpus = gpn * nodes, per_node = 1 / nodes, largest = 4 * L;
  if (off_opt && off_param) {
    return {P * (zero_init ? 18 * per_node : std::max(4 * gpn, 18 * per_node)) * f, largest};
  }
  if (off_opt) {
    return {P * (zero_init ? 16 * per_node : std::max(4 * gpn, 16 * per_node)) * f,
            largest + std::floor(2 * P / gpus)};
  }
  return {zero_init ? L * 4 * gpn * f : P * 4 * gpn * f, largest + std::floor(18 * P / gpus)};
}

TEST(Offload, DeepSpeedFormulasReproduceTheirDocs) {
  // The transcription above against the numbers DeepSpeed's docs print (t5-3b, all_cold);
  // where the docs and the code disagree the code is the reference and the row says so.
  const json ref = testing::reference("deepspeed_offload_estimators.json");
  const json& d = ref["docs_all_cold"];
  const double P = d["total_params"], L = d["largest_layer_params"];
  const double gpn = d["num_gpus_per_node"], nodes = d["num_nodes"];
  const double f = d["additional_buffer_factor"];
  int disagree = 0;
  for (const json& row : d["rows"]) {
    const bool off_opt = row["offload_optimizer"] == "cpu";
    const bool off_param = row["offload_param"] == "cpu";
    const DsBytes b = row["stage"] == 2 ? ds_zero2(P, gpn, nodes, off_opt, f)
                                        : ds_zero3(P, L, gpn, nodes, off_opt, off_param,
                                                   row["zero_init"] == 1, f);
    auto gb = [](double bytes) { return fmt::format("{:.2f}", bytes / (1 << 30)); };
    EXPECT_EQ(gb(b.cpu), fmt::format("{:.2f}", row["cpu_gb"].get<double>())) << row.dump();
    if (row.contains("docs_disagree_with_code")) {
      ++disagree;
      EXPECT_NE(gb(b.gpu), fmt::format("{:.2f}", row["gpu_gb"].get<double>()));
      EXPECT_EQ(gb(b.gpu), "11.28");  // the code's 2P + 18P/8
    } else {
      EXPECT_EQ(gb(b.gpu), fmt::format("{:.2f}", row["gpu_gb"].get<double>())) << row.dump();
    }
  }
  EXPECT_EQ(disagree, 1);
}

// Llama-2-7B's ZeRO shard over S GPUs, by hand from its shapes (h 4096, FFN 11008, vocab 32000,
// 32 layers, untied): each unit (a layer, the embedding, the final norm with the LM head) is
// padded to a multiple of S and split S ways (docs/memory.md, "Units").
Count llama2_7b_shard(Count S) {
  const Count h = 4096, f = 11008, V = 32000;
  const Count layer = 4 * h * h + 3 * h * f + 2 * h;  // q, k, v, o; gate, up, down; two norms
  auto part = [S](Count u) { return (u + S - 1) / S; };
  return 32 * part(layer) + part(V * h) + part(h + V * h);
}

json offload_doc(Count gpus_per_node, Count nodes, int zero, const char* opt, const char* params) {
  // A Llama-2-7B layout with pure data parallelism: DeepSpeed's estimators assume tp = pp = 1.
  json doc = {{"model", "llama2-7b"},
              {"cluster",
               {{"gpu", "a100-80gb"},
                {"num_gpus", gpus_per_node * nodes},
                {"gpus_per_node", gpus_per_node}}},
              {"training", {{"seq_length", 512}, {"global_batch_size", 64}}},
              {"parallel",
               {{"tp", 1},
                {"pp", 1},
                {"zero_stage", zero},
                {"offload_optimizer", opt},
                {"offload_params", params}}},
              {"assumptions", {{"zero3_prefetch_layers", 0}}}};
  return doc;
}

// The largest ZeRO unit distplan gathers: a layer, the embedding or the LM head (tp = 1).
double largest_unit(const Scenario& s) {
  const Count layer = layer_parameters_per_tp_rank(build_layer_table(s.model, s.training), 1);
  const Count emb = s.model.vocab_size * s.model.hidden_size;
  return static_cast<double>(std::max(layer, emb));
}

TEST(Offload, Zero2OptimizerToCpuMatchesDeepSpeed) {
  for (Count gpn : {1, 2, 4}) {  // max(4 * gpus, 16) = 16: the steady-state term
    const Scenario s = testing::scenario(offload_doc(gpn, 1, 2, "cpu", "none"));
    const Estimate e = estimate(s);
    const double P = static_cast<double>(e.parameters);
    const DsBytes ds = ds_zero2(P, static_cast<double>(gpn), 1, true, 1.5);
    const StageMemory& m = e.memory.stages[0];
    const double states =
        static_cast<double>(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes);
    EXPECT_NEAR(states, ds.gpu, 1e-6 * ds.gpu) << gpn;
    EXPECT_NEAR(1.5 * static_cast<double>(e.memory.host_bytes_per_node), ds.cpu, 1e-6 * ds.cpu)
        << gpn;
    EXPECT_EQ(e.memory.nvme_bytes_per_node, 0);
  }
}

TEST(Offload, Zero3OffloadMatchesDeepSpeed) {
  for (Count nodes : {1, 2}) {
    for (bool params : {true, false}) {
      const Scenario s =
          testing::scenario(offload_doc(8, nodes, 3, "cpu", params ? "cpu" : "none"));
      const Estimate e = estimate(s);
      const double P = static_cast<double>(e.parameters);
      const DsBytes ds =
          ds_zero3(P, largest_unit(s), 8, static_cast<double>(nodes), true, params, true, 1.5);
      const StageMemory& m = e.memory.stages[0];
      // The gathered unit and its gradient are the buffers' peak here (short sequences: the
      // logits workspace is smaller).
      const double gpu = static_cast<double>(m.weights_bytes + m.gradients_bytes +
                                             m.optimizer_bytes + m.buffers_bytes);
      EXPECT_NEAR(gpu, ds.gpu, 1e-6 * ds.gpu) << nodes << params;
      EXPECT_NEAR(1.5 * static_cast<double>(e.memory.host_bytes_per_node), ds.cpu, 1e-6 * ds.cpu)
          << nodes << params;
    }
  }
}

TEST(Offload, NvmeHoldsTheSwappedStatesAndPinsBuffers) {
  json doc = offload_doc(8, 1, 3, "nvme", "nvme");
  doc["cluster"]["nvme_bandwidth"] = 25e9;
  const Scenario s = testing::scenario(doc);
  const Estimate e = estimate(s);
  const StageMemory& m = e.memory.stages[0];
  // By hand: the shard's parameters x (fp32 params 4 + Adam 8 + bf16 params 2) on NVMe; the fp32
  // gradients (4 per parameter), DeepSpeed's 4 optimizer buffers of min(1e9, shard) fp32 elements
  // and 5 parameter buffers of 1e8 bf16 elements pinned in host memory.
  const Count shard = llama2_7b_shard(8);
  EXPECT_EQ(shard, 842301952);
  EXPECT_EQ(m.nvme_bytes, shard * 14);
  EXPECT_EQ(m.host_bytes, shard * 4 + 4 * shard * 4 + 5 * Count{100000000} * 2);
  EXPECT_EQ(e.memory.nvme_bytes_per_node, 8 * m.nvme_bytes);
  EXPECT_EQ(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes, 0);
}

TEST(Offload, TrafficAndTimeByHand) {
  json doc = offload_doc(4, 1, 2, "cpu", "none");
  const Scenario s = testing::scenario(doc);
  const Estimate e = estimate(s);
  const Estimate base = [&] {
    json d = doc;
    d["parallel"]["offload_optimizer"] = "none";
    return estimate(testing::scenario(d));
  }();
  // The host holds the fp32 gradients, master weights and Adam moments of the shard: 16 bytes.
  const double shard = static_cast<double>(llama2_7b_shard(4));
  EXPECT_EQ(static_cast<double>(e.memory.stages[0].host_bytes), 16 * shard);
  const double m = static_cast<double>(e.num_microbatches);
  // ZeRO-2: the bf16 gradient partition goes down once per micro-batch, the bf16 parameters come
  // back once per step.
  const double pcie_bytes = shard * 2 * m + shard * 2;
  EXPECT_NEAR(static_cast<double>(e.offload.pcie_bytes_per_gpu_per_step), pcie_bytes,
              1.0 + 1e-9 * pcie_bytes);
  const double pcie = 32e9 * 0.8;  // A100: PCIe Gen4 x16, pcie_efficiency
  EXPECT_NEAR(e.offload.pcie_seconds, pcie_bytes / pcie, 1e-9);
  // CPU Adam: 4 + 8 + 16 + 2 bytes per parameter at 200 GB/s shared by the node's 4 processes.
  const double cpu = shard * 30 / (200e9 / 4);
  EXPECT_NEAR(e.offload.cpu_optimizer_seconds, cpu, 1e-9);
  EXPECT_NEAR(e.stage_costs[0].optimizer, cpu + shard * 2 / pcie, 1e-9);
  // The gradient copies ride on the DP stream next to the reduce-scatters.
  EXPECT_NEAR(e.stage_costs[0].grad_reduce - base.stage_costs[0].grad_reduce, shard * 2 * m / pcie,
              1e-9);
  // Offload frees exactly the gradient and optimizer partitions on the GPU.
  const StageMemory& a = e.memory.stages[0];
  const StageMemory& b = base.memory.stages[0];
  EXPECT_EQ(b.total_bytes - a.total_bytes, b.gradients_bytes + b.optimizer_bytes);
}

TEST(Offload, HostCapacityIsChecked) {
  json doc = offload_doc(8, 1, 3, "cpu", "cpu");
  doc["cluster"]["host_memory_bytes"] = Count{64} << 30;  // 18 x 6.7e9 bytes do not fit
  const Estimate e = estimate(testing::scenario(doc));
  EXPECT_FALSE(e.memory.host_fits);
  EXPECT_EQ(e.memory.host_capacity_bytes, Count{64} << 30);
}

TEST(Offload, RefusesWhatIsNotModelled) {
  auto refused = [](json doc, const std::string& path) {
    try {
      (void)testing::scenario(doc);
    } catch (const InputError& err) {
      EXPECT_EQ(err.path(), path) << err.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << doc["parallel"].dump();
  };
  refused(offload_doc(8, 1, 2, "cpu", "cpu"), "/parallel/offload_params");       // needs ZeRO-3
  refused(offload_doc(8, 1, 0, "cpu", "none"), "/parallel/offload_optimizer");   // needs ZeRO
  refused(offload_doc(8, 1, 2, "nvme", "none"), "/parallel/offload_optimizer");  // Infinity: ZeRO-3
  refused(offload_doc(8, 1, 3, "none", "cpu"), "/parallel/offload_params");      // optimizer too
  refused(offload_doc(8, 1, 3, "nvme", "none"), "/cluster/nvme_bandwidth");
  json bad = offload_doc(8, 1, 3, "disk", "none");
  refused(bad, "/parallel/offload_optimizer");
  json no_pcie = offload_doc(8, 1, 3, "cpu", "none");
  no_pcie["cluster"]["gpu"] = {{"preset", "a100-80gb"}, {"pcie_bandwidth", 0}};
  refused(no_pcie, "/cluster/gpu/pcie_bandwidth");
}

// README's offload example: its scenario block, planned, prints its table block (the lines up to
// the communication table). DISTPLAN_WRITE_DOCS=1 rewrites the table.
TEST(Offload, ReadmeExampleIsWhatThePlannerPrints) {
  const Scenario s = scenario_from_text(testing::readme_scenario("offload"));
  const std::string table = testing::plan_table(s);
  const std::string want = table.substr(0, table.find("\nCommunication per GPU"));
  testing::check_readme_table("offload", want, "Offload.ReadmeExample*");
  const Estimate e = estimate(s);
  EXPECT_TRUE(e.memory.fits);
  EXPECT_TRUE(e.memory.host_fits);
}

}  // namespace
}  // namespace distplan
