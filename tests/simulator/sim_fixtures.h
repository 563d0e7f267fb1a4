// Scenarios and estimates built by hand for the simulator tests: the simulator reads only the
// layout (pp, dp, m, schedule, v), the per-stage costs and the activation bytes per micro-batch.
#pragma once

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"
#include "distplan/simulator/simulate.h"

namespace distplan::sim::testing {

/// pp = p, dp = 1, micro-batch 1, global batch m: m micro-batches per step.
inline Scenario pipeline(Count p, Count m, Schedule schedule, Count v = 1) {
  Scenario s;
  s.parallel.pp = p;
  s.parallel.dp = 1;
  s.parallel.tp = 1;
  s.parallel.schedule = schedule;
  s.parallel.virtual_stages = v;
  s.training.micro_batch_size = 1;
  s.training.global_batch_size = m;
  s.cluster.num_gpus = p;
  s.cluster.gpus_per_node = 8;
  return s;
}

/// An estimate whose every stage has `act` activation bytes per micro-batch and the given costs.
inline Estimate uniform_estimate(Count p, Bytes act = 0, StageCosts costs = {}) {
  Estimate e;
  e.stage_costs.assign(static_cast<std::size_t>(p), costs);
  e.memory.stages.resize(static_cast<std::size_t>(p));
  for (Count i = 0; i < p; ++i) {
    e.memory.stages[static_cast<std::size_t>(i)].stage = static_cast<int>(i);
    e.memory.stages[static_cast<std::size_t>(i)].activation_bytes_per_microbatch = act;
  }
  return e;
}

inline SimOptions with_costs(Seconds f, Seconds b, std::optional<Seconds> w = std::nullopt,
                             Seconds p2p = 0) {
  SimOptions o;
  o.costs = CostOverride{f, b, w, p2p, std::nullopt};
  return o;
}

/// Costs of one DualPipe / DualPipeV chunk (half of a device's layers): F, B (input gradient), W
/// and the overlapped F&B pair, as the stage costs of a device holding two such chunks.
inline SimOptions chunk_costs(double f, double b, double w, double fb, double p2p = 0) {
  SimOptions o;
  o.costs = CostOverride{2 * f, 2 * b, 2 * w, p2p, 2 * fb};
  return o;
}

}  // namespace distplan::sim::testing
