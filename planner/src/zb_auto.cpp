// The Zero Bubble paper's automatic schedule (zb_auto.h; docs/simulator.md, "zb_auto").
#include "distplan/planner/zb_auto.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "distplan/planner/error.h"

namespace distplan {

namespace {

struct Variant {
  bool allow_bubble_before_first_b = false;
  bool prioritize_b = false;
  bool no_bubble_greedy = true;
};

// One run of the list scheduler. Each pass starts when its stage is free and its input has
// arrived (the previous stage's F plus p2p, the next stage's B plus p2p) and holds its stage for
// its time; `bubble[j]` sums stage j's waits after its first forward. Returns nothing when a
// stage cannot stay within its memory limit.
class ListScheduler {
 public:
  ListScheduler(Count m, const std::vector<ZbAutoStage>& st, Seconds comm, Variant var)
      : m_(m), p_(static_cast<Count>(st.size())), st_(st), comm_(comm), var_(var) {
    const auto P = static_cast<std::size_t>(p_);
    for (auto* v : {&f_, &b_, &w_}) v->assign(P, 0);
    mem_.assign(P, 0.0);
    peak_.assign(P, 0.0);
    end_.assign(P, 0.0);
    bubble_.assign(P, 0.0);
    for (auto& t : t_) t.assign(P * static_cast<std::size_t>(m_), 0.0);
    out_.order.resize(P);
  }

  std::optional<ZbAutoSchedule> run() {
    for (Count i = 0; i < m_; ++i) {
      if (!(i == 0 ? first_microbatch() : steady(i))) return std::nullopt;
    }
    for (Count j = 0; j < p_; ++j)
      while (w_[ux(j)] < m_) put(j, kW);
    for (Count j = 0; j < p_; ++j) {
      const Seconds span = t(kW, j, m_ - 1) - t(kF, j, 0) + st_[ux(j)].forward;
      out_.longest_span = std::max(out_.longest_span, span);
    }
    out_.peak_memory = peak_;
    return std::move(out_);
  }

 private:
  static constexpr int kF = 0, kB = 1, kW = 2;

  static std::size_t ux(Count j) { return static_cast<std::size_t>(j); }
  Seconds& t(int k, Count j, Count mb) {
    return t_[k][ux(j) * static_cast<std::size_t>(m_) + static_cast<std::size_t>(mb)];
  }
  Seconds cost(int k, Count j) const {
    const ZbAutoStage& s = st_[ux(j)];
    return k == kF ? s.forward : k == kB ? s.backward_input : s.backward_weight;
  }
  double mem(int k, Count j) const {
    const ZbAutoStage& s = st_[ux(j)];
    return k == kF ? s.mem_forward : k == kB ? s.mem_backward_input : s.mem_backward_weight;
  }
  double limit(Count j) const { return st_[ux(j)].memory_limit; }
  Count& count(int k, Count j) { return (k == kF ? f_ : k == kB ? b_ : w_)[ux(j)]; }
  Seconds max_bubble() const { return *std::max_element(bubble_.begin(), bubble_.end()); }

  void put(Count j, int k) {
    const Count i = count(k, j);
    const Seconds c = cost(k, j);
    const Seconds no_wait = end_[ux(j)] + c;
    Seconds done = no_wait;
    if (j > 0 && k == kF) done = std::max(done, t(kF, j - 1, i) + comm_ + c);
    if (j < p_ - 1 && k == kB) done = std::max(done, t(kB, j + 1, i) + comm_ + c);
    if (f_[ux(j)] > 0) bubble_[ux(j)] += done - no_wait;
    end_[ux(j)] = done;
    t(k, j, i) = done;
    mem_[ux(j)] += mem(k, j);
    peak_[ux(j)] = std::max(peak_[ux(j)], mem_[ux(j)]);
    out_.order[ux(j)].push_back({static_cast<ZbPass>(k), i, done});
    ++count(k, j);
  }

  // Weight passes until `need` more memory fits; false when none is left to free it.
  bool make_room(Count j, double need) {
    while (mem_[ux(j)] + need > limit(j)) {
      if (w_[ux(j)] >= b_[ux(j)]) return false;
      put(j, kW);
    }
    return true;
  }

  // Before a pass whose input arrives at `ready`: weight passes that end by then, and one more
  // that would overrun it when waiting is worse than the largest bubble (or when greedy).
  void fill_wait(Count j, Seconds ready) {
    while (w_[ux(j)] < b_[ux(j)] && end_[ux(j)] + cost(kW, j) <= ready) put(j, kW);
    if (w_[ux(j)] < b_[ux(j)] && end_[ux(j)] < ready) {
      if (ready - end_[ux(j)] <= max_bubble() - bubble_[ux(j)]) {
        if (var_.no_bubble_greedy) put(j, kW);
      } else {
        put(j, kW);
      }
    }
  }

  // Micro-batch 0: its forward everywhere, then as many warm-up forwards on each stage as fit in
  // memory and in the time until micro-batch 0's backward comes back, then its backwards.
  bool first_microbatch() {
    for (Count j = 0; j < p_; ++j) {
      if (mem_[ux(j)] + mem(kF, j) > limit(j)) return false;
      put(j, kF);
    }
    std::vector<Count> extra(ux(p_), 0);
    Seconds last = 0;
    for (Count j = p_ - 1; j >= 0; --j) {
      if (j == p_ - 1) {
        last = t(kF, j, 0) + cost(kB, j);
        continue;
      }
      double memory = mem_[ux(j)];
      Seconds busy = end_[ux(j)];
      while (f_[ux(j)] + extra[ux(j)] < m_ && memory + mem(kF, j) <= limit(j)) {
        if (var_.allow_bubble_before_first_b ? busy + cost(kF, j) > last + comm_
                                             : busy >= last + comm_)
          break;
        memory += mem(kF, j);
        busy += cost(kF, j);
        ++extra[ux(j)];
      }
      last = std::max(busy, last + comm_) + cost(kB, j);
    }
    // A stage warms up with fewer forwards than the one before it. The authors' loop stops
    // short of that once a stage would run every forward (f + extra = m), which can leave a
    // stage more warm-up forwards than the one before it has run (a slower stage 0, m close to
    // p): a forward whose input does not exist yet, and an order that deadlocks. The previous
    // stage's count is a hard bound (issue 29, item 10).
    for (Count j = 1; j < p_; ++j) {
      while (extra[ux(j)] > 0 && extra[ux(j)] >= extra[ux(j - 1)] && f_[ux(j)] + extra[ux(j)] < m_)
        --extra[ux(j)];
      extra[ux(j)] = std::min(extra[ux(j)], extra[ux(j - 1)]);
    }
    for (Count j = 0; j < p_; ++j)
      for (Count k = 0; k < extra[ux(j)]; ++k) put(j, kF);
    for (Count j = p_ - 1; j >= 0; --j) {
      if (mem_[ux(j)] + mem(kB, j) > limit(j)) return false;
      put(j, kB);
    }
    return true;
  }

  // Micro-batch i > 0: one more forward on the stages that should run one (a prefix of the
  // pipeline), then micro-batch i's backward from the last stage down.
  bool steady(Count i) {
    std::vector<int> forward(ux(p_), 0);
    for (Count j = 0; j < p_; ++j) {
      if (f_[ux(j)] >= m_) continue;
      if (j + 1 < p_ && f_[ux(j)] >= f_[ux(j + 1)] + 2 && var_.prioritize_b) {
        // Ahead of the next stage by two: run a forward only if it (with the weight passes
        // that make room for it) ends before the next stage's F and B come back.
        const Seconds next = end_[ux(j + 1)] + cost(kF, j + 1) + cost(kB, j + 1) + comm_;
        if (end_[ux(j)] >= next) continue;
        Seconds w_cost = 0;
        double memory = mem_[ux(j)] + mem(kF, j);
        for (Count n = 0; memory > limit(j) && w_[ux(j)] + n < b_[ux(j)]; ++n) {
          w_cost += cost(kW, j);
          memory += mem(kW, j);
        }
        if (end_[ux(j)] + cost(kF, j) + w_cost <= next) {
          forward[ux(j)] = 1;
          continue;
        }
        if (next - end_[ux(j)] <= max_bubble() - bubble_[ux(j)]) continue;
      }
      forward[ux(j)] = 1;
    }
    for (Count j = p_ - 2; j >= 0; --j)
      forward[ux(j)] = std::min(forward[ux(j)], forward[ux(j + 1)]);
    for (Count j = 0; j < p_; ++j) {
      if (forward[ux(j)] == 0) continue;
      if (!make_room(j, mem(kF, j))) return false;
      if (j > 0) fill_wait(j, t(kF, j - 1, f_[ux(j)]) + comm_);
      put(j, kF);
    }
    for (Count j = p_ - 1; j >= 0; --j) {
      if (!make_room(j, mem(kB, j))) return false;
      if (j + 1 < p_) fill_wait(j, t(kB, j + 1, i) + comm_);
      if (j == 0 && f_[ux(j)] == m_)
        while (w_[ux(j)] < b_[ux(j)]) put(j, kW);
      put(j, kB);
    }
    return true;
  }

  Count m_, p_;
  const std::vector<ZbAutoStage>& st_;
  Seconds comm_;
  Variant var_;
  std::vector<Count> f_, b_, w_;
  std::vector<double> mem_, peak_;
  std::vector<Seconds> end_, bubble_;
  std::vector<Seconds> t_[3];
  ZbAutoSchedule out_;
};

}  // namespace

ZbAutoSchedule zb_auto_schedule(Count microbatches, const std::vector<ZbAutoStage>& stages,
                                Seconds p2p, const char* limit_path) {
  if (stages.empty() || microbatches < 1)
    throw InputError(limit_path, "zb_auto needs at least one stage and one micro-batch");
  std::optional<ZbAutoSchedule> best;
  for (bool allow : {true, false}) {
    for (bool prioritize : {true, false}) {
      for (bool greedy : {true, false}) {
        std::optional<ZbAutoSchedule> s =
            ListScheduler(microbatches, stages, p2p, Variant{allow, prioritize, greedy}).run();
        if (s && (!best || s->longest_span < best->longest_span)) best = std::move(s);
      }
    }
  }
  if (!best) {
    throw InputError(limit_path,
                     "the memory limit is too small for any order of the zero-bubble heuristic "
                     "(every variant would have to exceed it on some stage); raise it");
  }
  return std::move(*best);
}

}  // namespace distplan
