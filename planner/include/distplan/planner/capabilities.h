// What each training framework runs (docs/frameworks.md): one typed table with the source of
// every row (a flag, a file, a version), read by every engine. validate_scenario() refuses a
// layout the scenario's framework cannot run at the field it cannot run; the search enumerates
// only what the framework runs; the exports write exactly the planned layout in its terms.
// `generic` runs everything distplan models. Memory conventions are FrameworkProfile's
// (framework.h); this table says what runs, and records the overlaps and kernels each
// framework really has for the time model.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "distplan/planner/spec.h"

namespace distplan {

/// One row: whether the framework runs it, and where that is written.
struct Support {
  bool runs = false;
  std::string_view source;
};

/// How the framework places the layers of a pipeline whose stages do not all hold the same
/// number (docs/frameworks.md, "Pipeline splits"). The planner's split itself is
/// stage_layer_counts() (layout.h); this says which splits the framework can be told.
enum class SplitSupport {
  /// Any per-stage list: Megatron-LM --pipeline-model-parallel-layout, torchtitan
  /// module_fqns_per_model_part.
  any,
  /// Own counts for the first and the last stage, the middle stages equal: Megatron-LM
  /// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers.
  first_last,
  /// Only what the framework's partitioner computes: DeepSpeed PipelineModule with
  /// partition_method "type:<layer class>" (equal stages) or "type:<layer class>|<embedding
  /// class>" (the embedding and the tied head weighed as layers: when they and the layers fill
  /// the stages equally, the first and last stage one layer fewer, as BLOOM-176B ran;
  /// runtime/utils.py partition_balanced).
  even_only,
};

inline constexpr std::size_t kScheduleCount = static_cast<std::size_t>(Schedule::dualpipe) + 1;

/// Everything one framework runs, by the scenario fields it governs.
struct FrameworkCapabilities {
  Framework framework = Framework::generic;
  std::string_view code;  // the code the rows are read from ("Megatron-LM core_v0.15.3")

  // --- Pipeline --------------------------------------------------------------------------
  std::array<Support, kScheduleCount> schedule;   // by Schedule, with pp > 1
  Support pipeline_with_tensor_parallel;          // pp > 1 and tp > 1 together
  std::array<Support, 4> sharding_with_pipeline;  // ZeRO stage s with pp > 1
  SplitSupport split = SplitSupport::any;         // uneven pipeline splits
  std::string_view split_source;

  // --- Data parallel and sharding --------------------------------------------------------
  std::array<Support, 4> zero_stage;    // by stage
  std::array<Support, 4> hybrid_shard;  // fsdp_shard_size < dp, by stage
  // ZeRO-0 replicas (dp > 1) beside tensor, context, pipeline or expert parallelism.
  Support replicas_with_model_parallel;
  Support unsharded_with_context_parallel;  // ZeRO-0 with cp > 1

  // --- Tensor, sequence, context and expert parallelism ----------------------------------
  Support tensor_parallel;                               // tp > 1
  std::array<Support, 4> sharding_with_tensor_parallel;  // ZeRO stage s with tp > 1
  Support sequence_parallel;                             // sequence_parallel with tp > 1
  Support tensor_parallel_without_sp;                    // tp > 1 with sequence_parallel off
  std::array<Support, 3> context_parallel;               // cp > 1, by CpComm
  Support expert_parallel;                               // ep > 1
  Support expert_tensor_parallel_equal_tp;               // etp > 1, etp = tp
  Support expert_tensor_parallel_other;                  // etp > 1, etp != tp
  // ep·etp not dividing the ZeRO shard group's tp·cp·shard ranks (only the whole tp·cp·dp).
  Support expert_parallel_beyond_shard;

  // --- Precision -------------------------------------------------------------------------
  std::array<Support, 3> precision;   // by DType (fp32, fp16, bf16)
  Support fp32_gradients_with_half;   // grad_accumulation_dtype fp32, bf16/fp16 compute
  Support half_gradients;             // gradients in the bf16/fp16 compute dtype
  std::array<Support, 5> fp8_recipe;  // by Fp8Recipe (none runs everywhere)

  // --- Memory levers ---------------------------------------------------------------------
  std::array<Support, 4> recompute;          // by Recompute
  std::array<Support, 3> offload_optimizer;  // by Offload
  std::array<Support, 3> offload_params;     // by Offload
  std::array<Support, 4> offload_with_zero;  // optimizer offload with ZeRO stage s
  Support offload_optimizer_alone;           // the optimizer offloaded, parameters on the GPU

  // --- Overlaps the scenario may assume (assumptions.*) ----------------------------------
  Support tp_comm_overlap;                       // TP collectives overlap the GEMMs
  Support tp_comm_overlap_without_sp;            // ... with sequence parallelism off
  Support overlap_grad_reduce;                   // DP gradient reduction overlaps the backward
  Support overlap_param_gather;                  // ZeRO parameter gathers overlap compute
  Support overlap_param_gather_after_step;       // ZeRO-1/2 gather behind the next forward
  Support overlap_param_gather_after_step_flat;  // ... with a schedule other than interleaved
  Support overlap_p2p;                           // pipeline sends overlap compute (flat schedules)
  Support overlap_p2p_interleaved;               // ... in the interleaved schedule
  Support interleaved_pp2_without_p2p_overlap;   // interleaved at pp = 2, sends not overlapped
  Support fine_tuning;  // training.peft: adapters, a frozen or quantized base (docs/peft.md)

  // --- Facts for the time model (recorded, not refused) ----------------------------------
  Support p2p_overlap_default;  // pipeline sends overlapped by default (its own default)
  Support ep_dispatch_overlap;  // MoE all-to-all overlapped with another micro-batch
  Support grouped_gemm;         // one grouped GEMM for a rank's experts
  Support fused_kernels;        // fused norms, rotary, cross-entropy, attention (TE)
  Support torch_compile;        // torch.compile of the model
};

/// The table row of a framework (sources beside each value in capabilities.cpp).
[[nodiscard]] const FrameworkCapabilities& capabilities(Framework f) noexcept;

/// A field of the scenario the framework cannot run: its JSON path and a message naming the
/// framework, what it lacks and the source.
struct FrameworkRefusal {
  std::string path;
  std::string message;
};

/// The refusal of one row that does not run: `path`, and a message naming the framework, `what`
/// it cannot run, the row's source and what to do.
[[nodiscard]] FrameworkRefusal refusal(const FrameworkCapabilities& c, const Support& row,
                                       std::string_view path, std::string_view what);

/// The first field of `s` that `s.training.framework` cannot run, or nothing.
[[nodiscard]] std::optional<FrameworkRefusal> framework_refusal(const Scenario& s);

/// The pipeline split of `s` (stage_layer_counts) in the framework's own terms: whether
/// `rule` can express it.
[[nodiscard]] bool split_expressible(const Scenario& s, SplitSupport rule);

/// Whether the split of `s` is not even but the one a partitioner gives when the embedding and
/// the LM head each weigh as a layer: (L + 2) / pp per stage, the first and last one layer fewer.
[[nodiscard]] bool split_weighs_embedding_and_head(const Scenario& s);

}  // namespace distplan
