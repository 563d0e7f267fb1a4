// Sharded training on the CPU: every layout of the matrix trains the tiny model to the same losses
// as one rank, its measured memory and collective bytes equal the planner's prediction, and each
// stage executes exactly its schedule program; after the first backward every parameter's
// gradient, reassembled from the shards, equals one rank's. Multi-rank layouts run under mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "distplan/gpu_backend/gradient_dump.h"
#include "distplan/gpu_backend/measurement_json.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "distplan/simulator/schedule.h"
#include "distplan/simulator/simulate.h"
#include "worker_launch.h"

namespace distplan::backend {
namespace {

using J = nlohmann::json;

struct Layout {
  const char* name;
  nlohmann::json parallel;
  const char* precision = "fp32";
  const char* attention = "flash";
  bool llama = false;
  bool tied = false;  // model.tied_embeddings
  const char* optimizer = "adamw";
  // training.global_batch_size: DualPipe needs at least 2 pp micro-batches per data-parallel rank.
  int global_batch = 4;
  int layers = 4;    // model.num_layers: 5 splits unevenly over every pipeline of the matrix
  int head_dim = 0;  // model.head_dim when > 0 (heads × head_dim ≠ hidden_size)
};

// Test names and failure messages show the layout's name.
void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.name;
}

nlohmann::json tiny_scenario(const Layout& l) {
  const Count ranks = l.parallel.value("tp", 1) * l.parallel.value("cp", 1) *
                      l.parallel.value("pp", 1) * l.parallel.value("dp", 1);
  nlohmann::json model = {{"num_layers", l.layers},
                          {"hidden_size", 64},
                          {"num_attention_heads", 4},
                          {"num_kv_heads", 4},
                          {"ffn_hidden_size", 256},
                          {"vocab_size", 512},
                          {"mlp", "gelu"},
                          {"norm", "layernorm"},
                          {"position_embedding", "learned"},
                          {"max_position_embeddings", 32},
                          {"tied_embeddings", l.tied},
                          {"bias", true}};
  if (l.llama) {
    model["mlp"] = "swiglu";
    model["norm"] = "rmsnorm";
    model["position_embedding"] = "rotary";
    model["num_kv_heads"] = 2;
    model["ffn_hidden_size"] = 128;
    model["bias"] = false;
  }
  if (l.head_dim > 0) model["head_dim"] = l.head_dim;
  return {{"model", model},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", ranks}, {"gpus_per_node", 8}}},
          {"training",
           {{"framework", "generic"},
            {"seq_length", 32},
            {"global_batch_size", l.global_batch},
            {"micro_batch_size", 1},
            {"precision", l.precision},
            {"grad_accumulation_dtype", l.precision},
            {"optimizer", l.optimizer},
            {"attention", l.attention}}},
          {"parallel", l.parallel}};
}

// SGD's learning rate in these tests. Adam normalises the gradient away (a gradient scaled by 2
// takes the same steps), SGD does not: with this rate 5 SGD steps move the tiny model's loss by far
// more than the fp32 tolerance, so a wrongly scaled gradient shows in the losses.
constexpr float kSgdLearningRate = 0.5f;

float learning_rate_of(const nlohmann::json& doc) {
  return doc.at("training").at("optimizer") == "sgd" ? kSgdLearningRate
                                                     : RunOptions{}.learning_rate;
}

// Runs the layout: in process when it has one rank, else under mpirun with the worker.
// `dump_dir` non-empty: every rank writes its gradients after the first step's reduction there.
Measurement run_layout(const nlohmann::json& doc, const std::string& name, Count ranks,
                       bool repeat_batch = false, Count steps = 5,
                       const std::string& dump_dir = "") {
  if (ranks == 1) {
    RunOptions o;
    o.steps = steps;
    o.comm = CommBackend::emulated;
    o.learning_rate = learning_rate_of(doc);
    o.repeat_batch = repeat_batch;
    o.dump_gradients = dump_dir;
    return run(scenario_from_json(doc), o);
  }
  std::ostringstream args;
  args << "--steps " << steps << " --lr " << learning_rate_of(doc)
       << (repeat_batch ? " --repeat-batch" : "")
       << (dump_dir.empty() ? "" : " --dump-gradients " + dump_dir);
  return testing_support::run_worker(doc, name, static_cast<int>(ranks), args.str(), 120);
}

void expect_matches_planner(const Scenario& s, const Measurement& m) {
  const Estimate e = estimate(s);
  // zb_auto's program is the heuristic's order for the planner's stage times.
  const sim::SchedulePrograms prog = sim::scenario_program(s, e);
  std::map<int, std::map<CommLog::Key, CommTotals>> stage_comm;
  for (const RankMeasurement& r : m.ranks) {
    const StageMemory& sm = e.memory.stages[static_cast<std::size_t>(r.coords.pp)];
    SCOPED_TRACE("rank " + std::to_string(r.rank));
    EXPECT_EQ(r.memory.peak_of(MemoryTag::weights), sm.weights_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::gradients), sm.gradients_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::optimizer), sm.optimizer_bytes);
    EXPECT_NEAR(static_cast<double>(r.memory.peak_of(MemoryTag::activations)),
                static_cast<double>(sm.activations_bytes),
                0.02 * static_cast<double>(sm.activations_bytes));
    EXPECT_NEAR(static_cast<double>(r.memory.peak_of(MemoryTag::buffers)),
                static_cast<double>(sm.buffers_bytes),
                0.10 * static_cast<double>(sm.buffers_bytes));
    if (s.parallel.cp > 1) {
      // Context parallelism (flash attention, every layer's tensors at s/cp tokens): the saved
      // activations are the planner's cp-divided figure exactly, and the ring's KV and output
      // buffers (never alive with the logits workspace, nor, under ZeRO 0 and 1, with a unit
      // gradient buffer) its cp_attention_buffer_bytes, unless the logits are larger.
      EXPECT_EQ(r.memory.peak_of(MemoryTag::activations), sm.activations_bytes);
      if (s.parallel.zero_stage <= 1) {
        EXPECT_EQ(r.memory.peak_of(MemoryTag::buffers), sm.buffers_bytes);
      }
    }
    if (two_chunks(s.parallel.schedule)) {
      // The V and DualPipe layouts (flash attention, no recomputation) hold exactly the planned
      // activation sets: the program's peak of (micro-batch, chunk) pairs, the embedding's and
      // the head's where they sit (stage 0 under a V, both end stages under DualPipe), and the
      // LM head's logits buffers there.
      EXPECT_EQ(r.memory.peak_of(MemoryTag::activations), sm.activations_bytes);
      EXPECT_EQ(r.memory.peak_of(MemoryTag::buffers), sm.buffers_bytes);
    }
    // The executed actions are the stage's program.
    const auto& want = prog.programs[static_cast<std::size_t>(r.coords.pp)];
    ASSERT_EQ(r.actions.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r.actions[i].action, want[i]) << i;
    if (r.coords.tp == 0 && r.coords.cp == 0 && r.coords.dp == 0) {
      auto& c = stage_comm[r.coords.pp];
      for (const auto& [k, v] : r.communication) {
        CommTotals& t = c[k];
        t.bytes += v.bytes;
        t.calls += v.calls;
      }
    }
  }
  // Every stage's collectives equal the planner's list for that stage, per (group, op, traffic):
  // the backend records each call under the id the planner plans it by.
  std::vector<int> stages;
  for (int st = 0; st < s.parallel.pp; ++st) stages.push_back(st);
  for (const int st : stages) {
    SCOPED_TRACE("stage " + std::to_string(st));
    std::map<CommLog::Key, CommTotals> predicted;
    for (const Collective& c : stage_communication(s, st)) {
      CommTotals& t = predicted[{c.group, c.op, c.purpose}];
      t.bytes += c.bytes_per_call * c.calls_per_step;
      t.calls += c.calls_per_step;
    }
    ASSERT_TRUE(stage_comm.count(st));
    for (const auto& [k, v] : predicted) {
      SCOPED_TRACE(std::string(to_string(std::get<0>(k))) + " " +
                   std::string(to_string(std::get<1>(k))) + " " +
                   std::string(to_string(std::get<2>(k))));
      EXPECT_EQ(stage_comm[st][k].bytes, v.bytes);
      EXPECT_EQ(stage_comm[st][k].calls, v.calls);
    }
    for (const auto& [k, v] : stage_comm[st]) {
      EXPECT_TRUE(predicted.count(k))
          << "unpredicted " << to_string(std::get<0>(k)) << " " << to_string(std::get<1>(k)) << " "
          << to_string(std::get<2>(k));
    }
  }
}

// The executed timeline as a trace (timeline_trace_json): it parses, has one process per stage,
// and on each stage's compute thread one slice per executed action, in program order and without
// overlap, then the optimizer; every slice carries the action's micro-batch and chunk.
void expect_trace_is_the_program(const Scenario& s, const Measurement& m) {
  const nlohmann::json doc = nlohmann::json::parse(timeline_trace_json(m));
  const sim::SchedulePrograms prog = sim::scenario_program(s, estimate(s));
  std::map<int, std::vector<sim::Action>> actions;
  std::map<int, int> optimizer, processes;
  std::map<int, double> end;
  for (const nlohmann::json& e : doc.at("traceEvents")) {
    const int pid = e.at("pid").get<int>();
    if (e.at("ph") == "M" && e.at("name") == "process_name") ++processes[pid];
    if (e.at("ph") != "X" || e.at("tid").get<int>() != 0) continue;
    const std::string kind = e.at("args").at("kind").get<std::string>();
    const double ts = e.at("ts").get<double>();
    EXPECT_GE(ts + 1e-3, end[pid]) << e.dump();
    end[pid] = ts + e.at("dur").get<double>();
    if (kind == "optimizer") {
      ++optimizer[pid];
      continue;
    }
    EXPECT_EQ(optimizer[pid], 0) << "an action after the optimizer: " << e.dump();
    sim::Action a;
    for (sim::Op op :
         {sim::Op::forward, sim::Op::backward, sim::Op::backward_input, sim::Op::backward_weight})
      if (sim::to_string(op) == kind) a.op = op;
    a.microbatch = e.at("args").at("microbatch").get<std::int32_t>();
    a.chunk = e.at("args").at("chunk").get<std::int32_t>();
    actions[pid].push_back(a);
  }
  for (int st = 0; st < s.parallel.pp; ++st) {
    SCOPED_TRACE("trace of stage " + std::to_string(st));
    EXPECT_EQ(processes[st], 1);
    EXPECT_EQ(optimizer[st], 1);
    // The trace draws an F&B pair's two passes as two slices (the actions above hold the flag).
    std::vector<sim::Action> want = prog.programs[static_cast<std::size_t>(st)];
    for (sim::Action& a : want) a.overlap_next = false;
    EXPECT_EQ(actions[st], want);
  }
}

// 16-bit layouts agree with one rank to within this share of the reference's 5-step loss change
// on the repeated batch (bf16 dp2 x tp2: the loss falls 0.74 in 5 steps, the layouts differ by at
// most 3.2e-4, a 23rd of the 2 % bound).
constexpr double kSixteenBitShareOfChange = 0.02;

class LayoutTest : public ::testing::TestWithParam<Layout> {};

// A working optimizer overfits one repeated batch: AdamW at the default rate and SGD at
// kSgdLearningRate must take the tiny model's loss on it from about ln(512) = 6.24 (uniform over
// the vocabulary) down by at least kOverfitFall within kOverfitSteps steps (both reach about 3.6,
// a 43 % fall). A dead optimizer (learning rate 0) leaves it unchanged.
constexpr int kOverfitSteps = 30;
constexpr double kOverfitFall = 0.2;  // relative

TEST(Training, OverfitsOneRepeatedBatch) {
  for (const char* optimizer : {"adamw", "sgd"}) {
    SCOPED_TRACE(optimizer);
    Layout l{"overfit", J{{"tp", 1}, {"pp", 1}, {"dp", 1}}};
    l.optimizer = optimizer;
    const nlohmann::json doc = tiny_scenario(l);
    RunOptions o;
    o.steps = kOverfitSteps;
    o.repeat_batch = true;
    o.learning_rate = learning_rate_of(doc);
    const Measurement m = run(scenario_from_json(doc), o);
    ASSERT_EQ(m.losses.size(), static_cast<std::size_t>(kOverfitSteps));
    EXPECT_NEAR(m.losses.front(), std::log(512.0), 0.1);
    EXPECT_LT(m.losses.back(), (1 - kOverfitFall) * m.losses.front());
    o.learning_rate = 0;
    const Measurement dead = run(scenario_from_json(doc), o);
    EXPECT_DOUBLE_EQ(dead.losses.back(), dead.losses.front());
  }
}

TEST_P(LayoutTest, TrainsLikeOneRankAndMatchesThePlanner) {
  const Layout& l = GetParam();
  const nlohmann::json doc = tiny_scenario(l);
  const Scenario s = scenario_from_json(doc);
  const Count ranks = s.parallel.tp * s.parallel.cp * s.parallel.dp * s.parallel.pp;
  // 16-bit layouts train on one repeated batch: the loss then falls steadily, and the
  // tolerance below can be tied to that fall.
  const bool fp32 = std::string(l.precision) == "fp32";
  const Measurement m = run_layout(doc, l.name, ranks, !fp32);
  Layout one = l;
  one.parallel = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
  const Measurement ref = run_layout(tiny_scenario(one), std::string(l.name) + "_ref", 1, !fp32);
  ASSERT_EQ(m.losses.size(), 5u);
  ASSERT_EQ(ref.losses.size(), 5u);
  // What 5 steps change: the reference's fall from step 1 to step 5.
  const double moved = std::abs(ref.losses.front() - ref.losses.back());
  // fp32: sums in another order differ by rounding only (1e-5 relative). 16-bit storage rounds
  // every weight and activation, and different layouts round at different places; the bound is a
  // small share of what 5 steps of training change, so a layout that did not train (or trained
  // on other data, or with a wrongly scaled update) breaks it.
  const double tol = fp32 ? 1e-5 * std::abs(ref.losses.front()) : kSixteenBitShareOfChange * moved;
  for (std::size_t i = 0; i < 5; ++i) EXPECT_NEAR(m.losses[i], ref.losses[i], tol) << "step " << i;
  // The comparison can see training: 5 steps move the loss by far more than the tolerance (for
  // 16-bit layouts that holds by construction).
  if (fp32) {
    EXPECT_GT(moved, 20 * tol) << "the tolerance is too loose to tell training from none";
  }
  ASSERT_EQ(static_cast<Count>(m.ranks.size()), ranks);
  expect_matches_planner(s, m);
  expect_trace_is_the_program(s, m);
}

// The JSON path check_supported refuses `s` at, or "accepted".
std::string refused_field(const Scenario& s) {
  try {
    check_supported(s);
  } catch (const InputError& e) {
    return e.path();
  }
  return "accepted";
}

// DualPipe runs as the planner plans it (untied embeddings, ZeRO 0 or 1); a Scenario built in
// code with tied embeddings or ZeRO-2 is refused at the field, and multi-GPU NCCL runs refuse the
// schedule (pipeline_rendezvous_test.cpp: it deadlocks under NCCL's matching).
TEST(Training, DualPipeRefusesWhatItIsNotPlannedFor) {
  const Layout l{"dualpipe", J{{"pp", 2}, {"schedule", "dualpipe"}}};
  const Scenario ok = scenario_from_json(tiny_scenario(l));
  EXPECT_NO_THROW(check_supported(ok));
  EXPECT_THROW(check_nccl_pipeline(ok.parallel), InputError);
  Scenario tied = ok;
  tied.model.tied_embeddings = true;
  EXPECT_EQ(refused_field(tied), "/model/tied_embeddings");
  Scenario zero2 = ok;
  zero2.parallel.zero_stage = 2;
  EXPECT_EQ(refused_field(zero2), "/parallel/zero_stage");
}

// BLOOM's ALiBi and embedding norm are planned but not trained: the backend refuses each at its
// field rather than train a model without them.
TEST(Training, RefusesTheBloomFeaturesItDoesNotTrain) {
  const Scenario ok = scenario_from_json(tiny_scenario(Layout{"single", J{{"tp", 1}}}));
  EXPECT_NO_THROW(check_supported(ok));
  Scenario alibi = ok;
  alibi.model.position_embedding = PositionEmbedding::alibi;
  EXPECT_EQ(refused_field(alibi), "/model/position_embedding");
  Scenario norm = ok;
  norm.model.embedding_norm = true;
  EXPECT_EQ(refused_field(norm), "/model/embedding_norm");
}

// Issue 29, item 7: ZeRO-3 at dp·cp = 1 still gathers every unit into a buffer of its own and
// fills a unit gradient (the plan had none: up to 4.3x fewer buffer bytes than measured); GPipe's
// last stage keeps the other micro-batches' logits while its first backward gathers; DualPipeV's
// F&B pairs hold both chunks' gathered units. Each rank of pp = 2, dp = 1 runs in process (an
// emulated rank) and its measured buffers are the plan's (the walk's, as validate compares):
// exactly, but for DualPipeV's stage 0 whose plan counts the final norm's weights with its
// gathered LM head (512 bytes, 0.08 %, above the measured peak).
TEST(Training, ZeroThreeBuffersAtDataParallelOne) {
  for (const char* schedule : {"1f1b", "gpipe", "zb_h1", "zb_v", "dualpipe_v"}) {
    J parallel = {{"pp", 2}, {"zero_stage", 3}, {"schedule", schedule}};
    if (std::string(schedule) == "zb_v" || std::string(schedule) == "dualpipe_v")
      parallel["virtual_stages"] = 2;
    J doc = tiny_scenario(Layout{"z3", parallel});
    doc["training"]["framework"] = "generic";
    const Scenario s = scenario_from_json(doc);
    const Estimate e = sim::plan(s);
    for (int rank = 0; rank < 2; ++rank) {
      RunOptions o;
      o.steps = 1;
      o.comm = CommBackend::emulated;
      o.emulate_rank = rank;
      const Measurement m = run(s, o);
      ASSERT_EQ(m.ranks.size(), 1u);
      const double measured = static_cast<double>(m.ranks[0].memory.peak_of(MemoryTag::buffers));
      const double planned =
          static_cast<double>(e.memory.stages[static_cast<std::size_t>(rank)].buffers_bytes);
      const double tol = std::string(schedule) == "dualpipe_v" ? 1e-3 * planned : 0.0;
      EXPECT_NEAR(measured, planned, tol) << schedule << " stage " << rank;
    }
  }
}

// Issue 29, item 8: what the backend does not train is refused by run() itself, for every caller
// (not only `distplan validate`): frameworks whose conventions it does not emulate, offload, fp8
// and per-head q/k norms, each at its field. run() is called directly here, as a library user
// would.
TEST(Training, RunRefusesWhatItDoesNotTrainAtTheField) {
  const Scenario ok = scenario_from_json(tiny_scenario(Layout{"single", J{{"tp", 1}}}));
  auto run_field = [](const Scenario& s) {
    RunOptions o;
    o.steps = 1;
    o.comm = CommBackend::emulated;
    try {
      (void)run(s, o);
    } catch (const InputError& e) {
      return e.path();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(run_field(ok), "accepted");
  EXPECT_TRUE(emulates(Framework::generic));
  EXPECT_TRUE(emulates(Framework::megatron));
  for (Framework f : {Framework::deepspeed, Framework::torchtitan}) {
    Scenario x = ok;
    x.training.framework = f;
    EXPECT_FALSE(emulates(f));
    EXPECT_EQ(run_field(x), "/training/framework") << to_string(f);
  }
  Scenario offload = ok;
  offload.parallel.zero_stage = 1;
  offload.parallel.offload_optimizer = Offload::cpu;
  EXPECT_EQ(run_field(offload), "/parallel/offload_optimizer");
  Scenario fp8 = ok;
  fp8.training.precision = DType::bf16;
  fp8.training.fp8 = Fp8Recipe::delayed;
  EXPECT_EQ(run_field(fp8), "/training/precision");
  Scenario qk = ok;
  qk.model.qk_norm = true;
  EXPECT_EQ(run_field(qk), "/model/qk_norm");
}

// The CUDA device (tensors in device memory, GEMMs in cuBLAS, the other ops through the device
// dispatch) trains the single-rank model like the CPU oracle within `tol` of its losses and
// measures the same bytes per category. Skips itself without a GPU.
void expect_cuda_trains_like_cpu(const Layout& l, double tol) {
  const Scenario s = scenario_from_json(tiny_scenario(l));
  RunOptions o;
  o.comm = CommBackend::emulated;
  const Measurement cpu_run = run(s, o);
  o.device = Device::cuda;
  const Measurement gpu_run = run(s, o);
  ASSERT_EQ(gpu_run.losses.size(), cpu_run.losses.size());
  for (std::size_t i = 0; i < cpu_run.losses.size(); ++i)
    EXPECT_NEAR(gpu_run.losses[i], cpu_run.losses[i], tol * std::abs(cpu_run.losses[i])) << i;
  // The steps move the loss by far less than a 16-bit `tol` of it (5 steps of the tiny Llama:
  // about 4e-3 of 6.2), so the bound above alone would pass a device that never updated the
  // weights: the device's loss must move as the oracle's does, within half of that movement.
  ASSERT_GE(cpu_run.losses.size(), 2u);
  const double cpu_moved = cpu_run.losses.back() - cpu_run.losses.front();
  const double gpu_moved = gpu_run.losses.back() - gpu_run.losses.front();
  ASSERT_NE(cpu_moved, 0.0);
  EXPECT_NEAR(gpu_moved, cpu_moved, 0.5 * std::abs(cpu_moved));
  EXPECT_EQ(gpu_run.skipped, cpu_run.skipped);
  for (const MemoryTag t : {MemoryTag::weights, MemoryTag::gradients, MemoryTag::optimizer,
                            MemoryTag::activations, MemoryTag::buffers})
    EXPECT_EQ(gpu_run.ranks.front().memory.peak_of(t), cpu_run.ranks.front().memory.peak_of(t))
        << to_string(t);
}

TEST(CudaTrainer, TrainsLikeTheCpuAndMeasuresTheSameMemory) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible";
  expect_cuda_trains_like_cpu(Layout{"cuda", {{"tp", 1}, {"pp", 1}, {"dp", 1}}}, 1e-4);
}

// GPT with standard attention in fp32: LayerNorm, GeLU, the attention kernels, embedding, the
// cross-entropy pieces and AdamW on the device; fp32 throughout, so the 1e-4 bound above.
TEST(CudaTrainer, StandardAttentionGptRunsItsOpsOnTheDeviceLikeTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible";
  expect_cuda_trains_like_cpu(
      Layout{"cuda_std", {{"tp", 1}, {"pp", 1}, {"dp", 1}}, "fp32", "standard"}, 1e-4);
}

// Llama (RMSNorm, SwiGLU, grouped key/value heads) in bf16 and fp16: device casts of gradients
// and master weights, and in fp16 the overflow check on the device. The 2e-2 bound of the layout
// matrix for 16-bit storage (LayoutTest above), where rounding ties may break differently.
TEST(CudaTrainer, LlamaIn16BitStorageTrainsLikeTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible";
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    expect_cuda_trains_like_cpu(
        Layout{"cuda_llama", {{"tp", 1}, {"pp", 1}, {"dp", 1}}, precision, "standard", true}, 2e-2);
  }
}

// Gradients after the first backward, before any optimizer step: every parameter's full
// gradient, reassembled from the shards every rank of a layout holds after the gradient
// reduction (tensor-parallel slices, pipeline stages, ZeRO flat shards, replicas), equals the
// one-rank run's element by element. Losses alone can hide a wrong gradient that the optimizer
// mostly normalises away (Adam) or that barely moves the loss (one norm weight of one layer).
class GradientTest : public ::testing::TestWithParam<Layout> {};

// Reads every rank's dump in `dir`: parameter id -> (index -> gradient), one entry per rank
// holding that element (replicas repeat it).
std::map<std::uint64_t, std::vector<std::pair<Count, float>>> read_dumps(const std::string& dir,
                                                                         Count ranks) {
  std::map<std::uint64_t, std::vector<std::pair<Count, float>>> out;
  Count files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    for (const GradientRecord& r : read_gradient_dump(e.path().string()))
      for (std::size_t i = 0; i < r.index.size(); ++i)
        out[r.param].emplace_back(r.index[i], r.value[i]);
  }
  EXPECT_EQ(files, ranks) << "one dump per rank in " << dir;
  return out;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/grad_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// fp32 throughout: the layouts sum the same products in other orders (a row-parallel GEMM splits
// its contraction over tp, micro-batch and replica gradients add in another order, the
// reductions add in rank order), so entries differ by rounding only: a few units in the last
// place (2^-24 = 6e-8 relative) of the largest terms summed, over the handful of sums between
// the loss and a weight of the 4-layer model (measured: at most 9.6e-7 of the parameter's largest
// gradient, under tp2). The bound, 1e-5 of the parameter's largest gradient (about 170 ulp), leaves
// room for that and is far below any real error: a gradient scaled by one part in 10^4 on one
// rank, or a sequence-parallel partial sum not all-reduced (half the tokens missing), breaks it.
// The 1e-7 floor covers parameters whose gradient is rounding noise around 0.
constexpr double kGradRelTol = 1e-5;
constexpr double kGradAbsTol = 1e-7;

TEST_P(GradientTest, EveryParameterMatchesOneRankAfterTheFirstBackward) {
  const Layout& l = GetParam();
  const nlohmann::json doc = tiny_scenario(l);
  const Scenario s = scenario_from_json(doc);
  const Count ranks = s.parallel.tp * s.parallel.cp * s.parallel.dp * s.parallel.pp;
  const std::string dir = fresh_dir(l.name), ref_dir = fresh_dir(std::string(l.name) + "_ref");
  (void)run_layout(doc, std::string(l.name) + "_grad", ranks, false, 1, dir);
  Layout one = l;
  one.parallel = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
  (void)run_layout(tiny_scenario(one), std::string(l.name) + "_grad_ref", 1, false, 1, ref_dir);
  const auto got = read_dumps(dir, ranks);
  const auto want = read_dumps(ref_dir, 1);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got.size(), want.size()) << "the layout's parameters differ from one rank's";
  double worst = 0;  // largest error as a share of the parameter's largest gradient
  for (const auto& [param, entries] : want) {
    SCOPED_TRACE(parameter_name(param));
    // One rank holds the whole parameter, at indices 0 .. n-1.
    std::vector<float> full(entries.size());
    double largest = 0;
    for (const auto& [i, g] : entries) {
      ASSERT_LT(i, static_cast<Count>(full.size()));
      full[static_cast<std::size_t>(i)] = g;
      largest = std::max(largest, std::abs(static_cast<double>(g)));
    }
    ASSERT_GT(largest, 0) << "a parameter without gradient cannot tell layouts apart";
    const auto it = got.find(param);
    ASSERT_NE(it, got.end()) << "no rank holds its gradient";
    const double tol = kGradRelTol * largest + kGradAbsTol;
    std::vector<bool> seen(full.size(), false);
    Count bad = 0;
    for (const auto& [i, g] : it->second) {
      ASSERT_TRUE(i >= 0 && i < static_cast<Count>(full.size())) << "index " << i;
      seen[static_cast<std::size_t>(i)] = true;
      const double err = std::abs(static_cast<double>(g) - full[static_cast<std::size_t>(i)]);
      worst = std::max(worst, err / largest);
      if (err > tol && bad++ < 3) {
        ADD_FAILURE() << "element " << i << ": " << g << " vs one rank's "
                      << full[static_cast<std::size_t>(i)] << " (bound " << tol << ")";
      }
    }
    EXPECT_EQ(bad, 0) << "elements off";
    EXPECT_EQ(std::count(seen.begin(), seen.end(), false), 0) << "elements no rank holds";
  }
  std::printf("%s: largest gradient error %.3g of the parameter's largest gradient\n", l.name,
              worst);
}

// Tensor parallelism with sequence parallelism (GPT: LayerNorm, biases, learned positions) and
// without it but with the vocabulary-parallel tied head; pipeline stages with Llama's grouped
// key/value heads and SwiGLU; data parallelism with full gradients (ZeRO-0), ZeRO-1 shards of
// tied embeddings summed across stages, ZeRO-2 shards under tp with sequence parallelism, and
// hybrid ZeRO-3 shards summed over replicas.
INSTANTIATE_TEST_SUITE_P(
    Layouts, GradientTest,
    ::testing::Values(
        Layout{"tp2_sp", J{{"tp", 2}, {"sequence_parallel", true}}},
        Layout{"tied_tp2", J{{"tp", 2}}, "fp32", "flash", false, true},
        Layout{"llama_tp2_sp_pp2", J{{"tp", 2}, {"pp", 2}, {"sequence_parallel", true}}, "fp32",
               "flash", true},
        Layout{"dp2", J{{"dp", 2}}},
        Layout{"tied_zero1_dp2_pp2", J{{"dp", 2}, {"pp", 2}, {"zero_stage", 1}}, "fp32", "flash",
               false, true},
        Layout{"zero2_dp2_tp2_sp",
               J{{"dp", 2}, {"tp", 2}, {"sequence_parallel", true}, {"zero_stage", 2}}},
        Layout{"hybrid_zero3_dp4_s2", J{{"dp", 4}, {"zero_stage", 3}, {"fsdp_shard_size", 2}}},
        // Context parallelism (ring attention): with tp and sequence parallelism (GPT, learned
        // positions at the chunks' global positions); Llama (rotary, grouped KV heads) over 4
        // ranks, where the KV gradients travel 3 hops and ranks see blocks before and after
        // their own; ZeRO-3 sharded over the cp ranks.
        Layout{"cp2_tp2_sp", J{{"cp", 2}, {"tp", 2}, {"sequence_parallel", true}}},
        Layout{"llama_cp4", J{{"cp", 4}}, "fp32", "flash", true},
        Layout{"zero3_cp2", J{{"cp", 2}, {"zero_stage", 3}}},
        Layout{"llama_cp4_all_gather", J{{"cp", 4}, {"cp_comm", "all_gather"}}, "fp32", "flash",
               true},
        Layout{"cp2_tp2_sp_a2a",
               J{{"cp", 2}, {"cp_comm", "a2a"}, {"tp", 2}, {"sequence_parallel", true}}},
        Layout{"llama_cp2_a2a", J{{"cp", 2}, {"cp_comm", "a2a"}}, "fp32", "flash", true},
        // DualPipe: every parameter has two copies (stages s and pp - 1 - s), each of which must
        // hold the whole gradient after the mirror exchange: Llama over pp2, GPT over pp4 (one
        // layer per model stage) and ZeRO-1 shards over dp2.
        Layout{"llama_pp2_dualpipe", J{{"pp", 2}, {"schedule", "dualpipe"}}, "fp32", "flash", true},
        Layout{"pp4_dualpipe", J{{"pp", 4}, {"schedule", "dualpipe"}}, "fp32", "flash", false,
               false, "adamw", 8},
        Layout{"zero1_dp2_pp2_dualpipe",
               J{{"dp", 2}, {"pp", 2}, {"schedule", "dualpipe"}, {"zero_stage", 1}}, "fp32",
               "flash", false, false, "adamw", 8},
        // Uneven splits (pipeline_split.h): 5 layers over pp 2 x v 2 interleaved (virtual stages
        // of 1, 2, 1, 1 layers), over a V (stage 1's chunks 2 and 1 layers) and over DualPipe's
        // model stages (3 and 2); the Llama 3 paper's ends under Megatron-LM's
        // account-for-embedding/loss rule, 2 layers: one chunk with only the embedding, one with
        // only the LM head.
        Layout{"uneven5_pp2_interleaved",
               J{{"pp", 2}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}, "fp32",
               "flash", false, false, "adamw", 4, 5},
        Layout{"llama_uneven5_pp2_zb_v", J{{"pp", 2}, {"schedule", "zb_v"}}, "fp32", "flash", true,
               false, "adamw", 4, 5},
        Layout{"uneven5_pp2_dualpipe", J{{"pp", 2}, {"schedule", "dualpipe"}}, "fp32", "flash",
               false, false, "adamw", 4, 5},
        Layout{"llama3_ends_pp2_interleaved",
               J{{"pp", 2},
                 {"schedule", "interleaved_1f1b"},
                 {"virtual_stages", 2},
                 {"pipeline_split",
                  {{"rule", "megatron"},
                   {"account_for_embedding", true},
                   {"account_for_loss", true}}}},
               "fp32", "flash", false, false, "adamw", 4, 2}),
    [](const auto& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(
    Matrix, LayoutTest,
    ::testing::Values(
        Layout{"single", J{{"tp", 1}, {"pp", 1}, {"dp", 1}}}, Layout{"dp2", J{{"dp", 2}}},
        Layout{"tp2", J{{"tp", 2}}}, Layout{"tp2_sp", J{{"tp", 2}, {"sequence_parallel", true}}},
        Layout{"tp2_sp_pp2", J{{"tp", 2}, {"pp", 2}, {"sequence_parallel", true}}},
        Layout{"zero2_dp2_tp2_sp",
               J{{"dp", 2}, {"tp", 2}, {"sequence_parallel", true}, {"zero_stage", 2}}},
        Layout{"pp2_gpipe", J{{"pp", 2}, {"schedule", "gpipe"}}},
        Layout{"pp2_1f1b", J{{"pp", 2}, {"schedule", "1f1b"}}},
        Layout{"pp2_interleaved",
               J{{"pp", 2}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}},
        Layout{"pp2_zb_h1", J{{"pp", 2}, {"schedule", "zb_h1"}}},
        // zb_auto: the Zero Bubble heuristic's order for the planner's stage times (limit pp).
        Layout{"pp2_zb_auto", J{{"pp", 2}, {"schedule", "zb_auto"}}},
        // The V schedules (m = 4 = 2p): stage 0 holds virtual stages 0 and 3, so the embedding
        // and the LM head; the turn at stage 1 stays on it. DualPipeV's F&B pairs run one pass
        // after the other, in the program's order.
        Layout{"pp2_zb_v", J{{"pp", 2}, {"schedule", "zb_v"}}},
        Layout{"pp2_v_half", J{{"pp", 2}, {"schedule", "v_half"}}},
        Layout{"pp2_v_min", J{{"pp", 2}, {"schedule", "v_min"}}},
        Layout{"pp2_dualpipe_v", J{{"pp", 2}, {"schedule", "dualpipe_v"}}},
        // Uneven splits: each chunk its own layers, saved activations and program position
        // (5 layers: interleaved virtual stages of 1, 2, 1, 1; a V whose stage 1 holds chunks of
        // 2 and 1 layers; DualPipeV likewise; DualPipe model stages of 3 and 2).
        Layout{"uneven5_pp2_interleaved",
               J{{"pp", 2}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}, "fp32",
               "flash", false, false, "adamw", 4, 5},
        Layout{"uneven5_pp2_zb_v", J{{"pp", 2}, {"schedule", "zb_v"}}, "fp32", "flash", false,
               false, "adamw", 4, 5},
        Layout{"uneven5_pp2_dualpipe_v", J{{"pp", 2}, {"schedule", "dualpipe_v"}}, "fp32", "flash",
               false, false, "adamw", 4, 5},
        Layout{"uneven5_pp2_dualpipe", J{{"pp", 2}, {"schedule", "dualpipe"}}, "fp32", "flash",
               false, false, "adamw", 4, 5},
        // DualPipe (m = 2p): stage s holds model stage s of direction 0 and pp - 1 - s of
        // direction 1, so both end stages hold an embedding and an LM head; the two copies of
        // each model stage sum their gradients once per step (the mirror exchange), before the
        // data-parallel reduction (here ZeRO-1 over dp2).
        Layout{"pp2_dualpipe", J{{"pp", 2}, {"schedule", "dualpipe"}}},
        Layout{"pp4_dualpipe", J{{"pp", 4}, {"schedule", "dualpipe"}}, "fp32", "flash", false,
               false, "adamw", 8},
        Layout{"zero1_dp2_pp2_dualpipe",
               J{{"dp", 2}, {"pp", 2}, {"schedule", "dualpipe"}, {"zero_stage", 1}}, "fp32",
               "flash", false, false, "adamw", 8},
        // SGD: a copy that missed its mirror's gradient takes half the step, visible in the loss.
        Layout{"sgd_pp4_dualpipe", J{{"pp", 4}, {"schedule", "dualpipe"}}, "fp32", "flash", false,
               false, "sgd", 8},
        Layout{"zero1_dp2", J{{"dp", 2}, {"zero_stage", 1}}},
        Layout{"zero2_dp2", J{{"dp", 2}, {"zero_stage", 2}}},
        Layout{"zero3_dp2", J{{"dp", 2}, {"zero_stage", 3}}},
        // ZeRO-3 under zero-bubble schedules: the W pass runs after the unit's gather is
        // released (issue 18, item 1).
        Layout{"zero3_dp2_zb_h1", J{{"dp", 2}, {"schedule", "zb_h1"}, {"zero_stage", 3}}},
        Layout{"zero3_dp2_pp2_zb_h2",
               J{{"dp", 2}, {"pp", 2}, {"schedule", "zb_h2"}, {"zero_stage", 3}}},
        Layout{"zero3_dp2_pp2_zb_h1",
               J{{"dp", 2}, {"pp", 2}, {"schedule", "zb_h1"}, {"zero_stage", 3}}},
        Layout{"recompute_selective", J{{"tp", 2}, {"recompute", "selective"}}, "fp32", "standard"},
        Layout{"recompute_full", J{{"pp", 2}, {"recompute", "full"}}},
        Layout{"dp2_tp2_pp2", J{{"dp", 2}, {"tp", 2}, {"pp", 2}}},
        Layout{"bf16_dp2_tp2", J{{"dp", 2}, {"tp", 2}}, "bf16"},
        Layout{"llama_tp2_pp2", J{{"tp", 2}, {"pp", 2}}, "fp32", "flash", true},
        // Hybrid sharding: shard groups of 2 consecutive dp ranks, shards all-reduced over the 2
        // replicas (dp_replicate).
        Layout{"hybrid_zero1_dp4_s2", J{{"dp", 4}, {"zero_stage", 1}, {"fsdp_shard_size", 2}}},
        Layout{"hybrid_zero2_dp4_s2", J{{"dp", 4}, {"zero_stage", 2}, {"fsdp_shard_size", 2}}},
        Layout{"hybrid_zero3_dp4_s2", J{{"dp", 4}, {"zero_stage", 3}, {"fsdp_shard_size", 2}}},
        Layout{"hybrid_zero1_dp4_s2_pp2",
               J{{"dp", 4}, {"pp", 2}, {"zero_stage", 1}, {"fsdp_shard_size", 2}}},
        // Tied embeddings: a copy on the last stage summed with the first (pp2), the embedding
        // itself as the LM head (pp1, vocab-parallel over tp2), and with ZeRO-1 over dp2.
        Layout{"tied_pp2", J{{"pp", 2}}, "fp32", "flash", false, true},
        Layout{"tied_tp2", J{{"tp", 2}}, "fp32", "flash", false, true},
        Layout{"tied_pp2_interleaved",
               J{{"pp", 2}, {"schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}, "fp32",
               "flash", false, true},
        // Under a V the embedding is the LM head on stage 0: no copy, nothing to all-reduce.
        Layout{"tied_tp2_sp_pp2_zb_v",
               J{{"tp", 2}, {"pp", 2}, {"sequence_parallel", true}, {"schedule", "zb_v"}}, "fp32",
               "flash", false, true},
        Layout{"tied_pp2_zb_h1_zero1_dp2",
               J{{"pp", 2}, {"dp", 2}, {"schedule", "zb_h1"}, {"zero_stage", 1}}, "fp32", "flash",
               false, true},
        Layout{"tied_zero1_dp2_pp2", J{{"dp", 2}, {"pp", 2}, {"zero_stage", 1}}, "fp32", "flash",
               false, true},
        // SGD (momentum 0.9, kSgdLearningRate): gradient-scale errors that Adam hides show in the
        // losses. Data, tensor, pipeline and ZeRO-3 sharding each split the gradient differently.
        Layout{"sgd_dp2", J{{"dp", 2}}, "fp32", "flash", false, false, "sgd"},
        Layout{"sgd_tp2_sp", J{{"tp", 2}, {"sequence_parallel", true}}, "fp32", "flash", false,
               false, "sgd"},
        Layout{"sgd_pp2_1f1b", J{{"pp", 2}, {"schedule", "1f1b"}}, "fp32", "flash", false, false,
               "sgd"},
        Layout{"sgd_zero3_dp2", J{{"dp", 2}, {"zero_stage", 3}}, "fp32", "flash", false, false,
               "sgd"},
        Layout{"sgd_hybrid_zero2_dp4_s2", J{{"dp", 4}, {"zero_stage", 2}, {"fsdp_shard_size", 2}},
               "fp32", "flash", false, false, "sgd"},
        // Context parallelism, cp_comm p2p (ring attention, 2 cp chunks per rank): alone, with
        // tp (4 ranks, rank order tp, cp, dp, pp), with tp and sequence parallelism, Llama
        // (rotary at global positions, grouped KV heads) over cp = 4, a pipeline (stage 0 holds
        // no logits: its buffers are the ring's alone), ZeRO-1 sharded over dp·cp, full
        // recomputation (the ring replayed in the backward), bf16 storage, and SGD.
        Layout{"cp2", J{{"cp", 2}}}, Layout{"cp2_tp2", J{{"cp", 2}, {"tp", 2}}},
        Layout{"cp2_tp2_sp", J{{"cp", 2}, {"tp", 2}, {"sequence_parallel", true}}},
        Layout{"llama_cp4", J{{"cp", 4}}, "fp32", "flash", true},
        Layout{"cp2_pp2", J{{"cp", 2}, {"pp", 2}}},
        Layout{"zero1_cp2_dp2", J{{"cp", 2}, {"dp", 2}, {"zero_stage", 1}}},
        Layout{"recompute_full_cp2", J{{"cp", 2}, {"recompute", "full"}}},
        Layout{"bf16_llama_cp2_tp2", J{{"cp", 2}, {"tp", 2}}, "bf16", "flash", true},
        Layout{"sgd_cp2", J{{"cp", 2}}, "fp32", "flash", false, false, "sgd"},
        // cp_comm all_gather (the KV all-gather): alone, with tp and sequence parallelism, and
        // Llama over cp = 4 with full recomputation (the gather replayed).
        Layout{"cp2_all_gather", J{{"cp", 2}, {"cp_comm", "all_gather"}}},
        Layout{"cp2_tp2_sp_all_gather",
               J{{"cp", 2}, {"cp_comm", "all_gather"}, {"tp", 2}, {"sequence_parallel", true}}},
        Layout{"llama_cp4_all_gather_recompute_full",
               J{{"cp", 4}, {"cp_comm", "all_gather"}, {"recompute", "full"}}, "fp32", "flash",
               true},
        // cp_comm a2a (DeepSpeed-Ulysses): cp2 (GPT: 4 heads, 2 per cp rank), cp4 with 4 heads
        // (one per rank), with tp2 and sequence parallelism, Llama (grouped KV heads: 2, one per
        // cp rank) with full recomputation (the all-to-alls replayed).
        Layout{"cp2_a2a", J{{"cp", 2}, {"cp_comm", "a2a"}}},
        Layout{"cp4_a2a", J{{"cp", 4}, {"cp_comm", "a2a"}}},
        Layout{"cp2_tp2_sp_a2a",
               J{{"cp", 2}, {"cp_comm", "a2a"}, {"tp", 2}, {"sequence_parallel", true}}},
        Layout{"llama_cp2_a2a_recompute_full",
               J{{"cp", 2}, {"cp_comm", "a2a"}, {"recompute", "full"}}, "fp32", "flash", true},
        // An explicit head_dim (Qwen3's shapes: heads × head_dim = 2 × hidden here): the queries,
        // the output and their exchanges are heads × head_dim wide, not hidden_size (issue 29,
        // item 4), under every cp_comm.
        Layout{"llama_cp2_a2a_head_dim", J{{"cp", 2}, {"cp_comm", "a2a"}}, "fp32", "flash", true,
               false, "adamw", 4, 32},
        Layout{"llama_cp2_head_dim", J{{"cp", 2}}, "fp32", "flash", true, false, "adamw", 4, 32},
        Layout{"llama_cp2_all_gather_head_dim", J{{"cp", 2}, {"cp_comm", "all_gather"}}, "fp32",
               "flash", true, false, "adamw", 4, 32}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace distplan::backend
