// DualPipe's program (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipe.py, commit 3da1bbe,
// DualPipe.step): the planner's order (dualpipe_order.h) as a schedule program
// (docs/simulator.md, "DualPipe").
#include "distplan/planner/dualpipe_order.h"
#include "distplan/simulator/schedule.h"

namespace distplan::sim {

// The order's passes are the program's ops, one to one.
static_assert(static_cast<int>(DualPipePass::Op::backward) == static_cast<int>(Op::backward));
static_assert(static_cast<int>(DualPipePass::Op::backward_input) ==
              static_cast<int>(Op::backward_input));
static_assert(static_cast<int>(DualPipePass::Op::backward_weight) ==
              static_cast<int>(Op::backward_weight));

SchedulePrograms make_dualpipe(Count p, Count m) {
  const DualPipeOrder order = dualpipe_order(p, m);  // throws at /parallel/schedule
  SchedulePrograms out;
  out.stages = p;
  out.microbatches = m;
  out.virtual_stages = 2;
  out.bidirectional = true;
  out.programs.resize(static_cast<std::size_t>(p));
  for (std::size_t s = 0; s < order.size(); ++s) {
    auto& prog = out.programs[s];
    prog.reserve(order[s].size());
    for (const DualPipePass& x : order[s]) {
      prog.push_back(Action{static_cast<Op>(x.op), static_cast<std::int32_t>(x.microbatch),
                            static_cast<std::int32_t>(x.chunk), x.overlap_next});
    }
  }
  return out;
}

}  // namespace distplan::sim
