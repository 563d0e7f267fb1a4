// DualPipeV in the search space and in the exports: torch.distributed.pipelining names it
// "DualPipeV" (get_schedule_class, pytorch/pytorch torch/distributed/pipelining/schedules.py,
// ScheduleDualPipeV); Megatron-LM has no DualPipe, so its export notes the default it runs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"
#include "distplan/search/export.h"
#include "distplan/search/search_json.h"
#include "distplan/search/space.h"

namespace distplan::search {
namespace {

nlohmann::json doc(const char* schedule) {
  return {{"model", "llama2-70b"},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
          {"training", {{"seq_length", 4096}, {"global_batch_size", 512}}},
          {"parallel", {{"tp", 8}, {"pp", 4}, {"dp", 2}, {"schedule", schedule}}}};
}

TEST(DualPipeVExport, TorchtitanNamesDualPipeV) {
  const Exported x =
      export_scenario(scenario_from_json(doc("dualpipe_v")), ExportFormat::torchtitan);
  EXPECT_NE(x.text.find("pipeline_parallel_schedule = \"DualPipeV\""), std::string::npos) << x.text;
  // Two stages per rank in a V: 80 layers / (2 * 4).
  EXPECT_NE(x.text.find("pipeline_parallel_layers_per_stage = 10"), std::string::npos) << x.text;
}

TEST(DualPipeVExport, MegatronNotesItsDefaultSchedule) {
  const Exported x = export_scenario(scenario_from_json(doc("dualpipe_v")), ExportFormat::megatron);
  bool noted = false;
  for (const std::string& n : x.notes) noted = noted || n.find("dualpipe_v") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(DualPipeVSearch, TheSpaceProposesDualPipeVWhereTheVFits) {
  const nlohmann::json d = {
      {"model", "gpt3-1.3b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 24}, {"gpus_per_node", 8}}},
      {"training", {{"seq_length", 2048}, {"global_batch_size", 96}}}};
  const Space sp = request_from_json(d).space;
  RejectCounts rejected{};
  std::size_t found = 0;
  for (const Layout& l : enumerate_layouts(sp, rejected)) {
    if (l.schedule != Schedule::dualpipe_v) continue;
    ++found;
    EXPECT_EQ(l.virtual_stages, 2);
    EXPECT_EQ(24 % (2 * l.pp), 0) << l.pp;  // 24 layers, two equal chunks per stage
  }
  EXPECT_GT(found, 0u);
}

TEST(DualPipeSearch, NamingTheBidirectionalDualPipeIsRefusedAtItsEntry) {
  // dualpipe plans with ZeRO 0/1 and untied embeddings only: the search says it does not try it,
  // at the schedule list's entry, instead of proposing layouts the planner refuses.
  nlohmann::json d = {
      {"model", "gpt3-1.3b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 24}, {"gpus_per_node", 8}}},
      {"training", {{"seq_length", 2048}, {"global_batch_size", 96}}},
      {"parallel", {{"schedule", nlohmann::json::array({"1f1b", "dualpipe"})}}}};
  try {
    (void)request_from_json(d);
    FAIL() << "dualpipe was accepted by the search";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/parallel/schedule/1");
  }
  // Nor does the default space propose it.
  d["parallel"].erase("schedule");
  RejectCounts rejected{};
  for (const Layout& l : enumerate_layouts(request_from_json(d).space, rejected))
    EXPECT_NE(l.schedule, Schedule::dualpipe);
}

}  // namespace
}  // namespace distplan::search
