// Exports run as planned: each export (Megatron-LM arguments, DeepSpeed config JSON, torchtitan
// TOML) is read back into a layout by a reader written from the framework's own semantics
// (the flags' meaning in Megatron-LM's arguments.py, DeepSpeed's batch check in
// runtime/config.py, torchtitan's job_config.py and parallel_dims.py), not from the exporter,
// and must equal the plan, for every plan of several searches per framework.
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/pipeline_split.h"
#include "distplan/search/export.h"
#include "distplan/search/search.h"
#include "distplan/search/search_json.h"

namespace distplan::search {
namespace {

using nlohmann::json;

/// What a launch configures: the layout, the batch and the precision-related settings.
struct Launched {
  Count tp = 1, cp = 1, pp = 1, dp = 1, ep = 1, etp = 1;
  std::string cp_comm = "p2p";
  int zero_stage = 0;
  Count shard = 0;  // ZeRO shard group over dp (= dp when not hybrid)
  bool sequence_parallel = false;
  std::string recompute = "none";
  std::string schedule = "1f1b";
  Count virtual_stages = 1;
  std::vector<Count> layers;  // per virtual stage, in the path's order (pipeline_split.h)
  Count micro_batch_size = 1, global_batch_size = 0;
  std::string grad_dtype;
  std::string offload = "none";
  bool operator==(const Launched&) const = default;
};

std::ostream& operator<<(std::ostream& o, const Launched& l) {
  o << "tp=" << l.tp << " cp=" << l.cp << "(" << l.cp_comm << ") pp=" << l.pp << " dp=" << l.dp
    << " ep=" << l.ep << " etp=" << l.etp << " zero=" << l.zero_stage << " shard=" << l.shard
    << " sp=" << l.sequence_parallel << " rc=" << l.recompute << " " << l.schedule
    << " v=" << l.virtual_stages << " layers=[";
  for (Count n : l.layers) o << n << ",";
  return o << "] mb=" << l.micro_batch_size << " B=" << l.global_batch_size
           << " grads=" << l.grad_dtype << " offload=" << l.offload;
}

/// The plan, in the same terms.
Launched planned(const Scenario& s) {
  const ParallelSpec& p = s.parallel;
  Launched l;
  l.tp = p.tp, l.cp = p.cp, l.pp = p.pp, l.dp = p.dp, l.ep = p.ep, l.etp = p.etp;
  l.cp_comm = p.cp > 1 ? std::string(to_string(p.cp_comm)) : "p2p";
  l.zero_stage = p.zero_stage;
  l.shard = p.zero_stage > 0 ? s.shard_size() : p.dp;
  l.sequence_parallel = p.tp > 1 && p.sequence_parallel;
  l.recompute = to_string(p.recompute);
  l.schedule = p.pp > 1 ? std::string(to_string(p.schedule)) : "1f1b";
  l.virtual_stages = p.virtual_stages;
  if (p.pp > 1) l.layers = pipeline_split(s).layers;
  l.micro_batch_size = s.training.micro_batch_size;
  l.global_batch_size = s.training.global_batch_size;
  l.grad_dtype = to_string(s.training.grad_accumulation_dtype);
  l.offload = to_string(p.offload_optimizer);
  return l;
}

// ---- Megatron-LM: pretrain_gpt.py arguments (arguments.py at core_v0.15.3) ----------------

std::map<std::string, std::string> flags_of(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream w(line);
    std::string flag, value;
    w >> flag;
    if (w >> value && value != "\\") {
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      out[flag] = value;
    } else {
      out[flag] = "";
    }
  }
  return out;
}

Launched read_megatron(const std::string& text, Count world, const Scenario& s) {
  const auto f = flags_of(text);
  auto has = [&](const char* k) { return f.count(k) == 1; };
  auto num = [&](const char* k, Count fallback) {
    return has(k) ? static_cast<Count>(std::stoll(f.at(k))) : fallback;
  };
  Launched l;
  l.tp = num("--tensor-model-parallel-size", 1);
  l.pp = num("--pipeline-model-parallel-size", 1);
  l.cp = num("--context-parallel-size", 1);
  l.dp = world / (l.tp * l.cp * l.pp);  // Megatron's data-parallel size
  l.ep = num("--expert-model-parallel-size", 1);
  l.etp = num("--expert-tensor-parallel-size", 1);  // written for MoE models
  if (l.cp > 1) {
    const std::string t = f.at("--cp-comm-type");
    l.cp_comm = t == "allgather" ? "all_gather" : t;
  }
  // Sharding: DDP; the distributed optimizer (ZeRO-1); Megatron FSDP's strategies.
  if (has("--use-distributed-optimizer")) l.zero_stage = 1;
  if (has("--use-megatron-fsdp"))
    l.zero_stage = f.at("--data-parallel-sharding-strategy") == "optim_grads" ? 2 : 3;
  l.shard = l.dp / num("--num-distributed-optimizer-instances", 1);
  l.sequence_parallel = has("--sequence-parallel") && l.tp > 1;
  if (has("--recompute-granularity")) {
    l.recompute = f.at("--recompute-granularity");
    if (l.recompute == "full") {
      EXPECT_EQ(f.at("--recompute-method"), "uniform");
      EXPECT_EQ(f.at("--recompute-num-layers"), "1");  // every layer
    }
  }
  const Count layers = num("--num-layers", 0);
  if (has("--num-layers-per-virtual-pipeline-stage"))
    l.virtual_stages = layers / (l.pp * num("--num-layers-per-virtual-pipeline-stage", 1));
  l.virtual_stages = num("--num-virtual-stages-per-pipeline-rank", l.virtual_stages);
  if (l.pp > 1) {
    if (has("--pipeline-model-parallel-layout")) {
      // PipelineParallelLayerLayout: every virtual stage spelled out.
      const MegatronLayout x = parse_megatron_layout(f.at("--pipeline-model-parallel-layout"),
                                                     l.pp, layers, s.model.mtp_layers, "");
      l.layers = x.decoder;
      l.virtual_stages = static_cast<Count>(x.decoder.size()) / l.pp;
    } else {
      // Megatron-LM's get_num_layers_to_build (transformer_block.py): each rank's layers, split
      // equally over its virtual stages.
      const Count v = l.virtual_stages;
      std::vector<Count> per_rank(static_cast<std::size_t>(l.pp));
      const bool emb = has("--account-for-embedding-in-pipeline-split");
      const bool loss = has("--account-for-loss-in-pipeline-split");
      const Count first = num("--decoder-first-pipeline-num-layers", -1);
      const Count last = num("--decoder-last-pipeline-num-layers", -1);
      if (first >= 0 || last >= 0) {
        Count rest = layers, ranks = l.pp;
        if (first >= 0) rest -= first, --ranks;
        if (last >= 0) rest -= last, --ranks;
        EXPECT_EQ(rest % ranks, 0) << "Megatron-LM asserts the middle ranks split evenly";
        for (Count& n : per_rank) n = rest / ranks;
        if (first >= 0) per_rank.front() = first;
        if (last >= 0) per_rank.back() = last;
      } else {
        const Count slots = layers + (emb ? 1 : 0) + (loss ? 1 : 0);
        EXPECT_EQ(slots % l.pp, 0) << "Megatron-LM asserts an even split of the slots";
        for (Count& n : per_rank) n = slots / l.pp;
      }
      l.layers.assign(static_cast<std::size_t>(l.pp * v), 0);
      for (Count r = 0; r < l.pp; ++r) {
        EXPECT_EQ(per_rank[static_cast<std::size_t>(r)] % v, 0) << "each rank's layers split by v";
        for (Count c = 0; c < v; ++c)
          l.layers[static_cast<std::size_t>(c * l.pp + r)] = per_rank[static_cast<std::size_t>(r)] / v;
      }
      // The embedding and the loss take a layer's slot on the first and the last virtual stage.
      if (emb) --l.layers.front();
      if (loss) --l.layers.back();
    }
    if (l.virtual_stages > 1) l.schedule = "interleaved_1f1b";
  }
  l.micro_batch_size = num("--micro-batch-size", 1);
  l.global_batch_size = num("--global-batch-size", 0);
  // Gradient dtype (validate_args): bf16 accumulates in fp32 unless --grad-reduce-in-bf16; fp16
  // in fp16 unless --accumulate-allreduce-grads-in-fp32; fp32 in fp32.
  if (has("--bf16")) {
    l.grad_dtype = has("--grad-reduce-in-bf16") ? "bf16" : "fp32";
  } else if (has("--fp16")) {
    l.grad_dtype = has("--accumulate-allreduce-grads-in-fp32") ? "fp32" : "fp16";
  } else {
    l.grad_dtype = "fp32";
  }
  if (has("--optimizer-cpu-offload")) {
    l.offload = "cpu";
    EXPECT_TRUE(has("--use-precision-aware-optimizer"));  // arguments.py asserts it
    EXPECT_EQ(f.at("--optimizer-offload-fraction"), "1.0");
  }
  if (s.model.moe.enabled()) {
    EXPECT_TRUE(has("--moe-grouped-gemm"));
    EXPECT_DOUBLE_EQ(std::stod(f.at("--moe-aux-loss-coeff")), s.model.moe.aux_loss_coeff);
  }
  // What the plan assumes about overlap is what the run does.
  const Assumptions& a = s.assumptions;
  if (l.schedule == "interleaved_1f1b") {
    EXPECT_EQ(!has("--no-overlap-p2p-communication"), a.overlap_p2p);
  }
  if (l.tp > 1) {
    EXPECT_EQ(has("--tp-comm-overlap"), a.tp_comm_overlap);
  }
  if (l.dp * l.cp > 1) {
    EXPECT_EQ(has("--overlap-grad-reduce"), a.overlap_grad_reduce);
  }
  return l;
}

// ---- DeepSpeed: config JSON (v0.18.0) --------------------------------------------------

Launched read_deepspeed(const std::string& text, const std::vector<std::string>& to_add,
                        Count world, const Scenario& s) {
  const json j = json::parse(text);
  Launched l;
  // The stages are the PipelineModule's num_stages, which the model code sets.
  for (const std::string& a : to_add) {
    std::smatch m;
    if (std::regex_search(a, m, std::regex("num_stages=(\\d+)"))) l.pp = std::stoll(m[1].str());
  }
  if (j.contains("tensor_parallel")) l.tp = j["tensor_parallel"]["autotp_size"].get<Count>();
  // Beside a pipeline, tensor parallelism is the model code's (Megatron-DeepSpeed).
  for (const std::string& a : to_add) {
    std::smatch m;
    if (std::regex_search(a, m, std::regex("^tensor parallelism (\\d+) in the model code")))
      l.tp = std::stoll(m[1].str());
  }
  l.dp = world / (l.tp * l.pp);
  const json& z = j["zero_optimization"];
  l.zero_stage = z["stage"].get<int>();
  l.shard = z.contains("mics_shard_size") ? z["mics_shard_size"].get<Count>() : l.dp;
  if (z.contains("offload_optimizer")) l.offload = z["offload_optimizer"]["device"];
  EXPECT_EQ(z["overlap_comm"].get<bool>(), s.assumptions.overlap_grad_reduce);
  l.recompute = j.contains("activation_checkpointing") ? "full" : "none";
  l.micro_batch_size = j["train_micro_batch_size_per_gpu"].get<Count>();
  const Count gas = j["gradient_accumulation_steps"].get<Count>();
  // DeepSpeed's batch check (runtime/config.py _batch_assertion) over its world size: the
  // pipeline grid's data-parallel size with a PipelineModule, all ranks for a plain model.
  const Count ds_world = l.pp > 1 ? l.dp : world;
  EXPECT_EQ(j["train_batch_size"].get<Count>(), l.micro_batch_size * gas * ds_world);
  l.global_batch_size = l.micro_batch_size * gas * l.dp;  // distinct sequences per step
  if (l.pp > 1) {
    // PipelineModule's partitioner: equal stages of the decoder layers, or, with the embedding
    // class in partition_method, of the layers and the embedding and tied head together.
    bool weighed = false;
    for (const std::string& a : to_add) weighed = weighed || a.find("|<your embedding class>") != std::string::npos;
    const Count slots = s.model.num_layers + (weighed ? 2 : 0);
    EXPECT_EQ(slots % l.pp, 0) << "the partitioner's equal stages";
    l.layers.assign(static_cast<std::size_t>(l.pp), slots / l.pp);
    if (weighed) --l.layers.front(), --l.layers.back();
  }
  // grad_accum_dtype defaults to the model dtype (runtime/engine.py get_data_types).
  const std::string model = j.contains("bf16") ? "bf16" : j.contains("fp16") ? "fp16" : "fp32";
  l.grad_dtype =
      j.contains("data_types") ? j["data_types"]["grad_accum_dtype"].get<std::string>() : model;
  l.ep = s.parallel.ep;  // DeepSpeed-MoE's ep_size is model code (listed under "you still add")
  l.etp = 1;
  return l;
}

// ---- torchtitan: job config TOML (v0.2.2) ----------------------------------------------

std::map<std::string, std::string> toml(const std::string& text) {
  std::map<std::string, std::string> out;  // "table.key" -> value
  std::istringstream in(text);
  std::string line, table;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      table = line.substr(1, line.find(']') - 1);
      continue;
    }
    const auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    std::string v = line.substr(eq + 3);
    if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
    out[table + "." + line.substr(0, eq)] = v;
  }
  return out;
}

Launched read_torchtitan(const std::string& text, Count world, const Scenario& s) {
  const auto t = toml(text);
  auto num = [&](const std::string& k, Count fallback) {
    return t.count(k) ? static_cast<Count>(std::stoll(t.at(k))) : fallback;
  };
  Launched l;
  const Count replicate = num("parallelism.data_parallel_replicate_degree", 1);
  const Count shard = num("parallelism.data_parallel_shard_degree", -1);
  l.tp = num("parallelism.tensor_parallel_degree", 1);
  l.pp = num("parallelism.pipeline_parallel_degree", 1);
  l.cp = num("parallelism.context_parallel_degree", 1);
  EXPECT_EQ(replicate * shard * l.cp * l.tp * l.pp, world);  // parallel_dims.py asserts it
  l.dp = replicate * shard;
  // FSDP when dp_shard > 1 or cp > 1 (parallel_dims.py fsdp_enabled): ZeRO-3 over shard x cp.
  l.zero_stage = shard > 1 || l.cp > 1 ? 3 : 0;
  // Parameters kept gathered from the forward to the end of the backward: ZeRO-2.
  if (l.zero_stage == 3 && t.at("parallelism.fsdp_reshard_after_forward") == "never")
    l.zero_stage = 2;
  l.shard = l.zero_stage >= 2 ? shard : l.dp;
  l.sequence_parallel = l.tp > 1;  // torchtitan's TP always shards the sequence
  if (l.cp > 1)
    l.cp_comm =
        t.at("parallelism.context_parallel_rotate_method") == "alltoall" ? "p2p" : "all_gather";
  l.ep = num("parallelism.expert_parallel_degree", 1);
  l.etp = num("parallelism.expert_tensor_parallel_degree", 1);
  const std::string mode = t.at("activation_checkpoint.mode");
  l.recompute = mode == "selective" ? (t.at("activation_checkpoint.selective_ac_option") == "op"
                                           ? "selective_op"
                                           : "selective_layers")
                                    : mode;
  l.global_batch_size = num("training.global_batch_size", 0);
  const Count local = num("training.local_batch_size", 0);
  if (l.pp > 1) {
    const std::map<std::string, std::string> names = {{"GPipe", "gpipe"},
                                                      {"1F1B", "1f1b"},
                                                      {"Interleaved1F1B", "interleaved_1f1b"},
                                                      {"ZBVZeroBubble", "zb_v"},
                                                      {"DualPipeV", "dualpipe_v"}};
    l.schedule = names.at(t.at("parallelism.pipeline_parallel_schedule"));
    l.micro_batch_size = num("parallelism.pipeline_parallel_microbatch_size", 1);
    EXPECT_EQ(local, l.global_batch_size / l.dp);
    const bool multi = l.schedule == "interleaved_1f1b" || l.schedule == "zb_v" ||
                       l.schedule == "dualpipe_v";
    std::vector<Count> chunks;
    if (t.count("parallelism.module_fqns_per_model_part")) {
      // module_fqns_per_model_part: "layers.<i>" per chunk.
      const std::string fq = t.at("parallelism.module_fqns_per_model_part");
      for (std::size_t at = fq.find('['), end; (at = fq.find('[', at + 1)) != std::string::npos;
           at = end) {
        end = fq.find(']', at);
        const std::string part = fq.substr(at, end - at);
        Count n = 0;
        for (std::size_t p = part.find("layers."); p != std::string::npos;
             p = part.find("layers.", p + 1))
          ++n;
        chunks.push_back(n);
      }
    } else {
      // _generate_llm_fqn_per_model_part with the first and last stages' weights over the
      // stages: one per rank, two for a multi-stage schedule, or ceil((L + iw + ow) / k).
      const Count iw = num("parallelism.pipeline_parallel_first_stage_less_layers", 1);
      const Count ow = num("parallelism.pipeline_parallel_last_stage_less_layers", 1);
      const Count k = num("parallelism.pipeline_parallel_layers_per_stage", 0);
      const Count L = s.model.num_layers;
      const Count n = k > 0 ? (L + iw + ow + k - 1) / k : l.pp * (multi ? 2 : 1);
      chunks = torchtitan_split(L, n, iw, ow, "");
    }
    l.virtual_stages = static_cast<Count>(chunks.size()) / l.pp;
    l.layers = chunks;
  } else {
    l.micro_batch_size = local;
  }
  l.grad_dtype = "fp32";  // mixed_precision_reduce is float32
  EXPECT_EQ(t.at("training.mixed_precision_reduce"), "float32");
  l.offload = t.count("training.enable_cpu_offload") ? "cpu" : "none";
  (void)s;
  return l;
}

// Every plan of the search exports, and the export read back is the plan.
void expect_round_trip(json doc, const char* framework, int top) {
  doc["training"]["framework"] = framework;
  doc["search"] = {{"top_k", top}, {"threads", 1}};
  const Request req = request_from_json(doc);
  const Result r = run(req.space, req.options);
  ASSERT_FALSE(r.plans.empty()) << framework;
  const ExportFormat format = std::string(framework) == "megatron"    ? ExportFormat::megatron
                              : std::string(framework) == "deepspeed" ? ExportFormat::deepspeed
                                                                      : ExportFormat::torchtitan;
  for (const Plan& p : r.plans) {
    const Scenario s = make_scenario(req.space.base, p.layout);
    Exported e;
    ASSERT_NO_THROW(e = export_scenario(s, format)) << framework;
    EXPECT_TRUE(e.fits);
    const Count world = s.cluster.num_gpus;
    const Launched back = format == ExportFormat::megatron ? read_megatron(e.text, world, s)
                          : format == ExportFormat::deepspeed
                              ? read_deepspeed(e.text, e.to_add, world, s)
                              : read_torchtitan(e.text, world, s);
    EXPECT_EQ(back, planned(s)) << framework << "\n" << e.text;
  }
}

json doc_of(const char* model, int gpus, int seq, int batch) {
  return {{"model", model},
          {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", gpus}, {"gpus_per_node", 8}}},
          {"training", {{"seq_length", seq}, {"global_batch_size", batch}}}};
}

TEST(ExportRoundTrip, EveryPlanOfADenseSearchRunsAsPlanned) {
  for (const char* f : {"megatron", "torchtitan", "deepspeed"})
    expect_round_trip(doc_of("llama3.1-8b", 16, 8192, 64), f, 40);
}

TEST(ExportRoundTrip, UnevenPipelinesAndOffloadRunAsPlanned) {
  json d = doc_of("llama2-13b", 8, 4096, 32);
  d["model"] = {{"preset", "llama2-13b"}, {"num_layers", 38}};  // 38 over 4 stages: uneven
  d["cluster"]["gpu"] = "a100-40gb";
  d["parallel"] = {{"pp", {1, 2, 4}}};
  for (const char* f : {"megatron", "torchtitan", "deepspeed"}) expect_round_trip(d, f, 30);
}

TEST(ExportRoundTrip, MixtureOfExpertsRunsAsPlannedOnMegatron) {
  expect_round_trip(doc_of("mixtral-8x7b", 32, 4096, 128), "megatron", 20);
}

TEST(ExportRoundTrip, APlanOfAnotherFrameworkIsNotExported) {
  json d = doc_of("llama3.1-8b", 16, 8192, 64);
  d["training"]["framework"] = "generic";
  d["parallel"] = {{"tp", 2}, {"pp", 2}, {"dp", 4}};
  const Scenario s = make_scenario(request_from_json(d).space.base, Layout{2, 2, 4});
  try {
    (void)export_scenario(s, ExportFormat::megatron);
    ADD_FAILURE() << "exported a generic plan";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "/training/framework");
    EXPECT_NE(std::string(e.what()).find("\"framework\": \"megatron\""), std::string::npos);
  }
}

}  // namespace
}  // namespace distplan::search
