// DualPipe (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipe.py, commit 3da1bbe): the
// bidirectional generator against the checker and against hand counts of the source's eight
// steps, and the README's table ("Pipeline Bubbles and Memory Usage Comparison"): PP devices of
// two model stages each (stage s and PP - 1 - s), bubble (PP/2 - 1)(F&B + B - 3W), activations
// PP + 1 per device. distplan's pp counts devices: PP = pp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "distplan/planner/error.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/simulator/plan.h"
#include "distplan/simulator/schedule.h"
#include "distplan/simulator/schedule_io.h"
#include "distplan/simulator/simulate.h"
#include "sim_fixtures.h"

namespace distplan::sim {
namespace {

using testing::chunk_costs;
using testing::pipeline;
using testing::uniform_estimate;

TEST(DualPipe, ProgramsPassTheCheckerAndCountAsTheSource) {
  for (Count p = 2; p <= 8; p += 2) {
    for (Count m = 2 * p; m <= 3 * p + 4; m += 2) {
      const SchedulePrograms prog = make_dualpipe(p, m);
      EXPECT_TRUE(prog.bidirectional);
      EXPECT_FALSE(prog.v_shape);
      EXPECT_NO_THROW(check_program(prog)) << "p " << p << " m " << m;
      const Count n = p / 2;
      for (Count r = 0; r < p; ++r) {
        SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m) + " r " +
                     std::to_string(r));
        const auto& a = prog.programs[static_cast<std::size_t>(r)];
        const Count h = std::min(r, p - 1 - r);
        // Split backwards (each with a W of its own): step 3 (n - h - 1), step 6 (h + 1 of its
        // 2(h + 1) backwards: from the middle iteration on), step 7 (n - h - 1); step 8 pops the
        // h + 1 left. Pairs: step 4 two per iteration, m/2 - p + h + 1 of them, the middle
        // stages' (h = n - 1) first not overlapped; step 5 one each, n - h - 1.
        const Count split = 2 * (n - h - 1) + (h + 1);
        const Count pairs = 2 * (m / 2 - p + h + 1) - (h == n - 1 ? 1 : 0) + (n - h - 1);
        Count w = 0, overlapped = 0, f0 = 0, f1 = 0;
        for (const Action& x : a) {
          w += x.op == Op::backward_weight;
          overlapped += x.overlap_next;
          if (x.op == Op::forward) (x.chunk == 0 ? f0 : f1) += 1;
          // Each micro-batch runs in its direction's chunk only.
          EXPECT_EQ(x.chunk, x.microbatch < m / 2 ? 0 : 1) << action_to_string(x);
        }
        // m/2 micro-batches in each direction: m forwards, m backwards, and the W's.
        EXPECT_EQ(static_cast<Count>(a.size()), 2 * m + split);
        EXPECT_EQ(w, split);
        EXPECT_EQ(overlapped, pairs);
        EXPECT_EQ(f0, m / 2);
        EXPECT_EQ(f1, m / 2);
        // Step 1: 2(n - h - 1) forwards of phase 0: the forward direction (chunk 0, from
        // micro-batch 0) on the first half of the stages, the reverse one (chunk 1, from
        // micro-batch m/2) on the second. Step 2 then alternates the two phases.
        const Count phase0 = r < n ? 0 : 1;
        for (Count i = 0; i < 2 * (n - h - 1); ++i) {
          EXPECT_EQ(a[static_cast<std::size_t>(i)],
                    (Action{Op::forward, static_cast<int>(phase0 * (m / 2) + i),
                            static_cast<int>(phase0), false}));
        }
        const Action second = a[static_cast<std::size_t>(2 * (n - h - 1) + 1)];
        EXPECT_EQ(second, (Action{Op::forward, static_cast<int>((1 - phase0) * (m / 2)),
                                  static_cast<int>(1 - phase0), false}));
        // Step 8: the program ends with the h + 1 deferred weight passes.
        for (Count i = 0; i < h + 1; ++i)
          EXPECT_EQ(a[a.size() - 1 - static_cast<std::size_t>(i)].op, Op::backward_weight);
      }
    }
  }
}

TEST(DualPipe, RefusesWhatTheSourceAsserts) {
  // dualpipe.py asserts num_ranks % 2 == 0, num_chunks % 2 == 0, num_chunks >= num_ranks * 2.
  for (auto [p, m] : {std::pair<Count, Count>{3, 6}, {4, 7}, {4, 6}, {1, 2}}) {
    try {
      (void)make_dualpipe(p, m);
      ADD_FAILURE() << "p " << p << " m " << m << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), "/parallel/schedule") << p << " " << m;
    }
  }
  EXPECT_NO_THROW((void)make_dualpipe(4, 8));
  EXPECT_NO_THROW((void)make_dualpipe(2, 4));
  // Through the scenario, at the same path: odd pp, too few or an odd number of micro-batches.
  auto doc = [](int pp, int gbs) {
    return nlohmann::json{{"model", {{"preset", "llama2-7b"}, {"num_layers", 12}}},
                          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", pp}}},
                          {"training",
                           {{"framework", "generic"},
                            {"seq_length", 256},
                            {"global_batch_size", gbs},
                            {"micro_batch_size", 1}}},
                          {"parallel", {{"pp", pp}, {"schedule", "dualpipe"}}}};
  };
  for (auto [pp, gbs] : {std::pair<int, int>{3, 12}, {4, 6}, {4, 9}}) {
    try {
      (void)estimate(scenario_from_json(doc(pp, gbs)));
      ADD_FAILURE() << "pp " << pp << " gbs " << gbs << " was planned";
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), "/parallel/schedule") << pp << " " << gbs << ": " << e.what();
    }
  }
  EXPECT_NO_THROW((void)estimate(scenario_from_json(doc(4, 8))));
  // What the planner does not model is refused at its field: ZeRO-2/3 (per-micro-batch reductions
  // of two copies), tied embeddings (four matrices), and a virtual_stages other than the implied 2.
  auto refused = [&](nlohmann::json d, const char* path) {
    try {
      (void)scenario_from_json(d);
      ADD_FAILURE() << path << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), path) << e.what();
    }
  };
  // Model stages of unequal size plan (pipeline_split.h): 10 layers over 4 model stages.
  auto d = doc(4, 8);
  d["model"]["num_layers"] = 10;
  EXPECT_NO_THROW((void)estimate(scenario_from_json(d)));
  d = doc(4, 16);  // dp 2: m = 8
  d["parallel"]["zero_stage"] = 2;
  d["parallel"]["dp"] = 2;
  d["cluster"]["num_gpus"] = 8;
  refused(d, "/parallel/zero_stage");
  d = doc(4, 8);
  d["model"]["tied_embeddings"] = true;
  refused(d, "/model/tied_embeddings");
  d = doc(4, 8);
  d["parallel"]["virtual_stages"] = 3;
  refused(d, "/parallel/virtual_stages");
}

TEST(DualPipe, ProgramsRoundTripThroughScheduleFilesAndWrongDirectionsAreRefused) {
  const SchedulePrograms prog = make_dualpipe(4, 10);
  const nlohmann::json j = schedule_to_json(prog);
  EXPECT_EQ(j.at("placement"), "bidirectional");
  EXPECT_EQ(schedule_from_json(j), prog);
  // Micro-batch 0 runs in the forward direction (chunk 0): running it through chunk 1 is refused
  // at that action.
  SchedulePrograms bad = make_dualpipe(2, 4);
  bad.programs[0][0].chunk = 1;
  try {
    check_program(bad);
    FAIL() << "a micro-batch in the wrong direction was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/stages/0/0");
  }
  // Swapping two stages' programs breaks the directions' order: a deadlock (or a missing pass).
  SchedulePrograms swapped = make_dualpipe(4, 8);
  std::swap(swapped.programs[0], swapped.programs[1]);
  EXPECT_THROW(check_program(swapped), InputError);
}

// The bubble: the idle time of the device that idles most (PP - 1 F&B-free devices run the
// same work, m/2 micro-batches in each direction through two model stages).
double largest_idle(const SimResult& r) {
  double idle = 0;
  for (const StageResult& st : r.stages) idle = std::max(idle, r.step_seconds - st.busy_seconds);
  return idle;
}

TEST(DualPipe, BubbleIsTheReadmes) {
  // README: bubble (PP/2 - 1)(F&B + B - 3W), B the whole backward of a chunk (B_in + W), F&B the
  // overlapped pair, PP = p devices. Swept as DualPipeV's test: forward and input-gradient pass
  // of equal time (the README's drawing), W from 0 to F, F&B from a whole backward up to
  // F + B (nothing hidden).
  for (Count p = 2; p <= 8; p += 2) {
    for (Count m : {2 * p, 2 * p + 4, 4 * p}) {
      for (double f : {1.0, 2.0}) {
        for (double w : {0.0, 0.5 * f, f}) {
          const double whole = f + f + w;  // F + B_in + W of a chunk
          for (double hide : {1.0, 0.85, 0.7, 0.6}) {
            const double fb = hide * whole;
            if (fb < f + w) continue;  // shorter than a whole backward: outside the form
            const SimResult r = simulate(pipeline(p, m, Schedule::dualpipe, 2), uniform_estimate(p),
                                         chunk_costs(f, f, w, fb));
            const double readme = static_cast<double>(p / 2 - 1) * (fb + (f + w) - 3 * w);
            EXPECT_NEAR(largest_idle(r), readme, 1e-9)
                << "p " << p << " m " << m << " F " << f << " W " << w << " F&B " << fb;
          }
        }
      }
    }
  }
}

TEST(DualPipe, ActivationsArePpPlusOneChunksOnEveryDevice) {
  // README: activations PP + 1 per device (chunks of one model stage); the planner's count.
  for (Count p = 2; p <= 8; p += 2) {
    for (Count m : {2 * p, 3 * p + 2}) {
      const SimResult r = simulate(pipeline(p, m, Schedule::dualpipe, 2),
                                   uniform_estimate(p, 1 << 20), chunk_costs(1, 1, 1, 2.5));
      for (const StageResult& st : r.stages) {
        EXPECT_EQ(st.peak_inflight_chunks, p + 1) << "p " << p << " m " << m;
        // A chunk's share: half the device's bytes per micro-batch (1 MiB over two stages).
        EXPECT_EQ(st.peak_activation_bytes, (p + 1) * (1 << 19)) << "p " << p << " m " << m;
        EXPECT_EQ(inflight_chunks(Schedule::dualpipe, p, 2, st.stage, m), p + 1);
      }
    }
  }
}

TEST(DualPipe, BothDirectionsCrossEveryLinkOnce) {
  // With a p2p time the path of each direction crosses p - 1 links: the step of a zero-compute
  // run is the two directions' sends on their own links, in parallel.
  for (Count p : {2, 4, 6}) {
    const Count m = 2 * p;
    const SimResult r = simulate(pipeline(p, m, Schedule::dualpipe, 2), uniform_estimate(p),
                                 chunk_costs(1, 1, 0.5, 2.0, 0.25));
    const SimResult q = simulate(pipeline(p, m, Schedule::dualpipe, 2), uniform_estimate(p),
                                 chunk_costs(1, 1, 0.5, 2.0, 0.0));
    EXPECT_GT(r.step_seconds, q.step_seconds) << p;
    // Each stage sends m/2 activations and m/2 gradients of each direction it forwards, but
    // the ends of each direction send one less kind: sends per stage on the two links.
    for (std::size_t s = 0; s < r.stages.size(); ++s) {
      const Count ends = (s == 0) + (s + 1 == r.stages.size());
      EXPECT_NEAR(r.stages[s].send_seconds, 0.25 * static_cast<double>(m * (2 - ends)), 1e-12)
          << "p " << p << " stage " << s;
    }
  }
}

nlohmann::json llama(const char* schedule, int pp, int gbs = 32, int zero = 1) {
  return nlohmann::json{
      {"model", {{"preset", "llama2-7b"}, {"num_layers", 16}}},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2 * pp}}},
      {"training",
       {{"framework", "generic"},
        {"seq_length", 256},
        {"global_batch_size", gbs},
        {"micro_batch_size", 1}}},
      {"parallel", {{"pp", pp}, {"dp", 2}, {"zero_stage", zero}, {"schedule", schedule}}}};
}

TEST(DualPipe, ParametersAreTwoModelStagesOfOneFOneB) {
  // README: 2x parameters per device against 1F1B over the same PP stages on PP devices. By
  // construction (dualpipe.py's example loads full_modules[rank] and full_modules[pp-1-rank]):
  // stage s holds exactly 1F1B's stages s and p - 1 - s, the ends both an embedding and a head.
  for (int p : {2, 4, 8}) {
    const Estimate dual = estimate(scenario_from_json(llama("dualpipe", p)));
    const Estimate one = estimate(scenario_from_json(llama("1f1b", p)));
    for (int s = 0; s < p; ++s) {
      const auto& d = dual.memory.stages[static_cast<std::size_t>(s)];
      const auto& a = one.memory.stages[static_cast<std::size_t>(s)];
      const auto& b = one.memory.stages[static_cast<std::size_t>(p - 1 - s)];
      EXPECT_EQ(d.parameters, a.parameters + b.parameters) << "p " << p << " stage " << s;
      EXPECT_EQ(d.weights_bytes, a.weights_bytes + b.weights_bytes) << "p " << p << " " << s;
      EXPECT_EQ(d.num_layers, 2 * 16 / p);
    }
    // A stage with neither end: exactly twice (the README's column).
    if (p > 2) {
      EXPECT_EQ(dual.memory.stages[1].parameters, 2 * one.memory.stages[1].parameters);
    }
  }
}

TEST(DualPipe, CommunicationIsBothDirectionsAndTheMirrorSum) {
  // Per step: stage s sends m/2 activations and m/2 gradients of each direction it does not end
  // (the ends one direction's each way), and once its whole gradient to the stage holding the
  // other copy of its model stages (ZeRO-1: the full gradients, 2 bytes each in bf16), one send
  // per unit: its 2 L / p = 8 layers, and the embedding and the LM head on the end stages.
  const Scenario s = scenario_from_json(llama("dualpipe", 4, 16));
  const Estimate e = estimate(s);
  const Count m = s.num_microbatches();
  ASSERT_EQ(m, 8);
  for (int st = 0; st < 4; ++st) {
    Count acts = 0, grads = 0, mirror_calls = 0;
    Bytes mirror = 0;
    for (const Collective& c : stage_communication(s, st)) {
      if (c.purpose == Traffic::activations_forward) acts = c.calls_per_step;
      if (c.purpose == Traffic::gradients_backward) grads = c.calls_per_step;
      if (c.purpose == Traffic::mirror_gradients) {
        mirror_calls += c.calls_per_step;
        mirror += c.bytes_per_call * c.calls_per_step;
      }
    }
    const Count ends = (st == 0) + (st == 3);
    EXPECT_EQ(acts, m / 2 * (2 - ends)) << st;
    EXPECT_EQ(grads, m / 2 * (2 - ends)) << st;
    EXPECT_EQ(mirror_calls, 2 * 16 / 4 + 2 * ends) << st;
    EXPECT_EQ(mirror, e.memory.stages[static_cast<std::size_t>(st)].gradients_bytes) << st;
  }
}

TEST(DualPipe, PlanIsTheWalkAndItsActivationsTheOrdersPeak) {
  // Llama-2-7B, tp 2, pp 4, dp 2, ZeRO-1, sequence parallel: the plan's step is the walk's, the
  // closed form bounds it, and the in-flight sets and bytes are the order's peak.
  nlohmann::json j = nlohmann::json::parse(R"({
      "model": "llama2-7b",
      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
      "training": {"seq_length": 4096, "global_batch_size": 64, "framework": "generic"},
      "parallel": {"tp": 2, "pp": 4, "zero_stage": 1, "sequence_parallel": true,
                   "schedule": "dualpipe"}})");
  const Scenario s = scenario_from_json(j);
  const Estimate e = estimate(s);
  const SimResult r = simulate(s, e);
  EXPECT_EQ(plan(s).time.step_seconds, r.step_seconds);
  EXPECT_LE(e.time.step_seconds, r.step_seconds);
  for (std::size_t k = 0; k < r.stages.size(); ++k) {
    EXPECT_EQ(e.memory.stages[k].inflight_chunks, r.stages[k].peak_inflight_chunks) << k;
    EXPECT_EQ(e.memory.stages[k].activations_bytes, r.stages[k].peak_activation_bytes) << k;
  }
}

}  // namespace
}  // namespace distplan::sim
