// Schedule generators and the program checker (docs/simulator.md, "Schedules").
#include "distplan/simulator/schedule.h"

#include <algorithm>
#include <array>
#include <deque>
#include <string>

#include <fmt/format.h>

#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/v_schedule.h"

namespace distplan::sim {

std::string_view to_string(Op op) noexcept {
  switch (op) {
    case Op::forward:
      return "forward";
    case Op::backward:
      return "backward";
    case Op::backward_input:
      return "backward_input";
    case Op::backward_weight:
      return "backward_weight";
  }
  return "?";
}

std::string action_to_string(const Action& a) {
  std::string_view letter = "F";
  switch (a.op) {
    case Op::forward:
      letter = "F";
      break;
    case Op::backward:
      letter = "B";
      break;
    case Op::backward_input:
      letter = "BI";
      break;
    case Op::backward_weight:
      letter = "W";
      break;
  }
  // "&" marks a forward overlapped with the next action (an F&B pair).
  const std::string_view pair = a.overlap_next ? "&" : "";
  if (a.chunk == 0) return fmt::format("{}{}{}", letter, a.microbatch, pair);
  return fmt::format("{}{}.{}{}", letter, a.microbatch, a.chunk, pair);
}

Count SchedulePrograms::virtual_stage(Count stage, Count chunk) const noexcept {
  if (bidirectional) return dualpipe_model_stage(stages, stage, chunk);
  return virtual_stage_of(v_shape, stages, stage, chunk);
}

StageChunk SchedulePrograms::locate(Count vs, Count chunk) const noexcept {
  if (bidirectional) return dualpipe_locate(stages, vs, chunk);
  return locate_virtual_stage(v_shape, stages, vs);
}

bool SchedulePrograms::runs(Count mb, Count chunk) const noexcept {
  return !bidirectional || dualpipe_direction(microbatches, mb) == chunk;
}

namespace {

SchedulePrograms empty_programs(Count p, Count m, Count v) {
  DISTPLAN_CHECK(p >= 1 && m >= 1 && v >= 1, "a schedule needs p, m, v >= 1");
  SchedulePrograms out;
  out.stages = p;
  out.microbatches = m;
  out.virtual_stages = v;
  out.programs.resize(static_cast<std::size_t>(p));
  return out;
}

Action act(Op op, Count mb, Count chunk = 0) {
  return Action{op, static_cast<std::int32_t>(mb), static_cast<std::int32_t>(chunk), false};
}

// Stage s of a split-backward 1F1B family schedule: `warmup` forwards, then (F, B) pairs (B and
// its due W before F when `backward_first`), then the remaining B; the weight pass of micro-batch k
// runs once `defer` further input-gradient passes have run (k + defer + 1 B's done), and the
// deferred ones drain at the end.
std::vector<Action> split_backward_stage(Count m, Count warmup, Count defer, bool backward_first) {
  std::vector<Action> prog;
  prog.reserve(static_cast<std::size_t>(3 * m));
  Count nf = 0, nb = 0, nw = 0;
  auto backward = [&] {
    prog.push_back(act(Op::backward_input, nb++));
    if (nb - nw > defer) prog.push_back(act(Op::backward_weight, nw++));
  };
  for (; nf < warmup; ++nf) prog.push_back(act(Op::forward, nf));
  while (nf < m) {
    if (backward_first) {
      backward();
      prog.push_back(act(Op::forward, nf++));
    } else {
      prog.push_back(act(Op::forward, nf++));
      backward();
    }
  }
  while (nb < m) backward();
  while (nw < m) prog.push_back(act(Op::backward_weight, nw++));
  return prog;
}

}  // namespace

SchedulePrograms make_gpipe(Count p, Count m) {
  SchedulePrograms out = empty_programs(p, m, 1);
  for (auto& prog : out.programs) {
    prog.reserve(static_cast<std::size_t>(2 * m));
    for (Count k = 0; k < m; ++k) prog.push_back(act(Op::forward, k));
    for (Count k = m - 1; k >= 0; --k) prog.push_back(act(Op::backward, k));
  }
  return out;
}

SchedulePrograms make_1f1b(Count p, Count m) {
  SchedulePrograms out = empty_programs(p, m, 1);
  for (Count s = 0; s < p; ++s) {
    auto& prog = out.programs[static_cast<std::size_t>(s)];
    prog.reserve(static_cast<std::size_t>(2 * m));
    const Count warmup = std::min(p - s - 1, m);
    for (Count k = 0; k < warmup; ++k) prog.push_back(act(Op::forward, k));
    for (Count k = 0; k < m - warmup; ++k) {
      prog.push_back(act(Op::forward, warmup + k));
      prog.push_back(act(Op::backward, k));
    }
    for (Count k = m - warmup; k < m; ++k) prog.push_back(act(Op::backward, k));
  }
  return out;
}

SchedulePrograms make_interleaved_1f1b(Count p, Count m, Count v) {
  if (v == 1) return make_1f1b(p, m);
  if (m % p != 0) {
    throw InputError("/parallel/schedule",
                     fmt::format("interleaved_1f1b needs the number of micro-batches per step "
                                 "(m = global_batch_size / (micro_batch_size * dp) = {}) to be a "
                                 "multiple of pp = {}, as Megatron-LM requires",
                                 m, p));
  }
  SchedulePrograms out = empty_programs(p, m, v);
  const Count total = m * v;
  // Megatron-LM's get_model_chunk_id and per-chunk FIFO micro-batch order: virtual micro-batch k
  // belongs to group k / (p v); inside the group, p consecutive ones share a chunk.
  auto chunk_of = [&](Count k, bool forward) {
    const Count c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](Count k) { return (k / (p * v)) * p + k % p; };
  for (Count s = 0; s < p; ++s) {
    auto& prog = out.programs[static_cast<std::size_t>(s)];
    prog.reserve(static_cast<std::size_t>(2 * total));
    // get_pp_rank_microbatches in NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py
    // (commit 00611e6eeb0b09b5ee074750956855215ddbd67f): (p - s - 1) * 2 + (v - 1) * N warm-up
    // forwards with N = microbatch_group_size_per_vp_stage (default p), capped at m * v. Older
    // versions ran every forward first when m == p; the current code has no such case.
    const Count warmup = std::min((p - s - 1) * 2 + (v - 1) * p, total);
    auto forward = [&](Count k) {
      prog.push_back(act(Op::forward, microbatch_of(k), chunk_of(k, true)));
    };
    auto backward = [&](Count k) {
      prog.push_back(act(Op::backward, microbatch_of(k), chunk_of(k, false)));
    };
    for (Count k = 0; k < warmup; ++k) forward(k);
    for (Count k = 0; k < total - warmup; ++k) {
      forward(warmup + k);
      backward(k);
    }
    for (Count k = total - warmup; k < total; ++k) backward(k);
  }
  return out;
}

SchedulePrograms make_zb_h1(Count p, Count m) {
  SchedulePrograms out = empty_programs(p, m, 1);
  for (Count s = 0; s < p; ++s)
    out.programs[static_cast<std::size_t>(s)] =
        split_backward_stage(m, std::min(p - s - 1, m), s, false);
  return out;
}

SchedulePrograms make_zb_h2(Count p, Count m) {
  SchedulePrograms out = empty_programs(p, m, 1);
  for (Count s = 0; s < p; ++s)
    out.programs[static_cast<std::size_t>(s)] =
        split_backward_stage(m, std::min(2 * (p - s) - 1, m), 2 * s, true);
  return out;
}

namespace {

// The planner's V order (v_schedule.h) as schedule programs: one truth for the order the
// simulator runs and the planner times.
SchedulePrograms v_programs(Schedule kind, Count p, Count m) {
  SchedulePrograms out = empty_programs(p, m, 2);
  out.v_shape = true;
  const VOrder order = v_schedule_order(kind, p, m);
  for (Count s = 0; s < p; ++s) {
    auto& prog = out.programs[static_cast<std::size_t>(s)];
    prog.reserve(order[static_cast<std::size_t>(s)].size());
    for (const VPass& x : order[static_cast<std::size_t>(s)]) {
      const Op op = x.pass == ZbPass::forward          ? Op::forward
                    : x.pass == ZbPass::backward_input ? Op::backward_input
                                                       : Op::backward_weight;
      prog.push_back(act(op, x.microbatch, x.chunk));
    }
  }
  return out;
}

}  // namespace

SchedulePrograms make_zb_v(Count p, Count m) {
  return v_programs(Schedule::zb_v, p, m);
}

SchedulePrograms make_v_half(Count p, Count m) {
  return v_programs(Schedule::v_half, p, m);
}

SchedulePrograms make_v_min(Count p, Count m) {
  return v_programs(Schedule::v_min, p, m);
}

SchedulePrograms make_dualpipe_v(Count p, Count m) {
  if (m < 2 * p) {
    throw InputError("/parallel/schedule",
                     fmt::format("dualpipe_v needs at least 2*pp = {} micro-batches per step, as "
                                 "DualPipeV asserts (num_chunks >= num_ranks * 2); the step has {}",
                                 2 * p, m));
  }
  SchedulePrograms out = empty_programs(p, m, 2);
  out.v_shape = true;
  for (Count r = 0; r < p; ++r) {
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(static_cast<std::size_t>(6 * m));
    Count f[2] = {0, 0}, b[2] = {0, 0};
    std::deque<Action> weights;  // deferred W, first in first out (WeightGradStore)
    auto fwd = [&](Count c) { prog.push_back(act(Op::forward, f[c]++, c)); };
    auto bwd = [&](Count c, bool split) {
      if (split) weights.push_back(act(Op::backward_weight, b[c], c));
      prog.push_back(act(split ? Op::backward_input : Op::backward, b[c]++, c));
    };
    auto wgt = [&] {
      prog.push_back(weights.front());
      weights.pop_front();
    };
    // The forward of an F&B pair, overlapped with the backward pushed right after it.
    auto pair = [&](Count fc, Count bc) {
      fwd(fc);
      prog.back().overlap_next = true;
      bwd(bc, false);
    };
    for (Count i = 0; i < 2 * (p - r - 1); ++i) fwd(0);
    for (Count i = 0; i < r + 1; ++i) fwd(0), fwd(1);
    for (Count i = 0; i < p - r - 1; ++i) bwd(1, true), wgt(), fwd(1);
    for (Count i = 0; i < m - 2 * p + r + 1; ++i) {
      if (i == 0 && r == p - 1) {
        // The last rank does not overlap its first F0 and B1 "to further reduce bubble size".
        fwd(0), bwd(1, false);
      } else {
        pair(0, 1);
      }
      pair(1, 0);
    }
    for (Count i = 0; i < p - r - 1; ++i) bwd(1, false), pair(1, 0);
    bool split = false;
    for (Count i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      bwd(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      bwd(0, split);
    }
    for (Count i = 0; i < p - r - 1; ++i) wgt(), bwd(0, true);
    while (!weights.empty()) wgt();
    DISTPLAN_CHECK(f[0] == m && f[1] == m && b[0] == m && b[1] == m,
                   "DualPipeV runs every pass of every micro-batch once");
  }
  return out;
}

SchedulePrograms make_zb_auto(Count m, const std::vector<ZbAutoStage>& stages, Seconds p2p) {
  const ZbAutoSchedule z =
      zb_auto_schedule(m, stages, p2p, "/parallel/zb_memory_limit_microbatches");
  SchedulePrograms out = empty_programs(static_cast<Count>(stages.size()), m, 1);
  for (std::size_t s = 0; s < stages.size(); ++s) {
    auto& prog = out.programs[s];
    prog.reserve(z.order[s].size());
    for (const ZbAutoPass& x : z.order[s]) {
      const Op op = x.pass == ZbPass::forward          ? Op::forward
                    : x.pass == ZbPass::backward_input ? Op::backward_input
                                                       : Op::backward_weight;
      prog.push_back(act(op, x.microbatch));
    }
  }
  return out;
}

SchedulePrograms make_schedule(Schedule kind, Count p, Count m, Count v) {
  if (two_chunks(kind) && v != 2) {
    throw InputError("/parallel/virtual_stages",
                     fmt::format("schedule {} places two chunks on each stage; virtual_stages "
                                 "must be 2, not {}",
                                 to_string(kind), v));
  }
  if (v != 1 && kind != Schedule::interleaved_1f1b && !two_chunks(kind)) {
    throw InputError("/parallel/virtual_stages",
                     fmt::format("virtual_stages = {} needs schedule interleaved_1f1b", v));
  }
  switch (kind) {
    case Schedule::gpipe:
      return make_gpipe(p, m);
    case Schedule::one_f_one_b:
      return make_1f1b(p, m);
    case Schedule::interleaved_1f1b:
      return make_interleaved_1f1b(p, m, v);
    case Schedule::zb_h1:
      return make_zb_h1(p, m);
    case Schedule::zb_h2:
      return make_zb_h2(p, m);
    case Schedule::zb_v:
      return make_zb_v(p, m);
    case Schedule::v_half:
      return make_v_half(p, m);
    case Schedule::v_min:
      return make_v_min(p, m);
    case Schedule::dualpipe_v:
      return make_dualpipe_v(p, m);
    case Schedule::dualpipe:
      return make_dualpipe(p, m);
    case Schedule::zb_auto:
      break;  // needs the stage times: make_zb_auto
  }
  throw InputError("/parallel/schedule",
                   kind == Schedule::zb_auto
                       ? std::string("zb_auto's order depends on the stage times; it is built "
                                     "with them (simulate, make_zb_auto)")
                       : fmt::format("schedule {} has no program generator", to_string(kind)));
}

// ---- checker ---------------------------------------------------------------------------------

namespace {

std::string where(std::size_t s, std::size_t i) {
  return fmt::format("/stages/{}/{}", s, i);
}

}  // namespace

void check_program(const SchedulePrograms& prog) {
  const Count p = prog.stages, m = prog.microbatches, v = prog.virtual_stages;
  if (p < 1) throw InputError("/stages", "a schedule needs at least one stage");
  if (m < 1) throw InputError("/microbatches", "a schedule needs at least one micro-batch");
  if (v < 1) throw InputError("/virtual_stages", "virtual_stages must be at least 1");
  if (static_cast<Count>(prog.programs.size()) != p) {
    throw InputError("/stages", fmt::format("the schedule has {} stage programs but the pipeline "
                                            "has {} stages",
                                            prog.programs.size(), p));
  }
  const auto pairs = static_cast<std::size_t>(m * v);
  auto slot = [&](const Action& a) { return static_cast<std::size_t>(a.chunk * m + a.microbatch); };

  // Local checks: ranges, duplicates, order of F / B / BI / W of each (micro-batch, chunk).
  enum : std::uint8_t { kF = 1, kB = 2, kBI = 4, kW = 8 };
  std::vector<std::uint8_t> seen(pairs);
  for (std::size_t s = 0; s < prog.programs.size(); ++s) {
    std::fill(seen.begin(), seen.end(), 0);
    const auto& actions = prog.programs[s];
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      const std::string name = action_to_string(a);
      if (a.microbatch < 0 || a.microbatch >= m) {
        throw InputError(where(s, i),
                         fmt::format("stage {} action {} ({}): micro-batch {} is out of "
                                     "range [0, {}); its dependency can never be met",
                                     s, i, name, a.microbatch, m));
      }
      if (a.chunk < 0 || a.chunk >= v) {
        throw InputError(where(s, i),
                         fmt::format("stage {} action {} ({}): chunk {} is out of range "
                                     "[0, {}); its dependency can never be met",
                                     s, i, name, a.chunk, v));
      }
      if (!prog.runs(a.microbatch, a.chunk)) {
        throw InputError(
            where(s, i),
            fmt::format("stage {} action {} ({}): micro-batch {} runs in direction "
                        "{} (DualPipe: the first m/2 in chunk 0, the rest in chunk "
                        "1), not through chunk {}",
                        s, i, name, a.microbatch, dualpipe_direction(m, a.microbatch), a.chunk));
      }
      std::uint8_t& st = seen[slot(a)];
      auto fail = [&](const std::string& what) {
        throw InputError(where(s, i), fmt::format("stage {} action {} ({}): {}", s, i, name, what));
      };
      if (a.overlap_next) {
        // An F&B pair: a forward and the backward right after it, of another chunk or micro-batch.
        if (a.op != Op::forward) fail("only a forward can be overlapped with the next action");
        if (i + 1 >= actions.size() ||
            (actions[i + 1].op != Op::backward && actions[i + 1].op != Op::backward_input)) {
          fail("an overlapped forward must be followed by a backward (an F&B pair)");
        }
        if (actions[i + 1].microbatch == a.microbatch && actions[i + 1].chunk == a.chunk)
          fail("an F&B pair cannot overlap a micro-batch's forward with its own backward");
      }
      switch (a.op) {
        case Op::forward:
          if (st & kF) fail("duplicated forward of this micro-batch");
          st |= kF;
          break;
        case Op::backward:
          if (!(st & kF)) fail("backward before its forward on this stage");
          if (st & (kB | kBI | kW)) fail("duplicated backward of this micro-batch");
          st |= kB;
          break;
        case Op::backward_input:
          if (!(st & kF)) fail("backward before its forward on this stage");
          if (st & (kB | kBI)) fail("duplicated backward of this micro-batch");
          st |= kBI;
          break;
        case Op::backward_weight:
          if (st & (kB | kW)) fail("duplicated weight-gradient pass of this micro-batch");
          if (!(st & kBI)) fail("weight-gradient pass before its input-gradient pass (BI)");
          st |= kW;
          break;
      }
    }
    for (std::size_t k = 0; k < pairs; ++k) {
      const std::uint8_t st = seen[k];
      const Action a{Op::forward, static_cast<std::int32_t>(k % static_cast<std::size_t>(m)),
                     static_cast<std::int32_t>(k / static_cast<std::size_t>(m))};
      if (!prog.runs(a.microbatch, a.chunk)) continue;
      std::string missing;
      if (!(st & kF))
        missing = "forward";
      else if (!(st & (kB | kBI)))
        missing = "backward";
      else if ((st & kBI) && !(st & kW))
        missing = "weight-gradient pass (W)";
      if (!missing.empty()) {
        throw InputError(fmt::format("/stages/{}", s),
                         fmt::format("stage {}: the {} of micro-batch {} chunk {} is missing", s,
                                     missing, a.microbatch, a.chunk));
      }
    }
  }

  // Deadlock: execute the dependency graph. fwd_done / bwd_done per (stage, chunk, micro-batch).
  const auto P = static_cast<std::size_t>(p);
  std::vector<std::uint8_t> fwd_done(P * pairs), bwd_done(P * pairs);
  std::vector<std::size_t> pc(P, 0);
  std::vector<std::uint8_t> queued(P, 1);
  std::deque<std::size_t> work;
  for (std::size_t s = 0; s < P; ++s) work.push_back(s);
  const Count last_virtual = prog.path_length() - 1;
  if ((prog.v_shape || prog.bidirectional) && v != 2) {
    throw InputError("/virtual_stages",
                     "a V-shape or bidirectional placement has exactly two "
                     "chunks per stage");
  }
  if (prog.v_shape && prog.bidirectional)
    throw InputError("/placement", "a placement is a V or bidirectional, not both");
  if (prog.bidirectional && (p % 2 != 0 || m % 2 != 0)) {
    throw InputError("/stages", fmt::format("a bidirectional placement needs an even number of "
                                            "stages and micro-batches (p = {}, m = {})",
                                            p, m));
  }
  // Stage and chunk of virtual stage vs on the path of chunk c's micro-batches (layout.h).
  auto at = [&](Count vs, Count c) { return prog.locate(vs, c); };
  auto index = [&](StageChunk sc, std::int32_t mb) {
    return static_cast<std::size_t>(sc.stage) * pairs + static_cast<std::size_t>(sc.chunk * m + mb);
  };
  auto runnable = [&](std::size_t s, const Action& a) {
    const Count vs = prog.virtual_stage(static_cast<Count>(s), a.chunk);
    switch (a.op) {
      case Op::forward:
        return vs == 0 || fwd_done[index(at(vs - 1, a.chunk), a.microbatch)] != 0;
      case Op::backward:
      case Op::backward_input:
        return vs == last_virtual || bwd_done[index(at(vs + 1, a.chunk), a.microbatch)] != 0;
      case Op::backward_weight:
        return true;
    }
    return false;
  };
  auto wake = [&](std::size_t s) {
    if (!queued[s]) {
      queued[s] = 1;
      work.push_back(s);
    }
  };
  while (!work.empty()) {
    const std::size_t s = work.front();
    work.pop_front();
    queued[s] = 0;
    const auto& actions = prog.programs[s];
    auto complete = [&](const Action& a) {
      const std::size_t k = s * pairs + slot(a);
      const Count vs = prog.virtual_stage(static_cast<Count>(s), a.chunk);
      if (a.op == Op::forward) {
        fwd_done[k] = 1;
        if (vs < last_virtual) wake(static_cast<std::size_t>(at(vs + 1, a.chunk).stage));
      } else if (a.op != Op::backward_weight) {
        bwd_done[k] = 1;
        if (vs > 0) wake(static_cast<std::size_t>(at(vs - 1, a.chunk).stage));
      }
    };
    while (pc[s] < actions.size() && runnable(s, actions[pc[s]])) {
      const Action& a = actions[pc[s]];
      // An F&B pair starts when both of its inputs are there (validated above: a next exists).
      if (a.overlap_next && !runnable(s, actions[pc[s] + 1])) break;
      ++pc[s];
      complete(a);
      if (a.overlap_next) complete(actions[pc[s]++]);
    }
  }
  // The message names the first few stuck stages and counts the rest: bounded at any p.
  constexpr std::size_t kListed = 8;
  std::string stuck;
  std::size_t first_stuck = P, n_stuck = 0;
  for (std::size_t s = 0; s < P; ++s) {
    if (pc[s] == prog.programs[s].size()) continue;
    if (first_stuck == P) first_stuck = s;
    if (++n_stuck > kListed) continue;
    if (!stuck.empty()) stuck += "; ";
    const Action& here = prog.programs[s][pc[s]];
    // A pair whose forward could run waits for its backward's gradient.
    const Action& a = here.overlap_next && runnable(s, here) ? prog.programs[s][pc[s] + 1] : here;
    const Count vs = prog.virtual_stage(static_cast<Count>(s), a.chunk);
    const Count from = a.op == Op::forward ? (vs > 0 ? at(vs - 1, a.chunk).stage : 0)
                                           : (vs < last_virtual ? at(vs + 1, a.chunk).stage : 0);
    stuck +=
        fmt::format("stage {} waits at action {} ({}) for the {} of stage {}", s, pc[s],
                    action_to_string(a), a.op == Op::forward ? "activation" : "gradient", from);
  }
  if (n_stuck > kListed) stuck += fmt::format("; and {} more stages", n_stuck - kListed);
  if (first_stuck != P) {
    throw InputError(where(first_stuck, pc[first_stuck]),
                     "deadlock: no stage can proceed: " + stuck);
  }
}

}  // namespace distplan::sim
