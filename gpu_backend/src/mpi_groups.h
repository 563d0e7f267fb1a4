// Process groups split out of MPI_COMM_WORLD in Megatron-LM's rank order, with the communicator
// implementation chosen by the caller (MPI on CPUs, NCCL on GPUs). Built only with MPI.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>

#include "distplan/gpu_backend/comm.h"

namespace distplan::backend {

using MakeCommunicator =
    std::function<std::unique_ptr<Communicator>(Group group, MPI_Comm comm, CommLog* log)>;

/// MPI must be initialised and the world size equal tp*cp*dp*pp. `expert_groups`: also split the
/// MoE layers' ep and edp groups (ProcessGroups::ep, edp; null otherwise).
[[nodiscard]] std::unique_ptr<ProcessGroups> make_groups_over_mpi(const ParallelSpec& p,
                                                                  const MakeCommunicator& make,
                                                                  bool expert_groups = true);

}  // namespace distplan::backend
