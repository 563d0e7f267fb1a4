// The step simulation: one compute stream per stage runs its program in order; a pass starts when
// its inputs have arrived (and, under ZeRO-3, its parameters are gathered); finished passes send
// activations / gradients over the link to the neighbour stage. docs/simulator.md, "Event model".
#include "distplan/simulator/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/overlap.h"
#include "distplan/simulator/engine.h"

namespace distplan::sim {

std::string_view to_string(SliceKind k) noexcept {
  switch (k) {
    case SliceKind::forward:
      return "forward";
    case SliceKind::backward:
      return "backward";
    case SliceKind::backward_input:
      return "backward_input";
    case SliceKind::backward_weight:
      return "backward_weight";
    case SliceKind::optimizer:
      return "optimizer";
    case SliceKind::send_activation:
      return "send_activation";
    case SliceKind::send_gradient:
      return "send_gradient";
    case SliceKind::grad_reduce:
      return "grad_reduce";
    case SliceKind::param_gather:
      return "param_gather";
    case SliceKind::zero3_gather:
      return "zero3_gather";
  }
  return "?";
}

std::string_view to_string(Track t) noexcept {
  switch (t) {
    case Track::compute:
      return "compute";
    case Track::send_next:
      return "send to next stage";
    case Track::send_prev:
      return "send to previous stage";
    case Track::dp:
      return "data-parallel comm";
    case Track::zero3:
      return "ZeRO-3 gather";
  }
  return "?";
}

bool stages_cross_nodes(const Scenario& s, Count stage_a, Count stage_b) noexcept {
  const Count per_stage = s.parallel.tp * s.parallel.dp;  // ranks of one stage (Megatron order)
  const Count gpn = s.cluster.gpus_per_node;
  if (gpn <= 0) return false;
  return (stage_a * per_stage) / gpn != (stage_b * per_stage) / gpn;
}

namespace {

/// Seconds and bytes of one chunk's passes on one stage (per action).
struct ChunkTimes {
  Seconds forward = 0, backward = 0, backward_input = 0, backward_weight = 0;
  Seconds tp_communication = 0;  // in-pass communication of a forward and a backward
  Seconds zero3_gather = 0;      // before each forward / backward(-input) pass
  Seconds grad_reduce = 0;       // per step (ZeRO-2/3: spread over the m micro-batches)
  Count grad_buckets = 1;
  Bytes bytes = 0;  // one (micro-batch, chunk) set: its layers, and the embedding's or head's
};

/// Seconds of each kind of task on one stage.
struct StageTimes {
  std::vector<ChunkTimes> chunk;  // [chunk]
  // An overlapped F&B pair with a whole backward (DualPipe) is given whole by a cost override;
  // otherwise (negative) it is the two passes with their in-pass communication overlapped.
  Seconds forward_backward = -1;
  Seconds p2p = 0;       // one send
  bool gathers = false;  // ZeRO-3: passes wait for their chunk's parameter gather
  Seconds param_gather = 0;
  Seconds first_forward = 0;  // one micro-batch's forward through the whole stage
  Seconds optimizer = 0;
  Bytes static_bytes = 0;          // allocated all step: model states, buffers, workspace
  Bytes backward_extra_bytes = 0;  // while a backward runs: recompute working set and transient
};

enum EventKind : std::uint32_t { kDone = 0, kArriveForward = 1, kArriveBackward = 2, kWake = 3 };

struct StageState {
  std::size_t pc = 0;
  bool busy = false;
  Action current{};
  bool current_pair = false;  // `current` and the next action run as one F&B pair
  EventTime current_start = 0;
  EventTime wake_at = -1;
  std::size_t gather_pc = std::numeric_limits<std::size_t>::max();
  EventTime gather_end = 0;
  EventTime first_start = -1;
  EventTime last_end = 0;
  Seconds busy_seconds = 0;
  Seconds slowdown_seconds = 0;  // of busy_seconds: overlap_penalty()
  Count inflight_chunks = 0, peak_chunks = 0;
  Count inflight_mbs = 0, peak_mbs = 0;
  Bytes inflight_bytes = 0, peak_bytes = 0;
  Bytes peak_backward_bytes = 0;  // live activations plus the backward's extra, at backward starts
  Resource send_next, send_prev, dp, zero3;
};

/// Storage reused across calls on one thread (the search calls simulate() many times).
struct Workspace {
  EventQueue queue;
  std::vector<StageState> stages;
  std::vector<std::uint8_t> fwd_ready, bwd_ready, alive;
  std::vector<std::int32_t> mb_refs;
  std::vector<std::size_t>
      last_wgrad;  // [stage * v + chunk]: position of its last W-producing pass
};

bool needs_gather(Op op) noexcept {
  return op != Op::backward_weight;
}

struct Run {
  const SchedulePrograms& prog;
  const std::vector<StageTimes>& times;
  bool overlap_grad_reduce;
  bool overlap_param_gather;
  bool per_microbatch_reduce;  // ZeRO-2/3: gradients are reduce-scattered after every micro-batch
  bool overlap_steps;          // steps_overlap(schedule): the step is the longest stage span
  bool gather_after_step;      // ZeRO-1/2 gather behind the next step's first forward
  double slowdown;             // assumptions.overlap_compute_slowdown (F&B pairs, hidden traffic)
  bool record;
  Workspace& ws;
  SimResult& out;  // trace and memory are appended when `record` (to `sink` when one is set)
  TraceSink* sink = nullptr;
  const std::atomic<bool>* cancel = nullptr;

  Count p = 0, m = 0, v = 0;
  std::size_t pairs = 0;
  Count last_virtual = 0;

  void init() {
    p = prog.stages;
    m = prog.microbatches;
    v = prog.virtual_stages;
    pairs = static_cast<std::size_t>(m * v);
    last_virtual = prog.path_length() - 1;
    const auto P = static_cast<std::size_t>(p);
    ws.queue.clear();
    ws.queue.reserve(4 * P + 16);
    ws.stages.assign(P, StageState{});
    ws.fwd_ready.assign(P * pairs, 0);
    ws.bwd_ready.assign(P * pairs, 0);
    ws.alive.assign(P * pairs, 0);
    ws.mb_refs.assign(P * static_cast<std::size_t>(m), 0);
    ws.last_wgrad.assign(P * static_cast<std::size_t>(v), 0);
    for (std::size_t s = 0; s < P; ++s) {
      const auto& actions = prog.programs[s];
      for (std::size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (a.op == Op::backward || a.op == Op::backward_weight)
          ws.last_wgrad[s * static_cast<std::size_t>(v) + static_cast<std::size_t>(a.chunk)] = i;
      }
    }
  }

  const ChunkTimes& chunk_times(std::size_t s, Count chunk) const noexcept {
    return times[s].chunk[static_cast<std::size_t>(chunk)];
  }

  Seconds duration(std::size_t s, const Action& a) const noexcept {
    const ChunkTimes& t = chunk_times(s, a.chunk);
    switch (a.op) {
      case Op::forward:
        return t.forward;
      case Op::backward:
        return t.backward;
      case Op::backward_input:
        return t.backward_input;
      case Op::backward_weight:
        return t.backward_weight;
    }
    return 0;
  }

  // An F&B pair: the forward with the next action, a whole backward or an input-gradient pass
  // (which leaves the weight pass, and its time, out of the pair). The two passes' in-pass
  // communication (TP collectives) hides behind each other's computation (overlap.h): half of
  // each chunk's, a forward's and a backward's share.
  Seconds pair_duration(std::size_t s, const Action& f, const Action& b) const noexcept {
    const ChunkTimes& x = chunk_times(s, f.chunk);
    const ChunkTimes& y = chunk_times(s, b.chunk);
    const Seconds whole =
        times[s].forward_backward >= 0
            ? times[s].forward_backward
            : overlapped_pair_seconds(x.forward + y.backward,
                                      (x.tp_communication + y.tp_communication) / 2, slowdown);
    return b.op == Op::backward ? whole : std::max(0.0, whole - y.backward_weight);
  }

  void trace(std::size_t s, Track track, SliceKind kind, const Action* a, EventTime start,
             Seconds dur) {
    const TraceEvent e{static_cast<std::int32_t>(s),
                       track,
                       kind,
                       a ? a->microbatch : -1,
                       a ? a->chunk : -1,
                       start,
                       dur};
    if (sink != nullptr) {
      sink->slice(e);
    } else {
      out.trace.push_back(e);
    }
  }

  void memory_sample(std::size_t s, EventTime t) {
    const MemorySample sample{static_cast<std::int32_t>(s), t, ws.stages[s].inflight_bytes};
    if (sink != nullptr) {
      sink->memory(sample);
    } else {
      out.memory.push_back(sample);
    }
  }

  // Saved activations of one (micro-batch, chunk) on stage s.
  Bytes pass_bytes(std::size_t s, Count chunk) const noexcept {
    return chunk_times(s, chunk).bytes;
  }

  void issue_gather(std::size_t s, std::size_t pos, EventTime now) {
    StageState& st = ws.stages[s];
    // An F&B pair gathers the parameters of both of its passes.
    const Action& a = prog.programs[s][pos];
    Seconds g = chunk_times(s, a.chunk).zero3_gather;
    if (a.overlap_next) g += chunk_times(s, prog.programs[s][pos + 1].chunk).zero3_gather;
    const EventTime start = st.zero3.submit(now, g);
    st.gather_pc = pos;
    st.gather_end = start + g;
    if (record) trace(s, Track::zero3, SliceKind::zero3_gather, &prog.programs[s][pos], start, g);
  }

  // Has the input of action `a` on stage s arrived (the activation of a forward, the gradient of
  // a backward; the first virtual stage and the loss need none)?
  bool input_ready(std::size_t s, const Action& a) const noexcept {
    const std::size_t k = s * pairs + static_cast<std::size_t>(a.chunk * m + a.microbatch);
    const Count vs = prog.virtual_stage(static_cast<Count>(s), a.chunk);
    if (a.op == Op::forward) return vs == 0 || ws.fwd_ready[k] != 0;
    if (a.op != Op::backward_weight) return vs == last_virtual || ws.bwd_ready[k] != 0;
    return true;
  }

  void try_start(std::size_t s, EventTime now) {
    StageState& st = ws.stages[s];
    const auto& actions = prog.programs[s];
    if (st.busy || st.pc == actions.size()) return;
    const Action a = actions[st.pc];
    const std::size_t k = s * pairs + static_cast<std::size_t>(a.chunk * m + a.microbatch);
    if (!input_ready(s, a)) return;
    // An F&B pair starts when the backward's gradient is there too (check_program: it exists).
    const bool pair = a.overlap_next;
    if (pair && !input_ready(s, actions[st.pc + 1])) return;
    const bool gathers = times[s].gathers;
    if (gathers && needs_gather(a.op)) {
      if (st.gather_pc != st.pc) issue_gather(s, st.pc, now);
      if (st.gather_end > now) {
        if (st.wake_at != st.gather_end) {
          st.wake_at = st.gather_end;
          ws.queue.push(st.gather_end, kWake, static_cast<std::uint32_t>(s), 0);
        }
        return;
      }
    }
    Seconds d = pair ? pair_duration(s, a, actions[st.pc + 1]) : duration(s, a);
    const Seconds lost = overlap_penalty(s, st.pc, pair, d);
    d += lost;
    st.slowdown_seconds += lost;
    st.busy = true;
    st.current = a;
    st.current_pair = pair;
    st.current_start = now;
    st.busy_seconds += d;
    if (st.first_start < 0) st.first_start = now;
    ws.queue.push(now + d, kDone, static_cast<std::uint32_t>(s), 0);
    if (record) {
      if (pair) {
        // Drawn as two slices sharing the pair's time in proportion to the passes alone.
        const Action& b = actions[st.pc + 1];
        const Seconds fa = duration(s, a), fb = duration(s, b);
        const Seconds df = fa + fb > 0 ? d * fa / (fa + fb) : 0.0;
        trace(s, Track::compute, SliceKind::forward, &a, now, df);
        trace(s, Track::compute, static_cast<SliceKind>(b.op), &b, now + df, d - df);
      } else {
        trace(s, Track::compute, static_cast<SliceKind>(a.op), &a, now, d);
      }
    }
    if (a.op == Op::forward && !ws.alive[k]) {
      ws.alive[k] = 1;
      if (++st.inflight_chunks > st.peak_chunks) st.peak_chunks = st.inflight_chunks;
      st.inflight_bytes += pass_bytes(s, a.chunk);
      st.peak_bytes = std::max(st.peak_bytes, st.inflight_bytes);
      if (ws.mb_refs[s * static_cast<std::size_t>(m) + static_cast<std::size_t>(a.microbatch)]++ ==
          0) {
        if (++st.inflight_mbs > st.peak_mbs) st.peak_mbs = st.inflight_mbs;
      }
      if (record) memory_sample(s, now);
    }
    if (a.op == Op::backward || a.op == Op::backward_input) {
      st.peak_backward_bytes =
          std::max(st.peak_backward_bytes, st.inflight_bytes + times[s].backward_extra_bytes);
    }
    // ZeRO-3 prefetch: the next pass's parameters are gathered while this one runs.
    const std::size_t next = st.pc + (pair ? 2 : 1);
    if (gathers && overlap_param_gather && next < actions.size() &&
        needs_gather(actions[next].op)) {
      issue_gather(s, next, now);
    }
  }

  // NCCL's kernels share the SMs with the pass they overlap, which runs overlap_compute_slowdown
  // slower for the communication it hides: the next pass's ZeRO-3 gather (prefetched while this
  // one runs) and the gradient reduction this pass's weight gradients start (overlap.h,
  // exposed_after_overlap: slowdown x min(communication, window)).
  Seconds overlap_penalty(std::size_t s, std::size_t pos, bool pair, Seconds d) const noexcept {
    if (slowdown <= 0 || d <= 0) return 0;
    const auto& actions = prog.programs[s];
    const std::size_t next = pos + (pair ? 2 : 1);
    Seconds comm = 0;
    if (overlap_param_gather && times[s].gathers && next < actions.size() &&
        needs_gather(actions[next].op)) {
      comm += chunk_times(s, actions[next].chunk).zero3_gather;
      if (actions[next].overlap_next && next + 1 < actions.size())
        comm += chunk_times(s, actions[next + 1].chunk).zero3_gather;
    }
    if (overlap_grad_reduce) {
      for (std::size_t i = pos; i < next; ++i) {
        const Action& a = actions[i];
        if (a.op != Op::backward && a.op != Op::backward_weight) continue;
        const Seconds reduce = chunk_times(s, a.chunk).grad_reduce;
        if (per_microbatch_reduce) {
          comm += reduce / static_cast<double>(m);
        } else if (i == ws.last_wgrad[s * static_cast<std::size_t>(v) +
                                      static_cast<std::size_t>(a.chunk)]) {
          comm += reduce;
        }
      }
    }
    return slowdown * std::min(comm, d);
  }

  void release(std::size_t s, const Action& a, EventTime now) {
    StageState& st = ws.stages[s];
    const std::size_t k = s * pairs + static_cast<std::size_t>(a.chunk * m + a.microbatch);
    if (!ws.alive[k]) return;
    ws.alive[k] = 0;
    --st.inflight_chunks;
    st.inflight_bytes -= pass_bytes(s, a.chunk);
    if (--ws.mb_refs[s * static_cast<std::size_t>(m) + static_cast<std::size_t>(a.microbatch)] == 0)
      --st.inflight_mbs;
    if (record) memory_sample(s, now);
  }

  // Gradient reduction of `amount` seconds in n buckets after a weight-gradient pass that ran
  // [start, end). With overlap, bucket i is ready at start + (i + 1)(end - start)/n (gradients
  // fill buckets as the pass runs) and the buckets reduce back to back on the DP stream; the last
  // one ends at max(free + n r, start + D/n + n r, start + D + r) with r = amount/n, D = end -
  // start (the latest of "bucket i ready, then it and the rest back to back" is at i = 0 or
  // i = n - 1). Without overlap all buckets are ready at `end`. docs/simulator.md.
  void reduce_gradients(std::size_t s, const Action& a, EventTime start, EventTime end,
                        Seconds amount) {
    StageState& st = ws.stages[s];
    if (amount <= 0) return;
    const double n = static_cast<double>(chunk_times(s, a.chunk).grad_buckets);
    const Seconds r = amount / n;
    EventTime first_ready = end, finish;
    if (overlap_grad_reduce) {
      const Seconds d = end - start;
      first_ready = start + d / n;
      finish = std::max({st.dp.free_at + amount, first_ready + amount, end + r});
    } else {
      finish = std::max(st.dp.free_at, end) + amount;
    }
    const EventTime slice_start = std::max(st.dp.free_at, first_ready);
    st.dp.free_at = finish;
    st.dp.busy_seconds += amount;
    if (record) trace(s, Track::dp, SliceKind::grad_reduce, &a, slice_start, finish - slice_start);
  }

  void send(std::size_t s, bool forward, const Action& a, EventTime now) {
    StageState& st = ws.stages[s];
    const Count vs = prog.virtual_stage(static_cast<Count>(s), a.chunk);
    const StageChunk to = prog.locate(forward ? vs + 1 : vs - 1, a.chunk);
    const auto dest = static_cast<std::size_t>(to.stage);
    // The V's turn (virtual stage p - 1 to p) stays on the GPU: no send (PyTorch's "V-schedule
    // special case", set_local_fwd_input / set_local_bwd_input in schedules.py).
    const Seconds d = prog.v_shape && dest == s ? 0.0 : times[s].p2p;
    const auto slot = static_cast<std::size_t>(to.chunk * m + a.microbatch);
    if (d <= 0) {
      // An instantaneous send: deliver now instead of through the queue. The receiver starts at
      // the same time either way (if it is busy, its own completion will start it), so the
      // timeline is unchanged and the zero-communication run needs half the events.
      (forward ? ws.fwd_ready : ws.bwd_ready)[dest * pairs + slot] = 1;
      try_start(dest, now);
      return;
    }
    Resource& link = forward ? st.send_next : st.send_prev;
    const EventTime start = link.submit(now, d);
    ws.queue.push(start + d, forward ? kArriveForward : kArriveBackward,
                  static_cast<std::uint32_t>(dest), static_cast<std::uint32_t>(slot));
    if (record) {
      trace(s, forward ? Track::send_next : Track::send_prev,
            forward ? SliceKind::send_activation : SliceKind::send_gradient, &a, start, d);
    }
  }

  void on_done(std::size_t s, EventTime now) {
    StageState& st = ws.stages[s];
    st.last_end = now;
    // An F&B pair completes both passes (forward first: its activation is sent first). The stage
    // stays busy until both are done, so a send to itself (the V's turn) cannot start the pair's
    // own backward; the try_start below starts whatever is next.
    const bool pair = st.current_pair;
    complete(s, st.current, st.pc++, now);
    if (pair) complete(s, prog.programs[s][st.pc], st.pc, now), ++st.pc;
    st.current_pair = false;
    st.busy = false;
    try_start(s, now);
  }

  void complete(std::size_t s, const Action a, std::size_t pos, EventTime now) {
    StageState& st = ws.stages[s];
    const Count vs = prog.virtual_stage(static_cast<Count>(s), a.chunk);
    switch (a.op) {
      case Op::forward:
        if (vs != last_virtual) send(s, true, a, now);
        break;
      case Op::backward:
      case Op::backward_input:
        // Release first: with one stage the gradient goes to this stage itself, and an
        // instantaneous send starts its next pass at once.
        if (a.op == Op::backward) release(s, a, now);
        if (vs != 0) send(s, false, a, now);
        break;
      case Op::backward_weight:
        release(s, a, now);
        break;
    }
    if (a.op == Op::backward || a.op == Op::backward_weight) {
      const Seconds reduce = chunk_times(s, a.chunk).grad_reduce;
      if (per_microbatch_reduce) {
        reduce_gradients(s, a, st.current_start, now, reduce / static_cast<double>(m));
      } else if (pos == ws.last_wgrad[s * static_cast<std::size_t>(v) +
                                      static_cast<std::size_t>(a.chunk)]) {
        reduce_gradients(s, a, st.current_start, now, reduce);
      }
    }
  }

  void run() {
    init();
    const auto P = static_cast<std::size_t>(p);
    for (std::size_t s = 0; s < P; ++s) try_start(s, 0);
    EventQueue& q = ws.queue;
    std::uint64_t until_check = kCancelCheckEvents;
    while (!q.empty()) {
      if (cancel != nullptr && --until_check == 0) {
        until_check = kCancelCheckEvents;
        if (cancel->load(std::memory_order_relaxed)) throw Cancelled();
      }
      const Event e = q.pop();
      const std::size_t s = e.target;
      switch (e.kind) {
        case kDone:
          on_done(s, e.time);
          break;
        case kArriveForward:
          ws.fwd_ready[s * pairs + e.payload] = 1;
          try_start(s, e.time);
          break;
        case kArriveBackward:
          ws.bwd_ready[s * pairs + e.payload] = 1;
          try_start(s, e.time);
          break;
        case kWake:
          ws.stages[s].wake_at = -1;
          try_start(s, e.time);
          break;
        default:
          break;
      }
    }
    out.events = q.events_processed();
    // After its last pass and its gradient reduction, each stage steps its optimizer on the
    // compute stream, then (ZeRO-1/2) all-gathers the updated parameters on the DP stream.
    out.stages.assign(P, StageResult{});
    Seconds step = 0, busy_total = 0;
    for (std::size_t s = 0; s < P; ++s) {
      StageState& st = ws.stages[s];
      DISTPLAN_CHECK(st.pc == prog.programs[s].size(), "a checked program cannot deadlock");
      const StageTimes& t = times[s];
      StageResult& r = out.stages[s];
      r.stage = static_cast<int>(s);
      r.first_start_seconds = st.first_start < 0 ? 0 : st.first_start;
      r.compute_end_seconds = st.last_end;
      r.span_idle_seconds = std::max(0.0, st.last_end - r.first_start_seconds - st.busy_seconds);
      const EventTime opt_start = std::max(st.last_end, st.dp.free_at);
      const EventTime opt_end = opt_start + t.optimizer;
      if (record && t.optimizer > 0)
        trace(s, Track::compute, SliceKind::optimizer, nullptr, opt_start, t.optimizer);
      // ZeRO-1/2's parameter all-gather: after the optimizer on the DP stream, or with
      // Megatron-LM's --overlap-param-gather (assumptions.overlap_param_gather_after_step) bucket
      // by bucket behind the next step's first forward: what that forward cannot hide, and the
      // slowdown of what it hides (overlap.h), extend this step (every step is alike).
      EventTime gather_end = opt_end;
      if (t.param_gather > 0) {
        if (gather_after_step) {
          gather_end = opt_end + exposed_after_overlap(t.param_gather, t.first_forward, slowdown);
          if (record)
            trace(s, Track::dp, SliceKind::param_gather, nullptr, opt_end, t.param_gather);
        } else {
          const EventTime g = st.dp.submit(opt_end, t.param_gather);
          if (record) trace(s, Track::dp, SliceKind::param_gather, nullptr, g, t.param_gather);
        }
      }
      r.end_seconds = std::max({opt_end, gather_end, st.dp.free_at, st.send_next.free_at,
                                st.send_prev.free_at, st.zero3.free_at});
      r.busy_seconds = st.busy_seconds + t.optimizer;
      r.optimizer_seconds = t.optimizer;
      r.overlap_slowdown_seconds = st.slowdown_seconds;
      r.send_seconds = st.send_next.busy_seconds + st.send_prev.busy_seconds;
      r.dp_communication_seconds = st.dp.busy_seconds + st.zero3.busy_seconds;
      r.peak_inflight_chunks = st.peak_chunks;
      r.peak_inflight_microbatches = st.peak_mbs;
      r.peak_activation_bytes = st.peak_bytes;
      r.peak_allocated_bytes = t.static_bytes + std::max(st.peak_bytes, st.peak_backward_bytes);
      r.peak_in_backward = st.peak_backward_bytes >= st.peak_bytes && st.peak_backward_bytes > 0;
      r.peak_moment_activation_bytes =
          r.peak_in_backward ? st.peak_backward_bytes - t.backward_extra_bytes : st.peak_bytes;
      // Overlapping steps: each stage starts its next step as soon as its own work is done, so
      // shifting every stage's timeline by its longest span is a feasible period.
      step = std::max(step, overlap_steps ? r.end_seconds - r.first_start_seconds : r.end_seconds);
      busy_total += r.busy_seconds;
    }
    out.step_seconds = step;
    out.bubble_fraction = step > 0 ? 1.0 - busy_total / (static_cast<double>(p) * step) : 0.0;
    out.microbatches = m;
    out.virtual_stages = v;
  }
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

void require_finite(Seconds x, const char* what) {
  if (!(x >= 0) || !std::isfinite(x))
    throw InputError("/costs", fmt::format("{} must be a finite number >= 0", what));
}

std::vector<StageTimes> stage_times(const Scenario& s, const Estimate& e, const SimOptions& opts) {
  const Count p = s.parallel.pp, v = s.parallel.virtual_stages;
  const double vd = static_cast<double>(v);
  std::vector<StageTimes> times(static_cast<std::size_t>(p));
  const bool have_memory = static_cast<Count>(e.memory.stages.size()) == p;
  for (Count i = 0; i < p; ++i) {
    StageTimes& t = times[static_cast<std::size_t>(i)];
    t.chunk.resize(static_cast<std::size_t>(v));
    if (have_memory) {
      // Each chunk's saved bytes per micro-batch (the estimate's, pipeline_split.h); a hand-made
      // estimate without them: the stage's bytes in equal shares, the embedding's and the head's
      // on the chunks at the ends of the path.
      const StageMemory& sm = e.memory.stages[static_cast<std::size_t>(i)];
      const bool per_chunk = static_cast<Count>(sm.chunk_activation_bytes.size()) == v;
      const Bytes even = (sm.activation_bytes_per_microbatch - sm.embedding_activation_bytes -
                          sm.head_activation_bytes) /
                         v;
      for (Count c = 0; c < v; ++c) {
        const Count vs = chunk_virtual_stage(s.parallel.schedule, p, i, c);
        t.chunk[static_cast<std::size_t>(c)].bytes =
            per_chunk
                ? sm.chunk_activation_bytes[static_cast<std::size_t>(c)]
                : even + (vs == 0 ? sm.embedding_activation_bytes : 0) +
                      (vs == path_length(s.parallel.schedule, p, v) - 1 ? sm.head_activation_bytes
                                                                        : 0);
      }
      t.backward_extra_bytes = sm.backward_extra_bytes;
      t.static_bytes =
          sm.allocated_bytes - sm.activations_bytes - sm.transient_bytes;  // states, buffers
    }
    if (opts.costs) {
      const CostOverride& c = *opts.costs;
      require_finite(c.forward_seconds, "forward_seconds");
      require_finite(c.backward_seconds, "backward_seconds");
      require_finite(c.p2p_seconds, "p2p_seconds");
      const Seconds w = c.backward_weight_seconds.value_or(0.0);
      require_finite(w, "backward_weight_seconds");
      const Seconds fb =
          c.forward_backward_seconds.value_or(c.forward_seconds + c.backward_seconds + w);
      require_finite(fb, "forward_backward_seconds");
      // An overlapped F&B pair (DualPipe, DualPipeV) runs both passes: it cannot end before the
      // longer of them (issue 29, item 9: 0 was accepted, a pair shorter than its forward).
      if (const Seconds longer = std::max(c.forward_seconds, c.backward_seconds + w); fb < longer) {
        throw InputError(
            "/costs/forward_backward_seconds",
            fmt::format("an overlapped forward and backward pair takes at least its longer pass: "
                        "forward_backward_seconds = {} is below max(forward_seconds, "
                        "backward_seconds + backward_weight_seconds) = {}",
                        fb, longer));
      }
      // The same on every stage: a chunk takes 1/v.
      for (ChunkTimes& x : t.chunk) {
        x.forward = c.forward_seconds / vd;
        x.backward_input = c.backward_seconds / vd;
        x.backward_weight = w / vd;
        x.backward = (c.backward_seconds + w) / vd;
      }
      t.forward_backward = fb / vd;
      t.p2p = c.p2p_seconds;
      continue;
    }
    DISTPLAN_CHECK(static_cast<Count>(e.stage_costs.size()) == p,
                   "the estimate must hold one StageCosts per pipeline stage");
    const StageCosts& c = e.stage_costs[static_cast<std::size_t>(i)];
    // Each chunk its own passes (StageCosts::chunks); without them (a hand-made estimate), equal
    // shares of the stage's.
    const bool per_chunk = static_cast<Count>(c.chunks.size()) == v;
    const double params =
        have_memory ? static_cast<double>(e.memory.stages[static_cast<std::size_t>(i)].parameters)
                    : 0.0;
    double chunk_params = 0;
    if (per_chunk)
      for (const ChunkCosts& k : c.chunks) chunk_params += static_cast<double>(k.parameters);
    for (Count ch = 0; ch < v; ++ch) {
      ChunkTimes& x = t.chunk[static_cast<std::size_t>(ch)];
      if (per_chunk) {
        const ChunkCosts& k = c.chunks[static_cast<std::size_t>(ch)];
        x.forward = k.forward;
        x.backward_input = k.backward_input;
        x.backward_weight = k.backward_weight;
        x.tp_communication = k.tp_communication;
      } else {
        x.forward = c.forward / vd;
        x.backward_input = c.backward_input / vd;
        x.backward_weight = c.backward_weight / vd;
        x.tp_communication = c.tp_communication / vd;
      }
      x.backward = x.backward_input + x.backward_weight;
      // The stage's gathers and reductions move its chunks' parameters: each chunk its share.
      const double share =
          per_chunk && chunk_params > 0
              ? static_cast<double>(c.chunks[static_cast<std::size_t>(ch)].parameters) /
                    chunk_params
              : 1.0 / vd;
      // zero3_gather covers the forward and the backward gathers of one micro-batch: half each.
      x.zero3_gather = s.parallel.zero_stage == 3 ? c.zero3_gather * share / 2.0 : 0.0;
      x.grad_reduce = c.grad_reduce * share;
      if (have_memory && opts.grad_bucket_bytes > 0) {
        const auto grad_bytes = static_cast<Bytes>(
            params * share * static_cast<double>(bytes_of(s.training.grad_accumulation_dtype)));
        x.grad_buckets = std::clamp<Count>(
            (grad_bytes + opts.grad_bucket_bytes - 1) / opts.grad_bucket_bytes, 1, 4096);
      }
      t.gathers = t.gathers || x.zero3_gather > 0;
    }
    t.p2p = c.p2p;
    t.param_gather = c.param_gather;
    t.first_forward = c.forward;
    t.optimizer = c.optimizer;
  }
  return times;
}

SchedulePrograms program_for(const Scenario& s, const std::vector<StageTimes>& times, Count m) {
  if (s.parallel.schedule != Schedule::zb_auto)
    return make_schedule(s.parallel.schedule, s.parallel.pp, m, s.parallel.virtual_stages);
  // The heuristic orders the passes for these times, with the activations of one micro-batch
  // held from its forward to its weight pass (docs/simulator.md, "Memory").
  std::vector<ZbAutoStage> stages(times.size());
  Seconds p2p = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const StageTimes& t = times[i];
    const ChunkTimes& x = t.chunk.front();  // one chunk per stage (validate)
    stages[i] = ZbAutoStage{x.forward,
                            x.backward_input,
                            x.backward_weight,
                            1,
                            0,
                            -1,
                            static_cast<double>(s.parallel.zb_memory_limit())};
    p2p = std::max(p2p, t.p2p);
  }
  return make_zb_auto(m, stages, p2p);
}

}  // namespace

SchedulePrograms scenario_program(const Scenario& s, const Estimate& e) {
  return program_for(s, stage_times(s, e, SimOptions{}), s.num_microbatches());
}

SimResult simulate(const Scenario& s, const Estimate& e, const SimOptions& opts) {
  const Count p = s.parallel.pp, v = s.parallel.virtual_stages, m = s.num_microbatches();
  // A step is simulated pass by pass; bound the work (time and memory grow linearly with it).
  const bool zb_auto = s.parallel.schedule == Schedule::zb_auto && opts.program == nullptr;
  const double limit = zb_auto ? kMaxPasses / kZbAutoPassCost : kMaxPasses;
  if (static_cast<double>(m) * static_cast<double>(p) * static_cast<double>(v) > limit) {
    throw InputError(
        "/training/global_batch_size",
        fmt::format(
            "simulating {} micro-batches x {} stages x {} chunks exceeds the {:.0f} passes "
            "a step {}may have; lower global_batch_size or raise micro_batch_size",
            m, p, v, limit,
            zb_auto ? "under zb_auto (whose list scheduler costs about 4 walks a pass) " : ""));
  }
  SchedulePrograms generated;
  const SchedulePrograms* prog = opts.program;
  if (prog) {
    if (prog->bidirectional != bidirectional(s.parallel.schedule)) {
      throw InputError(
          "/placement",
          fmt::format("the schedule program's placement is {}bidirectional but "
                      "schedule {} is {}",
                      prog->bidirectional ? "" : "not ", to_string(s.parallel.schedule),
                      bidirectional(s.parallel.schedule) ? "DualPipe's" : "not"));
    }
    if (prog->v_shape != v_shape(s.parallel.schedule)) {
      throw InputError(
          "/placement",
          fmt::format("the schedule program places chunks {} but schedule {} places "
                      "them {}",
                      prog->v_shape ? "in a V" : "interleaved", to_string(s.parallel.schedule),
                      v_shape(s.parallel.schedule) ? "in a V" : "interleaved"));
    }
    if (prog->stages != p || prog->virtual_stages != v || prog->microbatches != m) {
      throw InputError(
          "/stages", fmt::format("the schedule program has p = {}, v = {}, m = {} but the "
                                 "scenario has pp = {}, virtual_stages = {}, m = {}",
                                 prog->stages, prog->virtual_stages, prog->microbatches, p, v, m));
    }
    check_program(*prog);
  }
  const std::vector<StageTimes> times = stage_times(s, e, opts);
  if (!prog) {
    generated = program_for(s, times, m);
    prog = &generated;
  }

  SimResult out;
  Workspace& ws = workspace();
  if (opts.record_trace && opts.trace_sink == nullptr)
    out.trace.reserve(prog->num_actions() * 2 + 4 * static_cast<std::size_t>(p));
  const bool per_mb = s.parallel.zero_stage >= 2;
  Run run{*prog,
          times,
          s.assumptions.overlap_grad_reduce,
          s.assumptions.overlap_param_gather,
          per_mb,
          steps_overlap(s.parallel.schedule),
          s.assumptions.overlap_param_gather_after_step,
          s.assumptions.overlap_compute_slowdown,
          opts.record_trace,
          ws,
          out,
          opts.trace_sink,
          opts.cancel};
  run.run();

  bool any_comm = false;
  for (const StageTimes& t : times) {
    any_comm = any_comm || t.p2p > 0 || t.param_gather > 0;
    for (const ChunkTimes& x : t.chunk)
      any_comm = any_comm || x.zero3_gather > 0 || x.grad_reduce > 0;
  }
  if (opts.exposed_communication && any_comm) {
    std::vector<StageTimes> quiet = times;
    for (StageTimes& t : quiet) {
      t.p2p = t.param_gather = 0;
      t.gathers = false;
      for (ChunkTimes& x : t.chunk) x.zero3_gather = x.grad_reduce = 0;
    }
    SimResult q;
    Run again{*prog,
              quiet,
              true,
              true,
              per_mb,
              steps_overlap(s.parallel.schedule),
              s.assumptions.overlap_param_gather_after_step,
              s.assumptions.overlap_compute_slowdown,
              false,
              ws,
              q,
              nullptr,
              opts.cancel};
    again.run();
    out.exposed_communication_seconds = std::max(0.0, out.step_seconds - q.step_seconds);
  }
  return out;
}

}  // namespace distplan::sim
