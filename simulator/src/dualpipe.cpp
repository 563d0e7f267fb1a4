// DualPipe's program generator (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipe.py, commit
// 3da1bbe, DualPipe.step): the source's eight steps on every stage, in its order
// (docs/simulator.md, "DualPipe").
#include <deque>

#include <fmt/format.h>

#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/simulator/schedule.h"

namespace distplan::sim {

SchedulePrograms make_dualpipe(Count p, Count m) {
  // dualpipe.py: assert num_ranks % 2 == 0; assert num_chunks > 0 and num_chunks % 2 == 0 and
  // num_chunks >= num_ranks * 2.
  if (p < 2 || p % 2 != 0) {
    throw InputError("/parallel/schedule",
                     fmt::format("dualpipe needs an even number of pipeline stages (pp >= 2, "
                                 "DualPipe asserts num_ranks % 2 == 0); pp is {}",
                                 p));
  }
  if (m % 2 != 0 || m < 2 * p) {
    throw InputError("/parallel/schedule",
                     fmt::format("dualpipe needs an even number of micro-batches per step, at "
                                 "least 2*pp = {} (DualPipe asserts num_chunks % 2 == 0 and "
                                 "num_chunks >= num_ranks * 2); the step has {}",
                                 2 * p, m));
  }
  SchedulePrograms out;
  out.stages = p;
  out.microbatches = m;
  out.virtual_stages = 2;
  out.bidirectional = true;
  out.programs.resize(static_cast<std::size_t>(p));
  const Count n = p / 2, half = m / 2;
  for (Count r = 0; r < p; ++r) {
    auto& prog = out.programs[static_cast<std::size_t>(r)];
    prog.reserve(static_cast<std::size_t>(3 * m));
    const Count h = std::min(r, p - 1 - r);  // half_rank
    const Count second = r >= n ? 1 : 0;     // is_in_second_half: phase 0 is the reverse
    const bool middle = h == n - 1;          // is_middle_rank
    Count f[2] = {0, 0}, b[2] = {0, 0};      // per direction (chunk)
    std::deque<Action> weights;              // deferred W, first in first out (WeightGradStore)
    auto action = [](Op op, Count mb, Count c) {
      return Action{op, static_cast<std::int32_t>(mb), static_cast<std::int32_t>(c), false};
    };
    // Phase (the source's argument) to chunk (the direction), and each direction's micro-batches.
    auto fwd = [&](Count phase) {
      const Count c = phase ^ second;
      prog.push_back(action(Op::forward, c * half + f[c]++, c));
    };
    auto bwd = [&](Count phase, bool split) {
      const Count c = phase ^ second;
      const Count mb = c * half + b[c]++;
      if (split) weights.push_back(action(Op::backward_weight, mb, c));
      prog.push_back(action(split ? Op::backward_input : Op::backward, mb, c));
    };
    auto wgt = [&] {
      prog.push_back(weights.front());
      weights.pop_front();
    };
    // _forward_backward_chunk: the forward overlapped with the backward pushed right after it.
    auto pair = [&](Count fphase, Count bphase) {
      fwd(fphase);
      prog.back().overlap_next = true;
      bwd(bphase, false);
    };
    for (Count i = 0; i < 2 * (n - h - 1); ++i) fwd(0);  // step 1: nF0
    for (Count i = 0; i < h + 1; ++i) fwd(0), fwd(1);    // step 2: nF0F1
    for (Count i = 0; i < n - h - 1; ++i) {              // step 3: nB1W1F1
      bwd(1, true), wgt(), fwd(1);
    }
    for (Count i = 0; i < half - p + h + 1; ++i) {  // step 4: nF0B1F1B0
      if (i == 0 && middle) {
        // "We don't overlap these two chunks to further reduce bubble size."
        fwd(0), bwd(1, false);
      } else {
        pair(0, 1);
      }
      pair(1, 0);
    }
    for (Count i = 0; i < n - h - 1; ++i) bwd(1, false), pair(1, 0);  // step 5: nB1F1B0
    bool split = false;                                               // step 6: nB1B0
    for (Count i = 0; i < h + 1; ++i) {
      if (i == (h + 1) / 2 && h % 2 == 1) split = true;
      bwd(1, split);
      if (i == (h + 1) / 2 && h % 2 == 0) split = true;
      bwd(0, split);
    }
    for (Count i = 0; i < n - h - 1; ++i) wgt(), bwd(0, true);  // step 7: nWB0
    while (!weights.empty()) wgt();                             // step 8: nW
    DISTPLAN_CHECK(f[0] == half && f[1] == half && b[0] == half && b[1] == half,
                   "DualPipe runs every pass of every micro-batch once");
  }
  return out;
}

}  // namespace distplan::sim
