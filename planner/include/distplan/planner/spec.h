// Scenario value types: the model, the cluster, the training recipe and the parallel layout.
// Field names mirror the JSON contract (shared API.md); JSON lives in scenario_json.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distplan/planner/framework.h"
#include "distplan/planner/units.h"

namespace distplan {

/// The MLP: GeLU (two matrices), or gated with a third: SwiGLU (silu, Shazeer 2020; Llama) or
/// GeGLU (gelu, Shazeer 2020; Gemma's gelu_pytorch_tanh). Both gated kinds have the same shapes.
enum class Mlp { gelu, swiglu, geglu };
[[nodiscard]] constexpr bool gated(Mlp v) noexcept {
  return v != Mlp::gelu;
}
enum class Norm { layernorm, rmsnorm };
// ALiBi (Press et al. 2022): a per-head linear bias added to the attention scores; no parameters,
// nothing saved for the backward, its cost inside the softmax (or the flash kernel).
enum class PositionEmbedding { learned, rotary, alibi };
enum class DType { fp32, fp16, bf16 };
enum class Optimizer { adamw, adam, sgd };
enum class Attention { flash, standard };
/// selective: Megatron-LM's (the s x s attention tensors); selective_op: torchtitan's per-op
/// selective activation checkpointing (matmul and attention outputs saved, every second matmul
/// recomputed; docs/memory.md, "Per-op selective checkpointing").
enum class Recompute { none, selective, full, selective_op };
enum class Router { softmax, sigmoid };
/// Where ZeRO keeps a model state: on the GPU, in host memory, or on the node's NVMe (ZeRO-Offload,
/// Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021; docs/memory.md, "Offload").
enum class Offload { none, cpu, nvme };
/// How context-parallel ranks exchange keys and values (docs/communication.md, "Context
/// parallel"; Megatron-Core --cp-comm-type): p2p = ring attention with 2·cp load-balanced causal
/// chunks (Transformer Engine), all_gather = KV all-gather (Llama 3), a2a = all-to-all over heads
/// (DeepSpeed-Ulysses).
enum class CpComm { p2p, all_gather, a2a };
/// FP8 training (`training.precision: "fp8"`; docs/memory.md and docs/time.md, "FP8"): the
/// linear layers' GEMMs in fp8 with Transformer Engine's scaling recipes: delayed (per-tensor
/// scales from an amax history), current (per-tensor, this tensor's amax), blockwise (1x128
/// activation tiles and 128x128 weight blocks, DeepSeek-V3), mxfp8 (1x32 blocks with E8M0
/// scales, Blackwell). Everything else runs in bf16.
enum class Fp8Recipe { none, delayed, current, blockwise, mxfp8 };
/// How the element-wise ops around the GEMMs run (docs/time.md, "Kernel fusion"): fused kernels
/// (Transformer Engine and Megatron-LM's fused norm, rotary, bias-activation, cross-entropy),
/// torch.compile's generated kernels (one fused kernel per chain of point-wise ops), or eager
/// PyTorch modules op by op, with their fp32 intermediates (torchtitan without compile).
enum class Kernels { fused, compiled, eager };
enum class Schedule {
  gpipe,
  one_f_one_b,
  interleaved_1f1b,
  zb_h1,
  zb_h2,
  zb_v,
  v_half,
  v_min,
  dualpipe_v,
  zb_auto,
  dualpipe
};
/// V-shape schedules (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): two
/// chunks per stage, virtual stages s and 2p - 1 - s on stage s (down, then up). They imply
/// virtual_stages = 2. DualPipeV (DeepSeek-AI, deepseek-ai/DualPipe dualpipev.py) is one of them.
[[nodiscard]] constexpr bool v_shape(Schedule s) noexcept {
  return s == Schedule::zb_v || s == Schedule::v_half || s == Schedule::v_min ||
         s == Schedule::dualpipe_v;
}
/// DualPipe (DeepSeek-AI, deepseek-ai/DualPipe dualpipe/dualpipe.py): bidirectional, stage s
/// holds model stage s (chunk 0, forward direction) and model stage p - 1 - s (chunk 1, reverse
/// direction), a copy of each; half the micro-batches enter at stage 0, half at stage p - 1.
[[nodiscard]] constexpr bool bidirectional(Schedule s) noexcept {
  return s == Schedule::dualpipe;
}
/// Schedules with exactly two chunks per stage (virtual_stages = 2): the V shapes and DualPipe.
[[nodiscard]] constexpr bool two_chunks(Schedule s) noexcept {
  return v_shape(s) || bidirectional(s);
}

[[nodiscard]] std::string_view to_string(Mlp v) noexcept;
[[nodiscard]] std::string_view to_string(Norm v) noexcept;
[[nodiscard]] std::string_view to_string(PositionEmbedding v) noexcept;
[[nodiscard]] std::string_view to_string(DType v) noexcept;
[[nodiscard]] std::string_view to_string(Optimizer v) noexcept;
[[nodiscard]] std::string_view to_string(Attention v) noexcept;
[[nodiscard]] std::string_view to_string(Recompute v) noexcept;
[[nodiscard]] std::string_view to_string(Schedule v) noexcept;
[[nodiscard]] std::string_view to_string(Router v) noexcept;
[[nodiscard]] std::string_view to_string(Offload v) noexcept;
[[nodiscard]] std::string_view to_string(CpComm v) noexcept;
[[nodiscard]] std::string_view to_string(Fp8Recipe v) noexcept;
[[nodiscard]] std::string_view to_string(Kernels v) noexcept;
[[nodiscard]] constexpr Bytes bytes_of(DType d) noexcept {
  return d == DType::fp32 ? 4 : 2;
}

/// Mixture-of-Experts feed-forward layers (docs/moe.md). num_experts = 0: a dense model.
/// Layer i (from 0) is a MoE layer when it is listed in `layers`, or, with no list, when
/// i >= first_dense_layers and (i - first_dense_layers) % layer_frequency == 0; the other layers
/// keep the dense MLP of ffn_hidden_size. Experts use the model's `mlp` kind (SwiGLU: three
/// matrices).
struct MoeSpec {
  Count num_experts = 0;                    // routed experts per MoE layer
  Count top_k = 0;                          // routed experts per token
  Count expert_ffn_hidden_size = 0;         // one routed expert's FFN width
  Count num_shared_experts = 0;             // always-active experts (DeepSeekMoE, Qwen2-MoE)
  Count shared_expert_ffn_hidden_size = 0;  // one shared expert's FFN width
  bool shared_expert_gate = false;  // Qwen2-MoE: a sigmoid gate (h -> 1) on the shared output
  Count first_dense_layers = 0;     // leading dense layers (HF first_k_dense_replace)
  Count layer_frequency = 1;        // every k-th layer after them is a MoE layer
  // Explicit MoE layers (0-based, increasing; Megatron-LM --moe-layer-freq as a list, Qwen's
  // mlp_only_layers); empty: the rule above. Indices >= num_layers place the MTP modules' layers.
  std::vector<Count> layers;
  Router router = Router::softmax;  // score function of the router (h -> num_experts)
  bool router_bias = false;         // DeepSeek-V3's per-expert bias for top-k selection
  // Tokens an expert takes, as a multiple of its even share; nullopt: dropless.
  std::optional<double> capacity_factor;
  // The load-balancing loss's coefficient (Fedus et al. 2022, eq. 4): part of the training
  // objective, not of memory or time; the exports pass it on (Megatron-LM --moe-aux-loss-coeff,
  // whose default 0 would drop the loss). Presets and Hugging Face configs give theirs
  // (router_aux_loss_coef, DeepSeek's aux_loss_alpha); 0: none.
  double aux_loss_coeff = 0.0;
  [[nodiscard]] bool enabled() const noexcept { return num_experts > 0; }
  bool operator==(const MoeSpec&) const = default;
};

/// DeepSeek's multi-head latent attention (DeepSeek-V2 paper, sec. 2.1). kv_lora_rank = 0: off.
struct MlaSpec {
  Count q_lora_rank = 0;  // 0: queries projected directly (JSON null)
  Count kv_lora_rank = 0;
  Count qk_nope_head_dim = 0;
  Count qk_rope_head_dim = 0;
  Count v_head_dim = 0;
  [[nodiscard]] bool enabled() const noexcept { return kv_lora_rank > 0; }
  bool operator==(const MlaSpec&) const = default;
};

/// Attention restricted to nearby keys (docs/layer_ops.md, "Attention variants"): sliding, each
/// query sees the last `size` tokens, itself included (Mistral-7B-v0.1 4096; Gemma 2 and 3;
/// gpt-oss 128; transformers sliding_window), or chunked, each query sees the earlier tokens of
/// its own chunk of `size` (Llama 4's attention_chunk_size 8192). Layer i is windowed when it is
/// listed in `layers`, or, with no list, unless full_every > 0 and (i + 1) % full_every == 0
/// (Gemma 2 and gpt-oss alternate: 2; Gemma 3: 6; Llama 4: 4).
enum class WindowKind { sliding, chunked };
struct AttentionWindowSpec {
  Count size = 0;  // 0: every layer attends to all earlier tokens
  WindowKind kind = WindowKind::sliding;
  Count full_every = 0;
  std::vector<Count> layers;  // explicit windowed layers (0-based, increasing)
  [[nodiscard]] bool enabled() const noexcept { return size > 0; }
  bool operator==(const AttentionWindowSpec&) const = default;
};

/// A decoder-only transformer. Shapes: h = hidden_size, a = num_attention_heads,
/// h/a = head dim, kv = num_kv_heads (GQA when kv < a), f = ffn_hidden_size, V = vocab_size.
struct ModelSpec {
  std::string name;  // preset name, or "custom"
  Count num_layers = 0;
  Count hidden_size = 0;
  Count num_attention_heads = 0;
  Count num_kv_heads = 0;
  Count ffn_hidden_size = 0;
  Count vocab_size = 0;
  Mlp mlp = Mlp::gelu;
  Norm norm = Norm::layernorm;
  PositionEmbedding position_embedding = PositionEmbedding::learned;
  Count max_position_embeddings = 0;  // used when position_embedding is learned
  // Rotary embedding (Su et al. 2021, eq. 15): the base of the frequencies, and the factor of
  // Llama-3-style frequency scaling (0 = none). Neither changes memory or time; exports pass them
  // on (Megatron-LM --rotary-base, --use-rope-scaling --rope-scaling-factor).
  double rope_theta = 10000.0;
  double rope_scaling_factor = 0.0;
  bool tied_embeddings = false;
  bool bias = false;      // biases on the linear layers
  bool qkv_bias = false;  // biases on the q, k and v projections only (Qwen2); implied by bias
  // Attention head width when it is not hidden/heads (Qwen3: 128 with h = 2048, 32 heads);
  // 0: hidden_size / num_attention_heads.
  Count explicit_head_dim = 0;
  bool qk_norm = false;  // RMSNorm over each query and key head (Qwen3; weights of head_dim)
  // A norm of the word embedding's output before the first layer (BLOOM's
  // word_embeddings_layernorm; Megatron-DeepSpeed --embed-layernorm), of the model's norm kind.
  bool embedding_norm = false;
  MoeSpec moe;
  MlaSpec mla;
  Count mtp_layers = 0;  // multi-token prediction modules (DeepSeek-V3), counted apart
  AttentionWindowSpec attention_window;
  // A learned logit per head that joins each softmax (gpt-oss's `sinks`; attention sinks, Xiao
  // et al. 2024): num_attention_heads parameters a layer, nothing saved beyond the log-sum-exp.
  bool attention_sinks = false;
  // tanh softcapping of the attention scores and of the final logits, cap·tanh(x/cap) (Gemma 2:
  // 50 and 30); 0: none.
  double attention_softcap = 0;
  double final_logit_softcap = 0;
  // Norms on the outputs of attention and of the MLP too, before each residual add: four norms
  // a layer (Gemma 2 and 3: post_attention_layernorm, post_feedforward_layernorm).
  bool sandwich_norm = false;
  bool operator==(const ModelSpec&) const = default;

  [[nodiscard]] Count head_dim() const noexcept {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  [[nodiscard]] Count q_hidden() const noexcept { return head_dim() * num_attention_heads; }
  /// Parameters of one norm over the hidden size: LayerNorm's weight and bias, RMSNorm's weight.
  [[nodiscard]] Count norm_parameters() const noexcept {
    return norm == Norm::layernorm ? 2 * hidden_size : hidden_size;
  }
  /// The embedding's own parameters besides the word table: learned positions, embedding norm.
  [[nodiscard]] Count embedding_extra_parameters() const noexcept {
    return (position_embedding == PositionEmbedding::learned ? max_position_embeddings * hidden_size
                                                             : 0) +
           (embedding_norm ? norm_parameters() : 0);
  }
  [[nodiscard]] Count kv_hidden() const noexcept { return head_dim() * num_kv_heads; }

  // The attention core's shapes. Grouped-query attention: queries and keys of head_dim over a
  // and kv heads, values alike. MLA (DeepSeek-V2 eqs. 12-18): after the up-projections every one
  // of the a heads has its own key and value (kv = a), queries and keys of
  // qk_nope_head_dim + qk_rope_head_dim, values (and so the output) of v_head_dim.
  [[nodiscard]] Count attention_qk_head_dim() const noexcept {
    return mla.enabled() ? mla.qk_nope_head_dim + mla.qk_rope_head_dim : head_dim();
  }
  [[nodiscard]] Count attention_v_head_dim() const noexcept {
    return mla.enabled() ? mla.v_head_dim : head_dim();
  }
  [[nodiscard]] Count attention_kv_heads() const noexcept {
    return mla.enabled() ? num_attention_heads : num_kv_heads;
  }
  /// Widths per token, all heads: queries, keys, values, and the core's output (a · d_v).
  [[nodiscard]] Count attention_q_width() const noexcept {
    return num_attention_heads * attention_qk_head_dim();
  }
  [[nodiscard]] Count attention_k_width() const noexcept {
    return attention_kv_heads() * attention_qk_head_dim();
  }
  [[nodiscard]] Count attention_v_width() const noexcept {
    return attention_kv_heads() * attention_v_head_dim();
  }
  [[nodiscard]] Count attention_out_width() const noexcept {
    return num_attention_heads * attention_v_head_dim();
  }
};

/// Dense (non-sparse) peak throughput of one GPU per compute dtype.
struct PeakFlops {
  FlopsPerSecond fp32 = 0;  // plain FP32 (non-tensor-core) unless the preset says otherwise
  FlopsPerSecond tf32 = 0;
  FlopsPerSecond fp16 = 0;
  FlopsPerSecond bf16 = 0;
  FlopsPerSecond fp8 = 0;    // dense FP8 tensor-core peak (0: no FP8 tensor cores)
  FlopsPerSecond mxfp8 = 0;  // dense MXFP8 (block-scaled) peak (0: not supported)
  bool operator==(const PeakFlops&) const = default;
};

struct GpuSpec {
  std::string name;
  Bytes memory_bytes = 0;
  PeakFlops peak_flops;
  BytesPerSecond memory_bandwidth = 0;      // HBM, bytes/s
  BytesPerSecond intra_node_bandwidth = 0;  // per GPU, one direction (NVLink / xGMI)
  BytesPerSecond inter_node_bandwidth = 0;  // per GPU, one direction (NIC)
  Count gpus_per_node = 8;                  // the usual node of this GPU (cluster default)
  // Op-level time model (docs/time.md, "Op costs"); each preset names its source.
  Count sm_count = 0;  // streaming multiprocessors: GEMM wave quantisation (0: not modelled)
  double gemm_efficiency = 0.75;   // sustained / dense peak of a large, well-shaped GEMM
  double gemm_k_overhead = 64;     // K-equivalent of a GEMM tile's prologue and epilogue
  double memory_efficiency = 0.7;  // achieved / nominal HBM bandwidth of elementwise kernels
  double flash_forward_efficiency = 0.62;   // flash attention forward, achieved / dense peak
  double flash_backward_efficiency = 0.52;  // flash attention backward, achieved / dense peak
  BytesPerSecond pcie_bandwidth = 0;        // host link per GPU, one direction (0: offload refused)
  // FP8 GEMMs' ceiling, achieved / dense FP8 peak (0: gemm_efficiency); per recipe on Blackwell.
  double fp8_gemm_efficiency = 0;
  double mxfp8_gemm_efficiency = 0;  // 0: fp8_gemm_efficiency
  // FlashAttention-2 as PyTorch's scaled_dot_product_attention runs it (eager and compiled
  // kernels), achieved / dense peak; 0: the flash_* figures (the fused stacks' kernel).
  double sdpa_forward_efficiency = 0;
  double sdpa_backward_efficiency = 0;
  // Board power the efficiencies above are stated at (0: no power model), and the limit the GPU
  // runs under (0: tdp_watts). Compute-bound kernels slow down below it (docs/time.md, "Power").
  double tdp_watts = 0;
  double power_limit_watts = 0;
  Count nvlink_domain_gpus = 0;  // GPUs on one NVLink fabric (0: the node); GB200 NVL72: 72
  bool operator==(const GpuSpec&) const = default;
};

struct ClusterSpec {
  GpuSpec gpu;
  Count num_gpus = 0;
  Count gpus_per_node = 0;
  BytesPerSecond intra_node_bandwidth = 0;  // defaults to the GPU preset's
  BytesPerSecond inter_node_bandwidth = 0;  // defaults to the GPU preset's
  Seconds intra_node_latency = 0;
  Seconds inter_node_latency = 0;
  Bytes runtime_reserve_bytes = 0;  // CUDA context, NCCL, allocator reserve per GPU
  // runtime_reserve_bytes below zero: computed from training.framework's profile (docs/memory.md,
  // "Runtime and allocator"); the reader sets it when a framework is named and no reserve is given.
  static constexpr Bytes kRuntimeFromProfile = -1;
  Count nvlink_domain_size = 0;       // GPUs one NVLink fabric joins (set by the reader: >= node)
  double power_limit_watts = 0;       // the GPUs' power limit (set by the reader: the GPU's)
  Bytes host_memory_bytes = 0;        // host memory per node (0: not given, not checked)
  BytesPerSecond nvme_bandwidth = 0;  // the node's NVMe, one direction (0: nvme offload refused)
  bool operator==(const ClusterSpec&) const = default;
};

/// Fine-tuning (`training.peft`; docs/peft.md): LoRA adapters (Hu et al. 2021) on chosen linear
/// modules of a frozen base, QLoRA (Dettmers et al. 2023: LoRA on a bitsandbytes 4-bit base), or
/// full fine-tuning with frozen parts. `none`: pre-training, every parameter trained.
enum class PeftMethod { none, full, lora, qlora };
/// How the frozen base's linear weights are stored: a floating dtype, bitsandbytes' blockwise
/// 4-bit NF4 / FP4 (Params4bit) or LLM.int8 (Int8Params: int8 rows with an fp32 scale each).
enum class BaseStorage { fp32, fp16, bf16, nf4, fp4, int8 };
/// The Hugging Face modelling code whose module names `target_modules` uses: llama (Llama,
/// Mistral, Qwen2, Qwen3: q_proj ... down_proj), gpt2 (c_attn, c_proj, c_fc), gpt_neox (GPT-NeoX,
/// BLOOM: query_key_value, dense, dense_h_to_4h, dense_4h_to_h).
enum class PeftNaming { llama, gpt2, gpt_neox };
/// The linear modules of a layer an adapter can sit on, one bit each (peft.h maps the names).
/// qkv: one adapter on a fused q/k/v projection (GPT-2 c_attn, NeoX query_key_value); up / down:
/// the MLP's first and second linear (SwiGLU: gate_proj and up_proj are two).
enum PeftTarget : unsigned {
  peft_q = 1u << 0,
  peft_k = 1u << 1,
  peft_v = 1u << 2,
  peft_qkv = 1u << 3,
  peft_o = 1u << 4,
  peft_gate = 1u << 5,
  peft_up = 1u << 6,
  peft_down = 1u << 7,
};
struct PeftSpec {
  PeftMethod method = PeftMethod::none;
  Count rank = 0;           // LoRA r
  double alpha = 0;         // LoRA alpha (scale alpha / r); no memory or time effect
  double dropout = 0;       // lora_dropout: each adapter's own dropout of its input
  unsigned targets = 0;     // PeftTarget bits
  bool all_linear = false;  // target_modules "all-linear" (exported as such)
  PeftNaming naming = PeftNaming::llama;
  BaseStorage base_storage = BaseStorage::bf16;  // the frozen linear weights
  bool double_quant = false;       // bnb_4bit_use_double_quant: 8-bit absmax, fp32 per 256 blocks
  DType base_dtype = DType::bf16;  // the base's other parameters (embeddings, head, norms, biases)
  DType adapter_dtype = DType::fp32;  // the adapters' parameters (PEFT autocast_adapter_dtype)
  Count frozen_layers = 0;            // the first n layers: no adapters (LoRA) or frozen (full)
  bool freeze_embeddings = false;  // full: the word (and position) embedding frozen; LoRA: always
  bool paged_optimizer = false;    // bitsandbytes paged AdamW: states in unified memory
  // The embedding output requires grad (PEFT prepare_model_for_kbit_training's
  // enable_input_require_grads under reentrant checkpointing): frozen layers save for backward.
  bool input_requires_grad = false;
  [[nodiscard]] bool enabled() const noexcept { return method != PeftMethod::none; }
  [[nodiscard]] bool adapters() const noexcept {
    return method == PeftMethod::lora || method == PeftMethod::qlora;
  }
  [[nodiscard]] bool quantized() const noexcept {
    return base_storage == BaseStorage::nf4 || base_storage == BaseStorage::fp4 ||
           base_storage == BaseStorage::int8;
  }
  bool operator==(const PeftSpec&) const = default;
};

struct TrainingSpec {
  Count seq_length = 0;
  Count global_batch_size = 0;  // sequences per optimizer step
  Count micro_batch_size = 1;
  DType precision = DType::bf16;
  Optimizer optimizer = Optimizer::adamw;
  DType grad_accumulation_dtype = DType::bf16;  // defaults to the compute dtype
  Attention attention = Attention::flash;
  double dropout = 0.0;
  Framework framework = Framework::generic;  // memory conventions (framework.h)
  // FP8 GEMMs in the layers; `precision` is then bf16 (the dtype of everything else).
  Fp8Recipe fp8 = Fp8Recipe::none;
  // Optimizer states (master weights and moments) in fp32 or bf16 (Apex DistributedFusedAdam's
  // `dtype`, as NeMo runs it; docs/memory.md).
  DType optimizer_state_dtype = DType::fp32;
  Kernels kernels = Kernels::fused;  // the reader sets the framework's default
  bool cuda_graphs = false;          // whole-step CUDA graphs: no host launch gaps
  PeftSpec peft;                     // fine-tuning; method none: every parameter trained
  bool operator==(const TrainingSpec&) const = default;
};

/// How a pipeline's transformer layers are split over its virtual stages (pipeline_split.h;
/// docs/layout.md, "Pipeline splits"). Each rule is the framework's own code:
/// - even: as even as possible over the virtual stages, the remainder to the virtual stages
///   after the first in path order (the ends hold the embedding and the LM head).
/// - explicit_layers: `layers` gives every virtual stage's count (JSON layers_per_virtual_stage).
/// - megatron: Megatron-LM get_num_layers_to_build (megatron/core/transformer/
///   transformer_block.py): --decoder-first-pipeline-num-layers, --decoder-last-pipeline-
///   num-layers, --account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split.
/// - megatron_layout: Megatron-LM --pipeline-model-parallel-layout (PipelineParallelLayerLayout,
///   megatron/core/transformer/pipeline_parallel_layer_layout.py).
/// - torchtitan: torchtitan _generate_llm_fqn_per_model_part (torchtitan/distributed/
///   pipeline_parallel.py) with pipeline_parallel_first_stage_less_layers and
///   pipeline_parallel_last_stage_less_layers.
enum class SplitRule { even, explicit_layers, megatron, megatron_layout, torchtitan };
[[nodiscard]] std::string_view to_string(SplitRule v) noexcept;

struct PipelineSplitSpec {
  SplitRule rule = SplitRule::even;
  std::vector<Count> layers;  // explicit_layers: one count per virtual stage, in path order
  // megatron: the first and last pipeline stage's layers (all their chunks together), and the
  // embedding and the loss counted as one layer each of the first and last virtual stage.
  std::optional<Count> first_stage_layers;
  std::optional<Count> last_stage_layers;
  bool account_for_embedding = false;
  bool account_for_loss = false;
  std::string layout;  // megatron_layout: e.g. "Et*3|(tt|)*29,m|L"
  // torchtitan: layers the first (embedding) and last (norm, LM head) virtual stages hold fewer.
  Count first_stage_less_layers = 1;
  Count last_stage_less_layers = 1;
  bool operator==(const PipelineSplitSpec&) const = default;
};

struct ParallelSpec {
  Count tp = 1;
  Count pp = 1;
  Count dp = 1;
  int zero_stage = 0;
  Count fsdp_shard_size = 0;  // ZeRO shard group size; defaults to dp (hybrid when < dp)
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  Schedule schedule = Schedule::one_f_one_b;
  Count virtual_stages = 1;
  std::vector<Count> layers_per_stage;  // explicit split, one entry per GPU stage; empty: `split`
  PipelineSplitSpec split;              // layers per virtual stage (pipeline_split.h)
  Offload offload_optimizer = Offload::none;  // fp32 master weights, moments, fp32 gradients
  Offload offload_params = Offload::none;     // the compute-dtype parameter shard (ZeRO-3)
  /// zb_auto: saved activations each stage may hold, in micro-batches of that stage (the Zero
  /// Bubble paper's memory limit, Qi et al. 2023 Sec. 3.1: pp for ZB-1p, 2 pp for ZB-2p); 0 = pp.
  Count zb_memory_limit_microbatches = 0;
  [[nodiscard]] Count zb_memory_limit() const noexcept {
    return zb_memory_limit_microbatches > 0 ? zb_memory_limit_microbatches : pp;
  }
  // Context parallelism: the sequence split over cp ranks (rank order tp, cp, dp, pp as
  // Megatron-Core); the ZeRO / DP groups span dp·cp.
  Count cp = 1;
  CpComm cp_comm = CpComm::p2p;
  // Expert parallelism, Megatron-Core's MoE parallel folding (docs/layout.md): the tp·dp ranks of
  // a pipeline stage regrouped for the expert layers as etp · ep · edp.
  Count ep = 1;   // expert-parallel size: each MoE layer's routed experts split ep ways
  Count etp = 1;  // expert tensor-parallel size: each routed expert's FFN split etp ways
  bool operator==(const ParallelSpec&) const = default;
};

/// Named, overridable modelling assumptions (docs/assumptions.md gives each one's source).
struct Assumptions {
  // GEMM efficiency ceiling and HBM efficiency: 0 takes the GPU preset's gemm_efficiency /
  // memory_efficiency; a calibration sets them here.
  double compute_efficiency = 0;
  double memory_efficiency = 0;
  // FP8 GEMM ceiling, achieved / FP8 peak (0: the GPU preset's fp8 / mxfp8 figure); a
  // calibration sets it here.
  double fp8_compute_efficiency = 0;
  double communication_efficiency = 0.8;         // achieved / nominal bus bandwidth, large messages
  Bytes nccl_half_bandwidth_bytes = 4 << 20;     // message size reaching half the bus bandwidth
  Seconds kernel_launch_seconds = 3e-6;          // per kernel, on the stream between kernels
  double overlap_compute_slowdown = 0.1;         // compute slowdown while NCCL shares the SMs
  bool tp_comm_overlap = false;                  // TP collectives overlap the layer GEMMs
  bool overlap_p2p = false;                      // pipeline sends overlap compute
  bool p2p_scatter_gather = false;               // send 1/t of the activation per TP rank
  bool overlap_param_gather_after_step = false;  // ZeRO-1/2 gather hides behind the next forward
  bool tree_all_reduce = true;      // inter-node all-reduce latency as NCCL's tree when it is lower
  Count zero3_prefetch_layers = 1;  // gathered units kept live beyond the current one
  bool overlap_grad_reduce = true;  // DP gradient reduction overlaps the last backward
  bool overlap_param_gather = true;  // ZeRO-3 gathers overlap compute (prefetch)
  Count vocab_pad_multiple = 1;      // vocab padded to a multiple of this × tp
  // Dropless MoE: routed tokens on the busiest GPU over the even share (docs/moe.md, "Memory").
  double moe_load_imbalance = 1.0;
  // training.framework's memory profile; the reader fills it and applies the JSON's overrides.
  FrameworkProfile framework_profile;
  // Offload (docs/assumptions.md): host and NVMe figures DeepSpeed's offload depends on.
  double pcie_efficiency = 0.8;  // achieved / nominal PCIe bandwidth of pinned copies
  BytesPerSecond cpu_optimizer_bandwidth = 200e9;  // host memory bandwidth CPU Adam achieves, node
  Count nvme_optimizer_buffer_count = 4;           // DeepSpeed offload_optimizer.buffer_count
  Count nvme_sub_group_params = 1000000000;        // DeepSpeed zero_optimization.sub_group_size
  Count nvme_param_buffer_count = 5;               // DeepSpeed offload_param.buffer_count
  Count nvme_param_buffer_params = 100000000;      // DeepSpeed offload_param.buffer_size
  Count fp8_amax_history_len = 1024;  // delayed scaling's history (TE DelayedScaling default)
  // Clock of compute-bound kernels under a power limit: (limit / tdp)^exponent (dynamic power
  // ~ f V^2 with V ~ f in the DVFS range: 1/3; docs/time.md, "Power").
  double clock_power_exponent = 1.0 / 3.0;
  // MoE grouped GEMMs (many small per-expert GEMMs in one launch) against a dense GEMM of the
  // same tile and wave shape: achieved / dense ceiling (docs/time.md, "Mixture-of-Experts").
  double grouped_gemm_efficiency = 1.0;
  bool operator==(const Assumptions&) const = default;
};

struct Scenario {
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
  ParallelSpec parallel;
  Assumptions assumptions;
  bool operator==(const Scenario&) const = default;

  [[nodiscard]] Count num_microbatches() const noexcept {
    return training.global_batch_size / (training.micro_batch_size * parallel.dp);
  }
  /// Expert data-parallel size: the replicas of one expert shard within a stage
  /// (tp·cp·dp / ep·etp; Megatron-Core's expert_data_parallel_size = world / (pp·ep·etp)).
  [[nodiscard]] Count expert_data_parallel() const noexcept {
    return parallel.tp * parallel.cp * parallel.dp / (parallel.ep * parallel.etp);
  }
  [[nodiscard]] Count shard_size() const noexcept {
    return parallel.fsdp_shard_size > 0 ? parallel.fsdp_shard_size : parallel.dp;
  }
  /// The ZeRO shard group: the shard size times cp (Megatron-Core's distributed optimizer shards
  /// over the data-and-context-parallel group; torchtitan's FSDP over dp_shard·cp).
  [[nodiscard]] Count zero_shard() const noexcept { return shard_size() * parallel.cp; }
  /// Tokens of one sequence on one GPU: the context-parallel rank's share.
  [[nodiscard]] Count local_seq_length() const noexcept {
    return training.seq_length / parallel.cp;
  }
};

}  // namespace distplan
