// Layout search: bound every layout of the space (its peak memory and a lower bound of its step),
// drop what does not fit, and plan with the schedule walk (sim::plan, the one timing engine) in
// order of the bound until no layout left can enter the best: branch and bound, so the ranking is
// by the walk's exact figures. Answers with ranked plans, rejection counts and, when nothing fits,
// what would make it fit. Deterministic for any thread count (docs/search.md).
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distplan/planner/estimate.h"
#include "distplan/search/space.h"

namespace distplan::search {

enum class Objective {
  throughput,  // highest tokens/s
  memory,      // lowest peak memory per GPU
  gpus,        // fewest GPUs reaching target_tokens_per_second (then highest tokens/s)
};
[[nodiscard]] std::string_view to_string(Objective o) noexcept;

/// Throughputs within this relative difference rank as equal, the lower peak memory first
/// (docs/search.md, "Ties").
inline constexpr double kThroughputTieTolerance = 1e-9;

struct Options {
  Objective objective = Objective::throughput;
  int top_k = 10;
  double memory_margin = 0.0;           // a layout fits when peak <= capacity x (1 - margin)
  double target_tokens_per_second = 0;  // objective "gpus"
  int threads = 0;                      // 0: all hardware threads
  bool suggest = true;
  /// Reject what does not fit with the lean memory path (FastMemory) before estimating, and skip
  /// the estimate of what a bound proves cannot rank among the best.
  bool fast_memory = true;  // when nothing fits, search nearby spaces for what would fit
  /// When set and true, the workers stop at the next outer combination and run() returns what
  /// it has (Result::cancelled), for interactive front ends.
  const std::atomic<bool>* cancel = nullptr;
  /// Called from the calling thread with the fraction done, at most ~20 times a second.
  std::function<void(double fraction, std::uint64_t evaluated)> progress;
  /// Called from the calling thread while candidates are planned with the walk, at most ~20
  /// times a second: layouts walked so far, and the candidates not yet ruled out by their bound.
  std::function<void(std::uint64_t walked, std::uint64_t candidates)> walk_progress;
};

/// Bounds of Options, the same for the JSON fields and the CLI flags (docs/api.md).
inline constexpr int kMaxTopK = 10000;
inline constexpr int kMaxThreads = 1024;

/// The figures of one layout that the search ranks by.
struct Figures {
  Bytes peak_bytes = 0;
  Bytes capacity_bytes = 0;
  Seconds step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  bool operator==(const Figures&) const = default;
};

struct Plan {
  Layout layout;
  Figures bound;    // estimate() alone: its peak and the lower bound of the step (search prunes)
  Figures figures;  // the plan (sim::plan): what the plan is ranked by
  double bubble_fraction = 0;
  bool operator==(const Plan&) const = default;
};

struct Suggestion {
  std::string change;  // "more_gpus", "optimizer_offload", "shorter_sequence", "larger_gpu"
  std::string detail;  // one sentence for people
  double value = 0;    // the GPU count, sequence length or peak bytes the change reaches
  bool fits = false;
};

struct Result {
  Objective objective = Objective::throughput;
  std::uint64_t evaluated = 0;  // layouts estimated
  std::uint64_t feasible = 0;   // layouts that fit (and, for "gpus", reach the target)
  std::uint64_t pruned = 0;  // feasible layouts whose bound kept them out of the best (not walked)
  std::uint64_t walked = 0;  // layouts planned with the schedule walk
  double seconds = 0;        // wall-clock time of the search
  double evaluate_seconds = 0;  // of which enumerating and bounding (before the walks)
  int threads = 1;
  bool cancelled = false;
  RejectCounts rejected{};
  std::vector<Plan> plans;              // best first, at most top_k
  std::optional<Plan> closest;          // when nothing fits: the layout with the lowest peak
  std::vector<Suggestion> suggestions;  // when nothing fits
};

/// The plan of one layout's scenario (sim::plan) as the search ranks it.
[[nodiscard]] Figures evaluate(const Scenario& scenario);
[[nodiscard]] Figures figures_of(const Estimate& e, const Scenario& s);

/// Runs the search. Never throws for an empty or infeasible space: the Result says so.
[[nodiscard]] Result run(const Space& space, const Options& options);

/// The ranking order (lower is better): the objective, with throughputs within
/// kThroughputTieTolerance counted equal, then the other figure, then the layout's fields; a strict
/// weak order, total over distinct layouts.
[[nodiscard]] bool ranks_before(Objective obj, const Layout& la, const Figures& a, const Layout& lb,
                                const Figures& b);

}  // namespace distplan::search
