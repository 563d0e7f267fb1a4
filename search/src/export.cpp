// Layout exports. Mappings and departures: docs/exports.md.
#include "distplan/search/export.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/layout.h"

namespace distplan::search {

std::string_view to_string(ExportFormat f) noexcept {
  switch (f) {
    case ExportFormat::megatron:
      return "megatron";
    case ExportFormat::deepspeed:
      return "deepspeed";
    case ExportFormat::torchtitan:
      return "torchtitan";
  }
  return "?";
}

namespace {

Count accumulation_steps(const Scenario& s) {
  return s.training.global_batch_size / (s.training.micro_batch_size * s.parallel.dp);
}

Count shard(const Scenario& s) {
  return s.shard_size();
}
bool hybrid(const Scenario& s) {
  return s.parallel.zero_stage > 0 && shard(s) < s.parallel.dp;
}

std::string schedule_note(const Scenario& s, std::string_view framework) {
  return fmt::format("schedule {} is not built into {}; its default schedule runs instead",
                     to_string(s.parallel.schedule), framework);
}

Exported megatron(const Scenario& s) {
  const ModelSpec& m = s.model;
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  Exported out;
  std::vector<std::string> args;
  auto arg = [&](std::string_view flag, auto value) {
    args.push_back(fmt::format("{} {}", flag, value));
  };
  auto flag = [&](std::string_view f) { args.emplace_back(f); };

  // Model shape.
  arg("--num-layers", m.num_layers);
  arg("--hidden-size", m.hidden_size);
  arg("--ffn-hidden-size", m.ffn_hidden_size);
  arg("--num-attention-heads", m.num_attention_heads);
  if (m.num_kv_heads != m.num_attention_heads) {
    flag("--group-query-attention");
    arg("--num-query-groups", m.num_kv_heads);
  }
  arg("--seq-length", t.seq_length);
  arg("--max-position-embeddings", m.position_embedding == PositionEmbedding::learned
                                       ? m.max_position_embeddings
                                       : t.seq_length);
  arg("--position-embedding-type",
      m.position_embedding == PositionEmbedding::rotary ? "rope" : "learned_absolute");
  if (m.mlp == Mlp::swiglu) flag("--swiglu");
  if (m.norm == Norm::rmsnorm) arg("--normalization", "RMSNorm");
  if (!m.tied_embeddings) flag("--untie-embeddings-and-output-weights");
  if (!m.bias) flag("--disable-bias-linear");
  arg("--make-vocab-size-divisible-by", s.assumptions.vocab_pad_multiple);
  arg("--attention-dropout", t.dropout);
  arg("--hidden-dropout", t.dropout);
  if (t.attention == Attention::flash) flag("--use-flash-attn");

  // Precision and optimizer.
  if (t.precision == DType::bf16) flag("--bf16");
  if (t.precision == DType::fp16) flag("--fp16");
  if (t.grad_accumulation_dtype == DType::fp32 && t.precision != DType::fp32) {
    flag("--accumulate-allreduce-grads-in-fp32");
  }
  arg("--optimizer", t.optimizer == Optimizer::sgd ? "sgd" : "adam");

  // Layout.
  arg("--tensor-model-parallel-size", p.tp);
  arg("--pipeline-model-parallel-size", p.pp);
  if (p.pp > 1 && m.num_layers % p.pp != 0) {
    // Megatron-Core's uneven split: own counts for the first and last stage, the middle equal.
    const std::vector<Count> layers = stage_layer_counts(s);
    const bool middle_equal = p.pp == 2 || std::all_of(layers.begin() + 1, layers.end() - 1,
                                                       [&](Count c) { return c == layers[1]; });
    if (middle_equal) {
      arg("--decoder-first-pipeline-num-layers", layers.front());
      arg("--decoder-last-pipeline-num-layers", layers.back());
    } else {
      out.notes.push_back(fmt::format(
          "the planner's split of {} layers over {} stages has unequal middle stages, which "
          "Megatron-LM cannot express; set pp to a count that divides the layers",
          m.num_layers, p.pp));
    }
  }
  if (p.schedule == Schedule::interleaved_1f1b) {
    arg("--num-layers-per-virtual-pipeline-stage", m.num_layers / (p.pp * p.virtual_stages));
  } else if (p.schedule != Schedule::one_f_one_b && p.pp > 1) {
    out.notes.push_back(schedule_note(s, "Megatron-LM (1F1B)"));
  }
  if (p.sequence_parallel) flag("--sequence-parallel");
  arg("--micro-batch-size", t.micro_batch_size);
  arg("--global-batch-size", t.global_batch_size);
  if (p.recompute == Recompute::selective) arg("--recompute-granularity", "selective");
  if (p.recompute == Recompute::full) {
    arg("--recompute-granularity", "full");
    arg("--recompute-method", "uniform");
    arg("--recompute-num-layers", 1);
  }
  if (p.zero_stage >= 1) flag("--use-distributed-optimizer");
  if (p.zero_stage == 1 && hybrid(s)) {
    arg("--num-distributed-optimizer-instances", p.dp / shard(s));
  }
  if (p.zero_stage >= 2) {
    flag("--use-custom-fsdp");
    arg("--data-parallel-sharding-strategy",
        p.zero_stage == 2 ? "optim_grads" : "optim_grads_params");
    if (hybrid(s)) {
      out.notes.push_back(fmt::format(
          "Megatron-LM FSDP shards over the whole data-parallel group ({} GPUs), not groups of {}",
          p.dp, shard(s)));
    }
  }
  if (p.dp > 1 && s.assumptions.overlap_grad_reduce) flag("--overlap-grad-reduce");
  if (p.zero_stage >= 1 && p.dp > 1 && s.assumptions.overlap_param_gather) {
    flag("--overlap-param-gather");
  }

  std::ostringstream o;
  o << fmt::format("# Megatron-LM pretrain_gpt.py arguments for {} on {} GPUs: tp={} pp={} dp={}\n",
                   m.name, p.tp * p.pp * p.dp, p.tp, p.pp, p.dp);
  o << fmt::format(
      "# (dp = world size / (tp*pp); {} micro-batches per step; vocabulary {} from the "
      "tokenizer)\n",
      accumulation_steps(s), m.vocab_size);
  for (const std::string& n : out.notes) o << "# note: " << n << '\n';
  for (std::size_t i = 0; i < args.size(); ++i) {
    o << args[i] << (i + 1 < args.size() ? " \\\n" : "\n");
  }
  out.text = o.str();
  return out;
}

Exported deepspeed(const Scenario& s) {
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  Exported out;
  nlohmann::ordered_json j;
  j["train_batch_size"] = t.global_batch_size;
  j["train_micro_batch_size_per_gpu"] = t.micro_batch_size;
  j["gradient_accumulation_steps"] = accumulation_steps(s);
  if (t.precision == DType::bf16) j["bf16"] = {{"enabled", true}};
  if (t.precision == DType::fp16) j["fp16"] = {{"enabled", true}};
  if (t.precision != DType::fp32) {
    j["data_types"] = {{"grad_accum_dtype", t.grad_accumulation_dtype == DType::fp32 ? "fp32"
                                            : t.precision == DType::bf16             ? "bf16"
                                                                                     : "fp16"}};
  }
  nlohmann::ordered_json zero;
  zero["stage"] = p.zero_stage;
  zero["overlap_comm"] = s.assumptions.overlap_grad_reduce;
  zero["contiguous_gradients"] = true;
  if (p.zero_stage == 3) {
    zero["stage3_prefetch_bucket_size"] = "auto";
    if (hybrid(s)) zero["mics_shard_size"] = shard(s);
  } else if (hybrid(s)) {
    out.notes.push_back(fmt::format(
        "DeepSpeed shards ZeRO-{} over the whole data-parallel group ({} GPUs), not groups of {}",
        p.zero_stage, p.dp, shard(s)));
  }
  j["zero_optimization"] = zero;
  // Tensor parallelism through AutoTP training; the pipeline through PipelineModule(num_stages=pp).
  if (p.tp > 1) j["tensor_parallel"] = {{"autotp_size", p.tp}};
  if (p.pp > 1) {
    j["pipeline"] = {{"stages", p.pp}, {"partition", "uniform"}};
    if (s.model.num_layers % p.pp != 0) {
      out.notes.push_back(fmt::format(
          "{} layers do not split evenly over {} stages; DeepSpeed's uniform partition places the "
          "extra layers differently from the plan",
          s.model.num_layers, p.pp));
    }
    if (p.schedule != Schedule::one_f_one_b) {
      out.notes.push_back(schedule_note(s, "the DeepSpeed pipeline engine (1F1B)"));
    }
  }
  if (p.recompute != Recompute::none) {
    j["activation_checkpointing"] = {{"partition_activations", p.sequence_parallel},
                                     {"contiguous_memory_optimization", false},
                                     {"number_checkpoints", s.model.num_layers / p.pp}};
    if (p.recompute == Recompute::selective) {
      out.notes.push_back(
          "selective recompute is a model-code choice (Megatron-DeepSpeed "
          "--recompute-granularity selective); DeepSpeed's activation_checkpointing is full-layer");
    }
  }
  if (p.sequence_parallel) {
    out.notes.push_back(
        "sequence parallelism is a model-code choice (Megatron-DeepSpeed --sequence-parallel)");
  }
  if (t.optimizer != Optimizer::sgd) {
    j["optimizer"] = {{"type", t.optimizer == Optimizer::adamw ? "AdamW" : "Adam"}};
  } else {
    j["optimizer"] = {{"type", "SGD"}};
  }
  out.text = j.dump(2) + "\n";
  return out;
}

std::string toml_string(std::string_view v) {
  return fmt::format("\"{}\"", v);
}

Exported torchtitan(const Scenario& s) {
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  Exported out;
  // FSDP2 always shards parameters, gradients and optimizer states (ZeRO-3 layout); replicas of
  // a shard group form the HSDP replicate dimension. ZeRO-0 is plain replication (DDP).
  Count replicate = p.dp;
  Count shard_degree = 1;
  std::string reshard = "default";
  if (p.zero_stage >= 1) {
    shard_degree = shard(s);
    replicate = p.dp / shard_degree;
    if (p.zero_stage <= 2) {
      reshard = "never";  // parameters stay gathered between forward and backward
      out.notes.push_back(fmt::format(
          "torchtitan (FSDP2) has no ZeRO-{}; the nearest is full sharding with "
          "fsdp_reshard_after_forward = \"never\", which also shards parameters at rest",
          p.zero_stage));
    }
  }
  std::string schedule;
  switch (p.schedule) {
    case Schedule::gpipe:
      schedule = "GPipe";
      break;
    case Schedule::one_f_one_b:
      schedule = "1F1B";
      break;
    case Schedule::interleaved_1f1b:
      schedule = "Interleaved1F1B";
      break;
    case Schedule::zb_h1:
    case Schedule::zb_h2:
      schedule = "InterleavedZeroBubble";
      break;
    case Schedule::zb_v:
      // torch.distributed.pipelining's ScheduleZBVZeroBubble: two stages per rank in a V
      // (get_schedule_class name "ZBVZeroBubble", pytorch/pytorch schedules.py).
      schedule = "ZBVZeroBubble";
      break;
    case Schedule::v_half:
    case Schedule::v_min:
      schedule = "ZBVZeroBubble";
      out.notes.push_back(fmt::format(
          "torchtitan has no {} schedule; ZBVZeroBubble places the same V but keeps about {} "
          "times the activations",
          to_string(p.schedule), p.schedule == Schedule::v_half ? 2 : 3));
      break;
  }
  if ((p.schedule == Schedule::zb_h1 || p.schedule == Schedule::zb_h2) && p.pp > 1) {
    out.notes.push_back(fmt::format(
        "schedule {} maps to torch.distributed.pipelining's InterleavedZeroBubble (a looped "
        "schedule with one stage per rank here)",
        to_string(p.schedule)));
  }
  if (p.pp > 1 && s.model.num_layers % p.pp != 0) {
    out.notes.push_back(fmt::format(
        "{} layers do not split evenly over {} stages; set module_fqns_per_model_part to the "
        "plan's split (extra layers on the middle stages)",
        s.model.num_layers, p.pp));
  }
  if (!p.sequence_parallel && p.tp > 1) {
    out.notes.push_back("torchtitan's tensor parallelism always shards the sequence (sp on)");
  }
  std::ostringstream o;
  o << fmt::format("# torchtitan job config for {} on {} GPUs: tp={} pp={} dp={} ZeRO-{}\n",
                   s.model.name, p.tp * p.pp * p.dp, p.tp, p.pp, p.dp, p.zero_stage);
  for (const std::string& n : out.notes) o << "# note: " << n << '\n';
  o << "\n[training]\n";
  // Without a pipeline a local batch is one micro-batch and the rest is gradient accumulation;
  // with a pipeline the local batch is split into pipeline micro-batches.
  o << "local_batch_size = " << (p.pp > 1 ? t.global_batch_size / p.dp : t.micro_batch_size)
    << '\n';
  o << "global_batch_size = " << t.global_batch_size << '\n';
  o << "seq_len = " << t.seq_length << '\n';
  o << "mixed_precision_param = "
    << toml_string(t.precision == DType::fp32   ? "float32"
                   : t.precision == DType::bf16 ? "bfloat16"
                                                : "float16")
    << '\n';
  o << "mixed_precision_reduce = "
    << toml_string(t.grad_accumulation_dtype == DType::fp32   ? "float32"
                   : t.grad_accumulation_dtype == DType::bf16 ? "bfloat16"
                                                              : "float16")
    << '\n';
  o << "\n[parallelism]\n";
  o << "data_parallel_replicate_degree = " << replicate << '\n';
  o << "data_parallel_shard_degree = " << shard_degree << '\n';
  o << "fsdp_reshard_after_forward = " << toml_string(reshard) << '\n';
  o << "tensor_parallel_degree = " << p.tp << '\n';
  o << "pipeline_parallel_degree = " << p.pp << '\n';
  if (p.pp > 1) {
    o << "pipeline_parallel_schedule = " << toml_string(schedule) << '\n';
    o << "pipeline_parallel_microbatch_size = " << t.micro_batch_size << '\n';
    // Multi-stage schedules need torchtitan to cut 2 (ZB-V) or v stages per rank.
    if (p.schedule == Schedule::interleaved_1f1b || v_shape(p.schedule)) {
      o << "pipeline_parallel_layers_per_stage = " << s.model.num_layers / (p.pp * p.virtual_stages)
        << '\n';
    }
  }
  o << "\n[activation_checkpoint]\n";
  o << "mode = " << toml_string(to_string(p.recompute)) << '\n';
  if (p.recompute == Recompute::selective) o << "selective_ac_option = \"op\"\n";
  out.text = o.str();
  return out;
}

}  // namespace

Exported export_scenario(const Scenario& s, ExportFormat format) {
  switch (format) {
    case ExportFormat::megatron:
      return megatron(s);
    case ExportFormat::deepspeed:
      return deepspeed(s);
    case ExportFormat::torchtitan:
      return torchtitan(s);
  }
  return {};
}

}  // namespace distplan::search
