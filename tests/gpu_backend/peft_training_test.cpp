// Fine-tuning on the CPU backend (training.peft; docs/peft.md, docs/gpu_backend.md): LoRA adapters
// on a frozen base, in a float dtype or quantized as bitsandbytes stores it (QLoRA). The base stays
// bit for bit what it was and has no gradient; the adapters' gradient is the slope of the loss (a
// float64 directional finite difference along the step the optimizer takes, for SGD and AdamW);
// every layout's adapter gradients equal one rank's; the measured memory and collectives equal the
// planner's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/gradient_dump.h"
#include "distplan/gpu_backend/measurement_json.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/scenario_json.h"
#include "worker_launch.h"

namespace distplan::backend {
namespace {

using J = nlohmann::json;

// The tiny Llama-style model (4 layers, GQA, SwiGLU, RMSNorm, RoPE), fp32, LoRA r 4.
J lora_doc(J parallel, J peft, const char* optimizer = "adamw") {
  const Count ranks = parallel.value("tp", 1) * parallel.value("pp", 1) * parallel.value("dp", 1);
  return {{"model",
           {{"num_layers", 4},
            {"hidden_size", 64},
            {"num_attention_heads", 4},
            {"num_kv_heads", 2},
            {"ffn_hidden_size", 128},
            {"vocab_size", 512},
            {"mlp", "swiglu"},
            {"norm", "rmsnorm"},
            {"position_embedding", "rotary"},
            {"tied_embeddings", false},
            {"bias", false}}},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", ranks}, {"gpus_per_node", 8}}},
          {"training",
           {{"seq_length", 32},
            {"global_batch_size", 4},
            {"micro_batch_size", 1},
            {"precision", "fp32"},
            {"grad_accumulation_dtype", "fp32"},
            {"optimizer", optimizer},
            {"attention", "flash"},
            {"framework", "generic"},
            {"peft", std::move(peft)}}},
          {"parallel", std::move(parallel)}};
}

const J kOneRank = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
const J kAllLinear = {
    {"method", "lora"}, {"rank", 4}, {"alpha", 8}, {"target_modules", "all-linear"}};

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/peft_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs a layout: in process for one rank, else under mpirun with the worker.
Measurement run_layout(const J& doc, const std::string& name, Count steps, float lr,
                       const std::string& grad_dir = "", const std::string& weight_dir = "",
                       bool repeat_batch = false) {
  const Scenario s = scenario_for_training(doc);
  const Count ranks = s.parallel.tp * s.parallel.pp * s.parallel.dp;
  if (ranks == 1) {
    RunOptions o;
    o.steps = steps;
    o.comm = CommBackend::emulated;
    o.learning_rate = lr;
    o.dump_gradients = grad_dir;
    o.dump_weights = weight_dir;
    o.repeat_batch = repeat_batch;
    return run(s, o);
  }
  std::ostringstream args;
  args << "--steps " << steps << " --lr " << lr << (repeat_batch ? " --repeat-batch" : "")
       << (grad_dir.empty() ? "" : " --dump-gradients " + grad_dir)
       << (weight_dir.empty() ? "" : " --dump-weights " + weight_dir);
  return testing_support::run_worker(doc, "peft_" + name, static_cast<int>(ranks), args.str(), 120);
}

// parameter id -> index -> value, over every dump in `dir` (replicas agree; the last wins).
std::map<std::uint64_t, std::map<Count, float>> read_all(const std::string& dir) {
  std::map<std::uint64_t, std::map<Count, float>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    for (const GradientRecord& r : read_gradient_dump(e.path().string()))
      for (std::size_t i = 0; i < r.index.size(); ++i) out[r.param][r.index[i]] = r.value[i];
  return out;
}

bool is_adapter(std::uint64_t param) {
  return param / 64 < 100000 && param % 64 >= 20 && param % 64 < 36;
}

// Memory by category, and each stage's collectives per (group, op, what), equal the planner's.
void expect_memory_is_planned(const Scenario& s, const Measurement& m) {
  const Estimate e = estimate(s);
  for (const RankMeasurement& r : m.ranks) {
    if (r.coords.dp == 0 && r.coords.tp == 0) {
      std::map<std::string, std::pair<Bytes, Count>> want, got;
      for (const Collective& c : stage_communication(s, static_cast<int>(r.coords.pp))) {
        auto& w = want[std::string(to_string(c.group)) + " " + std::string(to_string(c.op)) + " " +
                       std::string(c.what())];
        w.first += c.bytes_per_call * c.calls_per_step;
        w.second += c.calls_per_step;
      }
      for (const auto& [k, v] : r.communication) {
        auto& g = got[std::string(to_string(std::get<0>(k))) + " " +
                      std::string(to_string(std::get<1>(k))) + " " +
                      std::string(to_string(std::get<2>(k)))];
        g.first += v.bytes;
        g.second += v.calls;
      }
      EXPECT_EQ(got, want) << "stage " << r.coords.pp;
    }
    const StageMemory& sm = e.memory.stages[static_cast<std::size_t>(r.coords.pp)];
    SCOPED_TRACE("rank " + std::to_string(r.rank));
    EXPECT_EQ(r.memory.peak_of(MemoryTag::weights), sm.weights_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::gradients), sm.gradients_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::optimizer), sm.optimizer_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::activations), sm.activations_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::buffers), sm.buffers_bytes);
  }
}

TEST(LoraTraining, FrozenBaseStaysBitForBitAndOnlyAdaptersHaveGradients) {
  for (const J& peft : {kAllLinear,
                        J{{"method", "lora"},
                          {"rank", 4},
                          {"target_modules", {"q_proj", "v_proj"}},
                          {"frozen_layers", 2}},
                        J{{"method", "qlora"}, {"rank", 4}, {"target_modules", "all-linear"}},
                        J{{"method", "qlora"},
                          {"rank", 4},
                          {"base_storage", "int8"},
                          {"target_modules", {"o_proj", "down_proj"}}}}) {
    SCOPED_TRACE(peft.dump());
    const J doc = lora_doc(kOneRank, peft);
    const std::string w0 = fresh_dir("w0"), w3 = fresh_dir("w3"), g = fresh_dir("g");
    (void)run_layout(doc, "w0", 0, 1e-2f, "", w0);
    const Measurement m = run_layout(doc, "w3", 3, 1e-2f, g, w3);
    const auto before = read_all(w0), after = read_all(w3), grads = read_all(g);
    ASSERT_EQ(before.size(), after.size());
    Count adapters = 0, moved = 0;
    for (const auto& [param, values] : before) {
      SCOPED_TRACE(parameter_name(param));
      const auto& now = after.at(param);
      if (!is_adapter(param)) {
        for (const auto& [i, v] : values) ASSERT_EQ(now.at(i), v) << "a frozen weight moved";
        EXPECT_EQ(grads.count(param), 0u) << "a frozen parameter has a gradient";
        continue;
      }
      ++adapters;
      for (const auto& [i, v] : values) moved += now.at(i) != v ? 1 : 0;
      ASSERT_EQ(grads.count(param), 1u);
    }
    EXPECT_GT(adapters, 0);
    EXPECT_GT(moved, 0);
    EXPECT_EQ(grads.size(), static_cast<std::size_t>(adapters));
    expect_memory_is_planned(scenario_for_training(doc), m);
  }
}

// The loss's change over one optimizer step from the dumped gradient g and the step the
// optimizer takes (SGD: -lr g; AdamW's first step: -lr (g / (|g| + eps) + wd w)): the
// first-order term of the float64 loss difference, the second order cancelled by two step sizes
// (Richardson: with d(lr) = -a lr + c lr^2, a lr = -(2 d(lr) - d(2 lr) / 2)). A wrong adapter
// gradient (a missing scale, a wrong column, a dropped term) or a wrong optimizer breaks it.
void expect_gradient_is_the_slope(const char* optimizer, const J& peft = kAllLinear) {
  SCOPED_TRACE(optimizer + peft.dump());
  const J doc = lora_doc(kOneRank, peft, optimizer);
  const std::string g = fresh_dir(std::string("slope_g_") + optimizer);
  (void)run_layout(doc, "slope", 1, 1e-3f, g, "", true);
  const auto grads = read_all(g);
  const bool sgd = std::string(optimizer) == "sgd";
  const RunOptions defaults;
  double per_lr = 0;  // the predicted loss decrease per unit of learning rate
  for (const auto& [param, values] : grads) {
    ASSERT_TRUE(is_adapter(param)) << parameter_name(param);
    for (const auto& [i, gi] : values) {
      const double gd = gi;
      if (sgd) {
        per_lr += gd * gd;
      } else {
        per_lr += gd * gd / (std::abs(gd) + 1e-8);  // Adam's first step: m / sqrt(v) = g / |g|
      }
    }
  }
  ASSERT_GT(per_lr, 0);
  // A step that moves the loss by about 1e-3 (of ln 512 = 6.2).
  const double lr = 1e-3 / per_lr;
  auto change = [&](double step_lr) {
    const Measurement m =
        run_layout(doc, "slope_run", 2, static_cast<float>(step_lr), "", "", true);
    return m.losses.at(1) - m.losses.at(0);
  };
  double a = -(2 * change(lr) - change(2 * lr) / 2);
  if (!sgd) {
    // AdamW's decoupled decay also moves the weights, by -lr wd w (w the adapters at the start,
    // a zero-step run's): its first-order effect on the loss is -lr wd sum(g w).
    const std::string w0 = fresh_dir("slope_w0");
    (void)run_layout(doc, "slope_w0", 0, 1e-3f, "", w0, true);
    const auto start = read_all(w0);
    double gw = 0;
    for (const auto& [param, values] : grads)
      for (const auto& [i, gi] : values) gw += static_cast<double>(gi) * start.at(param).at(i);
    a -= lr * defaults.weight_decay * gw;
  }
  // Measured: 1 + 7.5e-5 (SGD), 1 + 5.0e-5 (AdamW), the fp32 losses' rounding on a 1e-3 change;
  // a gradient 5% off reads 0.952.
  EXPECT_NEAR(a / (lr * per_lr), 1.0, 1e-3);
}

TEST(LoraTraining, AdapterGradientIsTheSlopeOfTheLossUnderSgd) {
  expect_gradient_is_the_slope("sgd");
}

TEST(LoraTraining, AdapterGradientIsTheSlopeOfTheLossUnderAdamW) {
  expect_gradient_is_the_slope("adamw");
}

// QLoRA: the gradient reaches the lower layers' adapters through the dequantized NF4 weights.
TEST(LoraTraining, QloraAdapterGradientIsTheSlopeOfTheLoss) {
  expect_gradient_is_the_slope(
      "sgd", {{"method", "qlora"}, {"rank", 4}, {"alpha", 8}, {"target_modules", "all-linear"}});
}

struct LoraLayout {
  const char* name;
  J parallel;
  J peft;
};
void PrintTo(const LoraLayout& l, std::ostream* os) {
  *os << l.name;
}
class LoraLayouts : public ::testing::TestWithParam<LoraLayout> {};

// fp32: the layouts sum the same products in other orders; within 1e-5 of a parameter's largest
// gradient (the bound of training_test.cpp's layouts, about 170 ulp).
TEST_P(LoraLayouts, AdapterGradientsAndLossesEqualOneRanksAndMemoryIsPlanned) {
  const LoraLayout& l = GetParam();
  const J doc = lora_doc(l.parallel, l.peft);
  const std::string dir = fresh_dir(l.name), ref = fresh_dir(std::string(l.name) + "_ref");
  const Measurement m = run_layout(doc, l.name, 3, 1e-2f, dir);
  const Measurement one = run_layout(lora_doc(kOneRank, l.peft), "ref", 3, 1e-2f, ref);
  ASSERT_EQ(m.losses.size(), one.losses.size());
  for (std::size_t i = 0; i < m.losses.size(); ++i)
    EXPECT_NEAR(m.losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i + 1;
  const auto got = read_all(dir), want = read_all(ref);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [param, values] : want) {
    SCOPED_TRACE(parameter_name(param));
    ASSERT_TRUE(is_adapter(param));
    double largest = 0;
    for (const auto& [i, v] : values) largest = std::max(largest, std::abs(static_cast<double>(v)));
    ASSERT_GT(largest, 0);
    const auto& mine = got.at(param);
    ASSERT_EQ(mine.size(), values.size());
    for (const auto& [i, v] : values)
      EXPECT_NEAR(mine.at(i), v, 1e-5 * largest + 1e-7) << "element " << i;
  }
  expect_memory_is_planned(scenario_for_training(doc), m);
}

const J kQv = {{"method", "lora"}, {"rank", 4}, {"target_modules", {"q_proj", "v_proj"}}};
const J kQlora = {{"method", "qlora"}, {"rank", 4}, {"target_modules", "all-linear"}};
const J kQloraFp4 = {{"method", "qlora"},     {"rank", 4},
                     {"base_storage", "fp4"}, {"double_quant", false},
                     {"base_dtype", "bf16"},  {"target_modules", {"q_proj", "k_proj", "up_proj"}}};
const J kFrozen2 = {
    {"method", "lora"}, {"rank", 4}, {"target_modules", "all-linear"}, {"frozen_layers", 2}};

INSTANTIATE_TEST_SUITE_P(
    Cpu, LoraLayouts,
    ::testing::Values(
        LoraLayout{"dp2", {{"tp", 1}, {"pp", 1}, {"dp", 2}}, kAllLinear},
        LoraLayout{"dp2_zero1", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"zero_stage", 1}}, kAllLinear},
        LoraLayout{"dp2_zero2", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"zero_stage", 2}}, kQv},
        LoraLayout{"dp2_zero3", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"zero_stage", 3}}, kAllLinear},
        LoraLayout{"pp2_frozen2", {{"tp", 1}, {"pp", 2}, {"dp", 1}}, kFrozen2},
        LoraLayout{"pp2_dp2_zero1_recompute",
                   {{"tp", 1}, {"pp", 2}, {"dp", 2}, {"zero_stage", 1}, {"recompute", "full"}},
                   kQv},
        LoraLayout{"qlora_dp2_zero2", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"zero_stage", 2}}, kQlora},
        LoraLayout{"qlora_fp4_pp2_dp2_zero1",
                   {{"tp", 1}, {"pp", 2}, {"dp", 2}, {"zero_stage", 1}},
                   kQloraFp4}),
    [](const ::testing::TestParamInfo<LoraLayout>& i) { return std::string(i.param.name); });

TEST(LoraTraining, RefusesWhatItDoesNotRun) {
  J nf4 = lora_doc({{"tp", 1}, {"pp", 1}, {"dp", 1}, {"zero_stage", 3}}, {{"method", "qlora"}});
  try {
    (void)run(scenario_for_training(nf4), RunOptions{});
    FAIL() << "ran a 4-bit base under ZeRO-3";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/zero_stage");
  }
  J dropout = lora_doc(kOneRank, {{"method", "lora"}, {"dropout", 0.1}});
  EXPECT_THROW((void)run(scenario_for_training(dropout), RunOptions{}), InputError);
}

}  // namespace
}  // namespace distplan::backend
