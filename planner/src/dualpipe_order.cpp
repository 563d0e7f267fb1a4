// DualPipe's pass order and its activation peak (dualpipe_order.h).
#include "distplan/planner/dualpipe_order.h"

#include <algorithm>
#include <deque>

#include <fmt/format.h>

#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"

namespace distplan {

DualPipeOrder dualpipe_order(Count p, Count m) {
  using Op = DualPipePass::Op;
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
  DualPipeOrder out(static_cast<std::size_t>(p));
  const Count n = p / 2, half = m / 2;
  for (Count r = 0; r < p; ++r) {
    auto& prog = out[static_cast<std::size_t>(r)];
    prog.reserve(static_cast<std::size_t>(3 * m));
    const Count h = std::min(r, p - 1 - r);  // half_rank
    const Count second = r >= n ? 1 : 0;     // is_in_second_half: phase 0 is the reverse
    const bool middle = h == n - 1;          // is_middle_rank
    Count f[2] = {0, 0}, b[2] = {0, 0};      // per direction (chunk)
    std::deque<DualPipePass> weights;        // deferred W, first in first out (WeightGradStore)
    // Phase (the source's argument) to chunk (the direction), and each direction's micro-batches.
    auto fwd = [&](Count phase) {
      const Count c = phase ^ second;
      prog.push_back(DualPipePass{Op::forward, c * half + f[c]++, c, false});
    };
    auto bwd = [&](Count phase, bool split) {
      const Count c = phase ^ second;
      const Count mb = c * half + b[c]++;
      if (split) weights.push_back(DualPipePass{Op::backward_weight, mb, c, false});
      prog.push_back(DualPipePass{split ? Op::backward_input : Op::backward, mb, c, false});
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

DualPipeOrder dualpipe_v_order(Count p, Count m) {
  using Op = DualPipePass::Op;
  if (m < 2 * p) {
    throw InputError("/parallel/schedule",
                     fmt::format("dualpipe_v needs at least 2*pp = {} micro-batches per step, as "
                                 "DualPipeV asserts (num_chunks >= num_ranks * 2); the step has {}",
                                 2 * p, m));
  }
  DualPipeOrder out(static_cast<std::size_t>(p));
  for (Count r = 0; r < p; ++r) {
    auto& prog = out[static_cast<std::size_t>(r)];
    prog.reserve(static_cast<std::size_t>(6 * m));
    Count f[2] = {0, 0}, b[2] = {0, 0};
    std::deque<DualPipePass> weights;  // deferred W, first in first out (WeightGradStore)
    auto fwd = [&](Count c) { prog.push_back(DualPipePass{Op::forward, f[c]++, c, false}); };
    auto bwd = [&](Count c, bool split) {
      if (split) weights.push_back(DualPipePass{Op::backward_weight, b[c], c, false});
      prog.push_back(DualPipePass{split ? Op::backward_input : Op::backward, b[c]++, c, false});
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

Bytes order_activation_peak(const std::vector<DualPipePass>& passes,
                            const std::vector<Bytes>& chunk_bytes) {
  using Op = DualPipePass::Op;
  Bytes bytes = 0, peak = 0;
  for (const DualPipePass& x : passes) {
    const Bytes b = chunk_bytes[static_cast<std::size_t>(x.chunk)];
    if (x.op == Op::forward) {
      bytes += b;
      peak = std::max(peak, bytes);
    } else if (x.op == Op::backward || x.op == Op::backward_weight) {
      bytes -= b;
    }
  }
  return peak;
}

DualPipePeak dualpipe_activation_peak(Count p, Count m, Count stage, Bytes chunk_bytes,
                                      Bytes first_bytes, Bytes last_bytes) {
  // Along DualPipe's order (layout.h, two_chunk_live_sets: the simulator's accounting, a set
  // counted when its forward starts and freed when its whole backward or its weight pass ends).
  auto set_bytes = [&](Count chunk) {
    const Count ms = dualpipe_model_stage(p, stage, chunk);
    return chunk_bytes + (ms == 0 ? first_bytes : 0) + (ms == p - 1 ? last_bytes : 0);
  };
  DualPipePeak peak;
  for (const auto& n : two_chunk_live_sets(Schedule::dualpipe, p, m, stage)) {
    peak.peak_sets = std::max(peak.peak_sets, n[0] + n[1]);
    peak.peak_bytes = std::max(peak.peak_bytes, n[0] * set_bytes(0) + n[1] * set_bytes(1));
  }
  return peak;
}

}  // namespace distplan
