// The validation comparison (validation_report.h): measured memory, collectives and time against
// the plan and the simulator with the measured costs.
#include "distplan/gpu_backend/validation_report.h"

#include <algorithm>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "distplan/planner/layout.h"

namespace distplan::backend {
namespace {

// The plan's figure for each category of one stage, as measured on the CPU (no device runtime).
std::map<std::string, Bytes> predicted_bytes(const StageMemory& ps) {
  return {{"weights", ps.weights_bytes},
          {"gradients", ps.gradients_bytes},
          {"optimizer", ps.optimizer_bytes},
          {"activations", ps.activations_bytes},
          {"buffers", ps.buffers_bytes},
          {"runtime", ps.runtime_bytes},
          {"total", ps.total_bytes - ps.runtime_bytes},
          {"reserved", ps.reserved_bytes - ps.runtime_bytes}};
}

std::string pct(const RelativeError& e) {
  return e ? fmt::format("{:+.2f} %", 100 * *e) : std::string("n/a");
}

// Sums (group, op, what) entries into a stage's collectives.
class CollectiveAccumulator {
 public:
  void add(const std::string& group, const std::string& op, const std::string& what, Bytes bytes,
           Count calls) {
    auto& a = by_what_[{group, op, what}];
    a.bytes += bytes;
    a.calls += calls;
  }
  void add_wire(Bytes w) { out_.wire_bytes_per_gpu_per_step += w; }
  StageCollectives finish(int stage) {
    out_.stage = stage;
    for (const auto& [k, v] : by_what_)
      out_.collectives.push_back(
          {std::get<0>(k), std::get<1>(k), std::get<2>(k), v.bytes, v.calls});
    sum_by_op(out_);
    return out_;
  }

 private:
  std::map<std::tuple<std::string, std::string, std::string>, CommTotals> by_what_;
  StageCollectives out_;
};

}  // namespace

RelativeError relative_error(double predicted, double measured) noexcept {
  if (predicted == 0) return measured == 0 ? RelativeError(0.0) : std::nullopt;
  return (measured - predicted) / predicted;
}

Count ranks_of(const Scenario& s) noexcept {
  return s.parallel.tp * s.parallel.cp * s.parallel.dp * s.parallel.pp;
}

void sum_by_op(StageCollectives& c) {
  c.by_op.clear();
  for (const CollectiveSum& x : c.collectives) {
    CommTotals& t = c.by_op[x.group + "/" + x.op];
    t.bytes += x.bytes_per_step;
    t.calls += x.calls_per_step;
  }
}

StageCollectives planned_collectives(const Scenario& s, int stage) {
  CollectiveAccumulator pc;
  for (const Collective& c : stage_communication(s, stage)) {
    pc.add(std::string(to_string(c.group)), std::string(to_string(c.op)), std::string(c.what()),
           c.bytes_per_call * c.calls_per_step, c.calls_per_step);
    pc.add_wire(c.wire_bytes_per_gpu_per_step);
  }
  return pc.finish(stage);
}

bool memory_in_gib(const Scenario& s, const Estimate& e) noexcept {
  return e.memory.peak_bytes - s.cluster.runtime_reserve_bytes >= (Bytes{1} << 30);
}

sim::SimResult simulate_with_measured_costs(const Scenario& s, const Estimate& e,
                                            const sim::CostOverride& costs) {
  sim::SimOptions so;
  so.costs = costs;
  so.exposed_communication = false;
  return sim::simulate(s, e, so);
}

ValidationReport compare(const Scenario& s, const Estimate& e, const Measurement* m,
                         const std::string& oom_message, const ValidationSettings& settings) {
  ValidationReport r;
  r.scenario = s;
  r.estimate = e;
  r.settings = settings;
  r.ranks = ranks_of(s);
  if (m == nullptr) {
    r.fits = false;
    r.oom_message = oom_message;
    return r;
  }
  const int pp = static_cast<int>(s.parallel.pp);

  // Memory per stage: the largest figure of the stage's ranks in each category.
  r.in_gib = memory_in_gib(s, e);
  for (int st = 0; st < pp; ++st) {
    StageMemoryMeasured ms;
    ms.stage = st;
    bool present = false;
    for (const RankMeasurement& rm : m->ranks) {
      if (rm.coords.pp != st) continue;
      present = true;
      auto take = [&](const char* k, Bytes v) { ms.bytes[k] = std::max(ms.bytes[k], v); };
      take("weights", rm.memory.peak_of(MemoryTag::weights));
      take("gradients", rm.memory.peak_of(MemoryTag::gradients));
      take("optimizer", rm.memory.peak_of(MemoryTag::optimizer));
      take("activations", rm.memory.peak_of(MemoryTag::activations));
      take("buffers", rm.memory.peak_of(MemoryTag::buffers));
      take("temporaries", rm.memory.peak_of(MemoryTag::temporaries));
      take("total", rm.memory.peak_total);
      take("reserved", rm.memory.peak_reserved);
    }
    if (!present) continue;
    r.peak_bytes = std::max(r.peak_bytes, ms.bytes["total"]);
    r.memory.push_back(std::move(ms));
  }

  // Collectives per stage (the first rank of each stage), against stage_communication().
  for (int st = 0; st < pp; ++st) {
    // An emulated run measures one rank: only its stage is compared.
    const RankMeasurement* first = nullptr;
    for (const RankMeasurement& rm : m->ranks)
      if (rm.coords.pp == st && (first == nullptr || rm.rank < first->rank)) first = &rm;
    if (first == nullptr) continue;
    CollectiveAccumulator mc;
    for (const auto& [k, v] : first->communication) {
      const auto& [g, op, what] = k;
      mc.add(std::string(to_string(g)), std::string(to_string(op)), std::string(to_string(what)),
             v.bytes, v.calls);
      // Every collective records its buffer (the ep all-to-all its token-side buffer, comm.h);
      // its wire share follows the planner's ring factors.
      if (v.calls > 0) {
        mc.add_wire(ring_wire_bytes(op, v.bytes / v.calls, group_size(s, g)) * v.calls);
      }
    }
    StageCollectives p = planned_collectives(s, st), me = mc.finish(st);
    r.busiest_wire_bytes = std::max(r.busiest_wire_bytes, me.wire_bytes_per_gpu_per_step);
    r.predicted_collectives.push_back(std::move(p));
    r.measured_collectives.push_back(std::move(me));
  }

  // Time: per-stage forward/backward times from the executed actions (a chunk action counts v
  // times for a whole stage), the simulator run with those costs, against the measured step.
  const Count v = s.parallel.virtual_stages;
  double fwd = 0, bwd = 0, bwd_w = 0;
  Count nf = 0, nb = 0, nw = 0;
  Seconds step = 0, busy_sum = 0;
  std::map<int, Seconds> busy;
  for (const RankMeasurement& rm : m->ranks) {
    step = std::max(step, rm.step_seconds);
    Seconds b = 0;
    for (const ExecutedAction& a : rm.actions) {
      b += a.seconds;
      switch (a.action.op) {
        case sim::Op::forward:
          fwd += a.seconds;
          ++nf;
          break;
        case sim::Op::backward_weight:
          bwd_w += a.seconds;
          ++nw;
          break;
        default:
          bwd += a.seconds;
          ++nb;
      }
    }
    busy[rm.coords.pp] = std::max(busy[rm.coords.pp], b);
  }
  for (const auto& [st, b] : busy) busy_sum += b;
  r.costs.forward_seconds = nf ? fwd / static_cast<double>(nf) * static_cast<double>(v) : 0;
  r.costs.backward_seconds = nb ? bwd / static_cast<double>(nb) * static_cast<double>(v) : 0;
  if (nw)
    r.costs.backward_weight_seconds = bwd_w / static_cast<double>(nw) * static_cast<double>(v);
  const sim::SimResult sr = simulate_with_measured_costs(s, e, r.costs);
  r.simulated_step_seconds = sr.step_seconds;
  r.simulated_bubble_fraction = sr.bubble_fraction;
  const bool whole = static_cast<Count>(busy.size()) == s.parallel.pp;
  r.time.step_seconds = step;
  r.time.bubble_fraction =
      whole && step > 0 ? 1.0 - busy_sum / (static_cast<double>(pp) * step) : 0.0;
  for (const auto& [st, b] : busy) r.time.compute_seconds = std::max(r.time.compute_seconds, b);
  for (const RankMeasurement& rm : m->ranks)
    r.time.optimizer_seconds = std::max(r.time.optimizer_seconds, rm.optimizer_seconds);
  fill_errors(r);
  r.losses = m->losses;
  r.skipped = m->skipped;
  return r;
}

void fill_errors(ValidationReport& r) {
  const Scenario& s = r.scenario;
  const Estimate& e = r.estimate;
  r.memory_error.clear();
  for (StageMemoryMeasured& ms : r.memory) {
    const std::map<std::string, Bytes> predicted =
        predicted_bytes(e.memory.stages[static_cast<std::size_t>(ms.stage)]);
    StageMemoryError es;
    es.stage = ms.stage;
    for (const char* c : kComparedCategories) {
      // Host memory has no device runtime: runtime is not measured, and the measured total (the
      // tracked joint peak) is compared with the predicted total less the runtime reserve. The
      // generic profile has no allocator model (its reserved is its total): nothing to compare
      // the allocator replay's reserved bytes with.
      const bool reserved_unmodelled =
          std::string(c) == "reserved" && !s.assumptions.framework_profile.models_allocator;
      if (std::string(c) == "runtime" || reserved_unmodelled) {
        es.by_category[c] = std::nullopt;
        continue;
      }
      es.by_category[c] =
          relative_error(static_cast<double>(predicted.at(c)), static_cast<double>(ms.bytes[c]));
    }
    r.memory_error.push_back(std::move(es));
  }
  const Bytes runtime = e.memory.stages.empty() ? 0 : e.memory.stages.front().runtime_bytes;
  r.peak_error = relative_error(static_cast<double>(e.memory.peak_bytes - runtime),
                                static_cast<double>(r.peak_bytes));

  r.collectives_error.clear();
  for (std::size_t i = 0; i < r.measured_collectives.size(); ++i) {
    const StageCollectives& p = r.predicted_collectives[i];
    const StageCollectives& me = r.measured_collectives[i];
    StageCollectivesError ec;
    ec.stage = me.stage;
    ec.wire_bytes_per_gpu_per_step =
        relative_error(static_cast<double>(p.wire_bytes_per_gpu_per_step),
                       static_cast<double>(me.wire_bytes_per_gpu_per_step));
    std::map<std::string, bool> keys;
    for (const auto& [k, v] : p.by_op) keys[k] = true;
    for (const auto& [k, v] : me.by_op) keys[k] = true;
    for (const auto& [k, unused] : keys) {
      const double pv = p.by_op.count(k) ? static_cast<double>(p.by_op.at(k).bytes) : 0.0;
      const double mv = me.by_op.count(k) ? static_cast<double>(me.by_op.at(k).bytes) : 0.0;
      ec.by_op[k] = relative_error(pv, mv);
    }
    r.collectives_error.push_back(std::move(ec));
  }

  // The simulator's step excludes the optimizer and DP communication (a cost override replaces
  // the whole cost model): compare it with the measured step less the optimizer.
  const Seconds step = r.time.step_seconds;
  r.simulated_step_error =
      relative_error(r.simulated_step_seconds, step - r.time.optimizer_seconds);
  // The bubble is measured when every stage was (not an emulated rank).
  const bool whole = static_cast<Count>(r.memory.size()) == s.parallel.pp;
  r.bubble_error.reset();
  if (whole) r.bubble_error = relative_error(r.simulated_bubble_fraction, r.time.bubble_fraction);
  // The planner's analytic time is for the scenario's GPU: compared only on that device.
  r.step_error.reset();
  if (r.settings.device == "cuda") r.step_error = relative_error(e.time.step_seconds, step);
}

std::string to_table(const ValidationReport& r) {
  const Scenario& s = r.scenario;
  const Estimate& e = r.estimate;
  const ValidationSettings& o = r.settings;
  std::ostringstream t;
  t << fmt::format("distplan validate: {} on {} ({} rank{}{}), {} step{}\n",
                   s.model.name.empty() ? std::string("model") : s.model.name, o.device, r.ranks,
                   r.ranks == 1 ? "" : "s",
                   o.emulate_rank >= 0 ? fmt::format(", emulating rank {}", o.emulate_rank) : "",
                   o.steps, o.steps == 1 ? "" : "s");
  // Ranks time-sharing cores run slower by the sharing, not by the layout.
  const Count processes = o.emulate_rank >= 0 ? 1 : r.ranks;
  if (o.device != "cuda" && o.host_cores > 0 && processes > static_cast<Count>(o.host_cores) &&
      (processes == 1 || o.local_ranks)) {
    t << fmt::format(
        "note: {} ranks on {} CPU cores: oversubscribed; measured times include the ranks "
        "waiting for a core\n",
        processes, o.host_cores);
  }
  if (!r.fits) {
    t << "measured: does not fit (" << r.oom_message << ")\n";
    t << fmt::format("predicted: peak {:.3f} GiB, {}\n",
                     static_cast<double>(e.memory.peak_bytes) / (1ull << 30),
                     e.memory.fits ? "fits" : "does not fit");
    return t.str();
  }
  // People read GiB for real models and MiB (2^20 bytes) for the small ones a CPU runs.
  const double unit = r.in_gib ? static_cast<double>(Bytes{1} << 30) : static_cast<double>(1 << 20);
  t << fmt::format("\nMemory per GPU ({})      predicted   measured   rel. error\n",
                   r.in_gib ? "GiB" : "MiB");
  for (std::size_t i = 0; i < r.memory.size(); ++i) {
    const StageMemoryMeasured& ms = r.memory[i];
    const StageMemoryError& es = r.memory_error[i];
    const std::map<std::string, Bytes> predicted =
        predicted_bytes(e.memory.stages[static_cast<std::size_t>(ms.stage)]);
    auto measured = [&](const std::string& k) {
      const auto it = ms.bytes.find(k);
      return it == ms.bytes.end() ? 0.0 : static_cast<double>(it->second);
    };
    t << fmt::format("stage {}\n", ms.stage);
    for (const char* c : kComparedCategories) {
      const double pv = static_cast<double>(predicted.at(c));
      if (std::string(c) == "runtime") {
        // The device's runtime reserve is not measured on a host, and both totals leave it out.
        t << fmt::format("  {:<22}{:>10.3f} {:>10}   n/a\n", "runtime (not in total)", pv / unit,
                         "-");
        continue;
      }
      t << fmt::format("  {:<22}{:>10.3f} {:>10.3f}   {}\n", c, pv / unit, measured(c) / unit,
                       pct(es.by_category.at(c)));
    }
    // Temporaries (activation gradients, collective staging inside one op) are measured and
    // counted in the measured total; the planner has no such category (docs/gpu_backend.md).
    t << fmt::format("  {:<22}{:>10} {:>10.3f}   n/a\n", "temporaries", "-",
                     measured("temporaries") / unit);
  }
  t << "  (temporaries: activation gradients and collective staging that live inside one op;\n"
       "   the planner has no such category, the measured total includes them)\n";
  if (!r.scenario.assumptions.framework_profile.models_allocator) {
    t << "  (reserved: the generic profile has no allocator model; set training.framework to\n"
         "   compare the allocator replay's reserved bytes with the plan's)\n";
  }

  t << "\nCollectives per GPU per step (bytes handed)    predicted       measured   rel. error\n";
  for (std::size_t i = 0; i < r.collectives_error.size(); ++i) {
    const StageCollectives& p = r.predicted_collectives[i];
    const StageCollectives& me = r.measured_collectives[i];
    t << fmt::format("stage {}\n", p.stage);
    for (const auto& [k, err] : r.collectives_error[i].by_op) {
      const Bytes pv = p.by_op.count(k) ? p.by_op.at(k).bytes : 0;
      const Bytes mv = me.by_op.count(k) ? me.by_op.at(k).bytes : 0;
      t << fmt::format("  {:<40}{:>12} {:>14}   {}\n", k, pv, mv, pct(err));
    }
  }

  const Seconds step = r.time.step_seconds;
  t << fmt::format("\nTime (ms)                 predicted   measured   rel. error\n");
  t << fmt::format("  simulated step, with measured costs {:>10.3f} {:>10.3f}   {}\n",
                   r.simulated_step_seconds * 1e3, (step - r.time.optimizer_seconds) * 1e3,
                   pct(r.simulated_step_error));
  t << "    (the simulator run with the forward/backward times measured here, without the\n"
       "     optimizer step; compared with the measured step less the optimizer)\n";
  if (o.device == "cuda") {
    t << fmt::format("  planner step ({})  {:>10.3f} {:>10.3f}\n", s.cluster.gpu.name,
                     e.time.step_seconds * 1e3, step * 1e3);
  } else {
    t << fmt::format("  planner step ({}, analytic) {:>10.3f} {:>10.3f}   not comparable\n",
                     s.cluster.gpu.name, e.time.step_seconds * 1e3, step * 1e3);
    t << fmt::format(
        "    (the planner's time is for a {}; the measured time is this CPU's: no error is "
        "computed)\n",
        s.cluster.gpu.name);
  }
  t << (o.emulate_rank >= 0 && r.ranks > 1
            ? "\nLoss per step (emulated collectives move no data: not the model's loss):"
            : "\nLoss per step:");
  for (double l : r.losses) t << fmt::format(" {:.6f}", l);
  t << "\n";
  return t.str();
}

}  // namespace distplan::backend
