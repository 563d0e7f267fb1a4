// ZeRO-Offload and ZeRO-Infinity (docs/memory.md and docs/time.md, "Offload"): what moves from the
// GPU to host memory or NVMe, the bytes it takes there, and the PCIe / NVMe traffic and CPU
// optimizer time it costs per step. Written once here and used by the memory terms
// (memory_terms.h, shared by estimate() and the search's lean path) and by estimate()'s costs.
#pragma once

#include <algorithm>

#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// Host bytes per parameter of an offloaded optimizer: fp32 parameters (4), the optimizer's
/// states (Adam's m and v 8, SGD's momentum 4) and the fp32 gradient partition (4) that CPU Adam
/// reads. DeepSpeed's estimators count 16 for Adam (deepspeed/runtime/zero/stage3.py,
/// estimate_zero3_model_states_mem_needs: "16 * gpus_factor"; stage_1_and_2.py: the 16 of
/// max(4 * total_gpus, 16)).
[[nodiscard]] constexpr Bytes offloaded_optimizer_bytes_per_param(Optimizer o) noexcept {
  return 4 + (o == Optimizer::sgd ? 4 : 8) + 4;
}
/// Of the above, what ZeRO-Infinity swaps to NVMe: the fp32 parameters and the optimizer states
/// (DeepSpeed's optimizer swapper, deepspeed/runtime/swap_tensor/optimizer_utils.py); the fp32
/// gradient partition is accumulated in host memory.
[[nodiscard]] constexpr Bytes nvme_optimizer_bytes_per_param(Optimizer o) noexcept {
  return 4 + (o == Optimizer::sgd ? 4 : 8);
}

/// Where one GPU's model states live beyond its own memory.
struct OffloadBytes {
  Bytes host = 0;  // pinned host memory of this GPU's process
  Bytes nvme = 0;  // on the node's NVMe
};

/// Host and NVMe bytes of one GPU whose ZeRO partition holds `shard_params` parameters (per TP
/// rank, summed over the units of its stage). Pinned swap buffers count as host memory: DeepSpeed
/// allocates `buffer_count` buffers of the swapped tensors' size (offload_optimizer.buffer_count
/// over sub-groups of at most sub_group_size parameters; offload_param.buffer_count buffers of
/// buffer_size elements), docs/memory.md.
[[nodiscard]] inline OffloadBytes offload_bytes(Offload optimizer, Offload params,
                                                const TrainingSpec& t, const Assumptions& a,
                                                Count shard_params) noexcept {
  OffloadBytes o;
  const Bytes cb = bytes_of(t.precision);
  switch (optimizer) {
    case Offload::none:
      break;
    case Offload::cpu:
      o.host += shard_params * offloaded_optimizer_bytes_per_param(t.optimizer);
      break;
    case Offload::nvme: {
      const Bytes on_nvme = nvme_optimizer_bytes_per_param(t.optimizer);
      o.nvme += shard_params * on_nvme;
      o.host += shard_params * (offloaded_optimizer_bytes_per_param(t.optimizer) - on_nvme);
      o.host += a.nvme_optimizer_buffer_count * std::min(a.nvme_sub_group_params, shard_params) * 4;
      break;
    }
  }
  switch (params) {
    case Offload::none:
      break;
    case Offload::cpu:
      o.host += shard_params * cb;
      break;
    case Offload::nvme:
      o.nvme += shard_params * cb;
      o.host += a.nvme_param_buffer_count * a.nvme_param_buffer_params * cb;
      break;
  }
  return o;
}

/// Bytes CPU Adam moves through host memory per parameter: reads the fp32 gradient, reads and
/// writes the fp32 parameter and each state, writes the compute-dtype copy the GPU receives
/// (DeepSpeed's fused CPU-Adam kernel, csrc/adam/cpu_adam_impl.cpp, one pass per element).
[[nodiscard]] constexpr Bytes cpu_optimizer_bytes_per_param(const TrainingSpec& t) noexcept {
  const Bytes states = t.optimizer == Optimizer::sgd ? 4 : 8;
  return 4 + 2 * 4 + 2 * states + bytes_of(t.precision);
}

}  // namespace distplan
