// Fine-tuning exports (docs/exports.md, "Fine-tuning"): the PEFT / bitsandbytes configuration and
// the launch settings of Hugging Face Accelerate (DDP, FSDP or DeepSpeed ZeRO) for Hugging Face
// PEFT's supervised fine-tuning example (peft examples/sft/train.py on TRL's SFTTrainer, the
// recipe of PEFT's "accelerate_fsdp_qlora" / "deepspeed_zero3_qlora" guides), which runs every
// layout the planner accepts with training.peft.
#include <fmt/format.h>

#include "distplan/planner/peft.h"
#include "distplan/search/export.h"

namespace distplan::search {

namespace {

std::string_view torch_dtype(DType d) {
  return d == DType::fp32 ? "float32" : d == DType::bf16 ? "bfloat16" : "float16";
}

}  // namespace

Exported export_peft(const Scenario& s, Exported out) {
  const TrainingSpec& t = s.training;
  const ParallelSpec& p = s.parallel;
  const PeftSpec& pe = t.peft;
  const Count nodes = (s.cluster.num_gpus + s.cluster.gpus_per_node - 1) / s.cluster.gpus_per_node;
  std::string o;
  auto line = [&o](std::string_view text) {
    o += text;
    o += '\n';
  };
  line(
      fmt::format("# {} + {} + {}, launched by Hugging Face Accelerate; the training script is "
                  "PEFT's examples/sft/train.py (TRL SFTTrainer)",
                  kPeftVersion, kBitsandbytesVersion, kAccelerateVersion));
  if (!out.fits) {
    line(
        fmt::format("# WARNING: this layout does not fit: the planner's peak is {:.2f} GiB per "
                    "GPU, the GPU has {:.2f} GiB",
                    to_gib(out.peak_bytes), to_gib(out.capacity_bytes)));
  }
  // accelerate config (accelerate launch --config_file accelerate.yaml).
  line("# ---- accelerate.yaml ----");
  line("compute_environment: LOCAL_MACHINE");
  const bool fsdp = p.zero_stage > 0 && t.framework != Framework::deepspeed;
  const bool ds = p.zero_stage > 0 && t.framework == Framework::deepspeed;
  std::string_view mixed = t.precision == DType::bf16   ? "bf16"
                           : t.precision == DType::fp16 ? "fp16"
                                                        : "'no'";
  // PEFT's fsdp_config_qlora.yaml: the model is loaded in the 4-bit storage dtype, no autocast.
  if (pe.quantized() && fsdp) mixed = "'no'";
  if (fsdp) {
    // FSDP's sharding strategies (torch.distributed.fsdp.ShardingStrategy): ZeRO-3 FULL_SHARD,
    // ZeRO-2 SHARD_GRAD_OP, ZeRO-1 has none (SHARD_GRAD_OP shards gradients too).
    const bool hybrid = s.shard_size() < p.dp;
    std::string_view strategy = p.zero_stage == 3
                                    ? (hybrid ? "HYBRID_SHARD" : "FULL_SHARD")
                                    : (hybrid ? "_HYBRID_SHARD_ZERO2" : "SHARD_GRAD_OP");
    if (p.zero_stage == 1) {
      out.notes.push_back(
          "FSDP has no ZeRO-1 strategy; SHARD_GRAD_OP also shards the gradients (ZeRO-2)");
    }
    line("distributed_type: FSDP");
    line("fsdp_config:");
    line("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP");
    line("  fsdp_backward_prefetch: BACKWARD_PRE");
    line("  fsdp_cpu_ram_efficient_loading: true");
    line(fmt::format("  fsdp_offload_params: {}",
                     p.offload_optimizer != Offload::none ? "true" : "false"));
    line(fmt::format("  fsdp_sharding_strategy: {}", strategy));
    line("  fsdp_state_dict_type: SHARDED_STATE_DICT");
    line("  fsdp_sync_module_states: true");
    line("  fsdp_use_orig_params: false");
    if (p.offload_optimizer != Offload::none) {
      out.notes.push_back(
          "FSDP's CPU offload moves parameters and gradients to the host with the optimizer "
          "states; the plan offloads the optimizer states only (DeepSpeed's offload_optimizer)");
    }
  } else if (ds) {
    line("distributed_type: DEEPSPEED");
    line("deepspeed_config:");
    line("  deepspeed_multinode_launcher: standard");
    line(fmt::format("  offload_optimizer_device: {}", to_string(p.offload_optimizer)));
    line("  offload_param_device: none");
    line(fmt::format("  zero3_init_flag: {}", p.zero_stage == 3 ? "true" : "false"));
    line(fmt::format("  zero_stage: {}", p.zero_stage));
  } else {
    line(fmt::format("distributed_type: {}", p.dp > 1 ? "MULTI_GPU" : "'NO'"));
  }
  line(fmt::format("mixed_precision: {}", mixed));
  line(fmt::format("num_machines: {}", nodes));
  line(fmt::format("num_processes: {}", s.cluster.num_gpus));
  line("rdzv_backend: static");
  line("same_network: true");
  line("use_cpu: false");
  // The script's arguments.
  line("# ---- train.py arguments ----");
  std::vector<std::string> args;
  auto arg = [&args](std::string_view flag, auto value) {
    args.push_back(fmt::format("--{} {}", flag, value));
  };
  arg("max_length", t.seq_length);
  arg("per_device_train_batch_size", t.micro_batch_size);
  arg("gradient_accumulation_steps", s.num_microbatches());
  arg(t.precision == DType::fp16 ? "fp16" : "bf16", t.precision == DType::fp32 ? "False" : "True");
  arg("use_flash_attn", t.attention == Attention::flash ? "True" : "False");
  arg("gradient_checkpointing", p.recompute == Recompute::full ? "True" : "False");
  if (p.recompute == Recompute::full)
    arg("use_reentrant", pe.input_requires_grad ? "True" : "False");
  if (p.recompute == Recompute::selective) {
    out.notes.push_back(
        "selective recompute (the attention scores only) is Megatron's; Hugging Face gradient "
        "checkpointing recomputes whole layers (recompute full)");
  }
  if (pe.adapters()) {
    arg("use_peft_lora", "True");
    arg("lora_r", pe.rank);
    arg("lora_alpha", pe.alpha);
    arg("lora_dropout", pe.dropout);
    std::string targets;
    if (pe.all_linear) {
      targets = "all-linear";
    } else {
      for (std::string_view n : peft_target_names(pe.naming, pe.targets)) {
        if (!targets.empty()) targets += ',';
        targets += n;
      }
    }
    arg("lora_target_modules", fmt::format("\"{}\"", targets));
    if (pe.frozen_layers > 0) {
      out.to_add.push_back(fmt::format(
          "LoraConfig(layers_to_transform=list(range({}, {}))) in train.py's create_and_prepare_"
          "model: the example has no argument for it",
          pe.frozen_layers, s.model.num_layers));
    }
    if (pe.adapter_dtype != DType::fp32) {
      out.to_add.push_back(fmt::format(
          "get_peft_model(..., autocast_adapter_dtype=False) and the adapters cast to {} "
          "(PEFT upcasts 16-bit adapters to fp32 by default)",
          to_string(pe.adapter_dtype)));
    }
  } else {
    out.notes.push_back(
        "full fine-tuning: train.py without --use_peft_lora trains every parameter; freezing "
        "(freeze_embeddings, frozen_layers) is requires_grad_(False) on those modules in the "
        "script");
  }
  if (pe.base_storage == BaseStorage::nf4 || pe.base_storage == BaseStorage::fp4) {
    arg("use_4bit_quantization", "True");
    arg("use_nested_quant", pe.double_quant ? "True" : "False");
    arg("bnb_4bit_quant_type", to_string(pe.base_storage));
    arg("bnb_4bit_compute_dtype", torch_dtype(t.precision));
    // FSDP and ZeRO-3 shard the packed weights only when they are stored in a float dtype.
    if (p.zero_stage == 3 || fsdp) arg("bnb_4bit_quant_storage_dtype", torch_dtype(t.precision));
  } else if (pe.base_storage == BaseStorage::int8) {
    arg("use_8bit_quantization", "True");
  }
  if (pe.paged_optimizer) {
    arg("optim", "paged_adamw_32bit");
  } else {
    arg("optim", t.optimizer == Optimizer::sgd ? "sgd" : "adamw_torch");
  }
  if (pe.quantized()) {
    // What the recipe keeps in 16 or 32 bits: sharded (FSDP / ZeRO-3) it loads the model in the
    // quant storage dtype and TRL skips prepare_model_for_kbit_training (is_sharded_qlora);
    // unsharded it loads fp32 and prepare_model_for_kbit_training keeps the rest fp32.
    const bool sharded = p.zero_stage == 3 || fsdp;
    const DType recipe = sharded ? t.precision : DType::fp32;
    if (pe.base_dtype != recipe) {
      out.notes.push_back(fmt::format(
          "the recipe keeps the embeddings, LM head and norms in {} ({}); the plan counts them in "
          "{}: set training.peft.base_dtype to {} to plan the recipe",
          to_string(recipe),
          sharded ? "bnb_4bit_quant_storage_dtype, no prepare_model_for_kbit_training"
                  : "prepare_model_for_kbit_training",
          to_string(pe.base_dtype), to_string(recipe)));
    }
  }
  if (p.pp > 1) {
    out.notes.push_back(fmt::format(
        "Accelerate and TRL have no pipeline parallelism: the plan's {} stages need a pipeline "
        "engine (DeepSpeed's PipelineModule) around the PEFT model",
        p.pp));
  }
  for (const std::string& a : args) line(a);
  out.to_add.insert(out.to_add.begin(),
                    {"--model_name_or_path and --dataset_name (the checkpoint and data)",
                     "--learning_rate, --lr_scheduler_type, --num_train_epochs, --output_dir"});
  for (const std::string& n : out.notes) line("# note: " + n);
  for (const std::string& a : out.to_add) line("# you still add: " + a);
  out.text = o;
  return out;
}

}  // namespace distplan::search
