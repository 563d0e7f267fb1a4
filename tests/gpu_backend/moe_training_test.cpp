// A tiny MoE GPT (4 routed SwiGLU experts, top-2, one shared expert, a dense first layer) trained
// on MPI ranks with expert parallelism (ep = 2, alone and with data, tensor + sequence, and
// pipeline parallelism): its losses equal one rank's over 5 steps, every parameter's gradient
// after the first backward (router, shared and every routed expert) equals one rank's element by
// element, the weights, gradients and optimizer states it measures equal the planner's per-GPU
// counts (moe_memory.h), and each all-to-all records its token-side buffer (the planner's bytes
// per call); the copies that crossed ranks are measured apart (moe_routing).
#include <gtest/gtest.h>

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
#include "distplan/planner/moe.h"
#include "distplan/planner/moe_memory.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/planner/validate.h"
#include "worker_launch.h"

namespace distplan::backend {
namespace {

using J = nlohmann::json;

constexpr Count kGlobalBatch = 4;

struct MoeLayout {
  const char* name;
  J parallel;
  const char* router = "softmax";
  bool router_bias = false;
  Count global_batch = kGlobalBatch;  // DualPipe needs 2 pp micro-batches per dp rank
};

void PrintTo(const MoeLayout& l, std::ostream* os) {
  *os << l.name;
}

// The model's sizes, named for the hand counts below.
constexpr Count kLayers = 4, kHidden = 64, kHeads = 4, kKvHeads = 2, kFfn = 128, kVocab = 512;
constexpr Count kExperts = 4, kTopK = 2, kExpertFfn = 32, kSharedFfn = 32, kFirstDense = 1;
constexpr Count kSeq = 32;

J moe_scenario(const MoeLayout& l) {
  const Count ranks =
      l.parallel.value("tp", 1) * l.parallel.value("pp", 1) * l.parallel.value("dp", 1);
  const J model = {{"num_layers", kLayers},
                   {"hidden_size", kHidden},
                   {"num_attention_heads", kHeads},
                   {"num_kv_heads", kKvHeads},
                   {"ffn_hidden_size", kFfn},
                   {"vocab_size", kVocab},
                   {"mlp", "swiglu"},
                   {"norm", "rmsnorm"},
                   {"position_embedding", "rotary"},
                   {"moe",
                    {{"num_experts", kExperts},
                     {"top_k", kTopK},
                     {"expert_ffn_hidden_size", kExpertFfn},
                     {"num_shared_experts", 1},
                     {"shared_expert_ffn_hidden_size", kSharedFfn},
                     {"first_dense_layers", kFirstDense},
                     {"router", l.router},
                     {"router_bias", l.router_bias}}}};
  return {{"model", model},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", ranks}, {"gpus_per_node", 8}}},
          {"training",
           {{"framework", "generic"},
            {"seq_length", kSeq},
            {"global_batch_size", l.global_batch},
            {"micro_batch_size", 1},
            {"precision", "fp32"},
            {"grad_accumulation_dtype", "fp32"},
            {"optimizer", "adamw"},
            {"attention", "flash"}}},
          {"parallel", l.parallel}};
}

// The same model without experts (every layer dense): the planner plans it today.
J dense_scenario(const MoeLayout& l) {
  J doc = moe_scenario(l);
  doc["model"].erase("moe");
  doc["parallel"].erase("ep");
  return doc;
}

// One rank in process (emulated groups, ep = 1), more under mpirun with the worker.
Measurement run_moe(const J& doc, const std::string& name, Count ranks, Count steps,
                    const std::string& dump_dir = "") {
  if (ranks == 1) {
    RunOptions o;
    o.steps = steps;
    o.comm = CommBackend::emulated;
    o.dump_gradients = dump_dir;
    return run(scenario_for_training(doc), o);
  }
  const std::string args = "--steps " + std::to_string(steps) +
                           (dump_dir.empty() ? "" : " --dump-gradients " + dump_dir);
  return testing_support::run_worker(doc, name, static_cast<int>(ranks), args);
}

MoeLayout one_rank(const MoeLayout& l) {
  MoeLayout one = l;
  one.parallel = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
  return one;
}

// MoE layers on pipeline stage `st`.
Count moe_layers_on(const Scenario& s, int st) {
  const std::vector<Count> counts = stage_layer_counts(s);
  Count first = 0;
  for (int i = 0; i < st; ++i) first += counts[static_cast<std::size_t>(i)];
  Count n = 0;
  for (Count l = first; l < first + counts[static_cast<std::size_t>(st)]; ++l)
    n += is_moe_layer(s.model, l) ? 1 : 0;
  return n;
}

class MoeLayoutMpiTest : public ::testing::TestWithParam<MoeLayout> {};

TEST_P(MoeLayoutMpiTest, TrainsLikeOneRankWithThePlannersExpertMemory) {
  const MoeLayout& l = GetParam();
  const J doc = moe_scenario(l);
  const Scenario s = scenario_for_training(doc);
  const ParallelSpec& p = s.parallel;
  const Count ranks = p.tp * p.dp * p.pp;
  const Measurement m = run_moe(doc, l.name, ranks, 5);
  const Measurement ref = run_moe(moe_scenario(one_rank(l)), std::string(l.name) + "_ref", 1, 5);
  ASSERT_EQ(m.losses.size(), 5u);
  ASSERT_EQ(ref.losses.size(), 5u);
  // fp32: the layouts sum in other orders (rounding only, as LayoutTest); 5 steps of AdamW move
  // the loss by far more than the bound.
  const double tol = 1e-5 * std::abs(ref.losses.front());
  for (std::size_t i = 0; i < 5; ++i) EXPECT_NEAR(m.losses[i], ref.losses[i], tol) << "step " << i;
  EXPECT_GT(std::abs(ref.losses.front() - ref.losses.back()), 20 * tol);
  ASSERT_EQ(static_cast<Count>(m.ranks.size()), ranks);

  // Memory: the dense model's planned model states, with each MoE layer's MLP replaced by its
  // router and shared expert, plus the routed experts of this GPU.
  // By hand, per TP rank (SwiGLU, no biases): a dense MLP has 3 h f / t parameters; a MoE
  // layer's dense part replaces it by the router (E h, and E for the selection bias; replicated)
  // and the shared expert
  // (3 h f_s / t); the routed experts are E / ep of 3 h f_e each (etp = 1).
  const Count t = p.tp, edp = s.expert_data_parallel();
  const Count dense_mlp = 3 * kHidden * kFfn / t;
  const Count moe_dense_extra =
      kExperts * kHidden + (l.router_bias ? kExperts : 0) + 3 * kHidden * kSharedFfn / t;
  const Count routed = kExperts / p.ep * 3 * kHidden * kExpertFfn;
  // One truth: the planner's per-GPU counts agree with the hand counts.
  const Count attention_and_norms = 2 * kHidden +
                                    (kHidden + 2 * kHidden * kKvHeads / kHeads) * kHidden / t +
                                    kHidden * kHidden / t;
  EXPECT_EQ(moe_layer_dense_params_per_tp_rank(s.model, t), attention_and_norms + moe_dense_extra);
  EXPECT_EQ(routed_expert_params_per_gpu(s.model, p.ep, p.etp), routed);
  const Estimate dense = estimate(scenario_from_json(dense_scenario(l)));
  for (const RankMeasurement& r : m.ranks) {
    SCOPED_TRACE("rank " + std::to_string(r.rank));
    const Count moe_layers = moe_layers_on(s, r.coords.pp);
    const StageMemory& sm = dense.memory.stages[static_cast<std::size_t>(r.coords.pp)];
    // fp32 weights and gradients (4 bytes), AdamW's two fp32 moments (8 bytes, no master copy).
    const ExpertStateBytes experts = expert_state_bytes(
        routed_expert_params_per_gpu(s.model, p.ep, p.etp), moe_layers, p.zero_stage, edp, 4, 4, 8);
    const Bytes delta = moe_layers * (moe_dense_extra - dense_mlp);
    if (p.zero_stage == 0) {  // ZeRO-1 pads the MoE layers' units unlike the dense ones
      EXPECT_EQ(r.memory.peak_of(MemoryTag::weights),
                sm.weights_bytes + 4 * delta + experts.weights);
      EXPECT_EQ(r.memory.peak_of(MemoryTag::gradients),
                sm.gradients_bytes + 4 * delta + experts.gradients);
      EXPECT_EQ(r.memory.peak_of(MemoryTag::optimizer),
                sm.optimizer_bytes + 8 * delta + experts.optimizer);
    }
  }

  // The planner plans this model itself (dense first layers mixed with MoE layers, docs/moe.md
  // "Layer placement"): every rank's model states are its stage's, exactly.
  validate_scenario(s);
  const Estimate plan = estimate(s);
  for (const RankMeasurement& r : m.ranks) {
    SCOPED_TRACE("rank " + std::to_string(r.rank) + " against the plan");
    const StageMemory& sm = plan.memory.stages[static_cast<std::size_t>(r.coords.pp)];
    EXPECT_EQ(r.memory.peak_of(MemoryTag::weights), sm.weights_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::gradients), sm.gradients_bytes);
    EXPECT_EQ(r.memory.peak_of(MemoryTag::optimizer), sm.optimizer_bytes);
  }

  // All-to-all: per rank, one call of each kind per MoE layer and micro-batch; over the world,
  // each kind moves the copies that crossed ranks (the dispatch's rows return in the combine).
  // Every rank routes its b s / t tokens (sequence parallel) times top_k: a hand count of the
  // copies, independent of the routing.
  const Count nmb = s.num_microbatches();
  std::map<std::string, Bytes> bytes;
  Count crossed = 0, copies = 0, received = 0;
  double planner_bytes = 0;
  for (const RankMeasurement& r : m.ranks) {
    const Count moe_layers = moe_layers_on(s, r.coords.pp);
    const Count tokens = kSeq / t;  // micro_batch_size 1
    EXPECT_EQ(r.moe.copies, tokens * kTopK * moe_layers * nmb) << "rank " << r.rank;
    crossed += r.moe.to_other_ranks;
    copies += r.moe.copies;
    received += r.moe.received;
    for (const auto& [k, v] : r.communication) {
      if (std::get<0>(k) != Group::ep) continue;
      EXPECT_EQ(std::get<1>(k), CollectiveOp::all_to_all);
      EXPECT_EQ(v.calls, moe_layers * nmb) << to_string(std::get<2>(k));
      // Recorded per call: the rank's token-side buffer, its tokens' top_k copies (hand count).
      EXPECT_EQ(v.bytes, tokens * kTopK * kHidden * 4 * moe_layers * nmb)
          << to_string(std::get<2>(k));
      bytes[std::string(to_string(std::get<2>(k)))] += v.bytes;
    }
    planner_bytes += ep_all_to_all_bytes(tokens, kTopK, kHidden, 4, p.ep) *
                     static_cast<double>(moe_layers * nmb);
  }
  EXPECT_EQ(received, copies);
  ASSERT_EQ(bytes.size(), 4u);
  // What crossed ranks is the routing's (moe_routing), against the planner's even split.
  EXPECT_EQ(bytes.size(), 4u);
  std::printf(
      "%s: %lld of %lld routed copies crossed ranks (%.1f%%); all-to-all bytes per kind "
      "over all ranks: realised %lld, planner's even split %.0f\n",
      l.name, static_cast<long long>(crossed), static_cast<long long>(copies),
      100.0 * static_cast<double>(crossed) / static_cast<double>(copies),
      static_cast<long long>(crossed * kHidden * 4), planner_bytes);
  // The expert gradients are reduced over the expert data-parallel group (ZeRO-0: one
  // all-reduce of each MoE layer's experts per step), none over dp.
  for (const RankMeasurement& r : m.ranks) {
    CommTotals edp_reduce;
    for (const auto& [k, v] : r.communication)
      if (std::get<0>(k) == Group::edp) edp_reduce.bytes += v.bytes, edp_reduce.calls += v.calls;
    const Count moe_layers = moe_layers_on(s, r.coords.pp);
    if (edp == 1) {
      EXPECT_EQ(edp_reduce.calls, 0);
    } else if (p.zero_stage == 0) {
      EXPECT_EQ(edp_reduce.calls, moe_layers);
      EXPECT_EQ(edp_reduce.bytes, moe_layers * routed * 4);
    }
    for (const auto& [k, v] : r.communication)
      if (std::get<0>(k) == Group::dp) {
        EXPECT_NE(std::get<2>(k), unit_traffic(UnitTraffic::gradients, ParamUnit::experts));
      }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeLayoutMpiTest,
    ::testing::Values(MoeLayout{"ep2_dp2", J{{"dp", 2}, {"ep", 2}}},
                      MoeLayout{"ep2_dp4", J{{"dp", 4}, {"ep", 2}}},
                      MoeLayout{"ep2_dp4_zero1", J{{"dp", 4}, {"ep", 2}, {"zero_stage", 1}}},
                      MoeLayout{"ep2_tp2_sp", J{{"tp", 2}, {"ep", 2}, {"sequence_parallel", true}}},
                      MoeLayout{"ep2_tp2_sp_dp2",
                                J{{"tp", 2}, {"dp", 2}, {"ep", 2}, {"sequence_parallel", true}}},
                      MoeLayout{"ep2_dp2_pp2_1f1b",
                                J{{"dp", 2}, {"pp", 2}, {"ep", 2}, {"schedule", "1f1b"}}},
                      MoeLayout{"sigmoid_bias_ep2_dp2", J{{"dp", 2}, {"ep", 2}}, "sigmoid", true}),
    [](const auto& info) { return std::string(info.param.name); });

// After the first backward, before the optimizer, every parameter's reduced gradient (router,
// shared expert, each routed expert, attention, embedding, head) equals one rank's element by
// element, within GradientTest's bound (training_test.cpp: 1e-5 of the parameter's largest
// gradient plus 1e-7; fp32 sums in other orders differ by rounding only).
const MoeLayout kDualPipe{"ep2_dp2_pp2_dualpipe",
                          J{{"dp", 2}, {"pp", 2}, {"ep", 2}, {"schedule", "dualpipe"}}, "softmax",
                          false, 8};

class MoeGradientMpiTest : public ::testing::TestWithParam<MoeLayout> {};

std::map<std::uint64_t, std::map<Count, std::vector<float>>> read_dumps(const std::string& dir) {
  std::map<std::uint64_t, std::map<Count, std::vector<float>>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    for (const GradientRecord& r : read_gradient_dump(e.path().string()))
      for (std::size_t i = 0; i < r.index.size(); ++i)
        out[r.param][r.index[i]].push_back(r.value[i]);
  return out;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/moe_grad_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST_P(MoeGradientMpiTest, EveryParameterMatchesOneRankAfterTheFirstBackward) {
  const MoeLayout& l = GetParam();
  const J doc = moe_scenario(l);
  const Scenario s = scenario_for_training(doc);
  const Count ranks = s.parallel.tp * s.parallel.dp * s.parallel.pp;
  const std::string dir = fresh_dir(l.name), ref_dir = fresh_dir(std::string(l.name) + "_ref");
  (void)run_moe(doc, std::string(l.name) + "_grad", ranks, 1, dir);
  (void)run_moe(moe_scenario(one_rank(l)), std::string(l.name) + "_grad_ref", 1, 1, ref_dir);
  const auto got = read_dumps(dir), want = read_dumps(ref_dir);
  ASSERT_EQ(got.size(), want.size()) << "the layout's parameters differ from one rank's";
  Count experts_seen = 0;
  for (const auto& [param, entries] : want) {
    SCOPED_TRACE(parameter_name(param));
    if (parameter_name(param).find("expert ") != std::string::npos) ++experts_seen;
    double largest = 0;
    for (const auto& [i, g] : entries) largest = std::max(largest, std::abs(double(g.front())));
    const bool bias = parameter_name(param).find("router bias") != std::string::npos;
    if (!bias) {
      ASSERT_GT(largest, 0) << "a parameter without gradient cannot tell layouts apart";
    }
    const auto it = got.find(param);
    ASSERT_NE(it, got.end()) << "no rank holds its gradient";
    ASSERT_EQ(it->second.size(), entries.size()) << "elements no rank holds";
    const double tol = 1e-5 * largest + 1e-7;
    Count bad = 0;
    for (const auto& [i, gs] : it->second) {
      const double want_i = entries.at(i).front();
      for (float g : gs)
        if (std::abs(g - want_i) > tol && bad++ < 3)
          ADD_FAILURE() << "element " << i << ": " << g << " vs one rank's " << want_i;
    }
    EXPECT_EQ(bad, 0);
  }
  // Every routed expert of every MoE layer, each held by one rank of each ep group.
  EXPECT_EQ(experts_seen, 2 * kExperts * moe_layer_count(s.model));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeGradientMpiTest,
    ::testing::Values(MoeLayout{"ep2_dp4_zero1", J{{"dp", 4}, {"ep", 2}, {"zero_stage", 1}}},
                      MoeLayout{"ep2_tp2_sp_dp2",
                                J{{"tp", 2}, {"dp", 2}, {"ep", 2}, {"sequence_parallel", true}}},
                      // DualPipe: each MoE layer's routed experts have two copies too (stages s
                      // and pp - 1 - s, the same ep rank), summed by the mirror exchange.
                      kDualPipe),
    [](const auto& info) { return std::string(info.param.name); });

// DualPipe's mirror exchange sends the stage's whole gradient once per step: every gradient
// buffer the rank holds (ZeRO-0: its gradient memory, routed experts included), one pipeline
// send per unit, which is the planner's Traffic::mirror_gradients entries for the stage. At pp = 2
// each stage holds the whole model: the embedding, the LM head, and per layer its unit and its
// routed experts' unit. Every layer is a MoE layer here: the planner counts a MoE model's layers
// alike (its MoE estimate is not yet per layer, moe_json.h), so a dense first layer would differ
// from it by that layer's MLP.
TEST(MoeTraining, DualPipeMirrorSendsTheStagesWholeGradientAsPlanned) {
  J doc = moe_scenario(kDualPipe);
  doc["model"]["moe"]["first_dense_layers"] = 0;
  const Scenario s = scenario_for_training(doc);
  const Count ranks = s.parallel.dp * s.parallel.pp;
  const Measurement m = run_moe(doc, "dualpipe_mirror", ranks, 1);
  ASSERT_EQ(static_cast<Count>(m.ranks.size()), ranks);
  for (const RankMeasurement& r : m.ranks) {
    SCOPED_TRACE("rank " + std::to_string(r.rank));
    CommTotals sent;
    for (const auto& [k, v] : r.communication)
      if (std::get<2>(k) == Traffic::mirror_gradients) sent.bytes += v.bytes, sent.calls += v.calls;
    EXPECT_EQ(sent.calls, 2 + 2 * kLayers);
    EXPECT_EQ(sent.bytes, r.memory.peak_of(MemoryTag::gradients));
    CommTotals planned;
    for (const Collective& c : stage_communication(s, static_cast<int>(r.coords.pp))) {
      if (c.purpose != Traffic::mirror_gradients) continue;
      planned.bytes += c.bytes_per_call * c.calls_per_step;
      planned.calls += c.calls_per_step;
    }
    EXPECT_EQ(sent.bytes, planned.bytes);
    EXPECT_EQ(sent.calls, planned.calls);
  }
}

// What the backend does not train is refused at its field.
// A MoE layer without shared experts keeps its router's input (the post-attention norm's output)
// for the router's weight gradient; with shared experts the shared MLP keeps the same tensor
// (issue 29, item 5: the plan left it out, about 3 % of Mixtral's activations). Every layer a
// MoE layer, one rank (the backend's MoE layers run without recomputation): taking the shared
// expert away changes the measured activations exactly as it changes the planned ones (both
// runs share a small difference of their own, 4,608 bytes with flash attention).
TEST(MoeTraining, RouterInputWithoutSharedExpertsIsPlanned) {
  for (const char* attention : {"flash", "standard"}) {
    Bytes gap[2] = {0, 0};
    for (int shared = 0; shared < 2; ++shared) {
      J doc = moe_scenario(MoeLayout{"x", J::object()});
      doc["training"]["attention"] = attention;
      doc["training"]["framework"] = "generic";
      doc["model"]["moe"]["first_dense_layers"] = 0;
      if (shared == 0) {
        doc["model"]["moe"].erase("num_shared_experts");
        doc["model"]["moe"].erase("shared_expert_ffn_hidden_size");
      }
      const Estimate e = estimate(scenario_from_json(doc));
      const Measurement m = run_moe(doc, "router", 1, 1);
      ASSERT_EQ(m.ranks.size(), 1u);
      gap[shared] =
          e.memory.stages[0].activations_bytes - m.ranks[0].memory.peak_of(MemoryTag::activations);
    }
    EXPECT_EQ(gap[0], gap[1]) << attention;
  }
}

TEST(MoeTraining, RefusesWhatItDoesNotImplement) {
  MoeLayout l{"refuse", J{{"dp", 2}, {"ep", 2}}};
  auto field_of = [](const J& doc, CommBackend comm = CommBackend::mpi) {
    try {
      check_moe_supported(scenario_for_training(doc), Device::cpu, comm);
    } catch (const InputError& e) {
      return e.path();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(field_of(moe_scenario(l)), "accepted");
  J capacity = moe_scenario(l);
  capacity["model"]["moe"]["capacity_factor"] = 1.25;
  EXPECT_EQ(field_of(capacity), "/model/moe/capacity_factor");
  J tp_no_sp = moe_scenario(MoeLayout{"x", J{{"tp", 2}, {"ep", 2}}});
  EXPECT_EQ(field_of(tp_no_sp), "/parallel/sequence_parallel");
  J zero2 = moe_scenario(MoeLayout{"x", J{{"dp", 2}, {"ep", 2}, {"zero_stage", 2}}});
  EXPECT_EQ(field_of(zero2), "/parallel/zero_stage");
  EXPECT_EQ(field_of(moe_scenario(l), CommBackend::emulated), "/parallel/ep");
  // The planner plans this model (a dense first layer before MoE layers, docs/moe.md), and
  // the backend's refusals stay at their own fields: ETP and ZeRO-3 of experts plan, and the
  // backend refuses them.
  EXPECT_NO_THROW((void)scenario_from_json(moe_scenario(l)));
  J etp = moe_scenario(MoeLayout{"x", J{{"dp", 4}, {"ep", 2}, {"etp", 2}}});
  EXPECT_NO_THROW((void)scenario_from_json(etp));
  EXPECT_EQ(field_of(etp), "/parallel/etp");
  J zero3 = moe_scenario(MoeLayout{"x", J{{"dp", 2}, {"ep", 2}, {"zero_stage", 3}}});
  EXPECT_NO_THROW((void)scenario_from_json(zero3));
  EXPECT_EQ(field_of(zero3), "/parallel/zero_stage");
}

}  // namespace
}  // namespace distplan::backend
