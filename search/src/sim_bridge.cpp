#include "sim_bridge.h"

#include "distplan/planner/error.h"
#if DISTPLAN_SEARCH_HAVE_SIMULATOR
#include "distplan/simulator/simulate.h"
#endif

namespace distplan::search::detail {

#if DISTPLAN_SEARCH_HAVE_SIMULATOR

bool simulator_available() noexcept {
  return true;
}

std::optional<SimFigures> simulate_figures(const Scenario& s, const Estimate& e) {
  sim::SimOptions opts;
  opts.exposed_communication = false;  // the search needs the step time only
  sim::SimResult r;
  try {
    r = sim::simulate(s, e, opts);
  } catch (const InputError&) {
    return std::nullopt;
  }
  if (!(r.step_seconds > 0)) return std::nullopt;
  SimFigures f;
  f.step_seconds = r.step_seconds;
  // Same tokens and FLOPs per step as the estimate; only the step time changes.
  const double tokens = static_cast<double>(s.training.global_batch_size) *
                        static_cast<double>(s.training.seq_length);
  f.tokens_per_second = tokens / r.step_seconds;
  f.mfu = e.time.mfu * (e.time.step_seconds / r.step_seconds);
  f.bubble_fraction = r.bubble_fraction;
  return f;
}

#else

bool simulator_available() noexcept {
  return false;
}

std::optional<SimFigures> simulate_figures(const Scenario&, const Estimate&) {
  return std::nullopt;
}

#endif

}  // namespace distplan::search::detail
