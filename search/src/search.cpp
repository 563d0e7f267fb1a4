#include "distplan/search/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/validate.h"
#include "distplan/search/fast_memory.h"
#include "distplan/simulator/plan.h"

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
  sim::PlanOptions po;
  po.exposed_communication = false;  // the ranking needs the step, not its decomposition
  return figures_of(sim::plan(scenario, po), scenario);
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
  [[nodiscard]] Objective objective() const noexcept { return obj_; }

 private:
  Objective obj_;
  std::size_t keep_;
  std::vector<Candidate> heap_;
};

// One worker's share: its best candidates by their bound (a bounded heap), and the best key among
// those it had to drop, so the walk knows whether a second pass is needed.
struct Partial {
  explicit Partial(Objective obj, std::size_t keep) : top(obj, keep) {}
  TopK top;
  std::uint64_t evaluated = 0;
  std::uint64_t feasible = 0;
  RejectCounts rejected{};
  std::optional<Candidate> lowest_peak;    // lowest peak among layouts that do not fit
  std::optional<Candidate> fastest_below;  // objective "gpus": fastest fitting, under target
  std::optional<Candidate> best_dropped;   // the best candidate the heap let go
  void offer(const Layout& l, const Figures& f) {
    if (top.full()) {
      const Candidate& worst = top.worst();
      const bool enters = better(top.objective(), l, f, worst.layout, worst.f);
      const Candidate out = enters ? worst : Candidate{l, f};
      if (!best_dropped ||
          better(top.objective(), out.layout, out.f, best_dropped->layout, best_dropped->f))
        best_dropped = out;
    }
    top.offer(l, f);
  }
};

bool fits(const Figures& f, double margin) {
  return static_cast<double>(f.peak_bytes) <=
         static_cast<double>(f.capacity_bytes) * (1.0 - margin);
}

// The bound of one layout: its peak as the lean path computes it (memory_terms.h, what
// estimate() has) and a lower bound of its walked step (FastMemory::step_lower_bound, or
// estimate()'s own bound without the lean path); throughput and MFU from that step are upper
// bounds.
Figures bound_of(const Space& space, const Options& opt, FastMemory& fast, Scenario& s,
                 const Layout& l) {
  Figures f;
  if (opt.fast_memory) {
    f.peak_bytes = fast.peak_bytes(l);
    f.capacity_bytes = fast.capacity_bytes();
    f.step_seconds = fast.step_lower_bound(l);
  } else {
    apply_layout(s, l);
    f = figures_of(estimate(s), s);
    return f;
  }
  (void)space;
  apply_layout(s, l);
  f.tokens_per_second = tokens_per_second(s, f.step_seconds);
  f.mfu = 0;  // not needed to rank; the walk's is reported
  return f;
}

// Bounds every layout of the outer combinations this worker takes, and keeps the best candidates
// by bound. In a refill pass (`after` set) only candidates that rank after `after` are kept, and
// the counts are not the search's (the first pass counted every layout once).
void search_worker(const Space& space, const Options& opt, const std::vector<Outer>& outers,
                   std::atomic<std::size_t>& next, std::atomic<std::size_t>& done,
                   std::atomic<std::uint64_t>& evaluated_so_far, Partial& part,
                   const std::optional<Candidate>& after) {
  Scenario s = space.base;
  FastMemory fast(space.base);
  for (;;) {
    const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= outers.size()) break;
    if (opt.cancel && opt.cancel->load(std::memory_order_relaxed)) {
      done.fetch_add(1, std::memory_order_release);
      continue;  // drain the remaining indices so the progress loop ends
    }
    const std::uint64_t before = part.evaluated;
    if (opt.fast_memory) fast.set_outer(outers[i]);
    for_each_inner(space, outers[i], part.rejected, [&](const Layout& l) {
      const Figures f = bound_of(space, opt, fast, s, l);
      ++part.evaluated;
      if (!fits(f, opt.memory_margin)) {
        ++part.rejected[static_cast<int>(Reject::out_of_memory)];
        if (!part.lowest_peak || f.peak_bytes < part.lowest_peak->f.peak_bytes ||
            (f.peak_bytes == part.lowest_peak->f.peak_bytes && l < part.lowest_peak->layout)) {
          part.lowest_peak = Candidate{l, f};
        }
        return;
      }
      // The bound's throughput is an upper bound: below the target, the walk is too.
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
      if (after && !better(opt.objective, after->layout, after->f, l, f)) return;
      part.offer(l, f);
    });
    evaluated_so_far.fetch_add(part.evaluated - before, std::memory_order_relaxed);
    done.fetch_add(1, std::memory_order_release);
  }
}

int threads_for(const Options& opt) {
  return opt.threads > 0 ? opt.threads
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// A tighter lower bound of a layout's walked step, shared by every layout that differs from it
// only in its ZeRO stage and shard group: the walk of its schedule program with every DP and
// ZeRO transfer and the optimizer at zero time (those are all the ZeRO stage changes in time;
// communication and the optimizer only add to a step). Unlike the closed form it has the
// pipeline's own bubble. +inf when the walk refuses the layout.
Seconds quiet_walk_seconds(const Space& space, const Layout& l) {
  const Scenario s = make_scenario(space.base, l);
  Estimate e = estimate(s);
  for (StageCosts& k : e.stage_costs)
    k.grad_reduce = k.param_gather = k.zero3_gather = k.optimizer = 0;
  sim::SimOptions so;
  so.exposed_communication = false;
  try {
    return sim::simulate(s, e, so).step_seconds;
  } catch (const InputError&) {
    return std::numeric_limits<double>::infinity();
  }
}

// The layouts one quiet walk bounds: the ZeRO stage and shard group left out.
Layout quiet_key(Layout l) {
  l.zero_stage = 0;
  l.fsdp_shard_size = 0;
  return l;
}

// The plan of one layout: the walk's figures (sim::plan) beside estimate()'s bound. nullopt when
// the walk refuses the layout (a step of more passes than simulate() takes).
std::optional<Plan> plan_of(const Space& space, const Layout& l) {
  const Scenario s = make_scenario(space.base, l);
  Estimate e = estimate(s);
  Plan p;
  p.layout = l;
  p.bound = figures_of(e, s);
  sim::SimOptions so;
  so.exposed_communication = false;
  try {
    sim::apply_walk(s, sim::simulate(s, e, so), e);
  } catch (const InputError&) {
    return std::nullopt;
  }
  p.figures = figures_of(e, s);
  p.bubble_fraction = e.time.bubble_fraction;
  return p;
}

void add_suggestions(const Space& space, const Options& opt, Result& r) {
  const double limit_factor = 1.0 - opt.memory_margin;
  if (r.closest) {
    const Plan& c = *r.closest;
    const Scenario s = make_scenario(space.base, c.layout);
    const Estimate e = sim::plan(s);
    if (!fits(c.figures, opt.memory_margin)) {
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
        const Estimate eo = sim::plan(x);
        Suggestion off;
        off.change = "optimizer_offload";
        off.value = static_cast<double>(eo.memory.peak_bytes);
        off.fits =
            eo.memory.host_fits && static_cast<double>(eo.memory.peak_bytes) <=
                                       static_cast<double>(c.figures.capacity_bytes) * limit_factor;
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "offloading the optimizer states of the closest layout to CPU memory%s "
                      "would lower its peak from %.1f GiB to %.1f GiB (capacity %.1f GiB), "
                      "%+.2f s per step, %.1f GiB of host memory per node",
                      s.parallel.zero_stage == 0 ? " (with ZeRO-1)" : "",
                      to_gib(c.figures.peak_bytes), to_gib(eo.memory.peak_bytes),
                      to_gib(c.figures.capacity_bytes), eo.time.step_seconds - e.time.step_seconds,
                      to_gib(eo.memory.host_bytes_per_node));
        off.detail = buf;
        r.suggestions.push_back(off);
      }

      char buf[256];
      Suggestion gpu;
      gpu.change = "larger_gpu";
      gpu.value = std::ceil(static_cast<double>(c.figures.peak_bytes) / limit_factor);
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
        (!target || rr.plans.front().figures.tokens_per_second >= opt.target_tokens_per_second)) {
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

namespace {

// One pass of the workers over the whole space (the first, which counts, or a refill pass).
std::vector<Partial> bound_pass(const Space& space, const Options& opt,
                                const std::vector<Outer>& outers, int threads, std::size_t keep,
                                const std::optional<Candidate>& after, bool report) {
  std::vector<Partial> parts(static_cast<std::size_t>(threads), Partial(opt.objective, keep));
  std::atomic<std::size_t> next{0}, done{0};
  std::atomic<std::uint64_t> evaluated_so_far{0};
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back(search_worker, std::cref(space), std::cref(opt), std::cref(outers),
                      std::ref(next), std::ref(done), std::ref(evaluated_so_far),
                      std::ref(parts[static_cast<std::size_t>(t)]), std::cref(after));
  }
  if (report && opt.progress && !outers.empty()) {
    // The calling thread reports progress while the workers run.
    std::thread last(search_worker, std::cref(space), std::cref(opt), std::cref(outers),
                     std::ref(next), std::ref(done), std::ref(evaluated_so_far), std::ref(parts[0]),
                     std::cref(after));
    while (done.load(std::memory_order_acquire) < outers.size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      opt.progress(static_cast<double>(done.load()) / static_cast<double>(outers.size()),
                   evaluated_so_far.load());
    }
    last.join();
  } else {
    search_worker(space, opt, outers, next, done, evaluated_so_far, parts[0], after);
  }
  for (auto& th : pool) th.join();
  return parts;
}

// Whether a candidate whose bound is `c` could still rank before `worst`, the last of the best
// plans: the walk's step is no shorter than the bound's, so its throughput is no higher. With the
// memory objective candidates rank by the planner's peak, which for DualPipe, DualPipeV and
// zb_auto can lie above the walk's (docs/search.md, "Ranking by the walk").
bool could_enter(Objective obj, const Candidate& c, const Plan& worst) {
  switch (obj) {
    case Objective::throughput:
      return ranks_before(obj, c.layout, c.f, worst.layout, worst.figures) ||
             c.f.step_seconds <= worst.figures.step_seconds;
    case Objective::gpus:
      if (c.layout.num_gpus() != worst.layout.num_gpus())
        return c.layout.num_gpus() < worst.layout.num_gpus();
      return c.f.step_seconds <= worst.figures.step_seconds;
    case Objective::memory:
      return c.f.peak_bytes <= worst.figures.peak_bytes;
  }
  return true;
}

}  // namespace

Result run(const Space& space, const Options& opt) {
  const auto t0 = Clock::now();
  // The same limits as the JSON fields (docs/api.md), whoever sets them (CLI flags, the GUI).
  if (opt.top_k < 1 || opt.top_k > kMaxTopK)
    throw InputError("/search/top_k", fmt::format("must be between 1 and {}", kMaxTopK));
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

  const std::vector<Outer> outers = enumerate_outer(space, r.rejected);
  int threads = threads_for(opt);
  threads =
      static_cast<int>(std::min<std::size_t>(threads, std::max<std::size_t>(1, outers.size())));
  r.threads = threads;

  // Candidates kept per worker and pass: enough that one pass nearly always suffices.
  const std::size_t keep = std::max<std::size_t>(256, 8 * static_cast<std::size_t>(opt.top_k));
  std::vector<Partial> parts =
      bound_pass(space, opt, outers, threads, keep, std::nullopt, /*report=*/true);
  r.evaluate_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cancelled = opt.cancel && opt.cancel->load();
  for (const Partial& p : parts) {
    r.evaluated += p.evaluated;
    r.feasible += p.feasible;
    for (int i = 0; i < kNumRejects; ++i) r.rejected[i] += p.rejected[i];
  }

  // Branch and bound (docs/search.md, "Ranking by the walk"): the candidates in order of their
  // bound are planned with the walk, in parallel waves, until the next one's bound cannot enter
  // the best plans. A pass keeps every candidate that ranks before the best one a worker dropped;
  // when the walk gets that far, another pass over the space brings the next ones.
  auto by_bound = [&](const Candidate& a, const Candidate& b) {
    return better(opt.objective, a.layout, a.f, b.layout, b.f);
  };
  std::vector<Plan> best;  // the walked plans that fit, best first, at most top_k
  auto ranks = [&](const Plan& a, const Plan& b) {
    return better(opt.objective, a.layout, a.figures, b.layout, b.figures);
  };
  std::uint64_t walked = 0, refused = 0;
  std::mutex quiet_mutex;
  std::map<Layout, Seconds> quiet_cache;  // quiet_walk_seconds by quiet_key
  const int sim_threads = std::max(1, threads_for(opt));
  bool finished = false;
  while (!finished && !r.cancelled) {
    std::vector<Candidate> cands;
    std::optional<Candidate> dropped;  // the best candidate any worker let go
    for (const Partial& p : parts) {
      cands.insert(cands.end(), p.top.items().begin(), p.top.items().end());
      if (p.best_dropped && (!dropped || by_bound(*p.best_dropped, *dropped)))
        dropped = p.best_dropped;
    }
    std::sort(cands.begin(), cands.end(), by_bound);
    // Every candidate before `dropped` is here; those after it may not be.
    if (dropped) {
      const auto end = std::lower_bound(cands.begin(), cands.end(), *dropped, by_bound);
      cands.erase(end, cands.end());
    }
    // The candidates are decided one by one in bound order, as a serial walk would: a wave walks
    // the next ones in parallel, and those after the one that stops the walk are discarded, so
    // what is walked does not depend on the thread count or on where a pass's list ends.
    auto open = [&](std::size_t k) {
      return static_cast<int>(best.size()) < opt.top_k ||
             could_enter(opt.objective, cands[k], best.back());
    };
    // A candidate whose quiet walk (quiet_walk_seconds) already cannot enter is not walked.
    auto enters_with = [&](std::size_t k, Seconds quiet) {
      if (static_cast<int>(best.size()) < opt.top_k || opt.objective == Objective::memory)
        return true;
      Candidate c = cands[k];
      if (quiet > c.f.step_seconds) {
        c.f.step_seconds = quiet;
        c.f.tokens_per_second = tokens_per_second(space.base, quiet);
      }
      return could_enter(opt.objective, c, best.back());
    };
    std::size_t next = 0;
    bool stopped = false;
    while (!stopped && next < cands.size() && !r.cancelled) {
      if (!open(next)) {
        stopped = true;
        break;
      }
      constexpr std::size_t kWave = 16;
      const std::size_t wave = std::min(cands.size() - next, kWave);
      std::vector<std::optional<Plan>> planned(wave);
      std::vector<Seconds> quiet(wave, 0.0);
      std::atomic<std::size_t> cursor{0};
      // Each candidate's quiet walk (once per ZeRO-free layout), and its full walk where the quiet
      // one leaves it a chance at the best as they stand when the wave starts (the best only get
      // better, so a candidate ruled out now stays out when its turn comes).
      auto work = [&] {
        for (std::size_t i; (i = cursor.fetch_add(1)) < wave;) {
          const Layout& l = cands[next + i].layout;
          const Layout key = quiet_key(l);
          bool cached = false;
          {
            const std::lock_guard<std::mutex> lock(quiet_mutex);
            if (auto it = quiet_cache.find(key); it != quiet_cache.end()) {
              quiet[i] = it->second;
              cached = true;
            }
          }
          if (!cached && opt.objective != Objective::memory) {
            quiet[i] = quiet_walk_seconds(space, key);
            const std::lock_guard<std::mutex> lock(quiet_mutex);
            quiet_cache.emplace(key, quiet[i]);
          }
          if (enters_with(next + i, quiet[i])) planned[i] = plan_of(space, l);
        }
      };
      std::vector<std::thread> pool;
      const int n =
          static_cast<int>(std::min<std::size_t>(wave, static_cast<std::size_t>(sim_threads)));
      for (int t = 1; t < n; ++t) pool.emplace_back(work);
      work();
      for (auto& th : pool) th.join();
      for (std::size_t i = 0; i < wave; ++i) {
        if (!open(next + i)) {
          stopped = true;
          next += i;
          break;
        }
        if (!enters_with(next + i, quiet[i])) continue;  // pruned by its quiet walk
        ++walked;
        if (!planned[i]) {
          ++refused;
          continue;
        }
        const Plan& p = *planned[i];
        if (!fits(p.figures, opt.memory_margin)) {
          ++r.rejected[static_cast<int>(Reject::out_of_memory)];
          continue;
        }
        if (opt.objective == Objective::gpus &&
            p.figures.tokens_per_second < opt.target_tokens_per_second) {
          ++r.rejected[static_cast<int>(Reject::below_target)];
          continue;
        }
        best.insert(std::upper_bound(best.begin(), best.end(), p, ranks), p);
        if (static_cast<int>(best.size()) > opt.top_k) best.pop_back();
      }
      if (!stopped) next += wave;
      if (opt.walk_progress) opt.walk_progress(walked, walked + (cands.size() - next));
      r.cancelled = opt.cancel && opt.cancel->load();
    }
    if (stopped || !dropped || r.cancelled) {
      finished = true;
    } else {
      // The walk reached what the workers dropped: bring the candidates after the last one.
      const Candidate last = cands.empty() ? *dropped : cands.back();
      parts = bound_pass(space, opt, outers, threads, keep, last, /*report=*/false);
    }
  }
  r.walked = walked;
  r.rejected[static_cast<int>(Reject::invalid_scenario)] += refused;
  r.pruned = r.feasible >= walked ? r.feasible - walked : 0;
  r.plans = std::move(best);

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
    if (closest) r.closest = plan_of(space, closest->layout);
    if (opt.suggest && !r.cancelled) add_suggestions(space, opt, r);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace distplan::search
