// The V-Half / V-Min authors' reordering of the building block (v_reorder.h).
#include "v_reorder.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "distplan/planner/check.h"

namespace distplan::detail {

namespace {

// Kinds: 0 F chunk 0, 1 F chunk 1, 2 B chunk 1, 3 B chunk 0, then W (one list, or W chunk 1 and
// W chunk 0 when split). Activations: a forward adds one set, a W frees one.
constexpr Count kMem[5] = {1, 1, 0, 0, -1};

Count last_slot(const StageSlots& s) {
  Count last = 0;
  for (const auto& kind : s)
    if (!kind.empty()) last = std::max(last, kind.back());
  return last;
}

// Fills each empty slot with the oldest pending W (put_w); `split` keeps one W list per chunk
// (chunk 1's first), else one list. Appends the W kind(s) to the four F/B kinds.
StageSlots put_w(StageSlots s, bool split) {
  DISTPLAN_CHECK(s.size() == 4, "put_w takes the four F/B kinds");
  const Count bound = last_slot(s);
  s.emplace_back();
  if (split) s.emplace_back();
  Count pending[2] = {0, 0};
  std::size_t p[4] = {0, 0, 0, 0};
  Count i = 0;
  for (; i <= bound; ++i) {
    int kind = -1;
    for (int t = 0; t < 4; ++t)
      if (p[t] < s[static_cast<std::size_t>(t)].size() && s[static_cast<std::size_t>(t)][p[t]] == i)
        kind = t;
    if (kind >= 0) {
      ++p[kind];
      if (kind >= 2) ++pending[split ? kind - 2 : 0];
      continue;
    }
    for (int w = 0; w < 2; ++w) {
      if (pending[w] > 0) {
        s[static_cast<std::size_t>(4 + w)].push_back(i);
        --pending[w];
        break;
      }
    }
  }
  --i;
  for (int w = 0; w < 2; ++w) {
    while (pending[w] > 0) {
      s[static_cast<std::size_t>(4 + w)].push_back(++i);
      --pending[w];
    }
  }
  return s;
}

// Peak activation sets of a stage (mem_of_stage): with a W kind, W frees at its slot; without,
// each empty slot frees one pending W.
Count stage_peak(const StageSlots& s) {
  const bool has_w = s.size() > 4;
  std::vector<std::pair<Count, int>> events;
  for (std::size_t t = 0; t < s.size(); ++t)
    for (Count x : s[t]) events.emplace_back(x, static_cast<int>(t));
  std::sort(events.begin(), events.end());
  const Count bound = last_slot(s);
  Count cur = 0, peak = 0, pending = 0;
  std::size_t e = 0;
  for (Count i = 0; i <= bound; ++i) {
    if (e < events.size() && events[e].first == i) {
      const int t = events[e].second;
      ++e;
      cur += kMem[std::min(t, 4)];
      if (t == 2 || t == 3) ++pending;
    } else if (!has_w && pending > 0) {
      cur += kMem[4];
      --pending;
    }
    peak = std::max(peak, cur);
  }
  return peak;
}

// Nodes in the authors' global order: by slot, then stage, kind, micro-batch.
struct Node {
  Count slot, stage, kind, mb;
};

template <class Visit>
void in_slot_order(const std::vector<StageSlots>& st, Visit&& visit) {
  const auto P = st.size();
  const std::size_t K = st[0].size();
  std::vector<std::vector<std::size_t>> p(P, std::vector<std::size_t>(K, 0));
  for (;;) {
    Node best{std::numeric_limits<Count>::max(), 0, 0, 0};
    bool any = false;
    for (std::size_t s = 0; s < P; ++s) {
      for (std::size_t k = 0; k < K; ++k) {
        if (p[s][k] >= st[s][k].size()) continue;
        const Node n{st[s][k][p[s][k]], static_cast<Count>(s), static_cast<Count>(k),
                     static_cast<Count>(p[s][k])};
        if (!any || std::tie(n.slot, n.stage, n.kind, n.mb) <
                        std::tie(best.slot, best.stage, best.kind, best.mb)) {
          best = n;
          any = true;
        }
      }
    }
    if (!any) return;
    ++p[static_cast<std::size_t>(best.stage)][static_cast<std::size_t>(best.kind)];
    visit(best);
  }
}

// Eager execution in unit time (eager_execution_time with costs 1 and no p2p): every pass starts
// when its dependencies and its stage's previous pass are done. Returns the start slots.
std::vector<StageSlots> eager(const std::vector<StageSlots>& st) {
  const Count P = static_cast<Count>(st.size());
  std::map<std::tuple<Count, Count, Count>, Count> end;
  std::vector<std::pair<Count, Count>> last(static_cast<std::size_t>(P), {-1, -1});
  std::vector<StageSlots> out = st;
  in_slot_order(st, [&](const Node& n) {
    Count deps = 0;
    auto after = [&](Count s, Count k, Count mb) { deps = std::max(deps, end.at({s, k, mb})); };
    if ((n.kind == 0 || n.kind == 2) && n.stage > 0) after(n.stage - 1, n.kind, n.mb);
    if ((n.kind == 1 || n.kind == 3) && n.stage + 1 < P) after(n.stage + 1, n.kind, n.mb);
    if (n.kind > 0 && n.kind < 4) after(n.stage, n.kind - 1, n.mb);
    if (n.mb > 0) after(n.stage, n.kind, n.mb - 1);
    const auto& prev = last[static_cast<std::size_t>(n.stage)];
    if (prev.first >= 0) after(n.stage, prev.first, prev.second);
    end[{n.stage, n.kind, n.mb}] = deps + 1;
    out[static_cast<std::size_t>(n.stage)][static_cast<std::size_t>(n.kind)]
       [static_cast<std::size_t>(n.mb)] = deps;
    last[static_cast<std::size_t>(n.stage)] = {n.kind, n.mb};
  });
  return out;
}

// One reorder pass: warm-up (only with W placed) and cool-down passes move to the earliest free
// slot after their dependencies that keeps the peak; the steady phase keeps its slots.
std::vector<StageSlots> reorder(std::vector<StageSlots> st, bool consider_w) {
  if (consider_w)
    for (auto& s : st) s = put_w(std::move(s), false);
  const Count P = static_cast<Count>(st.size());
  Count current = 0;
  for (const auto& s : st) current = std::max(current, stage_peak(s));
  std::vector<std::vector<std::uint8_t>> occupied;
  for (const auto& s : st) occupied.emplace_back(static_cast<std::size_t>(s.back().back() + 1), 0);
  const Count last_mb = static_cast<Count>(st[0][0].size()) - 1;
  int phase = 0;
  // Iterate over a snapshot of the order: moves only go earlier, the authors' min-of-heads order
  // over the live table is the same as the order of the original slots.
  const std::vector<StageSlots> original = st;
  in_slot_order(original, [&](const Node& n) {
    auto& slots = st[static_cast<std::size_t>(n.stage)];
    auto& occ = occupied[static_cast<std::size_t>(n.stage)];
    const Count next_time = n.slot;
    if (n.kind == 3 && n.stage == 0 && phase == 0) ++phase;
    if (phase == 1 || (phase == 0 && !consider_w)) {
      if (phase == 1 && n.kind == 0 && n.mb == last_mb) ++phase;
      occ[static_cast<std::size_t>(next_time)] = 1;
      return;
    }
    auto at = [&](Count s, Count k, Count mb) {
      return st[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)]
               [static_cast<std::size_t>(mb)];
    };
    Count deps = -1;
    if ((n.kind == 0 || n.kind == 2) && n.stage > 0)
      deps = std::max(deps, at(n.stage - 1, n.kind, n.mb));
    if ((n.kind == 1 || n.kind == 3) && n.stage + 1 < P)
      deps = std::max(deps, at(n.stage + 1, n.kind, n.mb));
    if (n.kind > 0 && n.kind < 4) deps = std::max(deps, at(n.stage, n.kind - 1, n.mb));
    if (n.kind == 4) {
      std::vector<Count> b = slots[2];
      b.insert(b.end(), slots[3].begin(), slots[3].end());
      std::sort(b.begin(), b.end());
      deps = std::max(deps, b[static_cast<std::size_t>(n.mb)]);
    }
    if (n.mb > 0) deps = std::max(deps, at(n.stage, n.kind, n.mb - 1));
    ++deps;
    Count& mine = slots[static_cast<std::size_t>(n.kind)][static_cast<std::size_t>(n.mb)];
    bool ok = false;
    for (Count t = deps; t < next_time; ++t) {
      if (occ[static_cast<std::size_t>(t)]) continue;
      mine = t;
      if (stage_peak(slots) <= current) {
        ok = true;
        break;
      }
    }
    if (!ok) mine = next_time;
    occ[static_cast<std::size_t>(mine)] = 1;
  });
  if (!consider_w)
    for (auto& s : st) s = put_w(std::move(s), false);
  return eager(st);
}

}  // namespace

std::vector<StageSlots> squeeze_v_block(std::vector<StageSlots> slots) {
  std::vector<StageSlots> r1 = reorder(std::move(slots), true);
  for (auto& s : r1) s.resize(4);
  std::vector<StageSlots> r2 = reorder(std::move(r1), false);
  for (auto& s : r2) s.resize(4);
  return r2;
}

}  // namespace distplan::detail
