// Weak stand-in for distplan::stage_communication() (planner_compat.h).
#include "distplan/gpu_backend/planner_compat.h"

#include <atomic>
#include <vector>

#include "distplan/planner/estimate.h"

namespace distplan {
namespace {
std::atomic<bool> g_stand_in_used{false};
}  // namespace

__attribute__((weak)) std::vector<Collective> stage_communication(const Scenario& scenario,
                                                                  int /*stage*/) {
  g_stand_in_used = true;
  return estimate(scenario).communication.collectives;
}

namespace backend {
bool stage_communication_is_stand_in() noexcept {
  return g_stand_in_used;
}
}  // namespace backend
}  // namespace distplan
