// The layout figures of the memory terms (memory_terms.h holds the terms themselves, inline so the
// search's lean path compiles them into its loop; docs/memory.md).
#include "distplan/planner/memory_terms.h"

#include "distplan/planner/fp8.h"
#include "distplan/planner/moe_layer.h"

namespace distplan {

MemoryLayout memory_layout(const Scenario& s) noexcept {
  const ParallelSpec& p = s.parallel;
  MemoryLayout l;
  l.tp = p.tp;
  l.pp = p.pp;
  l.virtual_stages = p.virtual_stages;
  l.micro_batch_size = s.training.micro_batch_size;
  l.num_microbatches = s.num_microbatches();
  l.zero_stage = p.zero_stage;
  l.shard = p.zero_stage == 0 ? 1 : s.zero_shard();
  l.dp = p.dp;
  l.cp = p.cp;
  if (s.training.fp8 != Fp8Recipe::none) {
    const LayerTable dense = build_layer_table(s.model, s.training);
    if (s.model.moe.enabled()) {
      l.fp8_layer_state =
          fp8_moe_layer_state_bytes(s.model, planner_layer_table(s.model, s.training),
                                    moe_layer_plan(s), p.tp, s.training.fp8, s.assumptions);
      l.fp8_dense_layer_state = fp8_layer_state_bytes(dense, p.tp, s.training.fp8, s.assumptions);
    } else {
      l.fp8_layer_state = fp8_layer_state_bytes(dense, p.tp, s.training.fp8, s.assumptions);
    }
  }
  l.cp_comm = p.cp_comm;
  l.sequence_parallel = p.sequence_parallel;
  l.recompute = p.recompute;
  l.schedule = p.schedule;
  l.offload_optimizer = p.offload_optimizer;
  l.offload_params = p.offload_params;
  l.zb_memory_limit = p.zb_memory_limit();
  if (s.model.moe.enabled()) {
    l.ep = p.ep;
    l.etp = p.etp;
    l.edp = s.expert_data_parallel();
    l.expert_params = routed_expert_params_per_gpu(s.model, p.ep, p.etp);
  }
  return l;
}

}  // namespace distplan
