// What each framework runs (capabilities.h), every row with its source; docs/frameworks.md
// gives the same table for people. Sources: NVIDIA/Megatron-LM at tag core_v0.15.3
// (megatron/training/arguments.py validate_args and its argument definitions,
// megatron/core/pipeline_parallel/schedules.py get_forward_backward_func);
// pytorch/torchtitan at tag v0.2.2 (torchtitan/config/job_config.py,
// torchtitan/models/llama3/infra/parallelize.py) with torch.distributed.pipelining
// (schedules.py get_schedule_class, stage.py); deepspeedai/DeepSpeed at tag v0.18.0
// (deepspeed/runtime/engine.py, runtime/pipe/engine.py, runtime/pipe/schedule.py,
// runtime/config.py, runtime/zero/config.py).
#include "distplan/planner/capabilities.h"

#include <algorithm>

#include <fmt/format.h>

#include "distplan/planner/layout.h"

namespace distplan {
namespace {

constexpr Support yes(std::string_view source) {
  return {true, source};
}
constexpr Support no(std::string_view source) {
  return {false, source};
}
std::size_t at(Schedule s) {
  return static_cast<std::size_t>(s);
}

// generic: the textbook conventions; every layout distplan models runs.
FrameworkCapabilities generic_row() {
  constexpr std::string_view src = "generic: every layout distplan models (docs/frameworks.md)";
  FrameworkCapabilities c;
  c.framework = Framework::generic;
  c.code = "distplan's own conventions";
  const Support all = yes(src);
  c.schedule.fill(all);
  c.pipeline_with_tensor_parallel = all;
  c.sharding_with_pipeline.fill(all);
  c.split = SplitSupport::any;
  c.split_source = src;
  c.zero_stage.fill(all);
  c.hybrid_shard.fill(all);
  c.replicas_with_model_parallel = all;
  c.unsharded_with_context_parallel = all;
  c.expert_parallel_beyond_shard = all;
  c.tensor_parallel = all;
  c.sharding_with_tensor_parallel.fill(all);
  c.sequence_parallel = all;
  c.tensor_parallel_without_sp = all;
  c.context_parallel.fill(all);
  c.expert_parallel = all;
  c.expert_tensor_parallel_equal_tp = all;
  c.expert_tensor_parallel_other = all;
  c.precision.fill(all);
  c.fp32_gradients_with_half = all;
  c.half_gradients = all;
  c.fp8_recipe.fill(all);
  c.recompute.fill(all);
  c.offload_optimizer.fill(all);
  c.offload_params.fill(all);
  c.offload_with_zero.fill(all);
  c.offload_optimizer_alone = all;
  c.tp_comm_overlap = all;
  c.tp_comm_overlap_without_sp = all;
  c.overlap_grad_reduce = all;
  c.overlap_param_gather = all;
  c.overlap_param_gather_after_step = all;
  c.overlap_param_gather_after_step_flat = all;
  c.overlap_p2p = all;
  c.overlap_p2p_interleaved = all;
  c.interleaved_pp2_without_p2p_overlap = all;
  c.fine_tuning = all;
  c.p2p_overlap_default = no("generic: assumptions.overlap_p2p decides (default off)");
  c.ep_dispatch_overlap = no("generic: not modelled");
  c.grouped_gemm = yes("generic: the op table times one GEMM per rank's experts");
  c.fused_kernels = yes("generic: the op table's kernels");
  c.torch_compile = no("generic: not modelled");
  return c;
}

FrameworkCapabilities megatron_row() {
  FrameworkCapabilities c;
  c.framework = Framework::megatron;
  c.code = "Megatron-LM core_v0.15.3";
  // Schedules: get_forward_backward_func picks forward_backward_no_pipelining (pp = 1),
  // forward_backward_pipelining_without_interleaving (1F1B) or ..._with_interleaving (virtual
  // stages); nothing else exists in megatron/core/pipeline_parallel/schedules.py.
  constexpr std::string_view none_else =
      "Megatron-LM runs 1F1B and interleaved 1F1B only (core/pipeline_parallel/schedules.py, "
      "get_forward_backward_func)";
  c.schedule.fill(no(none_else));
  c.schedule[at(Schedule::one_f_one_b)] =
      yes("forward_backward_pipelining_without_interleaving (core/pipeline_parallel/schedules.py)");
  c.schedule[at(Schedule::interleaved_1f1b)] =
      yes("--num-layers-per-virtual-pipeline-stage: forward_backward_pipelining_with_interleaving");
  c.pipeline_with_tensor_parallel =
      yes("--tensor-model-parallel-size with "
          "--pipeline-model-parallel-size");
  c.sharding_with_pipeline.fill(
      yes("--use-distributed-optimizer / --use-megatron-fsdp: no pipeline restriction in "
          "arguments.py validate_args"));
  c.split = SplitSupport::any;
  c.split_source =
      "--pipeline-model-parallel-layout (\"Et*7|t*8|...|t*7L\"): any per-stage layer list "
      "(core/transformer/pipeline_parallel_layer_layout.py)";
  c.zero_stage[0] = yes("DistributedDataParallel (no --use-distributed-optimizer)");
  c.zero_stage[1] =
      yes("--use-distributed-optimizer (optimizer states and fp32 main params "
          "sharded over dp x cp)");
  c.zero_stage[2] = yes("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads");
  c.zero_stage[3] =
      yes("--use-megatron-fsdp --data-parallel-sharding-strategy "
          "optim_grads_params");
  c.hybrid_shard[0] = no("ZeRO-0 has no shards");
  c.hybrid_shard[1] = yes("--num-distributed-optimizer-instances = dp / fsdp_shard_size");
  c.hybrid_shard[2] = c.hybrid_shard[3] =
      yes("--num-distributed-optimizer-instances: Megatron FSDP's HSDP "
          "(core/distributed/fsdp/mcore_fsdp_adapter.py, enable_hsdp)");
  c.replicas_with_model_parallel = yes("DistributedDataParallel over the data-parallel group");
  c.unsharded_with_context_parallel = yes("DistributedDataParallel over the dp x cp group");
  c.expert_parallel_beyond_shard = yes("MoE parallel folding over tp x cp x dp");
  c.tensor_parallel = yes("--tensor-model-parallel-size");
  c.sharding_with_tensor_parallel.fill(yes("--tensor-model-parallel-size with any sharding"));
  c.sequence_parallel = yes("--sequence-parallel");
  c.tensor_parallel_without_sp = yes("--sequence-parallel is optional");
  c.context_parallel.fill(
      yes("--context-parallel-size with --cp-comm-type p2p | allgather | "
          "a2a (Transformer Engine's context parallelism)"));
  c.expert_parallel = yes("--expert-model-parallel-size (MoE parallel folding)");
  c.expert_tensor_parallel_equal_tp = yes("--expert-tensor-parallel-size");
  c.expert_tensor_parallel_other = yes("--expert-tensor-parallel-size");
  c.precision.fill(yes("--fp16 / --bf16, fp32 without either"));
  c.fp32_gradients_with_half =
      yes("--accumulate-allreduce-grads-in-fp32 (the default under --bf16, arguments.py)");
  c.half_gradients = yes("--grad-reduce-in-bf16 under --bf16; fp16 gradients under --fp16");
  c.fp8_recipe.fill(
      yes("--fp8-recipe delayed | tensorwise | blockwise | mxfp8 (Transformer "
          "Engine)"));
  c.recompute[static_cast<std::size_t>(Recompute::none)] = yes("no --recompute-granularity");
  c.recompute[static_cast<std::size_t>(Recompute::selective)] =
      yes("--recompute-granularity selective (core_attn)");
  c.recompute[static_cast<std::size_t>(Recompute::full)] =
      yes("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  c.recompute[static_cast<std::size_t>(Recompute::selective_op)] =
      no("per-op selective checkpointing is torchtitan's policy; Megatron-LM's "
         "--recompute-granularity is full or selective (--recompute-modules)");
  c.offload_optimizer[0] = yes("no offload");
  c.offload_optimizer[static_cast<std::size_t>(Offload::cpu)] =
      yes("--optimizer-cpu-offload --use-precision-aware-optimizer (HybridDeviceOptimizer)");
  c.offload_optimizer[static_cast<std::size_t>(Offload::nvme)] =
      no("Megatron-LM has no NVMe offload (--optimizer-cpu-offload moves the states to host "
         "memory)");
  c.offload_params[0] = yes("no offload");
  c.offload_params[1] = c.offload_params[2] =
      no("Megatron-LM has no parameter offload (--optimizer-cpu-offload moves only the "
         "optimizer)");
  c.offload_with_zero.fill(
      no("--use-precision-aware-optimizer, which --optimizer-cpu-offload needs, asserts "
         "--use-distributed-optimizer (core/optimizer/optimizer_config.py)"));
  c.offload_with_zero[1] = yes("--optimizer-cpu-offload with --use-distributed-optimizer");
  c.offload_optimizer_alone = yes("--optimizer-cpu-offload keeps parameters on the GPU");
  c.tp_comm_overlap = yes("--tp-comm-overlap (Transformer Engine userbuffers)");
  c.tp_comm_overlap_without_sp =
      no("--tp-comm-overlap asserts --sequence-parallel (arguments.py validate_args)");
  c.overlap_grad_reduce = yes("--overlap-grad-reduce");
  c.overlap_param_gather = yes("--overlap-param-gather (with the distributed optimizer)");
  // distplan's overlap_param_gather_after_step is the distributed optimizer's all-gather behind
  // the next step's forward: --overlap-param-gather, with any schedule (the separate
  // --overlap-param-gather-with-optimizer-step, interleaved only, is not modelled).
  c.overlap_param_gather_after_step =
      yes("--overlap-param-gather (distributed optimizer; needs --overlap-grad-reduce)");
  c.overlap_param_gather_after_step_flat = c.overlap_param_gather_after_step;
  c.overlap_p2p = no("arguments.py sets overlap_p2p_comm False without the interleaved schedule");
  c.interleaved_pp2_without_p2p_overlap =
      no("arguments.py asserts pipeline-model-parallel size > 2 for the interleaved schedule "
         "without overlap_p2p_comm; set assumptions.overlap_p2p true (Megatron-LM's default "
         "there)");
  c.overlap_p2p_interleaved =
      yes("overlap_p2p_comm (on unless --no-overlap-p2p-communication) in the interleaved "
          "schedule");
  c.p2p_overlap_default = yes("interleaved schedule: overlap_p2p_comm on by default");
  c.ep_dispatch_overlap =
      yes("--overlap-moe-expert-parallel-comm (combined 1F1B, "
          "core/pipeline_parallel/combined_1f1b.py)");
  c.grouped_gemm = yes("--moe-grouped-gemm (TE GroupedLinear)");
  c.fused_kernels =
      yes("Transformer Engine layers: fused norms, rotary, softmax, attention; "
          "fused vocab-parallel cross-entropy");
  c.torch_compile = no("no torch.compile of the model; fusions are TE kernels");
  c.fine_tuning =
      no("Megatron-LM core_v0.15.3 trains no LoRA adapters or frozen 4-bit base "
         "(Megatron-Bridge's PEFT wraps its own adapters, not modelled); plan fine-tuning "
         "under \"generic\" or \"deepspeed\" (Hugging Face PEFT + Accelerate, export peft)");
  return c;
}

FrameworkCapabilities torchtitan_row() {
  FrameworkCapabilities c;
  c.framework = Framework::torchtitan;
  c.code = "torchtitan v0.2.2";
  constexpr std::string_view sched_src =
      "[parallelism] pipeline_parallel_schedule: torch.distributed.pipelining get_schedule_class "
      "has GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble and "
      "DualPipeV; none runs this schedule's order";
  c.schedule.fill(no(sched_src));
  c.schedule[at(Schedule::gpipe)] = yes("pipeline_parallel_schedule = \"GPipe\"");
  c.schedule[at(Schedule::one_f_one_b)] = yes("pipeline_parallel_schedule = \"1F1B\"");
  c.schedule[at(Schedule::interleaved_1f1b)] =
      yes("pipeline_parallel_schedule = \"Interleaved1F1B\"");
  c.schedule[at(Schedule::zb_v)] = yes("pipeline_parallel_schedule = \"ZBVZeroBubble\"");
  c.schedule[at(Schedule::dualpipe_v)] = yes("pipeline_parallel_schedule = \"DualPipeV\"");
  c.pipeline_with_tensor_parallel = yes("tensor_parallel_degree with pipeline_parallel_degree");
  c.sharding_with_pipeline.fill(yes("FSDP2 with pipeline_parallel_degree"));
  c.split = SplitSupport::any;
  c.split_source = "[parallelism] module_fqns_per_model_part: any list of layers per stage";
  c.zero_stage[0] = yes("data_parallel_replicate_degree (DDP) only");
  c.zero_stage[1] =
      no("FSDP2 (fully_shard) reduce-scatters every gradient: torchtitan has no ZeRO-1 (full "
         "gradients beside sharded optimizer states)");
  // Parameters gathered at the first forward and kept to the end of the backward, gradients and
  // optimizer states sharded: ZeRO-2's peak and traffic (the Llama 3 paper's FSDP, sec. 3.3.2).
  c.zero_stage[2] = yes("fsdp_reshard_after_forward = \"never\" with data_parallel_shard_degree");
  c.hybrid_shard[2] = yes("data_parallel_replicate_degree x data_parallel_shard_degree, "
                          "fsdp_reshard_after_forward = \"never\"");
  c.zero_stage[3] = yes("data_parallel_shard_degree: FSDP2 fully_shard");
  c.hybrid_shard[0] = c.hybrid_shard[1] = no("only FSDP2 shards");
  c.hybrid_shard[3] = yes("data_parallel_replicate_degree x data_parallel_shard_degree (HSDP)");
  c.replicas_with_model_parallel =
      no("DDP without sharding is 1-D only: \"DDP has not supported > 1D parallelism\" "
         "(models/llama3/infra/parallelize.py)");
  c.unsharded_with_context_parallel =
      no("FSDP shards over dp_shard x cp whenever cp > 1 (distributed/parallel_dims.py, "
         "fsdp_enabled): context parallelism runs with ZeRO-3 only");
  c.expert_parallel_beyond_shard =
      no("the expert mesh folds ep x etp into dp_shard x cp x tp (distributed/parallel_dims.py, "
         "efsdp); replicas (data_parallel_replicate_degree) stay outside it");
  c.tensor_parallel = yes("tensor_parallel_degree");
  c.sharding_with_tensor_parallel.fill(yes("tensor_parallel_degree with FSDP2"));
  c.sequence_parallel = yes("torchtitan's tensor parallelism shards the sequence (apply_tp)");
  c.tensor_parallel_without_sp =
      no("torchtitan's tensor parallelism always shards the sequence (apply_tp: "
         "SequenceParallel norms); set sequence_parallel true");
  c.context_parallel[static_cast<std::size_t>(CpComm::p2p)] =
      yes("context_parallel_degree, context_parallel_rotate_method \"alltoall\" (ring)");
  c.context_parallel[static_cast<std::size_t>(CpComm::all_gather)] =
      yes("context_parallel_degree, context_parallel_rotate_method \"allgather\"");
  c.context_parallel[static_cast<std::size_t>(CpComm::a2a)] =
      no("context_parallel_rotate_method is \"allgather\" or \"alltoall\" (a KV ring); "
         "torchtitan has no Ulysses head all-to-all");
  c.expert_parallel = yes("expert_parallel_degree");
  c.expert_tensor_parallel_equal_tp = yes("expert_tensor_parallel_degree = tensor_parallel_degree");
  c.expert_tensor_parallel_other =
      no("expert_tensor_parallel_degree is 1 or tensor_parallel_degree (config/job_config.py)");
  c.precision[static_cast<std::size_t>(DType::fp32)] = yes("mixed_precision_param = \"float32\"");
  c.precision[static_cast<std::size_t>(DType::fp16)] =
      no("mixed_precision_param is bfloat16 or float32: torchtitan has no fp16 training");
  c.precision[static_cast<std::size_t>(DType::bf16)] = yes("mixed_precision_param = \"bfloat16\"");
  c.fp32_gradients_with_half = yes("mixed_precision_reduce = \"float32\"");
  c.half_gradients =
      no("mixed_precision_reduce is float32 only: gradients are reduced and kept in fp32");
  c.fp8_recipe.fill(
      no("torchtitan's float8 (torchao Float8Linear) has the recipes tensorwise, "
         "rowwise and rowwise_with_gw_hp, and mx has mxfp8: no delayed scaling, "
         "no 128 x 128 blockwise"));
  c.fp8_recipe[static_cast<std::size_t>(Fp8Recipe::none)] = yes("no float8 converter");
  c.fp8_recipe[static_cast<std::size_t>(Fp8Recipe::current)] =
      yes("[quantize.linear.float8] recipe_name = \"tensorwise\" (per-tensor current scaling)");
  c.fp8_recipe[static_cast<std::size_t>(Fp8Recipe::mxfp8)] =
      yes("[quantize.linear.mx] recipe_name = \"mxfp8_cublas\"");
  c.recompute[static_cast<std::size_t>(Recompute::none)] =
      yes("[activation_checkpoint] mode = \"none\"");
  c.recompute[static_cast<std::size_t>(Recompute::selective)] =
      no("torchtitan's selective modes are per-op (selective_ac_option \"op\": recompute "
         "selective_op) or every n-th layer; Megatron's attention-only recompute is not one");
  c.recompute[static_cast<std::size_t>(Recompute::full)] =
      yes("[activation_checkpoint] mode = \"full\"");
  c.recompute[static_cast<std::size_t>(Recompute::selective_op)] =
      yes("[activation_checkpoint] mode = \"selective\", selective_ac_option = \"op\"");
  c.offload_optimizer[0] = yes("no offload");
  c.offload_optimizer[static_cast<std::size_t>(Offload::cpu)] =
      yes("[training] enable_cpu_offload (FSDP2 CPUOffloadPolicy)");
  c.offload_optimizer[static_cast<std::size_t>(Offload::nvme)] =
      no("FSDP2's CPUOffloadPolicy offloads to host memory only");
  c.offload_params = c.offload_optimizer;
  c.offload_with_zero.fill(no("CPUOffloadPolicy is an FSDP2 (ZeRO-3) policy"));
  c.offload_with_zero[3] = yes("enable_cpu_offload with FSDP2");
  c.offload_optimizer_alone =
      no("FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer states to the "
         "host together: offload_params must be cpu too");
  c.tp_comm_overlap =
      yes("enable_async_tensor_parallel (with [compile] enable: micro-pipelined TP)");
  c.tp_comm_overlap_without_sp = no("torchtitan's tensor parallelism always shards the sequence");
  c.overlap_grad_reduce = yes("FSDP2 reduce-scatters each block's gradients during the backward");
  c.overlap_param_gather = yes("FSDP2 prefetches the next block's all-gather");
  c.overlap_param_gather_after_step =
      no("FSDP2 gathers parameters in the forward (ZeRO-3), not after the optimizer step");
  c.overlap_param_gather_after_step_flat = c.overlap_param_gather_after_step;
  c.overlap_p2p = yes("torch.distributed.pipelining posts sends and receives asynchronously");
  c.overlap_p2p_interleaved = c.overlap_p2p;
  c.interleaved_pp2_without_p2p_overlap = yes("Interleaved1F1B at any pp");
  c.p2p_overlap_default = yes("torch.distributed.pipelining: async isend/irecv");
  c.ep_dispatch_overlap =
      yes("pipeline_parallel_expert_parallel_overlap (DualPipeV with ep > 1): EP dispatch and "
          "combine overlap the other chunk's compute; TP collectives are not overlapped");
  c.grouped_gemm = yes("MoE experts through torch._grouped_mm (use_grouped_mm)");
  c.fused_kernels = no("eager PyTorch ops (fused only under [compile] enable)");
  c.fine_tuning =
      no("torchtitan v0.2.2 has no LoRA converter or quantized base (its LoRA came later, "
         "pytorch/torchtitan#2484); plan fine-tuning under \"generic\" or \"deepspeed\" "
         "(Hugging Face PEFT + Accelerate, export peft)");
  c.torch_compile =
      yes("[compile] enable, components [\"model\", \"loss\"]: per-block "
          "torch.compile (apply_compile)");
  return c;
}

FrameworkCapabilities deepspeed_row() {
  FrameworkCapabilities c;
  c.framework = Framework::deepspeed;
  c.code = "DeepSpeed v0.18.0";
  c.schedule.fill(
      no("DeepSpeed's pipeline engine runs TrainSchedule, 1F1B "
         "(runtime/pipe/schedule.py); it has no other training schedule"));
  c.schedule[at(Schedule::one_f_one_b)] = yes("PipelineEngine TrainSchedule (1F1B)");
  // A PipelineModule gets tensor parallelism from its model code: Megatron-DeepSpeed's
  // --tensor-model-parallel-size under the PipelineEngine, as BLOOM-176B and MT-NLG 530B ran.
  c.pipeline_with_tensor_parallel =
      yes("Megatron-DeepSpeed model code (--tensor-model-parallel-size) under the "
          "PipelineEngine (BLOOM-176B, MT-NLG 530B)");
  c.sharding_with_pipeline.fill(
      no("\"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
         "parallelism\" (runtime/pipe/engine.py)"));
  c.sharding_with_pipeline[0] = c.sharding_with_pipeline[1] = yes("PipelineEngine with ZeRO 0/1");
  c.split = SplitSupport::even_only;
  c.split_source =
      "PipelineModule(partition_method=\"type:<layer class>\"): its partitioner "
      "(runtime/utils.py) places uneven layers by its own rule, which distplan does not plan";
  c.zero_stage.fill(yes("zero_optimization.stage"));
  c.zero_stage[0] = yes("zero_optimization.stage 0");
  c.hybrid_shard.fill(no("DeepSpeed's ZeRO-1/2 shard over the whole data-parallel group"));
  c.hybrid_shard[3] = yes("zero_optimization.mics_shard_size (MiCS)");
  c.replicas_with_model_parallel = yes("the engine all-reduces over the data-parallel group");
  c.unsharded_with_context_parallel = yes("no context parallelism to shard over");
  c.expert_parallel_beyond_shard = yes("deepspeed.moe groups ep within the data-parallel ranks");
  c.tensor_parallel = yes("tensor_parallel.autotp_size (AutoTP training)");
  c.sharding_with_tensor_parallel.fill(yes("AutoTP training with ZeRO 0, 1, 2"));
  c.sharding_with_tensor_parallel[3] =
      no("\"the compatibility between 'autotp' and 'zero_stage = 3' has not been validated\" "
         "(runtime/engine.py _configure_tensor_parallel asserts zero stage <= 2)");
  c.sequence_parallel =
      no("AutoTP shards the linear layers only; Megatron-style sequence parallelism is model "
         "code (Megatron-DeepSpeed --sequence-parallel)");
  c.tensor_parallel_without_sp = yes("AutoTP (no sequence parallelism)");
  c.context_parallel.fill(
      no("DeepSpeed's engine has no context parallelism; "
         "DeepSpeed-Ulysses is model code (deepspeed.sequence.layer."
         "DistributedAttention)"));
  c.expert_parallel = yes("deepspeed.moe.layer.MoE(ep_size=...) in the model code");
  c.expert_tensor_parallel_equal_tp =
      no("DeepSpeed-MoE's experts are not split with AutoTP (deepspeed/moe/layer.py)");
  c.expert_tensor_parallel_other = c.expert_tensor_parallel_equal_tp;
  c.precision.fill(yes("bf16.enabled / fp16.enabled, fp32 without either"));
  c.fp32_gradients_with_half =
      yes("data_types.grad_accum_dtype \"fp32\" (BF16_Optimizer under ZeRO 0/1)");
  c.half_gradients =
      yes("data_types.grad_accum_dtype defaults to the model dtype "
          "(runtime/engine.py get_data_types)");
  c.fp8_recipe.fill(
      no("DeepSpeed's config has no FP8 training; Transformer Engine is model "
         "code (te.fp8_autocast)"));
  c.fp8_recipe[static_cast<std::size_t>(Fp8Recipe::none)] = yes("no FP8");
  c.recompute[static_cast<std::size_t>(Recompute::none)] = yes("no activation checkpointing");
  c.recompute[static_cast<std::size_t>(Recompute::full)] =
      yes("activation_checkpointing: deepspeed.checkpointing.checkpoint of each layer");
  c.recompute[static_cast<std::size_t>(Recompute::selective)] =
      no("DeepSpeed checkpoints whole layers (activation_checkpointing); selective recompute "
         "is Megatron model code");
  c.recompute[static_cast<std::size_t>(Recompute::selective_op)] =
      no("per-op selective checkpointing is torchtitan's policy");
  c.offload_optimizer.fill(yes("zero_optimization.offload_optimizer.device cpu | nvme"));
  c.offload_params.fill(yes("zero_optimization.offload_param.device cpu | nvme"));
  c.offload_with_zero.fill(yes("ZeRO-Offload with ZeRO 1, 2, 3"));
  c.offload_optimizer_alone = yes("offload_optimizer without offload_param");
  c.tp_comm_overlap = no("AutoTP's all-reduces are not overlapped with the GEMMs");
  c.tp_comm_overlap_without_sp = c.tp_comm_overlap;
  c.overlap_grad_reduce = yes("zero_optimization.overlap_comm");
  c.overlap_param_gather = yes("ZeRO-3 prefetch (stage3_prefetch_bucket_size)");
  c.overlap_param_gather_after_step =
      no("ZeRO-1/2 all-gather the updated parameters inside the optimizer step");
  c.overlap_param_gather_after_step_flat = c.overlap_param_gather_after_step;
  c.overlap_p2p =
      no("the pipeline engine's send/recv are blocking instructions of its "
         "schedule (runtime/pipe/engine.py)");
  c.overlap_p2p_interleaved = c.overlap_p2p;
  c.interleaved_pp2_without_p2p_overlap = no("DeepSpeed has no interleaved schedule");
  c.p2p_overlap_default = c.overlap_p2p;
  c.ep_dispatch_overlap = no("DeepSpeed-MoE's all-to-all is not overlapped");
  c.grouped_gemm =
      no("DeepSpeed-MoE runs its local experts one after another "
         "(deepspeed/moe/experts.py)");
  c.fused_kernels = no("the model's own (Hugging Face) eager ops");
  c.torch_compile = yes("compile.enabled: engine.compile()");
  c.fine_tuning = yes(
      "Hugging Face PEFT + Accelerate with DeepSpeed ZeRO (PEFT v0.20.0 examples/sft/configs)");
  return c;
}

const FrameworkCapabilities kGeneric = generic_row();
const FrameworkCapabilities kMegatron = megatron_row();
const FrameworkCapabilities kTorchtitan = torchtitan_row();
const FrameworkCapabilities kDeepspeed = deepspeed_row();

std::string_view dtype_word(DType d) {
  return d == DType::fp32 ? "fp32" : d == DType::fp16 ? "fp16" : "bf16";
}

}  // namespace

const FrameworkCapabilities& capabilities(Framework f) noexcept {
  switch (f) {
    case Framework::generic:
      return kGeneric;
    case Framework::megatron:
      return kMegatron;
    case Framework::torchtitan:
      return kTorchtitan;
    case Framework::deepspeed:
      return kDeepspeed;
  }
  return kGeneric;
}

FrameworkRefusal refusal(const FrameworkCapabilities& c, const Support& row, std::string_view path,
                         std::string_view what) {
  return FrameworkRefusal{
      std::string(path),
      fmt::format("training.framework {} ({}) cannot run {}: {}. Choose a layout it runs, "
                  "another training.framework, or \"generic\" (distplan's textbook model, "
                  "every layout; docs/frameworks.md)",
                  to_string(c.framework), c.code, what, row.source)};
}

bool split_expressible(const Scenario& s, SplitSupport rule) {
  const ParallelSpec& p = s.parallel;
  if (p.pp == 1 || rule == SplitSupport::any) return true;
  const std::vector<Count> layers = stage_layer_counts(s);
  const bool even =
      std::all_of(layers.begin(), layers.end(), [&](Count c) { return c == layers.front(); });
  if (even) return true;
  if (rule == SplitSupport::even_only) return split_weighs_embedding_and_head(s);
  // first_last: the middle stages equal (with two stages, any split).
  return p.pp == 2 ||
         std::all_of(layers.begin() + 1, layers.end() - 1, [&](Count c) { return c == layers[1]; });
}

bool split_weighs_embedding_and_head(const Scenario& s) {
  const ParallelSpec& p = s.parallel;
  const Count slots = s.model.num_layers + 2;
  if (p.pp < 2 || p.virtual_stages != 1 || slots % p.pp != 0) return false;
  const Count per = slots / p.pp;
  const std::vector<Count> layers = stage_layer_counts(s);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const bool end = i == 0 || i + 1 == layers.size();
    if (layers[i] != per - (end ? 1 : 0)) return false;
  }
  return true;
}

std::optional<FrameworkRefusal> framework_refusal(const Scenario& s) {
  const FrameworkCapabilities& c = capabilities(s.training.framework);
  const ParallelSpec& p = s.parallel;
  const TrainingSpec& t = s.training;
  const Assumptions& a = s.assumptions;
  std::optional<FrameworkRefusal> out;
  // The first row that does not run sets the refusal: path, what, and the row's source.
  auto need = [&](const Support& row, std::string_view path, const std::string& what) {
    if (out || row.runs) return;
    out = refusal(c, row, path, what);
  };
  const bool half = t.precision != DType::fp32;
  if (t.peft.enabled()) need(c.fine_tuning, "/training/peft", "fine-tuning (training.peft)");

  // Precision first: it is the recipe, the layout comes after.
  need(c.precision[static_cast<std::size_t>(t.precision)], "/training/precision",
       fmt::format("precision {}", dtype_word(t.precision)));
  need(c.fp8_recipe[static_cast<std::size_t>(t.fp8)],
       t.fp8 == Fp8Recipe::delayed ? "/training/precision" : "/training/fp8_recipe",
       fmt::format("FP8 with {} scaling", to_string(t.fp8)));
  if (half && t.grad_accumulation_dtype == DType::fp32) {
    need(c.fp32_gradients_with_half, "/training/grad_accumulation_dtype",
         fmt::format("fp32 gradients with {} compute", dtype_word(t.precision)));
  }
  if (half && t.grad_accumulation_dtype != DType::fp32 &&
      t.grad_accumulation_dtype != t.precision && c.framework != Framework::generic) {
    need(no("frameworks keep gradients in fp32 or in the compute dtype"),
         "/training/grad_accumulation_dtype",
         fmt::format("{} gradients with {} compute", dtype_word(t.grad_accumulation_dtype),
                     dtype_word(t.precision)));
  }
  if (half && t.grad_accumulation_dtype == t.precision) {
    need(c.half_gradients, "/training/grad_accumulation_dtype",
         fmt::format("{} gradients", dtype_word(t.precision)));
  }

  // Pipeline. The schedule is checked at pp = 1 too: one stage still runs its order (GPipe keeps
  // every micro-batch's activations; the frameworks run forward-backward per micro-batch).
  need(c.schedule[at(p.schedule)], "/parallel/schedule",
       fmt::format("schedule {}", to_string(p.schedule)));
  if (p.schedule == Schedule::interleaved_1f1b && p.pp == 2 && !a.overlap_p2p) {
    need(c.interleaved_pp2_without_p2p_overlap, "/assumptions/overlap_p2p",
         "the interleaved schedule at pp=2 without p2p overlap");
  }
  if (p.pp > 1) {
    if (p.tp > 1) {
      need(c.pipeline_with_tensor_parallel, "/parallel/tp",
           fmt::format("tensor parallelism (tp={}) with pipeline parallelism (pp={})", p.tp, p.pp));
    }
    need(c.sharding_with_pipeline[static_cast<std::size_t>(p.zero_stage)], "/parallel/zero_stage",
         fmt::format("ZeRO-{} with pipeline parallelism (pp={})", p.zero_stage, p.pp));
    if (!out && !split_expressible(s, c.split)) {
      const std::vector<Count> layers = stage_layer_counts(s);
      std::string list;
      for (Count n : layers) list += fmt::format("{}{}", list.empty() ? "" : ", ", n);
      need(no(c.split_source),
           p.layers_per_stage.empty() ? "/parallel/pp" : "/parallel/layers_per_stage",
           fmt::format("the pipeline split [{}] of {} layers over {} stages", list,
                       s.model.num_layers, p.pp));
    }
  }

  // Data parallel and sharding.
  need(c.zero_stage[static_cast<std::size_t>(p.zero_stage)], "/parallel/zero_stage",
       fmt::format("ZeRO-{}", p.zero_stage));
  if (p.zero_stage > 0 && s.shard_size() < p.dp) {
    need(c.hybrid_shard[static_cast<std::size_t>(p.zero_stage)], "/parallel/fsdp_shard_size",
         fmt::format("hybrid sharding (ZeRO-{} shards of {} GPUs, {} replicas)", p.zero_stage,
                     s.shard_size(), p.dp / s.shard_size()));
  }
  if (p.zero_stage == 0 && p.cp > 1) {
    need(c.unsharded_with_context_parallel, "/parallel/zero_stage",
         fmt::format("ZeRO-0 with context parallelism (cp={})", p.cp));
  }
  if (p.zero_stage == 0 && p.dp > 1 && (p.tp > 1 || p.cp > 1 || p.pp > 1 || p.ep > 1)) {
    need(c.replicas_with_model_parallel, "/parallel/zero_stage",
         fmt::format("{} unsharded replicas (ZeRO-0) beside tensor, context, pipeline or expert "
                     "parallelism",
                     p.dp));
  }

  // Tensor, sequence, context, expert parallelism.
  if (p.tp > 1) {
    need(c.tensor_parallel, "/parallel/tp", fmt::format("tensor parallelism (tp={})", p.tp));
    need(c.sharding_with_tensor_parallel[static_cast<std::size_t>(p.zero_stage)],
         "/parallel/zero_stage",
         fmt::format("ZeRO-{} with tensor parallelism (tp={})", p.zero_stage, p.tp));
    if (p.sequence_parallel) {
      need(c.sequence_parallel, "/parallel/sequence_parallel", "sequence parallelism");
    } else {
      need(c.tensor_parallel_without_sp, "/parallel/sequence_parallel",
           "tensor parallelism without sequence parallelism");
    }
  }
  if (p.cp > 1) {
    need(c.context_parallel[static_cast<std::size_t>(p.cp_comm)],
         p.cp_comm == CpComm::p2p ? "/parallel/cp" : "/parallel/cp_comm",
         fmt::format("context parallelism (cp={}, cp_comm {})", p.cp, to_string(p.cp_comm)));
  }
  if (p.ep > 1) {
    need(c.expert_parallel, "/parallel/ep", fmt::format("expert parallelism (ep={})", p.ep));
  }
  if (p.ep * p.etp > 1) {
    const Count shard = p.zero_stage > 0 ? s.shard_size() : 1;
    if ((p.tp * p.cp * shard) % (p.ep * p.etp) != 0) {
      need(c.expert_parallel_beyond_shard, "/parallel/ep",
           fmt::format("ep*etp = {}*{} beyond the ZeRO shard group's tp*cp*shard = {}*{}*{} ranks",
                       p.ep, p.etp, p.tp, p.cp, shard));
    }
  }
  if (p.etp > 1) {
    need(p.etp == p.tp ? c.expert_tensor_parallel_equal_tp : c.expert_tensor_parallel_other,
         "/parallel/etp", fmt::format("expert tensor parallelism etp={} (tp={})", p.etp, p.tp));
  }

  // Memory levers.
  need(c.recompute[static_cast<std::size_t>(p.recompute)], "/parallel/recompute",
       fmt::format("recompute {}", to_string(p.recompute)));
  need(c.offload_optimizer[static_cast<std::size_t>(p.offload_optimizer)],
       "/parallel/offload_optimizer",
       fmt::format("optimizer offload to {}", to_string(p.offload_optimizer)));
  need(c.offload_params[static_cast<std::size_t>(p.offload_params)], "/parallel/offload_params",
       fmt::format("parameter offload to {}", to_string(p.offload_params)));
  if (p.offload_optimizer != Offload::none) {
    need(c.offload_with_zero[static_cast<std::size_t>(p.zero_stage)], "/parallel/offload_optimizer",
         fmt::format("optimizer offload with ZeRO-{}", p.zero_stage));
    if (p.offload_params == Offload::none) {
      need(c.offload_optimizer_alone, "/parallel/offload_params",
           "optimizer offload with the parameters on the GPU");
    }
  }

  // Overlaps the scenario assumes.
  if (a.tp_comm_overlap && p.tp > 1) {
    need(c.tp_comm_overlap, "/assumptions/tp_comm_overlap", "TP communication overlap");
    if (!p.sequence_parallel) {
      need(c.tp_comm_overlap_without_sp, "/assumptions/tp_comm_overlap",
           "TP communication overlap without sequence parallelism");
    }
  }
  if (a.overlap_grad_reduce && p.dp * p.cp > 1) {
    need(c.overlap_grad_reduce, "/assumptions/overlap_grad_reduce", "gradient-reduction overlap");
  }
  if (a.overlap_param_gather_after_step && p.zero_stage >= 1 && p.zero_stage <= 2) {
    need(c.overlap_param_gather_after_step, "/assumptions/overlap_param_gather_after_step",
         "the parameter all-gather behind the next forward");
    if (p.schedule != Schedule::interleaved_1f1b) {
      need(c.overlap_param_gather_after_step_flat, "/assumptions/overlap_param_gather_after_step",
           fmt::format("the parameter all-gather behind the next forward with schedule {}",
                       to_string(p.schedule)));
    }
  }
  if (a.overlap_p2p && p.pp > 1) {
    need(p.schedule == Schedule::interleaved_1f1b ? c.overlap_p2p_interleaved : c.overlap_p2p,
         "/assumptions/overlap_p2p",
         fmt::format("pipeline send/receive overlap with schedule {}", to_string(p.schedule)));
  }
  return out;
}

}  // namespace distplan
