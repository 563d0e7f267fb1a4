// Memory per GPU of one pipeline stage, term by term (docs/memory.md). Written once here and used
// by the planner's estimate() and by the search's lean path (search/src/fast_memory.cpp), so a
// new term reaches both. Inline: the lean path evaluates it for every layout of a search, and
// compiled into its loop it keeps bench/search_bench's speed. Everything is per GPU; parameter
// counts are per TP rank.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "distplan/planner/checked.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/moe_memory.h"
#include "distplan/planner/offload.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

/// The layout figures the memory terms depend on.
struct MemoryLayout {
  Count tp = 1;
  Count pp = 1;
  Count virtual_stages = 1;
  Count micro_batch_size = 1;
  Count num_microbatches = 1;  // per pipeline per step
  int zero_stage = 0;
  Count shard = 1;  // ZeRO shard group size S (fsdp_shard_size, default dp); 1 at ZeRO-0
  Count dp = 1;     // data-parallel size: the NCCL communicators a rank joins
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  Schedule schedule = Schedule::one_f_one_b;
  Offload offload_optimizer = Offload::none;
  Offload offload_params = Offload::none;
  Count zb_memory_limit = 0;  // zb_auto's per-stage limit in micro-batches (ParallelSpec)
  Count cp = 1;  // context parallel: each GPU holds seq_length / cp tokens of a sequence
  CpComm cp_comm = CpComm::p2p;
  Bytes fp8_layer_state = 0;  // fp8_layer_state_bytes() of one layer (fp8.h); 0 without fp8
  // A MoE model: fp8_layer_state is a MoE layer's with its experts (fp8_moe_layer_state_bytes),
  // this a dense-MLP layer's.
  Bytes fp8_dense_layer_state = 0;
  // Mixture-of-Experts (moe_memory.h, moe_layer.h): every layer is a MoE layer whose routed
  // experts, expert_params of them per GPU, are sharded by ZeRO over the edp group.
  Count ep = 1;
  Count etp = 1;
  Count edp = 1;
  Count expert_params = 0;  // routed_expert_params_per_gpu() of one layer; 0 for a dense model
};
[[nodiscard]] MemoryLayout memory_layout(const Scenario& s) noexcept;

namespace detail {

inline Count ceil_div(Count a, Count b) noexcept {
  return (a + b - 1) / b;
}

// The largest sum of `k` consecutive units in the order [first] mid x n [last], where first and
// last are present only when their flag is set: the ZeRO-3 units gathered at once in one pass.
inline Count max_window(bool has_first, Count first, Count n, Count mid, bool has_last, Count last,
                        Count k) noexcept {
  const Count total = (has_first ? 1 : 0) + n + (has_last ? 1 : 0);
  k = std::min(k, total);
  if (k <= 0) return 0;
  // A window holds the first unit, the last unit, or only middle units (all of one size).
  auto from_start = [&] {
    Count left = k, sum = 0;
    if (has_first) sum += first, --left;
    const Count mids = std::min(left, n);
    sum += mids * mid, left -= mids;
    if (left > 0 && has_last) sum += last;
    return sum;
  };
  auto to_end = [&] {
    Count left = k, sum = 0;
    if (has_last) sum += last, --left;
    const Count mids = std::min(left, n);
    sum += mids * mid, left -= mids;
    if (left > 0 && has_first) sum += first;
    return sum;
  };
  Count best = std::max(from_start(), to_end());
  if (n >= k) best = std::max(best, k * mid);
  return best;
}

}  // namespace detail

/// Context-parallel working buffers of one layer's attention on one GPU, for `tokens` local
/// tokens (Transformer Engine, transformer_engine/pytorch/attention/dot_product_attention/
/// context_parallel.py): p2p (AttnFuncWithCPAndKVP2P) double-buffers the KV chunk in flight and
/// the per-step outputs being merged in the forward, and KV plus dKV in the backward;
/// all_gather (AttnFuncWithCPAndKVAllGather) gathers the whole sequence's K and V, and in the
/// backward their gradients before the reduce-scatter; a2a (AttnFuncWithCPAndQKVOA2A) holds the
/// exchanged q, k, v and output, each the size of the local ones. The widths are the attention
/// core's (ModelSpec::attention_*: heads × head_dim, not hidden_size when head_dim is explicit;
/// MLA's d_qk queries and keys, d_v values and output).
[[nodiscard]] inline Bytes cp_attention_buffer_bytes(const ModelSpec& m, const MemoryLayout& l,
                                                     Count tokens, Bytes cb) noexcept {
  if (l.cp <= 1) return 0;
  const Bytes kv = tokens * (m.attention_k_width() + m.attention_v_width()) / l.tp * cb;
  const Bytes q = tokens * m.attention_q_width() / l.tp * cb;  // local q
  const Bytes o = tokens * m.attention_out_width() / l.tp * cb;
  switch (l.cp_comm) {
    case CpComm::p2p:
      return std::max(2 * kv + 2 * o, 4 * kv);
    case CpComm::all_gather:
      return 2 * l.cp * kv;
    case CpComm::a2a:
      return q + o + kv;
  }
  return 0;
}

/// What a layer saves for its backward under context parallelism beyond the layer table: with
/// cp_comm a2a, Transformer Engine >= 2.9's AttnFuncWithCPAndQKVOA2A saves the attention output
/// in the head layout it was computed in (before its all-to-all back), beside the sequence-layout
/// output the out projection keeps, so that the backward exchanges only dO
/// (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, since
/// TE v2.9, NVIDIA/TransformerEngine#2012; docs/memory.md, "Context parallel"). Full
/// recomputation rebuilds it with the layer (its working set).
[[nodiscard]] inline LayerActivation add_cp_activation(LayerActivation a, const ModelSpec& m,
                                                       Count cp, CpComm comm, Count tokens,
                                                       Count tp, Bytes cb,
                                                       Recompute recompute) noexcept {
  if (cp <= 1 || comm != CpComm::a2a) return a;
  const Bytes out = tokens * m.attention_out_width() / tp * cb;
  (recompute == Recompute::full ? a.working : a.kept) += out;
  return a;
}

/// Optimizer bytes per parameter, the ZeRO paper's K (Rajbhandari et al. 2020, sec. 3.1).
[[nodiscard]] inline Bytes optimizer_bytes_per_param(const TrainingSpec& t) noexcept {
  // Master weights (mixed precision only) plus Adam's m and v, or SGD's momentum, each in the
  // optimizer state dtype: fp32 by default; bf16 with Apex's DistributedFusedAdam(dtype=bf16),
  // whose master copy (store_params) and moments are all bf16 (NeMo's distributed_fused_adam
  // with `dtype: bf16`; apex/contrib/optimizers/distributed_fused_adam.py).
  const Bytes e = bytes_of(t.optimizer_state_dtype);
  const Bytes master = t.precision == DType::fp32 ? 0 : e;
  const Bytes states = (t.optimizer == Optimizer::sgd ? 1 : 2) * e;
  return master + states;
}

/// Parameters per TP rank of the units one stage holds (docs/memory.md, "Units"); a unit that the
/// stage does not hold has count 0. A MoE model's layers are of two kinds (docs/moe.md, "Layer
/// placement"): `layer` is then a MoE layer's dense part (its routed experts are units of their
/// own, MemoryLayout::expert_params) and `dense_layer` a layer with the dense MLP.
struct StageUnitParams {
  Count layer = 0, layers = 0;              // one layer's parameters, and the stage's count
  Count dense_layer = 0, dense_layers = 0;  // a MoE model's dense-MLP layers
  // The layers of each chunk, of both kinds (virtual_stages of them, pipeline_split.h); empty:
  // all_layers() / v each.
  std::span<const Count> chunk_layers;
  // Of those, a MoE model's dense-MLP layers, chunk by chunk; empty: dense_layers / v each.
  std::span<const Count> chunk_dense_layers;
  Count first_layer = 0;  // the stage's first layer (fine-tuning: frozen_layers); 0 under v > 1
  Count embedding = 0, embeddings = 0;  // stage 0
  Count head = 0, heads = 0;            // final norm and LM head, last stage
  [[nodiscard]] Count total() const noexcept {
    return layer * layers + dense_layer * dense_layers + embedding * embeddings + head * heads;
  }
  [[nodiscard]] Count all_layers() const noexcept { return layers + dense_layers; }
};
/// What the MTP modules (model.mtp_layers; DeepSeek-V3 report, sec. 2.2) add to the stage that
/// holds them, the LM head's (their transformer layers are layers of the chunk, layer_kinds()):
/// per module the norms of the hidden state and of the embedding, the column-parallel projection
/// 2h -> h (split t ways) and the final norm (Megatron-Core MultiTokenPredictionLayer: hnorm,
/// enorm, eh_proj, final_layernorm); and the word embedding, of which the MTP stage builds its
/// own copy when it does not hold the embedding (GPTModel: `pre_process or mtp_process`),
/// unless the LM head already is that copy (tied embeddings). Per TP rank.
[[nodiscard]] inline Count mtp_head_parameters(const ModelSpec& m, Count tp, Count padded_vocab,
                                               bool holds_embedding) noexcept {
  if (m.mtp_layers == 0) return 0;
  const Count h = m.hidden_size;
  Count n = m.mtp_layers * (3 * m.norm_parameters() + 2 * h * h / tp);
  if (!holds_embedding && !m.tied_embeddings) {
    n += padded_vocab * h / tp;
    if (m.position_embedding == PositionEmbedding::learned) n += m.max_position_embeddings * h;
  }
  return n;
}

/// `schedule` places the LM head (head_stage in layout.h: stage 0 under a V). `mix` is the
/// stage's stage_layer_mix() (layout.h); `dense_layer_params` the parameters per TP rank of a
/// MoE model's dense-MLP layer (unused for a dense model, whose every layer is `layer_params`).
/// The chunks' spans (chunk_layers, chunk_dense_layers) are the caller's to set.
[[nodiscard]] inline StageUnitParams stage_unit_params(const ModelSpec& m, Count tp, Count pp,
                                                       Schedule schedule, int stage,
                                                       const StageLayerMix& mix, Count padded_vocab,
                                                       Count layer_params,
                                                       Count dense_layer_params = 0) noexcept {
  const Count h = m.hidden_size;
  StageUnitParams u;
  u.layer = layer_params;
  if (m.moe.enabled()) {
    u.layers = mix.moe_layers;
    u.dense_layer = dense_layer_params;
    u.dense_layers = mix.layers - mix.moe_layers;
  } else {
    u.layers = mix.layers;
  }
  if (holds_embedding(schedule, pp, stage)) {
    // Vocab-parallel embedding (Shoeybi et al. 2019, sec. 3); positions and the embedding norm
    // whole on every TP rank.
    u.embedding = padded_vocab * h / tp + m.embedding_extra_parameters();
    u.embeddings = 1;
  }
  const Count head_st = head_stage(schedule, pp);
  if (holds_head(schedule, pp, stage)) {
    Count head = m.norm_parameters();  // final norm
    // Untied: the LM head's own weight. Tied across stages: Megatron-LM keeps a copy of the word
    // embedding on the last stage and all-reduces its gradient with the first; on the embedding's
    // own stage (pp = 1, or a V) the one matrix serves both.
    if (!m.tied_embeddings || head_st != 0) head += padded_vocab * h / tp;
    head += mtp_head_parameters(m, tp, padded_vocab, holds_embedding(schedule, pp, stage));
    u.head = head;
    u.heads = 1;
  }
  return u;
}

/// Whether a stage's chunks differ: in layers (an uneven split, pipeline_split.h) or in their
/// layer kinds (a MoE model's dense-MLP layers in some chunks only).
[[nodiscard]] inline bool uneven_chunks(const StageUnitParams& u) noexcept {
  auto differ = [](std::span<const Count> x) {
    return std::adjacent_find(x.begin(), x.end(), std::not_equal_to<>()) != x.end();
  };
  return differ(u.chunk_layers) || differ(u.chunk_dense_layers);
}
/// Layers of chunk `c` of the stage, of both kinds.
[[nodiscard]] inline Count chunk_layer_count(const StageUnitParams& u, Count v, Count c) noexcept {
  return u.chunk_layers.empty() ? u.all_layers() / v : u.chunk_layers[static_cast<std::size_t>(c)];
}
/// Of those, a MoE model's dense-MLP layers (0 for a dense model).
[[nodiscard]] inline Count chunk_dense_layer_count(const StageUnitParams& u, Count v,
                                                   Count c) noexcept {
  return u.chunk_dense_layers.empty() ? u.dense_layers / v
                                      : u.chunk_dense_layers[static_cast<std::size_t>(c)];
}
/// What one micro-batch keeps through the layers of chunk `c`: each layer kind's own bytes
/// (`act` for u.layer's kind, `dense_act` for the dense-MLP layers).
[[nodiscard]] inline Bytes chunk_layers_kept(const StageUnitParams& u, Count v, Count c,
                                             const LayerActivation& act,
                                             const LayerActivation& dense_act) noexcept {
  const Count n = chunk_layer_count(u, v, c), d = chunk_dense_layer_count(u, v, c);
  return (n - d) * act.kept + d * dense_act.kept;
}

/// The bytes one micro-batch saves through chunk `c` of `stage`: its layers' saved tensors
/// (`layers_kept`, chunk_layers_kept()), and the embedding's (`first`) or the final norm and LM
/// head's (`last`) on the chunk at the start or the end of the path. The planner's peak and the
/// simulator's (micro-batch, chunk) sets use it.
[[nodiscard]] inline Bytes chunk_activation_bytes(Schedule schedule, Count pp, Count v, int stage,
                                                  Count c, Bytes layers_kept, Bytes first,
                                                  Bytes last) noexcept {
  const Count vs = chunk_virtual_stage(schedule, pp, stage, c);
  return layers_kept + (vs == 0 ? first : 0) + (vs == path_length(schedule, pp, v) - 1 ? last : 0);
}

/// Elements per TP rank of the stage's largest parameter tensor: the word embedding on the stage
/// that holds it (and the LM head's matrix on the last stage), else a layer's largest linear
/// weight (the fused qkv, or the MLP's first linear: gate and up fused under SwiGLU, as
/// Megatron-LM fuses them). DeepSpeed's BF16_Optimizer upcasts one such gradient at a time
/// (FrameworkProfile::gradient_upcast_transient).
[[nodiscard]] inline Count largest_parameter_elements(const ModelSpec& m, Count tp,
                                                      const StageUnitParams& u,
                                                      Count padded_vocab) noexcept {
  const Count h = m.hidden_size;
  Count largest = 0;
  if (u.all_layers() > 0) {
    Count qkv = (m.q_hidden() + 2 * m.kv_hidden()) * h / tp;
    if (m.mla.enabled()) {
      // MLA's projections (layer_ops.cpp): the down-projections whole on every rank, the up
      // ones and the output split t ways.
      const MlaSpec& x = m.mla;
      const Count a = m.num_attention_heads;
      const Count q_in = x.q_lora_rank > 0 ? x.q_lora_rank : h;
      qkv = std::max({x.q_lora_rank * h, (x.kv_lora_rank + x.qk_rope_head_dim) * h,
                      q_in * a * m.attention_qk_head_dim() / tp,
                      x.kv_lora_rank * a * (x.qk_nope_head_dim + x.v_head_dim) / tp,
                      m.attention_out_width() * h / tp});
    }
    const Count fc1 = (gated(m.mlp) ? 2 : 1) * m.ffn_hidden_size * h / tp;
    largest = std::max(qkv, fc1);
  }
  const Count word = padded_vocab * h / tp;
  if (u.embeddings > 0 || (u.heads > 0 && u.head >= word)) largest = std::max(largest, word);
  return largest;
}

/// Whether DeepSpeed runs BF16_Optimizer, whose layout the profile's
/// keeps_compute_dtype_gradients and gradient_upcast_transient describe: DeepSpeed v0.18.0's
/// choice (runtime/engine.py _do_optimizer_sanity_check) under bf16 is BF16_Optimizer for ZeRO-0
/// with the pipeline engine or fp32 gradient accumulation, and for ZeRO-1 with fp32 gradients
/// and the optimizer on the GPU; otherwise the ZeRO optimizer, or for ZeRO-0 bf16 gradients
/// all-reduced as they are (DDP_BFLOAT16).
[[nodiscard]] inline bool bf16_optimizer_layout(const TrainingSpec& t,
                                                const MemoryLayout& l) noexcept {
  if (t.precision != DType::bf16) return false;
  const bool fp32_grads = t.grad_accumulation_dtype == DType::fp32;
  if (l.zero_stage == 0) return l.pp > 1 || fp32_grads;
  return l.zero_stage == 1 && fp32_grads && l.offload_optimizer == Offload::none;
}

/// Whether the stage's units stay gathered with unsharded gradients through the step: ZeRO-3
/// under a pipeline with a framework whose FSDP does so (FrameworkProfile::
/// fsdp_unsharded_with_pipeline).
[[nodiscard]] inline bool fsdp_unsharded(const FrameworkProfile& fw,
                                         const MemoryLayout& l) noexcept {
  return fw.fsdp_unsharded_with_pipeline && l.zero_stage == 3 && l.pp > 1;
}

/// NCCL's buffers of one receive connection on one channel: the three protocols' buffers in one
/// allocation rounded up to CUDA's IPC granularity (NVIDIA/nccl src/transport/p2p.cc,
/// p2pRecvSetup: ALIGN_SIZE(recvSize, CUDA_IPC_MIN), 2 MiB).
[[nodiscard]] inline Bytes nccl_connection_bytes(const FrameworkProfile& fw) noexcept {
  constexpr Bytes kIpcGranularity = Bytes{2} << 20;
  const Bytes b = fw.nccl_buffer_bytes + fw.nccl_ll_buffer_bytes + fw.nccl_ll128_buffer_bytes;
  return (b + kIpcGranularity - 1) / kIpcGranularity * kIpcGranularity;
}

/// One rank's memory in a communicator of `n` ranks: on every channel a ring receive connection
/// and the tree's (a chain inside a node: parent and child, min(n - 1, 2)), all connected when
/// the communicator is created (src/init.cc, initTransportsRank), `extra` receive connections
/// more (an all-to-all's peers), and the per-communicator remainder.
[[nodiscard]] inline Bytes nccl_communicator_bytes(const FrameworkProfile& fw, Count n,
                                                   Count extra = 0) noexcept {
  if (n <= 1) return 0;
  const Count receives = 1 + std::min<Count>(n - 1, 2) + extra;
  return fw.nccl_communicator_bytes + receives * fw.nccl_channels * nccl_connection_bytes(fw);
}

/// NCCL memory of one rank of `stage`: a communicator for every process group it runs a
/// collective or a send/receive in (docs/memory.md, "NCCL communicators").
[[nodiscard]] inline Bytes nccl_buffer_bytes(const FrameworkProfile& fw, const MemoryLayout& l,
                                             bool tied_embeddings, int stage) noexcept {
  auto comm = [&](Count n, Count extra = 0) { return nccl_communicator_bytes(fw, n, extra); };
  // Hybrid sharding (ZeRO shard group smaller than dp): a shard group and a replicate group
  // (FSDP2's two-dimensional mesh, DeepSpeed's hpZ / MiCS groups), else one data-parallel group.
  const bool hybrid = l.shard > 1 && l.shard < l.dp;
  Bytes bytes = comm(l.tp) + comm(l.cp);
  bytes += hybrid ? comm(l.shard) + comm(l.dp / l.shard) : comm(l.dp);
  // MoE: the all-to-all connects to every other rank of the ep group; the experts' gradients
  // are reduced over the expert data-parallel group.
  if (l.expert_params > 0) {
    bytes += comm(l.ep, std::max<Count>(0, l.ep - 1 - std::min<Count>(l.ep - 1, 2))) + comm(l.edp) +
             comm(l.etp);
  }
  if (l.pp > 1) {
    const Count neighbours = (stage > 0 ? 1 : 0) + (stage < l.pp - 1 ? 1 : 0);
    if (fw.nccl_pipeline_group) bytes += comm(l.pp);
    if (fw.nccl_pipeline_pairs || !fw.nccl_pipeline_group) bytes += neighbours * comm(2);
    // Tied embeddings: the first and last stage all-reduce the word-embedding gradient.
    if (tied_embeddings && (stage == 0 || stage == l.pp - 1)) bytes += comm(2);
    // DualPipe: the stage holding the other copy of its model stages, when not a neighbour.
    const Count mirror = l.pp - 1 - stage;
    if (bidirectional(l.schedule) && (mirror > stage + 1 || mirror < stage - 1)) bytes += comm(2);
    if (fw.nccl_pipeline_slice_group) bytes += comm(l.tp);
  }
  if (fw.nccl_model_parallel_group) bytes += comm(l.tp * l.pp);
  if (fw.nccl_world_group) bytes += comm(l.tp * l.pp * l.dp * l.cp);
  return bytes;
}

/// The runtime and the totals of one stage from its categories (docs/memory.md, "Runtime and
/// allocator"): `sm` holds weights, gradients, optimizer, activations, buffers and transient; this
/// fills runtime, allocated, total and reserved. The plan calls it again once the schedule's walk
/// has replaced the activations and transient by those at the stage's joint peak.
inline void stage_totals(const Scenario& base, const MemoryLayout& l, int st, StageMemory& sm) {
  const FrameworkProfile& fw = base.assumptions.framework_profile;
  // The category sums, checked (checked.h): validation bounds each category, not their sum.
  constexpr const char* kStates = "/model";
  constexpr const char* kChurn = "/training/seq_length";
  const Bytes states =
      add_bytes(add_bytes(sm.weights_bytes, sm.gradients_bytes, kStates, "model states per GPU"),
                sm.optimizer_bytes, kStates, "model states per GPU");
  const Bytes churn = add_bytes(
      add_bytes(sm.activations_bytes, sm.buffers_bytes, kChurn, "activations and buffers per GPU"),
      sm.transient_bytes, kChurn, "activations and buffers per GPU");
  const Bytes reserve = base.cluster.runtime_reserve_bytes;
  if (!fw.models_allocator) {
    // generic: the flat reserve covers runtime, workspaces and the allocator.
    sm.runtime_bytes = std::max<Bytes>(reserve, 0);
    sm.allocated_bytes = add_bytes(states, churn, kChurn, "the memory of one GPU");
    sm.total_bytes =
        add_bytes(sm.allocated_bytes, sm.runtime_bytes, kChurn, "the memory of one GPU");
    sm.reserved_bytes = sm.total_bytes;
    return;
  }
  // Outside the allocator: the CUDA context and NCCL's buffers, or the user's own reserve.
  // Inside: the cuBLAS workspace.
  const bool computed = reserve < 0;
  const Bytes outside =
      computed ? fw.cuda_context_bytes +
                     nccl_buffer_bytes(fw, l, base.model.tied_embeddings && l.pp > 1, st)
               : reserve;
  const Bytes workspace = computed ? fw.cublas_workspace_bytes : 0;
  sm.runtime_bytes = outside + workspace;
  sm.allocated_bytes = add_bytes(add_bytes(states, churn, kChurn, "the memory of one GPU"),
                                 workspace, kChurn, "the memory of one GPU");
  sm.total_bytes = add_bytes(sm.allocated_bytes, outside, kChurn, "the memory of one GPU");
  // The allocator's segments: each model-state buffer and the workspace in one segment of their
  // own (rounded to 2 MiB); the bytes freed and reallocated every step with the fragmentation
  // factor on top, rounded likewise.
  using allocator::segment_bytes;
  auto seg = [](Bytes b) { return b > 0 ? segment_bytes(b) : Bytes{0}; };
  const double churn_reserved = static_cast<double>(churn) * (1.0 + fw.allocator_fragmentation);
  if (churn_reserved >= 0x1p63) bytes_overflow(kChurn, "the allocator's segments of one GPU");
  // Each segment is at most 2 MiB above its bytes: the sum is below the total plus 10 MiB.
  sm.reserved_bytes = add_bytes(
      seg(sm.weights_bytes) + seg(sm.gradients_bytes) + seg(sm.optimizer_bytes) + seg(workspace),
      seg(static_cast<Bytes>(churn_reserved)) + outside, kChurn,
      "the allocator's segments of one GPU");
}

/// The logits workspace of the stage that holds the LM head (buffers; 0 elsewhere): the logits
/// in the compute dtype (unless freed before the loss's backward) plus their fp32 copies for the
/// vocab-parallel loss (one, the softmax, unless the framework's loss keeps more), per loss
/// chunk; GPipe keeps every micro-batch's.
[[nodiscard]] inline Bytes logits_workspace_bytes(const Scenario& base, const MemoryLayout& l,
                                                  int st, Count vocab) noexcept {
  if (!holds_head(l.schedule, l.pp, st)) return 0;
  const FrameworkProfile& fw = base.assumptions.framework_profile;
  const Bytes cb = bytes_of(base.training.precision);
  const Count act_tokens = l.micro_batch_size * (base.training.seq_length / l.cp);
  // A final logit softcap (Gemma 2) keeps its tanh output for the backward: one more
  // compute-dtype copy of the logits.
  const Bytes kept_logits =
      (fw.loss_keeps_logits ? cb : 0) + (base.model.final_logit_softcap > 0 ? cb : 0);
  const Bytes logits =
      act_tokens * (vocab / l.tp) * (kept_logits + 4 * fw.loss_fp32_copies) / fw.loss_chunks;
  const Count live = l.schedule == Schedule::gpipe ? l.num_microbatches : 1;
  // Each MTP module's loss computes its logits in the same forward, before the backward of any
  // of them (Megatron-Core process_mtp_loss): 1 + mtp_layers workspaces live together.
  return logits * live * (1 + base.model.mtp_layers);
}

/// stage_memory() under fine-tuning (training.peft; peft_memory.cpp, docs/peft.md): frozen
/// parameters without gradients or optimizer states, adapters with both, a quantized base, and
/// the activations of layers that pass gradients on.
void peft_stage_memory(const Scenario& base, const MemoryLayout& l, const StageUnitParams& u,
                       int st, Count vocab, StageMemory& sm);

/// The framework's terms of one stage (docs/memory.md, "Framework profiles", "Runtime and
/// allocator"): the backward's transient, the runtime, and allocated and reserved bytes.
/// `sm` holds every category but the runtime; this fills the runtime, the transient and the
/// totals.
inline void framework_terms(const Scenario& base, const MemoryLayout& l, const StageUnitParams& u,
                            const LayerActivation& act, int st, Count padded_vocab,
                            StageMemory& sm) {
  const FrameworkProfile& fw = base.assumptions.framework_profile;
  const Bytes cb = bytes_of(base.training.precision);
  // Inside a layer's backward: the gradients of its largest activation (an op's output and input
  // gradients together), and the framework's gradient or prefetch buckets, which live while the
  // backward reduces gradients or gathers parameters.
  Bytes transient =
      u.all_layers() > 0 ? fw.backward_gradient_tensors * act.largest_elements * cb : 0;
  // BF16_Optimizer (the compute-dtype gradients kept beside its own unsharded ones) has no
  // reduce bucket: it all-reduces its flat gradient buffer (pipe/engine.py, _bf16_reduce_grads).
  const bool bf16_optimizer =
      fw.keeps_compute_dtype_gradients && bf16_optimizer_layout(base.training, l);
  // With the reduction overlapped (DeepSpeed's overlap_comm, which the export writes from
  // assumptions.overlap_grad_reduce) the bucket is double-buffered (stage_1_and_2.py
  // backward_prologue: buf_0, and buf_1 "to avoid data access conflict when overlap_comm").
  if (l.shard > 1 && (l.zero_stage == 1 || l.zero_stage == 2) && !bf16_optimizer) {
    const Count buckets =
        base.assumptions.overlap_grad_reduce ? 2 * fw.reduce_buckets : fw.reduce_buckets;
    transient += buckets * fw.reduce_bucket_elements * cb;
  }
  if (l.shard > 1 && l.zero_stage == 3) transient += fw.prefetch_bucket_elements * cb;
  // After a backward (its recompute working set freed): BF16_Optimizer's fp32 upcast of one
  // parameter's gradient, the largest one (runtime/bf16_optimizer.py, update_hp_grads). The
  // stage's peak is the larger of the two moments; the working set is already in activations.
  // (Fine-tuning with adapters: the trainable tensors are the small adapters; not counted.)
  if (fw.gradient_upcast_transient && !base.training.peft.adapters() &&
      bf16_optimizer_layout(base.training, l) &&
      base.training.grad_accumulation_dtype == DType::fp32) {
    const Bytes upcast = 4 * largest_parameter_elements(base.model, l.tp, u, padded_vocab);
    transient = std::max(transient, upcast - sm.working_bytes);
  }
  // After the backward, at the step: the ZeRO optimizer's fp32 copy of its gradient partition
  // (FrameworkProfile::optimizer_step_upcast), ZeRO-3 a sub-group at a time.
  if (fw.optimizer_step_upcast && l.zero_stage >= 1 && !bf16_optimizer &&
      base.training.grad_accumulation_dtype != DType::fp32 &&
      base.training.precision != DType::fp32 && l.offload_optimizer == Offload::none) {
    const Count S = std::max<Count>(l.shard, 1);
    Count partition =
        (u.layers > 0 ? detail::ceil_div(u.layer, S) * u.layers : 0) +
        (u.dense_layers > 0 ? detail::ceil_div(u.dense_layer, S) * u.dense_layers : 0) +
        (u.embeddings > 0 ? detail::ceil_div(u.embedding, S) : 0) +
        (u.heads > 0 ? detail::ceil_div(u.head, S) : 0);
    if (l.zero_stage == 3) partition = std::min(partition, base.assumptions.nvme_sub_group_params);
    transient = std::max(transient, 4 * partition - sm.working_bytes);
  }
  sm.transient_bytes = transient;
  sm.backward_extra_bytes = sm.working_bytes + transient;
  stage_totals(base, l, st, sm);
}

/// Fills everything of `sm` but the layer range (first_layer, end_layer), for one GPU of
/// `stage`. `act` is layer_activation() for the layout's tp, sequence parallelism and recompute
/// (and the training's micro-batch size) of u.layer's kind; `dense_act` the same for a MoE model's
/// dense-MLP layers (u.dense_layers; ignored when there are none). Filled in place: estimate()
/// writes its stages directly.
inline void stage_memory(const Scenario& base, const MemoryLayout& l, const StageUnitParams& u,
                         const LayerActivation& act, const LayerActivation& dense_act, int st,
                         Count vocab, StageMemory& sm) {
  if (base.training.peft.enabled()) {
    peft_stage_memory(base, l, u, st, vocab, sm);
    return;
  }
  const ModelSpec& m = base.model;
  const TrainingSpec& t = base.training;
  const Count pp = l.pp;
  const Count v = l.virtual_stages;
  const Count tp = l.tp;
  const Count h = m.hidden_size;
  const bool sp = l.sequence_parallel;
  const Bytes cb = bytes_of(t.precision);
  const Bytes gb = bytes_of(t.grad_accumulation_dtype);
  const Count S = l.shard;
  const bool zero = l.zero_stage > 0;
  const Count act_tokens = l.micro_batch_size * (t.seq_length / l.cp);  // this GPU's tokens
  const Count all_layers = u.all_layers();

  sm.stage = st;
  sm.num_layers = all_layers;
  sm.parameters = u.total();

  // Model states (Rajbhandari et al. 2020, Figure 1), unit by unit with padding.
  // Each unit's shard and padded size, computed for the units the stage holds only (divisions
  // are the lean path's main cost).
  const Count layer_shard = u.layers > 0 ? detail::ceil_div(u.layer, S) : 0;
  const Count dense_shard = u.dense_layers > 0 ? detail::ceil_div(u.dense_layer, S) : 0;
  const Count embedding_shard = u.embeddings > 0 ? detail::ceil_div(u.embedding, S) : 0;
  const Count head_shard = u.heads > 0 ? detail::ceil_div(u.head, S) : 0;
  const Count padded_layer = zero ? layer_shard * S : u.layer;
  const Count padded_dense = zero ? dense_shard * S : u.dense_layer;
  const Count padded_embedding = zero ? embedding_shard * S : u.embedding;
  const Count padded_head = zero ? head_shard * S : u.head;
  const Count full = padded_layer * u.layers + padded_dense * u.dense_layers +
                     padded_embedding * u.embeddings + padded_head * u.heads;
  const Count sharded = layer_shard * u.layers + dense_shard * u.dense_layers +
                        embedding_shard * u.embeddings + head_shard * u.heads;
  const FrameworkProfile& fw = base.assumptions.framework_profile;
  Bytes opt_k = optimizer_bytes_per_param(t);
  Bytes weight_b = cb;
  if (fw.sharded_params_are_master && l.zero_stage >= 3 && t.precision != DType::fp32) {
    // FSDP2: the sharded fp32 parameters are the master weights; no compute-dtype shard.
    weight_b = 4;
    opt_k -= 4;
  }
  sm.weights_bytes = (l.zero_stage >= 3 ? sharded : full) * weight_b;
  // FSDP under a pipeline: every unit's gathered copy stays through the step.
  const bool unsharded = fsdp_unsharded(fw, l);
  if (unsharded) sm.weights_bytes += full * cb;
  // FP8: each layer's cached fp8 weight copies and scales (fp8.h); under ZeRO-3 only the
  // gathered units have them (buffers, below).
  if (l.zero_stage < 3)
    sm.weights_bytes += u.layers * l.fp8_layer_state + u.dense_layers * l.fp8_dense_layer_state;
  sm.gradients_bytes = (l.zero_stage >= 2 && !unsharded ? sharded : full) * gb;
  // DeepSpeed's BF16_Optimizer: the compute-dtype .grad stays beside its own gradients
  // (FrameworkProfile::keeps_compute_dtype_gradients, runtime/bf16_optimizer.py).
  if (fw.keeps_compute_dtype_gradients && bf16_optimizer_layout(t, l))
    sm.gradients_bytes += full * cb;
  sm.optimizer_bytes = (l.zero_stage >= 1 ? sharded : full) * opt_k;
  // Routed experts: their own units, ZeRO-sharded over the expert data-parallel group
  // (moe_memory.h, expert_state_bytes; docs/moe.md, "Memory").
  if (l.expert_params > 0 && u.layers > 0) {
    const ExpertStateBytes x =
        expert_state_bytes(l.expert_params, u.layers, l.zero_stage, l.edp, weight_b, gb, opt_k);
    sm.parameters += l.expert_params * u.layers;
    sm.weights_bytes += x.weights;
    sm.gradients_bytes += x.gradients;
    sm.optimizer_bytes += x.optimizer;
  }
  // Offload (ZeRO-Offload, Ren et al. 2021, sec. 4; ZeRO-Infinity, Rajbhandari et al. 2021):
  // the optimizer's partition leaves the GPU, and with it the ZeRO-2/3 gradient partition, which
  // is copied to host memory as each unit is reduced (ZeRO-1 keeps its full gradients); ZeRO-3
  // can also move its parameter partition. Validation admits offload only with ZeRO
  // (docs/memory.md).
  if (l.offload_optimizer != Offload::none) {
    sm.optimizer_bytes = 0;
    if (l.zero_stage >= 2) sm.gradients_bytes = 0;
  }
  if (l.offload_params != Offload::none) sm.weights_bytes = 0;
  const OffloadBytes off =
      offload_bytes(l.offload_optimizer, l.offload_params, t, base.assumptions, sharded);
  sm.host_bytes = off.host;
  sm.nvme_bytes = off.nvme;

  // Activations: per micro-batch through this GPU's layers, times what is in flight.
  const Bytes token_h = act_tokens * h;
  sm.embedding_activation_bytes = 0;
  if (holds_embedding(l.schedule, pp, st)) {
    const Bytes local_h = sp ? token_h / tp : token_h;  // in the sequence-parallel region under SP
    if (t.dropout > 0) sm.embedding_activation_bytes += local_h;  // embedding dropout mask
    // The embedding norm keeps its input in the compute dtype, as a layer's norms do (Korthikanti
    // et al. 2022, sec. 4.1: 2sbh bytes per LayerNorm); it sits outside the layers that
    // recomputation checkpoints.
    if (base.model.embedding_norm) sm.embedding_activation_bytes += local_h * cb;
  }
  // The final norm's and the LM head's inputs; each MTP module adds its two norms' inputs, its
  // projection's 2h-wide input, its final norm's and its head's: 6h (sequence-parallel).
  sm.head_activation_bytes =
      holds_head(l.schedule, pp, st)
          ? (2 + 6 * base.model.mtp_layers) * (sp ? token_h * cb / tp : token_h * cb)
          : 0;
  const Bytes layers_kept = u.layers * act.kept + u.dense_layers * dense_act.kept;
  sm.activation_bytes_per_microbatch =
      layers_kept + sm.embedding_activation_bytes + sm.head_activation_bytes;
  sm.inflight_chunks =
      inflight_chunks(l.schedule, pp, v, st, l.num_microbatches, l.zb_memory_limit);
  sm.inflight_microbatches = static_cast<double>(sm.inflight_chunks) / static_cast<double>(v);
  // The embedding's and LM head's tensors belong to the first and last virtual stage only; the
  // schedule's order decides how many of those chunks are in flight at the peak.
  if (v > 1 && uneven_chunks(u)) {
    // Chunks of unequal layers or layer kinds: the peak of the per-chunk sets along the
    // schedule's order.
    std::vector<Bytes> chunk_bytes(static_cast<std::size_t>(v));
    for (Count c = 0; c < v; ++c) {
      chunk_bytes[static_cast<std::size_t>(c)] = chunk_activation_bytes(
          l.schedule, pp, v, st, c, chunk_layers_kept(u, v, c, act, dense_act),
          sm.embedding_activation_bytes, sm.head_activation_bytes);
    }
    sm.activations_bytes = activation_peak_bytes(l.schedule, pp, v, st, l.num_microbatches,
                                                 chunk_bytes, l.zb_memory_limit);
  } else {
    sm.activations_bytes = activation_peak_bytes(
        l.schedule, pp, v, st, l.num_microbatches, chunk_layers_kept(u, v, 0, act, dense_act),
        sm.embedding_activation_bytes, sm.head_activation_bytes, l.zb_memory_limit);
  }
  // A pipeline engine that keeps each in-flight micro-batch's stage output until its backward
  // (DeepSpeed's pipe_buffers['outputs'], partitioned over the TP group:
  // FrameworkProfile::pipeline_output_buffers); every stage that sends activations. DeepSpeed's
  // engine runs one chunk per stage (TrainSchedule): not counted with virtual stages.
  if (fw.pipeline_output_buffers && pp > 1 && v == 1 && st != head_stage(l.schedule, pp)) {
    const Bytes output = token_h * cb / tp;
    sm.activation_bytes_per_microbatch += output;
    sm.activations_bytes += sm.inflight_chunks * output;
  }
  // The layer whose backward runs rebuilds what recomputation dropped: one layer's working set,
  // counted on top of everything else in flight (docs/memory.md).
  sm.working_bytes =
      std::max(u.layers > 0 ? act.working : 0, u.dense_layers > 0 ? dense_act.working : 0);
  sm.activations_bytes += sm.working_bytes;

  // Buffers: the logits workspace lives from the last stage's forward to the loss gradient;
  // ZeRO-2/3 unit buffers live while a unit's gradient is reduced or its parameters are gathered.
  // One micro-batch's two are never alive together, so the category's peak is the larger (but
  // for the logits GPipe keeps waiting, below).
  const Bytes logits_ws = logits_workspace_bytes(base, l, st, vocab);
  const Bytes logits_one = l.schedule == Schedule::gpipe && l.num_microbatches > 0
                               ? logits_ws / l.num_microbatches
                               : logits_ws;
  Bytes zero_ws = 0;
  const bool expert_zero = l.expert_params > 0 && u.layers > 0 && l.edp > 1;
  // ZeRO-3 gathers every unit into a buffer of its own and fills a unit gradient before handing
  // it on, whatever the shard group: at dp·cp = 1 too (one GPU, or a pipeline at dp 1), where
  // the "gather" copies the GPU's (or, offloaded, the host's) whole partition (DeepSpeed's
  // partitioned parameters and FSDP2's unsharded parameter buffers exist at world size 1;
  // issue 29, item 7). ZeRO-2 at S = 1 reduces into the gradient buffer itself.
  const bool dense_zero = S > 1 || l.zero_stage == 3;
  // (Units kept gathered with unsharded gradients need no per-unit buffer: both are counted in
  // weights and gradients above.)
  if ((dense_zero || expert_zero) && l.zero_stage >= 2 && !unsharded) {
    Count largest = 0;
    if (dense_zero && u.layers > 0) largest = padded_layer;
    if (dense_zero && u.dense_layers > 0) largest = std::max(largest, padded_dense);
    if (dense_zero && u.embeddings > 0) largest = std::max(largest, padded_embedding);
    if (dense_zero && u.heads > 0) largest = std::max(largest, padded_head);
    // The routed experts of a layer are a unit too, padded over the expert data-parallel group.
    if (expert_zero) largest = std::max(largest, detail::ceil_div(l.expert_params, l.edp) * l.edp);
    const Bytes gradient = largest * gb;  // one unit's full gradient before its reduce-scatter
    zero_ws = gradient;
    if (l.zero_stage == 3) {
      // Gathered parameters: each pass over a chunk's units (embedding, layers, LM head) keeps
      // the current unit and the next zero3_prefetch_layers gathered, so the peak is the largest
      // run of that many consecutive units of one chunk. A chunk whose layers are of two kinds
      // counts each layer as the larger (an upper bound: the window's place among them is not
      // modelled); a chunk of one kind is exact.
      const Count k = 1 + base.assumptions.zero3_prefetch_layers;
      const bool emb = u.embeddings > 0, head = u.heads > 0;
      // A MoE layer gathers its routed experts too, over the expert data-parallel group.
      const Count gathered_experts =
          l.expert_params > 0 && l.edp > 1 ? detail::ceil_div(l.expert_params, l.edp) * l.edp : 0;
      const bool dualpipe_v = l.schedule == Schedule::dualpipe_v;
      Count gathered = 0;
      Bytes fp8 = 0;  // the gathered layers' fp8 copies (at most k of them per chunk)
      for (Count c = 0; c < v; ++c) {
        // Each chunk's pass: the embedding opens the chunk at the path's start and the LM head
        // closes the one at its end.
        const Count n = chunk_layer_count(u, v, c), d = chunk_dense_layer_count(u, v, c);
        const Count layer_unit =
            std::max(n > d ? padded_layer + gathered_experts : 0, d > 0 ? padded_dense : 0);
        const Bytes layer_fp8 =
            std::max(n > d ? l.fp8_layer_state : 0, d > 0 ? l.fp8_dense_layer_state : 0);
        const Count vs = chunk_virtual_stage(l.schedule, pp, st, c);
        const bool opens = emb && vs == 0;
        const bool closes = head && vs == path_length(l.schedule, pp, v) - 1;
        const Count window =
            detail::max_window(opens, padded_embedding, n, layer_unit, closes, padded_head, k);
        const Bytes window_fp8 = std::min(k, n) * layer_fp8;
        // DualPipeV's F&B pairs run a forward of one chunk and a backward of the other at once:
        // both chunks' gathered units are alive (issue 29, item 7: the backend measured twice
        // the one-chunk figure).
        gathered = dualpipe_v ? gathered + window : std::max(gathered, window);
        fp8 = dualpipe_v ? fp8 + window_fp8 : std::max(fp8, window_fp8);
      }
      // Zero-bubble schedules split the backward: the B pass gathers parameters and defers every
      // weight gradient, the W pass fills the unit gradient and reads no parameter, so the
      // gathered units and the unit gradient are never alive together.
      const bool split =
          l.schedule == Schedule::zb_h1 || l.schedule == Schedule::zb_h2 || v_shape(l.schedule);
      zero_ws = split ? std::max(gathered * cb + fp8, gradient) : gathered * cb + fp8 + gradient;
    }
  }
  // Context parallel: the key/value exchange buffers of the layer whose attention runs, alive
  // with that layer's ZeRO-3 gathered units (docs/memory.md, "Context parallel").
  const Bytes cp_ws = all_layers > 0 ? cp_attention_buffer_bytes(m, l, act_tokens, cb) : 0;
  // GPipe's last stage keeps every micro-batch's logits until its backward: while the first
  // backward gathers units and fills unit gradients, the other m - 1 are alive (issue 29,
  // item 7, measured by the backend at dp 1).
  const Bytes waiting_logits = logits_ws - logits_one;
  sm.buffers_bytes = std::max(logits_ws, waiting_logits + zero_ws + cp_ws);
  LayerActivation largest = act;
  if (u.dense_layers > 0)
    largest.largest_elements = std::max(act.largest_elements, dense_act.largest_elements);
  framework_terms(base, l, u, largest, st, vocab, sm);
}

}  // namespace distplan
