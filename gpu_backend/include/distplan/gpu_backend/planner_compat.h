// Until the planner library defines distplan::stage_communication() (declared in estimate.h), the
// backend links a weak stand-in that returns the busiest stage's list (Estimate::communication)
// for every stage; the planner's definition replaces it at link time as soon as it exists.
#pragma once

namespace distplan::backend {

/// True once the weak stand-in for stage_communication() has answered a call: only the busiest
/// stage's collectives are then known.
[[nodiscard]] bool stage_communication_is_stand_in() noexcept;

}  // namespace distplan::backend
