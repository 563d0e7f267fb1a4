#include "distplan/search/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/validate.h"
#include "distplan/search/fast_memory.h"
#include "sim_bridge.h"

namespace distplan::search {

std::string_view to_string(Objective o) noexcept {
  switch (o) {
    case Objective::throughput:
      return "throughput";
    case Objective::memory:
      return "memory";
    case Objective::gpus:
      return "gpus";
  }
  return "?";
}

Figures figures_of(const Estimate& e, const Scenario& s) {
  (void)s;
  Figures f;
  f.peak_bytes = e.memory.peak_reserved_bytes;  // what fits compares
  f.capacity_bytes = e.memory.capacity_bytes;
  f.step_seconds = e.time.step_seconds;
  f.tokens_per_second = e.time.tokens_per_second;
  f.mfu = e.time.mfu;
  return f;
}

Figures evaluate(const Scenario& scenario) {
  return figures_of(estimate(scenario), scenario);
}

bool simulator_linked() noexcept {
  return detail::simulator_available();
}

namespace {

using Clock = std::chrono::steady_clock;

struct Candidate {
  Layout layout;
  Figures f;
};

/// Throughputs in the same band of relative width kThroughputTieTolerance (logarithmic bands, so
/// the order stays a strict weak order) count as equal and rank by lower peak memory: a time
/// difference of 1e-9 relative is far below what the time model resolves (docs/search.md,
/// "Ties"). Two throughputs closer than the tolerance fall in different bands only when a band
/// edge lies between them (a chance of their relative difference / the tolerance).
double throughput_band(double tokens_per_second) {
  if (!(tokens_per_second > 0)) return -std::numeric_limits<double>::infinity();
  return std::floor(std::log(tokens_per_second) / std::log1p(kThroughputTieTolerance));
}

}  // namespace

bool ranks_before(Objective obj, const Layout& la, const Figures& a, const Layout& lb,
                  const Figures& b) {
  const double ta = throughput_band(a.tokens_per_second);
  const double tb = throughput_band(b.tokens_per_second);
  switch (obj) {
    case Objective::throughput:
      if (ta != tb) return ta > tb;
      if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
      break;
    case Objective::memory:
      if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
      if (ta != tb) return ta > tb;
      break;
    case Objective::gpus:
      if (la.num_gpus() != lb.num_gpus()) return la.num_gpus() < lb.num_gpus();
      if (ta != tb) return ta > tb;
      if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
      break;
  }
  return la < lb;
}

namespace {

bool better(Objective obj, const Layout& la, const Figures& a, const Layout& lb, const Figures& b) {
  return ranks_before(obj, la, a, lb, b);
}

/// The best `keep` candidates seen, as a max-heap on `better` (the worst kept on top).
class TopK {
 public:
  TopK(Objective obj, std::size_t keep) : obj_(obj), keep_(keep) {}
  void offer(const Layout& l, const Figures& f) {
    if (keep_ == 0) return;
    if (heap_.size() == keep_ && !better(obj_, l, f, heap_.front().layout, heap_.front().f)) {
      return;
    }
    auto cmp = [this](const Candidate& x, const Candidate& y) {
      return better(obj_, x.layout, x.f, y.layout, y.f);
    };
    if (heap_.size() == keep_) {
      std::pop_heap(heap_.begin(), heap_.end(), cmp);
      heap_.pop_back();
    }
    heap_.push_back({l, f});
    std::push_heap(heap_.begin(), heap_.end(), cmp);
  }
  [[nodiscard]] const std::vector<Candidate>& items() const { return heap_; }
  [[nodiscard]] bool full() const noexcept { return keep_ > 0 && heap_.size() == keep_; }
  [[nodiscard]] const Candidate& worst() const { return heap_.front(); }

 private:
  Objective obj_;
  std::size_t keep_;
  std::vector<Candidate> heap_;
};

struct Partial {
  explicit Partial(Objective obj, std::size_t keep) : top(obj, keep) {}
  TopK top;
  std::uint64_t evaluated = 0;
  std::uint64_t feasible = 0;
  std::uint64_t pruned = 0;
  RejectCounts rejected{};
  std::optional<Candidate> lowest_peak;    // lowest peak among layouts that do not fit
  std::optional<Candidate> fastest_below;  // objective "gpus": fastest fitting, under target
  // Objective throughput: the fastest step seen and every layout within the simulation window of
  // it (trimmed as the best improves).
  double best_step = std::numeric_limits<double>::infinity();
  std::vector<Candidate> near;
  std::size_t near_trimmed = 0;
  void offer_near(const Layout& l, const Figures& f, double window) {
    if (f.step_seconds < best_step) best_step = f.step_seconds;
    const double limit = (1.0 + window) * best_step;
    if (f.step_seconds > limit) return;
    near.push_back({l, f});
    if (near.size() >= 2 * near_trimmed + 64) {
      std::erase_if(near, [limit](const Candidate& c) { return c.f.step_seconds > limit; });
      near_trimmed = near.size();
    }
  }
};

bool fits(const Figures& f, double margin) {
  return static_cast<double>(f.peak_bytes) <=
         static_cast<double>(f.capacity_bytes) * (1.0 - margin);
}

void search_worker(const Space& space, const Options& opt, const std::vector<Outer>& outers,
                   std::atomic<std::size_t>& next, std::atomic<std::size_t>& done,
                   std::atomic<std::uint64_t>& evaluated_so_far, Partial& part) {
  Scenario s = space.base;
  FastMemory fast(space.base);
  const double near_window =
      opt.objective == Objective::throughput && opt.simulate_top > 0 && opt.simulate_within > 0
          ? opt.simulate_within
          : 0.0;
  for (;;) {
    const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= outers.size()) break;
    if (opt.cancel && opt.cancel->load(std::memory_order_relaxed)) {
      done.fetch_add(1, std::memory_order_release);
      continue;  // drain the remaining indices so the progress loop ends
    }
    const std::uint64_t before = part.evaluated;
    if (opt.fast_memory && !space.base.training.peft.enabled()) fast.set_outer(outers[i]);
    for_each_inner(space, outers[i], part.rejected, [&](const Layout& l) {
      Figures f;
      // zb_auto's activations come from its heuristic on the stage costs, which the lean path
      // does not have: it gives the limit's peak, an upper bound. A zb_auto layout that fits
      // under that bound fits, and may be pruned by its step bound; any other is estimated in
      // full.
      // Fine-tuning's frozen layers move the peak off stages 0, 1 and pp - 1 and its step has
      // no frozen weight gradients: the lean path's peak and bound are full training's, so a
      // PEFT layout is estimated in full (docs/search.md).
      const bool lean = opt.fast_memory && !space.base.training.peft.enabled();
      const bool exact_peak = l.schedule != Schedule::zb_auto;
      if (lean) {
        // Peak memory first, exactly as estimate() has it; only what fits is estimated in full.
        f.peak_bytes = fast.peak_bytes(l);
        f.capacity_bytes = fast.capacity_bytes();
      }
      if (lean && fits(f, opt.memory_margin) && part.top.full()) {
        // Bound pruning: a layout that fits but cannot enter this thread's kept best cannot
        // enter the global best either (docs/search.md, "Pruning"). It is feasible; its full
        // estimate is not needed.
        const Candidate& worst = part.top.worst();
        bool pruned = false;
        if (opt.objective == Objective::throughput) {
          // Nor one that cannot come within the simulation window of this thread's best (whose
          // best is no better than the global best).
          const double bound = fast.step_lower_bound(l);
          pruned =
              bound > worst.f.step_seconds * (1.0 + 1e-6) &&
              (near_window <= 0 || bound > part.best_step * (1.0 + near_window) * (1.0 + 1e-6));
        } else if (opt.objective == Objective::memory && exact_peak) {
          pruned = f.peak_bytes > worst.f.peak_bytes;
        }
        if (pruned) {
          ++part.evaluated;
          ++part.feasible;
          ++part.pruned;
          return;
        }
      }
      if (!lean || !exact_peak || fits(f, opt.memory_margin)) {
        apply_layout(s, l);
        f = evaluate(s);
      }
      ++part.evaluated;
      if (!fits(f, opt.memory_margin)) {
        ++part.rejected[static_cast<int>(Reject::out_of_memory)];
        if (!part.lowest_peak || f.peak_bytes < part.lowest_peak->f.peak_bytes ||
            (f.peak_bytes == part.lowest_peak->f.peak_bytes && l < part.lowest_peak->layout)) {
          part.lowest_peak = Candidate{l, f};
        }
        return;
      }
      if (opt.objective == Objective::gpus && f.tokens_per_second < opt.target_tokens_per_second) {
        ++part.rejected[static_cast<int>(Reject::below_target)];
        if (!part.fastest_below || f.tokens_per_second > part.fastest_below->f.tokens_per_second ||
            (f.tokens_per_second == part.fastest_below->f.tokens_per_second &&
             l < part.fastest_below->layout)) {
          part.fastest_below = Candidate{l, f};
        }
        return;
      }
      ++part.feasible;
      part.top.offer(l, f);
      if (near_window > 0) part.offer_near(l, f, near_window);
    });
    evaluated_so_far.fetch_add(part.evaluated - before, std::memory_order_relaxed);
    done.fetch_add(1, std::memory_order_release);
  }
}

int threads_for(const Options& opt) {
  return opt.threads > 0 ? opt.threads
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Plan plan_of(const Space& space, const Layout& l, bool simulate) {
  const Scenario s = make_scenario(space.base, l);
  const Estimate e = estimate(s);
  Plan p;
  p.layout = l;
  p.analytic = figures_of(e, s);
  p.figures = p.analytic;
  p.bubble_fraction = e.time.bubble_fraction;
  if (simulate) {
    if (auto sim = detail::simulate_figures(s, e)) {
      p.simulated = true;
      p.figures.step_seconds = sim->step_seconds;
      p.figures.tokens_per_second = sim->tokens_per_second;
      p.figures.mfu = sim->mfu;
      p.bubble_fraction = sim->bubble_fraction;
    }
  }
  return p;
}

void add_suggestions(const Space& space, const Options& opt, Result& r) {
  const double limit_factor = 1.0 - opt.memory_margin;
  if (r.closest) {
    const Plan& c = *r.closest;
    const Scenario s = make_scenario(space.base, c.layout);
    const Estimate e = estimate(s);
    if (!fits(c.analytic, opt.memory_margin)) {
      // Optimizer states moved to host memory (ZeRO-Offload, Ren et al. 2021): the planner's
      // offload model (docs/memory.md, "Offload") gives the closest layout's peak and the step
      // time it costs; offload needs ZeRO, so a ZeRO-0 layout takes ZeRO-1 with it.
      Scenario x = s;
      x.parallel.offload_optimizer = Offload::cpu;
      x.parallel.zero_stage = std::max(1, x.parallel.zero_stage);
      bool valid = true;
      try {
        validate_scenario(x);
      } catch (const InputError&) {
        valid = false;
      }
      if (valid) {
        const Estimate eo = estimate(x);
        Suggestion off;
        off.change = "optimizer_offload";
        off.value = static_cast<double>(eo.memory.peak_bytes);
        off.fits = eo.memory.host_fits &&
                   static_cast<double>(eo.memory.peak_bytes) <=
                       static_cast<double>(c.analytic.capacity_bytes) * limit_factor;
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "offloading the optimizer states of the closest layout to CPU memory%s "
                      "would lower its peak from %.1f GiB to %.1f GiB (capacity %.1f GiB), "
                      "%+.2f s per step, %.1f GiB of host memory per node",
                      s.parallel.zero_stage == 0 ? " (with ZeRO-1)" : "",
                      to_gib(c.analytic.peak_bytes), to_gib(eo.memory.peak_bytes),
                      to_gib(c.analytic.capacity_bytes), eo.time.step_seconds - e.time.step_seconds,
                      to_gib(eo.memory.host_bytes_per_node));
        off.detail = buf;
        r.suggestions.push_back(off);
      }

      char buf[256];
      Suggestion gpu;
      gpu.change = "larger_gpu";
      gpu.value = std::ceil(static_cast<double>(c.analytic.peak_bytes) / limit_factor);
      std::snprintf(buf, sizeof buf,
                    "a GPU with at least %.1f GiB of memory would fit the closest layout",
                    gpu.value / kGiB);
      gpu.detail = buf;
      gpu.fits = true;
      r.suggestions.push_back(gpu);
    }
  }

  Options sub = opt;
  sub.suggest = false;
  sub.simulate_top = 0;
  sub.top_k = 1;
  sub.progress = nullptr;
  // More GPUs: the same search on 2x .. 64x the cluster. For a throughput target, the fastest
  // layout of each larger cluster must reach it (a throughput search, which prunes).
  const bool target = opt.objective == Objective::gpus;
  if (target) sub.objective = Objective::throughput;
  for (Count k = 2; k <= 64; k *= 2) {
    Space more = space;
    more.fewer_gpus = false;
    more.base.cluster.num_gpus = space.base.cluster.num_gpus * k;
    const Result rr = run(more, sub);
    if (!rr.plans.empty() &&
        (!target || rr.plans.front().analytic.tokens_per_second >= opt.target_tokens_per_second)) {
      Suggestion g;
      g.change = "more_gpus";
      g.value = static_cast<double>(more.base.cluster.num_gpus);
      g.fits = true;
      const Layout& l = rr.plans.front().layout;
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    target ? "%lld GPUs (%lldx) would reach the target, e.g. tp=%lld pp=%lld "
                             "dp=%lld ZeRO-%d"
                           : "%lld GPUs (%lldx) would fit, e.g. tp=%lld pp=%lld dp=%lld ZeRO-%d",
                    static_cast<long long>(more.base.cluster.num_gpus), static_cast<long long>(k),
                    static_cast<long long>(l.tp), static_cast<long long>(l.pp),
                    static_cast<long long>(l.dp), l.zero_stage);
      g.detail = buf;
      r.suggestions.push_back(g);
      break;
    }
  }
  if (opt.objective == Objective::gpus) return;
  // A shorter sequence: halve it until something fits (not below 128 tokens).
  for (Count seq = space.base.training.seq_length / 2; seq >= 128; seq /= 2) {
    Space shorter = space;
    shorter.base.training.seq_length = seq;
    const Result rr = run(shorter, sub);
    if (!rr.plans.empty()) {
      Suggestion g;
      g.change = "shorter_sequence";
      g.value = static_cast<double>(seq);
      g.fits = true;
      char buf[160];
      std::snprintf(buf, sizeof buf, "a sequence of %lld tokens (instead of %lld) would fit",
                    static_cast<long long>(seq),
                    static_cast<long long>(space.base.training.seq_length));
      g.detail = buf;
      r.suggestions.push_back(g);
      break;
    }
  }
}

}  // namespace

Result run(const Space& space, const Options& opt) {
  const auto t0 = Clock::now();
  // The same limits as the JSON fields (docs/api.md), whoever sets them (CLI flags, the GUI).
  if (opt.top_k < 1 || opt.top_k > kMaxTopK)
    throw InputError("/search/top_k", fmt::format("must be between 1 and {}", kMaxTopK));
  if (opt.simulate_top < 0 || opt.simulate_top > kMaxTopK)
    throw InputError("/search/simulate_top", fmt::format("must be between 0 and {}", kMaxTopK));
  if (opt.threads < 0 || opt.threads > kMaxThreads)
    throw InputError("/search/threads", fmt::format("must be between 0 and {}", kMaxThreads));
  // Count the space before enumerating it: past kMaxLayouts it is refused, not run for hours.
  if (const std::uint64_t n = count_layouts(space, kMaxLayouts); n > kMaxLayouts) {
    throw InputError(
        "/parallel",
        fmt::format("the search space holds more than {} layouts (the limit, about 80 s on one "
                    "core; docs/trust.md); bound it: pin parallel dimensions as lists (e.g. "
                    "\"parallel\": {{\"tp\": [1, 2, 4, 8], \"pp\": [1, 2, 4]}}), "
                    "training.micro_batch_size, or search.constraints",
                    kMaxLayouts));
  }
  Result r;
  r.objective = opt.objective;
  r.simulator_available = detail::simulator_available();

  const std::vector<Outer> outers = enumerate_outer(space, r.rejected);
  int threads = threads_for(opt);
  threads =
      static_cast<int>(std::min<std::size_t>(threads, std::max<std::size_t>(1, outers.size())));
  r.threads = threads;

  const std::size_t keep =
      static_cast<std::size_t>(std::max(opt.top_k, 0) + std::max(opt.simulate_top, 0));
  std::vector<Partial> parts(static_cast<std::size_t>(threads), Partial(opt.objective, keep));
  std::atomic<std::size_t> next{0}, done{0};
  std::atomic<std::uint64_t> evaluated_so_far{0};
  {
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
      pool.emplace_back(search_worker, std::cref(space), std::cref(opt), std::cref(outers),
                        std::ref(next), std::ref(done), std::ref(evaluated_so_far),
                        std::ref(parts[static_cast<std::size_t>(t)]));
    }
    if (opt.progress && !outers.empty()) {
      // The calling thread reports progress while the workers run.
      std::thread last(search_worker, std::cref(space), std::cref(opt), std::cref(outers),
                       std::ref(next), std::ref(done), std::ref(evaluated_so_far),
                       std::ref(parts[0]));
      while (done.load(std::memory_order_acquire) < outers.size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        opt.progress(static_cast<double>(done.load()) / static_cast<double>(outers.size()),
                     evaluated_so_far.load());
      }
      last.join();
    } else {
      search_worker(space, opt, outers, next, done, evaluated_so_far, parts[0]);
    }
    for (auto& th : pool) th.join();
  }

  r.evaluate_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cancelled = opt.cancel && opt.cancel->load();
  // Merge in a thread-count-independent way: everything is ordered by a total key.
  std::vector<Candidate> best;
  for (const Partial& p : parts) {
    r.evaluated += p.evaluated;
    r.feasible += p.feasible;
    r.pruned += p.pruned;
    for (int i = 0; i < kNumRejects; ++i) r.rejected[i] += p.rejected[i];
    best.insert(best.end(), p.top.items().begin(), p.top.items().end());
  }
  auto by_objective = [&](const Candidate& a, const Candidate& b) {
    return better(opt.objective, a.layout, a.f, b.layout, b.f);
  };
  std::sort(best.begin(), best.end(), by_objective);
  if (best.size() > keep) best.resize(keep);
  // Every feasible layout within the simulation window of the global best joins the re-rank.
  double best_step = std::numeric_limits<double>::infinity();
  for (const Partial& p : parts) best_step = std::min(best_step, p.best_step);
  const double window_limit = (1.0 + opt.simulate_within) * best_step;
  std::size_t in_window = 0;
  if (opt.objective == Objective::throughput && opt.simulate_top > 0 && opt.simulate_within > 0) {
    std::vector<Candidate> near;
    for (const Partial& p : parts) {
      for (const Candidate& c : p.near) {
        if (c.f.step_seconds <= window_limit) near.push_back(c);
      }
    }
    std::sort(near.begin(), near.end(), by_objective);
    in_window = near.size();
    std::vector<Candidate> merged;
    merged.reserve(best.size() + near.size());
    std::merge(best.begin(), best.end(), near.begin(), near.end(), std::back_inserter(merged),
               by_objective);
    merged.erase(
        std::unique(merged.begin(), merged.end(),
                    [](const Candidate& a, const Candidate& b) { return a.layout == b.layout; }),
        merged.end());
    best = std::move(merged);
  }

  // Re-plan the best alone (the figures people see come from estimate() itself), guard with
  // validate_scenario(), and re-rank the first simulate_top by simulation.
  const bool sim = r.simulator_available && opt.simulate_top > 0;
  std::vector<Layout> valid;
  int valid_in_window = 0;
  for (const Candidate& c : best) {
    try {
      validate_scenario(make_scenario(space.base, c.layout));
    } catch (const InputError&) {
      ++r.rejected[static_cast<int>(Reject::invalid_scenario)];
      continue;
    }
    valid.push_back(c.layout);
    if (in_window > 0 && c.f.step_seconds <= window_limit) ++valid_in_window;
  }
  // The first simulate_top valid plans, and every one within simulate_within of the best analytic
  // step (a prefix of `valid`, which is in objective order), are simulated, in parallel and in
  // waves: a plan the simulator cannot run hands its turn to the next, as a serial pass would.
  const int sim_target = std::max(opt.simulate_top, valid_in_window);
  std::vector<Plan> plans(valid.size());
  std::vector<char> planned(valid.size(), 0);
  int simulated = 0;
  std::size_t next_plan = 0;
  const int sim_threads = std::max(1, threads_for(opt));
  while (sim && simulated < sim_target && next_plan < valid.size()) {
    const std::size_t wave =
        std::min(valid.size() - next_plan, static_cast<std::size_t>(sim_target - simulated));
    std::atomic<std::size_t> cursor{0}, finished{0};
    auto work = [&] {
      for (std::size_t i; (i = cursor.fetch_add(1)) < wave;) {
        plans[next_plan + i] = plan_of(space, valid[next_plan + i], true);
        finished.fetch_add(1, std::memory_order_release);
      }
    };
    std::vector<std::thread> pool;
    const int n =
        static_cast<int>(std::min<std::size_t>(wave, static_cast<std::size_t>(sim_threads)));
    for (int t = 1; t < n; ++t) pool.emplace_back(work);
    if (opt.rerank_progress) {
      std::thread last(work);
      while (finished.load(std::memory_order_acquire) < wave) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        opt.rerank_progress(simulated + static_cast<int>(finished.load()), sim_target);
      }
      last.join();
    } else {
      work();
    }
    for (auto& th : pool) th.join();
    for (std::size_t i = 0; i < wave; ++i) {
      planned[next_plan + i] = 1;
      if (plans[next_plan + i].simulated) ++simulated;
    }
    next_plan += wave;
  }
  for (std::size_t i = 0; i < valid.size(); ++i)
    if (!planned[i]) plans[i] = plan_of(space, valid[i], false);
  r.simulated = simulated;
  // Simulated plans are ranked among themselves by their simulated figures and stay ahead of
  // the ones only estimated (which rank below the simulated cut by analytic time anyway).
  std::stable_sort(plans.begin(), plans.end(), [&](const Plan& a, const Plan& b) {
    if (a.simulated != b.simulated) return a.simulated;
    return better(opt.objective, a.layout, a.figures, b.layout, b.figures);
  });
  if (static_cast<int>(plans.size()) > opt.top_k) plans.resize(static_cast<std::size_t>(opt.top_k));
  r.plans = std::move(plans);

  if (r.plans.empty()) {
    // The closest answer: for "gpus" the fastest layout that fits, else the lowest peak.
    std::optional<Candidate> lowest, fastest;
    for (const Partial& p : parts) {
      if (p.lowest_peak && (!lowest || p.lowest_peak->f.peak_bytes < lowest->f.peak_bytes ||
                            (p.lowest_peak->f.peak_bytes == lowest->f.peak_bytes &&
                             p.lowest_peak->layout < lowest->layout))) {
        lowest = p.lowest_peak;
      }
      if (p.fastest_below &&
          (!fastest || p.fastest_below->f.tokens_per_second > fastest->f.tokens_per_second ||
           (p.fastest_below->f.tokens_per_second == fastest->f.tokens_per_second &&
            p.fastest_below->layout < fastest->layout))) {
        fastest = p.fastest_below;
      }
    }
    const std::optional<Candidate>& closest = fastest ? fastest : lowest;
    if (closest) r.closest = plan_of(space, closest->layout, false);
    if (opt.suggest && !r.cancelled) add_suggestions(space, opt, r);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace distplan::search
