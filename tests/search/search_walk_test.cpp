// The search ranks by the schedule walk (docs/search.md, "Ranking by the walk"): its branch and
// bound answers exactly what walking every layout of the space and sorting would, and its bound
// is a lower bound of every walk.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

#include "distplan/search/fast_memory.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"
#include "distplan/simulator/plan.h"

namespace distplan::search {
namespace {

Request small_request(const char* model, int gpus, int batch, int seq, const char* framework,
                      int top_k) {
  const nlohmann::json doc = {
      {"model", model},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
      {"training", {{"seq_length", seq}, {"global_batch_size", batch}, {"framework", framework}}},
      {"search", {{"top_k", top_k}, {"suggest", false}}}};
  return request_from_json(doc);
}

struct Walked {
  Layout layout;
  Figures figures;
  Seconds bound = 0;    // the lean path's lower bound of the step
  Bytes lean_peak = 0;  // the lean path's peak (the planner's closed form)
};

// Every layout of the space walked, with the lean path's bound beside it.
std::vector<Walked> walk_everything(const Space& space) {
  RejectCounts rejected{};
  FastMemory fast(space.base);
  std::vector<Walked> out;
  for (const Outer& o : enumerate_outer(space, rejected)) {
    fast.set_outer(o);
    for_each_inner(space, o, rejected, [&](const Layout& l) {
      const Scenario s = make_scenario(space.base, l);
      Walked w;
      w.layout = l;
      w.figures = evaluate(s);
      w.bound = fast.step_lower_bound(l);
      w.lean_peak = fast.peak_bytes(l);
      out.push_back(w);
    });
  }
  return out;
}

void expect_exhaustive_answer(const Request& req) {
  const std::vector<Walked> all = walk_everything(req.space);
  ASSERT_FALSE(all.empty());
  // The answer the search owes: every layout that fits by the walk, among those its lean path
  // lets through (the planner's peak, which the walk's never exceeds), in rank order.
  std::vector<Walked> seen;
  for (const Walked& w : all) {
    // The bounds used to prune are below every walk.
    EXPECT_LE(w.bound, w.figures.step_seconds * (1 + 1e-12))
        << layout_to_json(w.layout).dump() << " sp=" << w.layout.sequence_parallel;
    EXPECT_GE(w.lean_peak, w.figures.peak_bytes);
    if (w.figures.peak_bytes <= w.figures.capacity_bytes && w.lean_peak <= w.figures.capacity_bytes)
      seen.push_back(w);
  }
  std::sort(seen.begin(), seen.end(), [&](const Walked& a, const Walked& b) {
    return ranks_before(req.options.objective, a.layout, a.figures, b.layout, b.figures);
  });
  const Result r = run(req.space, req.options);
  const std::size_t k = std::min<std::size_t>(seen.size(), req.options.top_k);
  ASSERT_EQ(r.plans.size(), k);
  for (std::size_t i = 0; i < k; ++i) {
    EXPECT_EQ(r.plans[i].layout, seen[i].layout) << "rank " << i + 1;
    EXPECT_EQ(r.plans[i].figures.step_seconds, seen[i].figures.step_seconds) << "rank " << i + 1;
    EXPECT_EQ(r.plans[i].figures.peak_bytes, seen[i].figures.peak_bytes) << "rank " << i + 1;
  }
  // The branch and bound walked fewer layouts than the space holds.
  EXPECT_LT(r.walked, all.size());
}

TEST(SearchWalk, BranchAndBoundAnswersWhatWalkingEveryLayoutAnswers) {
  expect_exhaustive_answer(small_request("llama2-7b", 16, 64, 2048, "megatron", 10));
  expect_exhaustive_answer(small_request("gpt3-1.3b", 8, 32, 2048, "generic", 25));
}

}  // namespace
}  // namespace distplan::search
