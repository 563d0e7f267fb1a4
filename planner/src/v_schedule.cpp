// The V-shape schedules' orders and their step on given pass times (v_schedule.h).
#include "distplan/planner/v_schedule.h"

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "distplan/planner/check.h"
#include "distplan/planner/layout.h"
#include "v_reorder.h"

namespace distplan {

namespace {

VPass pass(ZbPass p, Count mb, Count chunk) {
  return VPass{p, mb, chunk};
}

VOrder zb_v(Count p, Count m) {
  VOrder out(static_cast<std::size_t>(p));
  // PyTorch builds the order for at least 2p - 1 micro-batches (the V's warm-up) and drops the
  // passes of those that do not exist; the rest keeps its order (ScheduleZBVZeroBubble,
  // torch/distributed/pipelining/schedules.py).
  const Count n = std::max(m, 2 * p - 1);
  for (Count s = 0; s < p; ++s) {
    auto& prog = out[static_cast<std::size_t>(s)];
    prog.reserve(static_cast<std::size_t>(6 * m));
    Count f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
    auto push = [&](ZbPass op, Count chunk, Count& counter) {
      if (counter < m) prog.push_back(pass(op, counter, chunk));
      ++counter;
    };
    auto fwd = [&](Count c) { push(ZbPass::forward, c, f[c]); };
    auto bwd = [&](Count c) { push(ZbPass::backward_input, c, b[c]); };
    auto wgt = [&](Count c) { push(ZbPass::backward_weight, c, w[c]); };
    for (Count i = 0; i < 2 * (p - s) - 1; ++i) fwd(0);
    for (Count i = 0; i < s; ++i) fwd(1), fwd(0);
    for (Count i = 0; i < p - s; ++i) fwd(1), bwd(1), wgt(1);
    while (f[1] < f[0] || f[0] < n) {
      if (f[0] < n) fwd(0);
      bwd(0), wgt(0);
      fwd(1), bwd(1), wgt(1);
    }
    for (Count i = 0; i < s; ++i) bwd(0), bwd(1);
    for (Count i = 0; i < p - s; ++i) bwd(0), wgt(0);
    while (w[1] < b[1]) wgt(1);
    while (w[0] < b[0]) wgt(0);
    DISTPLAN_CHECK(f[0] == n && f[1] == n && b[0] == n && b[1] == n && w[0] == n && w[1] == n,
                   "ZB-V runs every pass of every micro-batch once");
  }
  return out;
}

// Slot order of a V building block (V-Half, V-Min). `first[s]` holds the slots of micro-batch
// 0's F chunk 0, F chunk 1, B chunk 1, B chunk 0 on stage s; micro-batch k adds 6k. The authors'
// reordering (v_reorder.h) then moves the warm-up and cool-down passes earlier.
VOrder v_from_block(Count p, Count m, const std::vector<std::array<Count, 4>>& first) {
  VOrder out(static_cast<std::size_t>(p));
  static constexpr ZbPass kOp[4] = {ZbPass::forward, ZbPass::forward, ZbPass::backward_input,
                                    ZbPass::backward_input};
  static constexpr Count kChunk[4] = {0, 1, 1, 0};
  std::vector<detail::StageSlots> slots(static_cast<std::size_t>(p));
  for (Count s = 0; s < p; ++s) {
    auto& st = slots[static_cast<std::size_t>(s)];
    st.resize(4);
    for (std::size_t t = 0; t < 4; ++t)
      for (Count k = 0; k < m; ++k) st[t].push_back(first[static_cast<std::size_t>(s)][t] + 6 * k);
  }
  slots = detail::squeeze_v_block(std::move(slots));
  for (Count s = 0; s < p; ++s) {
    const auto& base = slots[static_cast<std::size_t>(s)];
    auto& prog = out[static_cast<std::size_t>(s)];
    prog.reserve(static_cast<std::size_t>(6 * m));
    Count next[4] = {0, 0, 0, 0};  // next micro-batch of each kind
    Count pending[2] = {0, 0};     // W owed for chunk 1, chunk 0 (in B order)
    Count done_w[2] = {0, 0};
    Count last_slot = 0;
    for (const auto& kind : base) last_slot = std::max(last_slot, kind.back());
    for (Count slot = 0; slot <= last_slot; ++slot) {
      int kind = -1;
      for (int t = 0; t < 4; ++t) {
        if (next[t] < m &&
            base[static_cast<std::size_t>(t)][static_cast<std::size_t>(next[t])] == slot)
          kind = t;
      }
      if (kind >= 0) {
        prog.push_back(pass(kOp[kind], next[kind]++, kChunk[kind]));
        if (kind >= 2) ++pending[kind - 2];
        continue;
      }
      for (int w = 0; w < 2; ++w) {
        if (pending[w] > 0) {
          --pending[w];
          prog.push_back(pass(ZbPass::backward_weight, done_w[w]++, w == 0 ? 1 : 0));
          break;
        }
      }
    }
    for (int w = 0; w < 2; ++w)
      while (pending[w]-- > 0)
        prog.push_back(pass(ZbPass::backward_weight, done_w[w]++, w == 0 ? 1 : 0));
  }
  return out;
}

VOrder v_half(Count p, Count m) {
  const Count d = p % 2 == 0 ? 3 : 0;
  std::vector<std::array<Count, 4>> first(static_cast<std::size_t>(p));
  for (Count s = 0; s < p; ++s)
    first[static_cast<std::size_t>(s)] = {2 * s, 3 * p - s - 2, 3 * p + d + 2 * s - 1,
                                          6 * p + d - s - 2};
  return v_from_block(p, m, first);
}

VOrder v_min(Count p, Count m) {
  const Count d = p % 3 == 0 ? 2 : 0;
  std::vector<std::array<Count, 4>> first(static_cast<std::size_t>(p));
  for (Count s = 0; s < p; ++s)
    first[static_cast<std::size_t>(s)] = {s, 2 * p - s - 1, 2 * p + d + s, 4 * p + d - s - 1};
  return v_from_block(p, m, first);
}

VOrder build_order(Schedule kind, Count p, Count m) {
  switch (kind) {
    case Schedule::zb_v:
      return zb_v(p, m);
    case Schedule::v_half:
      return v_half(p, m);
    case Schedule::v_min:
      return v_min(p, m);
    default:
      break;
  }
  DISTPLAN_CHECK(false, "v_schedule_order takes zb_v, v_half or v_min");
  return {};
}

}  // namespace

VOrder v_schedule_order(Schedule kind, Count p, Count m) {
  DISTPLAN_CHECK(p >= 1 && m >= 1, "a V schedule needs p, m >= 1");
  // The order depends on (kind, p, m) only, and the authors' reordering takes a while at large m
  // (about 0.2 s at p = 16, m = 512): a search estimating many layouts builds each order once.
  static std::mutex mutex;
  static std::map<std::tuple<Schedule, Count, Count>, VOrder> cache;
  constexpr std::size_t kMaxCached = 64;
  const auto key = std::make_tuple(kind, p, m);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  VOrder order = build_order(kind, p, m);
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxCached) cache.clear();
  cache.emplace(key, order);
  return order;
}

}  // namespace distplan
