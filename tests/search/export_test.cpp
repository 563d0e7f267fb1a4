#include "distplan/search/export.h"

#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/layout.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"

namespace distplan::search {
namespace {

Scenario scenario_of(const Layout& l) {
  nlohmann::json doc = {
      {"model", "llama2-70b"},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 64}, {"gpus_per_node", 8}}},
      {"training", {{"seq_length", 4096}, {"global_batch_size", 512}}}};
  return make_scenario(request_from_json(doc).space.base, l);
}

Layout layout(Count tp, Count pp, Count dp, int zero, Count shard, Recompute r, bool sp,
              Schedule sched, Count v, Count mb) {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.zero_stage = zero, l.fsdp_shard_size = shard;
  l.recompute = r, l.sequence_parallel = sp, l.schedule = sched, l.virtual_stages = v;
  l.micro_batch_size = mb;
  return l;
}

/// "--flag value" pairs and bare flags of a Megatron-LM export (comments skipped).
std::multimap<std::string, std::string> megatron_args(const std::string& text) {
  std::multimap<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream w(line);
    std::string flag, value;
    w >> flag;
    if (w >> value && value != "\\")
      out.emplace(flag, value);
    else
      out.emplace(flag, "");
  }
  return out;
}

/// key = value of one TOML table.
std::map<std::string, std::string> toml_table(const std::string& text, const std::string& table) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      current = line.substr(1, line.find(']') - 1);
      continue;
    }
    const auto eq = line.find(" = ");
    if (current == table && eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

TEST(Export, MegatronArgumentsAreThePlansValues) {
  const Scenario s = scenario_of(
      layout(8, 4, 2, 1, 0, Recompute::selective, true, Schedule::interleaved_1f1b, 5, 2));
  const auto a = megatron_args(export_scenario(s, ExportFormat::megatron).text);
  EXPECT_EQ(a.find("--tensor-model-parallel-size")->second, "8");
  EXPECT_EQ(a.find("--pipeline-model-parallel-size")->second, "4");
  EXPECT_EQ(a.find("--num-layers-per-virtual-pipeline-stage")->second, "4");  // 80 / (4*5)
  EXPECT_EQ(a.find("--micro-batch-size")->second, "2");
  EXPECT_EQ(a.find("--global-batch-size")->second, "512");
  EXPECT_EQ(a.find("--seq-length")->second, "4096");
  EXPECT_EQ(a.find("--num-layers")->second, "80");
  EXPECT_EQ(a.find("--num-query-groups")->second, "8");
  EXPECT_EQ(a.find("--recompute-granularity")->second, "selective");
  EXPECT_EQ(a.count("--sequence-parallel"), 1u);
  EXPECT_EQ(a.count("--use-distributed-optimizer"), 1u);
  EXPECT_EQ(a.count("--use-custom-fsdp"), 0u);
  EXPECT_EQ(a.count("--bf16"), 1u);
}

TEST(Export, MegatronZero3AndFullRecompute) {
  const Scenario s =
      scenario_of(layout(4, 2, 8, 3, 0, Recompute::full, false, Schedule::one_f_one_b, 1, 1));
  const auto a = megatron_args(export_scenario(s, ExportFormat::megatron).text);
  EXPECT_EQ(a.find("--data-parallel-sharding-strategy")->second, "optim_grads_params");
  EXPECT_EQ(a.find("--recompute-granularity")->second, "full");
  EXPECT_EQ(a.find("--recompute-num-layers")->second, "1");
  EXPECT_EQ(a.count("--sequence-parallel"), 0u);
  EXPECT_EQ(a.count("--num-layers-per-virtual-pipeline-stage"), 0u);
}

TEST(Export, DeepSpeedConfigIsThePlansValues) {
  const Scenario s =
      scenario_of(layout(4, 2, 8, 3, 4, Recompute::full, false, Schedule::one_f_one_b, 1, 2));
  const nlohmann::json j = nlohmann::json::parse(export_scenario(s, ExportFormat::deepspeed).text);
  EXPECT_EQ(j.at("train_batch_size"), 512);
  EXPECT_EQ(j.at("train_micro_batch_size_per_gpu"), 2);
  EXPECT_EQ(j.at("gradient_accumulation_steps"), 512 / (2 * 8));
  EXPECT_EQ(j.at("zero_optimization").at("stage"), 3);
  EXPECT_EQ(j.at("zero_optimization").at("mics_shard_size"), 4);
  EXPECT_EQ(j.at("tensor_parallel").at("autotp_size"), 4);
  EXPECT_EQ(j.at("pipeline").at("stages"), 2);
  EXPECT_TRUE(j.at("bf16").at("enabled").get<bool>());
  // gbs = micro-batch x accumulation x dp, as DeepSpeed checks at start-up.
  EXPECT_EQ(j.at("train_batch_size").get<Count>(),
            j.at("train_micro_batch_size_per_gpu").get<Count>() *
                j.at("gradient_accumulation_steps").get<Count>() * 8);
}

TEST(Export, TorchtitanConfigIsThePlansValues) {
  const Scenario s = scenario_of(
      layout(8, 2, 4, 3, 2, Recompute::selective, true, Schedule::interleaved_1f1b, 2, 1));
  const std::string text = export_scenario(s, ExportFormat::torchtitan).text;
  const auto par = toml_table(text, "parallelism");
  EXPECT_EQ(par.at("tensor_parallel_degree"), "8");
  EXPECT_EQ(par.at("pipeline_parallel_degree"), "2");
  EXPECT_EQ(par.at("data_parallel_shard_degree"), "2");
  EXPECT_EQ(par.at("data_parallel_replicate_degree"), "2");
  EXPECT_EQ(par.at("pipeline_parallel_schedule"), "\"Interleaved1F1B\"");
  EXPECT_EQ(par.at("pipeline_parallel_layers_per_stage"), "20");  // 80 / (2*2)
  EXPECT_EQ(par.at("pipeline_parallel_microbatch_size"), "1");
  const auto tr = toml_table(text, "training");
  EXPECT_EQ(tr.at("global_batch_size"), "512");
  EXPECT_EQ(tr.at("local_batch_size"), "128");  // 512 / dp, split into pipeline micro-batches
  EXPECT_EQ(tr.at("seq_len"), "4096");
  EXPECT_EQ(toml_table(text, "activation_checkpoint").at("mode"), "\"selective\"");
}

TEST(Export, MegatronUnevenStagesGiveFirstAndLastCounts) {
  // 80 layers over pp = 6: 13 each, 2 extra on stages 1 and 2 (planner) -> unequal middle stages.
  Scenario s =
      scenario_of(layout(8, 6, 1, 0, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1));
  s.cluster.num_gpus = 48;
  EXPECT_FALSE(export_scenario(s, ExportFormat::megatron).notes.empty());
  // 80 layers over pp = 3: 26 / 28 / 26; first and last counts say it all.
  Scenario t =
      scenario_of(layout(8, 3, 1, 0, 0, Recompute::none, true, Schedule::one_f_one_b, 1, 1));
  t.cluster.num_gpus = 24;
  const auto a = megatron_args(export_scenario(t, ExportFormat::megatron).text);
  const std::vector<Count> layers = stage_layer_counts(t);
  EXPECT_EQ(a.find("--decoder-first-pipeline-num-layers")->second, std::to_string(layers.front()));
  EXPECT_EQ(a.find("--decoder-last-pipeline-num-layers")->second, std::to_string(layers.back()));
}

TEST(Export, DeparturesAreNoted) {
  const Scenario s =
      scenario_of(layout(8, 4, 2, 1, 0, Recompute::none, true, Schedule::zb_h1, 1, 1));
  EXPECT_FALSE(export_scenario(s, ExportFormat::megatron).notes.empty());
  EXPECT_FALSE(export_scenario(s, ExportFormat::torchtitan).notes.empty());  // no ZeRO-1 in FSDP2
}

TEST(Export, TorchtitanNamesZbvZeroBubble) {
  // torch.distributed.pipelining's get_schedule_class("ZBVZeroBubble") is ScheduleZBVZeroBubble:
  // two stages per rank in a V, so torchtitan cuts num_layers / (2 pp) layers per stage.
  const Scenario s =
      scenario_of(layout(8, 2, 4, 1, 0, Recompute::none, true, Schedule::zb_v, 2, 1));
  const std::string text = export_scenario(s, ExportFormat::torchtitan).text;
  const auto par = toml_table(text, "parallelism");
  EXPECT_EQ(par.at("pipeline_parallel_schedule"), "\"ZBVZeroBubble\"");
  EXPECT_EQ(par.at("pipeline_parallel_layers_per_stage"), "20");  // 80 / (2*2)
}

TEST(Export, TorchtitanRunsVHalfAsZbvWithANote) {
  const Scenario s =
      scenario_of(layout(8, 2, 4, 1, 0, Recompute::none, true, Schedule::v_half, 2, 1));
  const Exported x = export_scenario(s, ExportFormat::torchtitan);
  EXPECT_EQ(toml_table(x.text, "parallelism").at("pipeline_parallel_schedule"),
            "\"ZBVZeroBubble\"");
  bool noted = false;
  for (const std::string& n : x.notes) noted = noted || n.find("v_half") != std::string::npos;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace distplan::search
