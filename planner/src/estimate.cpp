// The planner's estimate: memory (docs/memory.md), communication (docs/communication.md),
// FLOPs (docs/flops.md) and analytic time (docs/time.md) of one scenario.
#include "distplan/planner/estimate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "distplan/planner/check.h"
#include "distplan/planner/checked.h"
#include "distplan/planner/fp8.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/memory_terms.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/offload.h"
#include "distplan/planner/op_costs.h"
#include "distplan/planner/overlap.h"
#include "distplan/planner/peft.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan {

Bytes ring_wire_bytes(CollectiveOp op, Bytes buffer_bytes, Count n) noexcept {
  // nccl-tests, doc/PERFORMANCE.md: a ring all-reduce sends 2(n-1)/n of the buffer per rank,
  // reduce-scatter and all-gather (n-1)/n; point-to-point sends the buffer once.
  using Wide = __int128;
  if (buffer_bytes <= std::numeric_limits<Bytes>::max() / (2 * n)) {
    // No overflow possible: plain 64-bit arithmetic (the 128-bit division is slow).
    switch (op) {
      case CollectiveOp::all_reduce:
        return buffer_bytes * 2 * (n - 1) / n;
      case CollectiveOp::reduce_scatter:
      case CollectiveOp::all_gather:
      case CollectiveOp::all_to_all:
        return buffer_bytes * (n - 1) / n;
      case CollectiveOp::send_recv:
        return buffer_bytes;
    }
  }
  switch (op) {
    case CollectiveOp::all_reduce:
      return static_cast<Bytes>(Wide{buffer_bytes} * 2 * (n - 1) / n);
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_gather:
    case CollectiveOp::all_to_all:  // each rank keeps 1/n of its buffer and sends the rest
      return static_cast<Bytes>(Wide{buffer_bytes} * (n - 1) / n);
    case CollectiveOp::send_recv:
      return buffer_bytes;
  }
  return 0;
}

namespace {

Count ceil_div(Count a, Count b) noexcept {
  return (a + b - 1) / b;
}

// The parameter groups ("units") a stage holds: its layers, the embedding on the first stage,
// the final norm and LM head on the last. ZeRO shards, gathers and reduces unit by unit.
struct Unit {
  std::string_view name;
  Count params = 0;  // per TP rank
  Count count = 0;   // how many such units the stage holds
};

// A MoE model's layers are of two kinds (docs/moe.md, "Layer placement"): `layer` is a MoE
// layer's dense part (its routed experts are reduced apart), `dense_layer` a layer with the dense
// MLP (DeepSeek's first_k_dense_replace, every other layer of Llama 4 Maverick); a dense model
// has `layer` only.
struct StageUnits {
  Unit layer, dense_layer, embedding, head;
  [[nodiscard]] Count params() const noexcept {
    return layer.params * layer.count + dense_layer.params * dense_layer.count +
           embedding.params * embedding.count + head.params * head.count;
  }
};

class Estimator {
 public:
  explicit Estimator(const Scenario& s)
      : s_(s),
        m_(s.model),
        t_(s.training),
        p_(s.parallel),
        table_(planner_layer_table(s.model, s.training)),
        // A dense model's table is already the dense-MLP layer's: built once, not copied.
        moe_dense_table_(s.model.moe.enabled()
                             ? std::optional<LayerTable>(build_layer_table(s.model, s.training))
                             : std::nullopt),
        dense_table_(moe_dense_table_ ? *moe_dense_table_ : table_),
        split_(pipeline_split(s)),
        layer_params_rank_(planner_layer_params_per_tp_rank(s.model, table_, s.parallel.tp)),
        dense_params_rank_(layer_parameters_per_tp_rank(dense_table_, s.parallel.tp)),
        layer_replicated_(replicated_parameters(table_)),
        dense_replicated_(replicated_parameters(dense_table_)),
        moe_(moe_layer_plan(s)) {
    // The router's weight is whole on every TP rank and, under sequence parallelism, sees only
    // the rank's tokens, like the norms (Megatron-Core marks it sequence_parallel). The shared
    // experts' gate too.
    if (moe_.enabled()) {
      layer_replicated_ += moe_.router_params;
      if (m_.moe.shared_expert_gate) layer_replicated_ += m_.hidden_size;
    }
    // Each chunk's layers and their kinds (MoE or dense MLP, windowed attention): the chunks'
    // costs and saved bytes are those of their own layers.
    const auto pp = static_cast<std::size_t>(s.parallel.pp);
    const bool moe = m_.moe.enabled();
    chunk_kinds_ = chunk_layer_kinds(m_, split_);
    mix_ = stage_layer_mix(m_, chunk_kinds_);
    layers_.resize(pp);
    chunk_layers_.resize(pp);
    chunk_dense_.resize(pp);
    for (std::size_t st = 0; st < pp; ++st) {
      layers_[st] = split_.stage_layers(static_cast<Count>(st));
      for (const LayerKinds& k : chunk_kinds_[st]) {
        chunk_layers_[st].push_back(k.layers);
        chunk_dense_[st].push_back(k.dense_layers(moe));
      }
    }
    init_groups();
  }

  [[nodiscard]] Count embedding_replicated() const noexcept {
    return m_.embedding_extra_parameters();
  }
  [[nodiscard]] Count head_replicated() const noexcept { return m_.norm_parameters(); }

  // Parameters of a layer that every TP rank holds whole.
  static Count replicated_parameters(const LayerTable& table) noexcept {
    Count n = 0;
    for (const LayerOp& op : table) {
      if (op.param_shard == TpShard::replicated) n += op.weight_params;
      if (op.bias_shard == TpShard::replicated) n += op.bias_params;
    }
    return n;
  }

  /// The collectives of one GPU of `stage` (public through stage_communication()).
  std::vector<Collective> collectives_of(int stage) {
    vocab_ = padded_vocab(s_);
    nmb_ = s_.num_microbatches();
    std::vector<Collective> out;
    auto keep = [&out](const Collective& c) { out.push_back(c); };
    stage_collectives(stage, keep);
    return out;
  }

  Estimate run() {
    Estimate e;
    e.parameters = model_parameters(m_, table_);
    e.padded_vocab_size = padded_vocab(s_);
    e.num_microbatches = s_.num_microbatches();
    vocab_ = e.padded_vocab_size;
    nmb_ = e.num_microbatches;
    memory(e);
    compute(e);
    communication_and_costs(e);
    time(e);
    return e;
  }

 private:
  [[nodiscard]] Bytes cb() const noexcept { return bytes_of(t_.precision); }
  [[nodiscard]] Bytes gb() const noexcept { return bytes_of(t_.grad_accumulation_dtype); }
  [[nodiscard]] Count shard() const noexcept { return p_.zero_stage == 0 ? 1 : s_.zero_shard(); }
  [[nodiscard]] Count padded(Count u) const noexcept {
    return p_.zero_stage == 0 ? u : ceil_div(u, shard()) * shard();
  }
  // Tokens of one micro-batch on one GPU (its context-parallel share).
  [[nodiscard]] Count act_tokens() const noexcept {
    return t_.micro_batch_size * s_.local_seq_length();
  }
  // The training as one context-parallel rank sees it: seq_length / cp tokens per sequence.
  [[nodiscard]] TrainingSpec local_training() const noexcept {
    TrainingSpec t = t_;
    t.seq_length = s_.local_seq_length();
    return t;
  }
  // One micro-batch's hidden states b*s*h in the compute dtype: the TP collective buffer.
  [[nodiscard]] Bytes hidden_bytes() const noexcept { return act_tokens() * m_.hidden_size * cb(); }

  // One definition of what a stage holds (memory_terms.h), with its chunks' layers and kinds.
  [[nodiscard]] StageUnitParams unit_params(int stage) const noexcept {
    const auto i = static_cast<std::size_t>(stage);
    StageUnitParams x = stage_unit_params(m_, p_.tp, p_.pp, p_.schedule, stage, mix_[i], vocab_,
                                          layer_params_rank_, dense_params_rank_);
    x.chunk_layers = chunk_layers_[i];
    if (x.dense_layers > 0) x.chunk_dense_layers = chunk_dense_[i];
    x.first_layer = stage_first_layer(stage);
    return x;
  }
  [[nodiscard]] StageUnits units(int stage) const noexcept {
    // Named for the collectives.
    const StageUnitParams x = unit_params(stage);
    StageUnits u;
    u.layer = {"layers", x.layer, x.layers};
    u.dense_layer = {"layers", x.dense_layer, x.dense_layers};
    u.embedding = {"embedding", x.embedding, x.embeddings};
    u.head = {"lm_head", x.head, x.heads};
    return u;
  }

  // Whether the model has layers of both kinds (a MoE model with dense-MLP layers).
  [[nodiscard]] bool mixed() const noexcept {
    return moe_.enabled() && moe_layer_count(m_) < m_.num_layers;
  }

  // Memory ------------------------------------------------------------------------------------
  void memory(Estimate& e) {
    // The terms are memory_terms.cpp's (docs/memory.md), shared with the search's lean path.
    const Count pp = p_.pp;
    const Count v = p_.virtual_stages;
    MemoryLayout ml = memory_layout(s_);
    const LayerActivation act =
        add_cp_activation(add_moe_activation(layer_activation(table_, m_, local_training(), p_.tp,
                                                              p_.sequence_parallel, p_.recompute),
                                             moe_, p_.recompute),
                          m_, p_.cp, p_.cp_comm, act_tokens(), p_.tp, cb(), p_.recompute);
    // A dense model's layers are all of one kind: its dense-MLP activation is `act` itself.
    const LayerActivation dense_act =
        moe_.enabled()
            ? add_cp_activation(layer_activation(dense_table_, m_, local_training(), p_.tp,
                                                 p_.sequence_parallel, p_.recompute),
                                m_, p_.cp, p_.cp_comm, act_tokens(), p_.tp, cb(), p_.recompute)
            : act;
    MemoryEstimate& mem = e.memory;
    mem.capacity_bytes = s_.cluster.gpu.memory_bytes;
    mem.stages.resize(static_cast<std::size_t>(pp));
    for (int st = 0; st < pp; ++st) {
      StageMemory& sm = mem.stages[static_cast<std::size_t>(st)];
      const StageUnitParams u = unit_params(st);
      stage_memory(s_, ml, u, act, dense_act, st, vocab_, sm);
      // The layer range of the stage's first chunk, and each chunk's layers and saved bytes (the
      // simulator's (micro-batch, chunk) sets).
      sm.first_layer = split_.chunk_first_layer(st, 0);
      sm.end_layer = sm.first_layer + split_.chunk_layers(st, 0);
      sm.chunk_layers = chunk_layers_[static_cast<std::size_t>(st)];
      sm.chunk_activation_bytes.resize(static_cast<std::size_t>(v));
      for (Count c = 0; c < v; ++c) {
        sm.chunk_activation_bytes[static_cast<std::size_t>(c)] =
            v == 1 ? sm.activation_bytes_per_microbatch
                   : chunk_activation_bytes(
                         p_.schedule, pp, v, st, c, chunk_layers_kept(u, v, c, act, dense_act),
                         sm.embedding_activation_bytes, sm.head_activation_bytes);
      }
      if (sm.total_bytes > mem.peak_bytes) {
        mem.peak_bytes = sm.total_bytes;
        mem.peak_stage = st;
      }
      mem.peak_allocated_bytes = std::max(mem.peak_allocated_bytes, sm.allocated_bytes);
      mem.peak_reserved_bytes = std::max(mem.peak_reserved_bytes, sm.reserved_bytes);
    }
    // What the device must hold: the allocator's segments and the runtime (docs/memory.md).
    mem.fits = mem.peak_reserved_bytes <= mem.capacity_bytes;
    // Offload: a node's processes each pin their own partition (docs/memory.md, "Offload"); the
    // stage with the most stands for every GPU of the node.
    Bytes host = 0, nvme = 0;
    for (const StageMemory& sm : mem.stages) {
      host = std::max(host, sm.host_bytes);
      nvme = std::max(nvme, sm.nvme_bytes);
    }
    const Count node_gpus = gpus_in_node();
    mem.host_bytes_per_node = mul_bytes(host, node_gpus, "/model", "the host memory of one node");
    mem.nvme_bytes_per_node = mul_bytes(nvme, node_gpus, "/model", "the NVMe bytes of one node");
    mem.host_capacity_bytes = s_.cluster.host_memory_bytes;
    mem.host_fits =
        mem.host_capacity_bytes == 0 || mem.host_bytes_per_node <= mem.host_capacity_bytes;
  }
  [[nodiscard]] Count gpus_in_node() const noexcept {
    return std::min(s_.cluster.num_gpus, s_.cluster.gpus_per_node);
  }

  // FLOPs -------------------------------------------------------------------------------------
  // Fine-tuning (peft.h, docs/peft.md): layer i is frozen below the trained ones (i <
  // frozen_layers), the first trained one (where the gradient may start) or above it; each kind
  // has its own flow, FLOPs and op costs.
  enum PeftKind { kBelow, kFirst, kAbove };
  struct PeftKindInfo {
    LayerFlops flops;
    PeftLayerFlow flow;
  };
  [[nodiscard]] PeftKindInfo peft_kind(int kind) const {
    const PeftSpec& pe = t_.peft;
    const Count n = pe.frozen_layers;
    const Count layer = kind == kBelow ? 0 : kind == kFirst ? n : n + 1;
    const bool trains = kind != kBelow;
    const LoraLayer lora = trains ? lora_layer(table_, m_, pe) : LoraLayer{};
    const bool own = trains && !pe.adapters();
    const bool grad_in = kind == kAbove || peft_grad_reaches(pe, layer);
    PeftKindInfo x;
    x.flow = peft_layer_flow(table_, lora, own, grad_in, pe.dropout > 0);
    x.flops =
        peft_layer_flops(table_, lora, pe.rank, own, grad_in, t_.micro_batch_size, t_.seq_length);
    return x;
  }
  // Layers of each kind among [first, first + count) (v = 1), or on a stage under v > 1
  // (frozen_layers is 0 then: layer 0, the first, sits on stage 0).
  [[nodiscard]] std::array<Count, 3> peft_kind_counts(Count first, Count count) const noexcept {
    const Count n = t_.peft.frozen_layers, end = first + count;
    std::array<Count, 3> c{};
    c[kBelow] = std::max<Count>(0, std::min(end, n) - first);
    c[kFirst] = first <= n && n < end ? 1 : 0;
    c[kAbove] = count - c[kBelow] - c[kFirst];
    return c;
  }
  // Of the chunk's layers [first, first + count), the windowed ones of each kind (the kinds of
  // their own indices), at most `n`'s counts.
  [[nodiscard]] std::array<Count, 3> peft_windowed_counts(
      Count first, Count count, const std::array<Count, 3>& n) const noexcept {
    std::array<Count, 3> w{};
    if (!m_.attention_window.enabled()) return w;
    const Count frozen = t_.peft.frozen_layers;
    for (Count i = first; i < first + count; ++i) {
      if (!is_windowed_layer(m_, i)) continue;
      ++w[i < frozen ? kBelow : i == frozen ? kFirst : kAbove];
    }
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = std::min(w[k], n[k]);
    return w;
  }
  [[nodiscard]] bool peft_head_trains() const noexcept {
    const PeftSpec& pe = t_.peft;
    return !pe.enabled() ||
           (pe.method == PeftMethod::full && !(m_.tied_embeddings && pe.freeze_embeddings));
  }

  void compute(Estimate& e) {
    if (t_.peft.enabled()) {
      peft_compute(e);
      return;
    }
    // Per micro-batch, all TP ranks together (Narayanan et al. 2021, eq. 3 derivation).
    lf_ = layer_flops(table_, t_.micro_batch_size, t_.seq_length);
    // MoE: the router and the top_k routed experts of every token (moe_layer.h).
    const LayerFlops routed = moe_layer_flops(m_, t_.micro_batch_size * t_.seq_length);
    lf_.forward += routed.forward;
    lf_.backward_input += routed.backward_input;
    lf_.backward_weight += routed.backward_weight;
    head_fwd_ = 2.0 * static_cast<double>(t_.micro_batch_size * t_.seq_length) *
                static_cast<double>(m_.hidden_size) * static_cast<double>(vocab_);
    const double mbs_per_step = static_cast<double>(nmb_ * p_.dp);
    // A MoE model's MoE layers (lf_) and dense-MLP layers (the dense table); every layer of a
    // dense model is lf_'s. The MTP modules' layers count as Megatron-LM's
    // num_floating_point_operations counts them (megatron/training/training.py), with their
    // norms, their 2h -> h projections and their logits.
    const Count all_layers = m_.num_layers + m_.mtp_layers;
    const Count moe_layers = moe_.enabled() ? moe_layers_in(m_, 0, all_layers) : all_layers;
    const double L = static_cast<double>(moe_layers);
    const double Ld = static_cast<double>(all_layers - moe_layers);
    const double mtp = static_cast<double>(m_.mtp_layers);
    const double mtp_proj = 2.0 * static_cast<double>(t_.micro_batch_size * t_.seq_length) * 2.0 *
                            static_cast<double>(m_.hidden_size) *
                            static_cast<double>(m_.hidden_size);
    const LayerFlops df =
        Ld > 0 ? layer_flops(dense_table_, t_.micro_batch_size, t_.seq_length) : LayerFlops{};
    // Model FLOPs count causal attention: half the s x s products, as Megatron-LM's
    // num_floating_point_operations does ("causal mask (only half of the mask is non-zero)",
    // megatron/training/training.py) and NeMo / Megatron-Bridge's FLOPs callbacks
    // (causal_self_attn). Hardware FLOPs are what the GPU runs: standard attention computes the
    // masked half too, flash attention skips it, also when it recomputes (docs/flops.md).
    const double full = L * (lf_.forward + lf_.backward_input + lf_.backward_weight) +
                        Ld * (df.forward + df.backward_input + df.backward_weight) +
                        3 * head_fwd_ * (1 + mtp) + 3 * mtp * mtp_proj;
    double masked = L * lf_.causal_masked + Ld * df.causal_masked;
    double masked_forward = L * lf_.causal_masked_forward + Ld * df.causal_masked_forward;
    if (m_.attention_window.enabled()) {
      // Windowed layers skip more of the square: only their window's causal pairs are model
      // FLOPs, and flash attention runs only those (layer_ops.h, attention_keys_fraction);
      // attention is alike in both layer kinds, so the dense table's difference serves every
      // layer.
      Count windowed = 0;
      for (Count i = 0; i < all_layers; ++i) windowed += is_windowed_layer(m_, i);
      const LayerFlops w =
          layer_flops(dense_table_, t_.micro_batch_size, t_.seq_length, &m_.attention_window);
      const LayerFlops f = layer_flops(dense_table_, t_.micro_batch_size, t_.seq_length);
      const double n = static_cast<double>(windowed);
      masked += n * (w.causal_masked - f.causal_masked);
      masked_forward += n * (w.causal_masked_forward - f.causal_masked_forward);
    }
    const double model = full - masked;
    const bool flash = t_.attention == Attention::flash;
    double recompute = 0;
    if (p_.recompute == Recompute::full)
      recompute = L * lf_.forward + Ld * df.forward - (flash ? masked_forward : 0.0);
    if (p_.recompute == Recompute::selective)
      recompute = L * lf_.selective_recompute + Ld * df.selective_recompute;
    if (p_.recompute == Recompute::selective_op)
      recompute = L * lf_.selective_op_recompute + Ld * df.selective_op_recompute;
    e.compute.model_flops_per_step = mbs_per_step * model;
    e.compute.hardware_flops_per_step = mbs_per_step * ((flash ? model : full) + recompute);
  }

  // Fine-tuning's FLOPs: the flows' halves of each layer kind and the adapters' GEMMs; the LM
  // head's input gradient always (the layers below need it), its weight gradient only when it
  // trains. Model FLOPs are what the step must compute (no frozen weight gradient).
  void peft_compute(Estimate& e) {
    head_fwd_ = 2.0 * static_cast<double>(t_.micro_batch_size * t_.seq_length) *
                static_cast<double>(m_.hidden_size) * static_cast<double>(vocab_);
    // Causal attention as compute() counts it: model FLOPs without the masked half of the s x s
    // products; hardware FLOPs with it where standard attention computes it.
    const std::array<Count, 3> n = peft_kind_counts(0, m_.num_layers);
    const bool flash = t_.attention == Attention::flash;
    double full = (peft_head_trains() ? 3 : 2) * head_fwd_, masked = 0, recompute = 0;
    for (int k = kBelow; k <= kAbove; ++k) {
      const PeftKindInfo x = peft_kind(k);
      const double c = static_cast<double>(n[static_cast<std::size_t>(k)]);
      full += c * (x.flops.forward + x.flops.backward_input + x.flops.backward_weight);
      masked += c * x.flops.causal_masked;
      if (!x.flow.any) continue;  // no graph, nothing to recompute
      if (p_.recompute == Recompute::full)
        recompute += c * (x.flops.forward - (flash ? x.flops.causal_masked_forward : 0.0));
      if (p_.recompute == Recompute::selective) recompute += c * x.flops.selective_recompute;
    }
    if (m_.attention_window.enabled()) {
      // Windowed layers skip more of the square (compute()): the whole difference where the
      // layer runs a backward, the forward's where it does not.
      const LayerFlops w =
          layer_flops(table_, t_.micro_batch_size, t_.seq_length, &m_.attention_window);
      const LayerFlops f = layer_flops(table_, t_.micro_batch_size, t_.seq_length);
      const std::array<Count, 3> nw = peft_windowed_counts(0, m_.num_layers, n);
      const double fwd_delta = w.causal_masked_forward - f.causal_masked_forward;
      for (int k = kBelow; k <= kAbove; ++k) {
        const bool backward = peft_kind(k).flow.any;
        const double c = static_cast<double>(nw[static_cast<std::size_t>(k)]);
        masked += c * (backward ? w.causal_masked - f.causal_masked : fwd_delta);
        if (backward && flash && p_.recompute == Recompute::full) recompute -= c * fwd_delta;
      }
    }
    const double model = full - masked;
    const double mbs_per_step = static_cast<double>(nmb_ * p_.dp);
    e.compute.model_flops_per_step = mbs_per_step * model;
    e.compute.hardware_flops_per_step = mbs_per_step * ((flash ? model : full) + recompute);
  }

  // Communication and per-stage costs -----------------------------------------------------------
  // Group sizes and links, computed once per estimate (indexed by Group).
  struct GroupInfo {
    Count size = 1;
    Link link = Link::intra_node;
    double bandwidth = 0;  // achieved, bytes/s
    Seconds latency = 0;
    Bytes max_plain_bytes = 0;  // largest buffer whose ring bytes fit 64-bit arithmetic
  };
  [[nodiscard]] const GroupInfo& group(Group g) const noexcept {
    return groups_[static_cast<std::size_t>(g)];
  }
  void init_groups() noexcept {
    const ClusterSpec& c = s_.cluster;
    for (Group g : {Group::dp, Group::dp_replicate, Group::tp, Group::pp, Group::embedding,
                    Group::cp, Group::ep, Group::edp, Group::etp}) {
      GroupInfo& x = groups_[static_cast<std::size_t>(g)];
      x.size = group_size(s_, g);
      x.link = group_link(s_, g);
      const bool intra = x.link == Link::intra_node;
      x.bandwidth = (intra ? c.intra_node_bandwidth : c.inter_node_bandwidth) *
                    s_.assumptions.communication_efficiency;
      x.latency = intra ? c.intra_node_latency : c.inter_node_latency;
      x.max_plain_bytes = std::numeric_limits<Bytes>::max() / (2 * x.size);
    }
  }

  // Alpha-beta time of `calls` calls with buffer `bytes` (docs/communication.md).
  [[nodiscard]] Seconds collective_seconds(Group g, CollectiveOp op, Bytes bytes,
                                           Count calls) const {
    const GroupInfo& x = group(g);
    const Count n = x.size;
    if (n <= 1 || calls == 0) return 0;
    const double wire = static_cast<double>(ring_wire_bytes(op, bytes, n));
    return static_cast<double>(calls) *
           (latency_steps(x, op) * x.latency + transfer_seconds(x, wire, bytes));
  }

  // Latency steps of one call: the ring's 2(n-1) for all-reduce, n-1 for reduce-scatter and
  // all-gather, 1 for p2p. Across nodes NCCL runs all-reduce on a double binary tree when its
  // tuning model finds it faster (NCCL >= 2.4, "Massively Scale Your Deep Learning Training with
  // NCCL 2.4"): 2·ceil(log2 n) steps (reduce up, broadcast down) with the same bus bytes, which
  // is fewer steps for n >= 3; `tree_all_reduce` false (NCCL_ALGO=Ring) keeps the ring.
  [[nodiscard]] double latency_steps(const GroupInfo& x, CollectiveOp op) const noexcept {
    const Count n = x.size;
    if (op == CollectiveOp::send_recv) return 1.0;
    if (op != CollectiveOp::all_reduce) return static_cast<double>(n - 1);
    const double ring = 2.0 * static_cast<double>(n - 1);
    if (!s_.assumptions.tree_all_reduce || x.link != Link::inter_node) return ring;
    return std::min(ring, 2.0 * std::ceil(std::log2(static_cast<double>(n))));
  }

  // Achieved bus bandwidth for a buffer of `bytes`: the link rate times the large-message
  // efficiency times S / (S + S_half) -- small messages do not fill NCCL's pipeline (nccl-tests
  // bus bandwidth curves rise with size and saturate; docs/communication.md).
  // Seconds to move `wire` bytes at that bandwidth (one division: the estimate's hot path).
  [[nodiscard]] double transfer_seconds(const GroupInfo& x, double wire,
                                        Bytes bytes) const noexcept {
    const double b = static_cast<double>(bytes);
    return wire * (b + static_cast<double>(s_.assumptions.nccl_half_bandwidth_bytes)) /
           (x.bandwidth * b);
  }

  // Hands one collective to `out`, a callable taking const Collective& (it may store it, or only
  // add up its figures).
  template <typename Sink>
  void add(Sink& out, Group g, CollectiveOp op, Traffic what, Bytes bytes, Count calls) const {
    const GroupInfo& x = group(g);
    const Count n = x.size;
    if (n <= 1 || calls <= 0 || bytes <= 0) return;
    Collective c;
    c.group = g;
    c.op = op;
    c.link = x.link;
    c.purpose = what;
    c.group_size = n;
    c.bytes_per_call = bytes;
    c.calls_per_step = calls;
    // Exact ring bytes; plain 64-bit arithmetic when it cannot overflow (the common case).
    const Bytes wire = bytes <= x.max_plain_bytes
                           ? (op == CollectiveOp::all_reduce  ? bytes * 2 * (n - 1) / n
                              : op == CollectiveOp::send_recv ? bytes
                                                              : bytes * (n - 1) / n)
                           : ring_wire_bytes(op, bytes, n);
    c.wire_bytes_per_gpu_per_step = mul_bytes(wire, calls, "/training/global_batch_size",
                                              "the bytes of one collective per step");
    c.seconds_per_step =
        static_cast<double>(calls) *
        (latency_steps(x, op) * x.latency + transfer_seconds(x, static_cast<double>(wire), bytes));
    out(c);
  }

  // TP collectives of one micro-batch through one layer (Korthikanti et al. 2022, sec. 4.2.2):
  // without SP, g (all-reduce) after attention_out and mlp_out forward, and f's all-reduce of the
  // input gradients of qkv and mlp_in backward. With SP, each all-reduce becomes an all-gather
  // and a reduce-scatter, and backward all-gathers the saved sharded inputs of qkv and mlp_in
  // again. Full recompute replays the forward collectives in backward.
  struct TpCalls {
    Count all_reduce = 0, all_gather = 0, reduce_scatter = 0;
    Count fwd_all_reduce = 0, fwd_all_gather = 0, fwd_reduce_scatter = 0;
  };
  // A MoE layer without shared experts has no tensor-parallel MLP: its tokens stay in their
  // sequence-parallel shards and reach the experts by the ep all-to-all (Megatron-Core's
  // MoEAlltoAllTokenDispatcher with etp = 1), so only the attention block's collectives remain.
  [[nodiscard]] TpCalls tp_layer_calls(bool moe_layer = true) const noexcept {
    TpCalls c;
    const bool full = p_.recompute == Recompute::full;
    const Count blocks = moe_layer && moe_.enabled() && m_.moe.num_shared_experts == 0 ? 1 : 2;
    const Count replay = full ? blocks : 0;
    if (!p_.sequence_parallel) {
      c.fwd_all_reduce = blocks;
      c.all_reduce = 2 * blocks + replay;
    } else {
      c.fwd_all_gather = blocks;
      c.fwd_reduce_scatter = blocks;
      c.all_gather = 3 * blocks + replay;
      c.reduce_scatter = 2 * blocks + replay;
    }
    // MLA's attention block carries its latents, not h, on its input side (tp_latent_calls).
    const TpCalls l = tp_latent_calls();
    c.all_reduce -= l.all_reduce;
    c.all_gather -= l.all_gather;
    c.fwd_all_gather -= l.fwd_all_gather;
    c.reduce_scatter -= l.reduce_scatter;
    return c;
  }
  // MLA (layer_ops.cpp, add_mla_projections): the attention block's input-side collectives move
  // the latents the up-projections read, not the hidden states. Under sequence parallelism the
  // normed query latent and kv latent are all-gathered by their TELayerNormColumnParallelLinear and
  // the rotary key part by gather_from_sequence_parallel_region (forward, again for the weight
  // gradients in backward, and in a full-recompute replay), their input gradients
  // reduce-scattered; without it the column-parallel up-projections' input gradients are
  // all-reduced. Counted as one collective of the three widths together (tp_latent_bytes).
  [[nodiscard]] TpCalls tp_latent_calls() const noexcept {
    TpCalls c;
    if (!m_.mla.enabled()) return c;
    const Count replay = p_.recompute == Recompute::full ? 1 : 0;
    if (!p_.sequence_parallel) {
      c.all_reduce = 1;
    } else {
      c.fwd_all_gather = 1;
      c.all_gather = 2 + replay;
      c.reduce_scatter = 1;
    }
    return c;
  }
  // One micro-batch's MLA latents: q_lora_rank (h without a query rank: linear_q_proj reads the
  // hidden states) + kv_lora_rank + qk_rope_head_dim per token, in the compute dtype.
  [[nodiscard]] Bytes tp_latent_bytes() const noexcept {
    const MlaSpec& x = m_.mla;
    const Count q = x.q_lora_rank > 0 ? x.q_lora_rank : m_.hidden_size;
    return act_tokens() * (q + x.kv_lora_rank + x.qk_rope_head_dim) * cb();
  }

  // Context-parallel exchanges of one layer's attention for one micro-batch (Transformer Engine
  // context_parallel.py, as Megatron-Core --cp-comm-type runs them; the local K and V are
  // b·(s/cp)·2·kv_hidden/t elements):
  // - p2p (AttnFuncWithCPAndKVP2P): a ring of cp - 1 steps, each sending the KV chunk on; the
  //   backward circulates KV and the KV gradients.
  // - all_gather (AttnFuncWithCPAndKVAllGather; Llama 3, Grattafiori et al. 2024, sec. 3.3.2):
  //   the whole sequence's K and V all-gathered, again in the backward, whose dK, dV are
  //   reduce-scattered.
  // - a2a (AttnFuncWithCPAndQKVOA2A; DeepSpeed-Ulysses, Jacobs et al. 2023): q, k and v
  //   all-to-all from sequence to head sharding before attention and the output back; the
  //   backward mirrors it (dO in; dQ, dK, dV out).
  // Full recompute replays the forward's exchanges in the backward.
  struct CpCall {
    CollectiveOp op = CollectiveOp::send_recv;
    Traffic what = Traffic::cp_kv;
    Bytes bytes = 0;
    Count calls = 0;          // per layer per micro-batch
    Count forward_calls = 0;  // of `calls`, in the forward (before any recompute replay)
  };
  struct CpCalls {
    std::array<CpCall, 3> calls{};
  };
  [[nodiscard]] Bytes cp_kv_bytes() const noexcept {
    // Keys and values together (MLA: every head's, of d_qk and d_v).
    return act_tokens() * (m_.attention_k_width() + m_.attention_v_width()) / p_.tp * cb();
  }
  [[nodiscard]] CpCalls cp_layer_calls() const noexcept {
    CpCalls x;
    const Count n = p_.cp;
    const Count replay = p_.recompute == Recompute::full ? 1 : 0;
    const Bytes kv = cp_kv_bytes();
    switch (p_.cp_comm) {
      case CpComm::p2p:
        x.calls[0] = {CollectiveOp::send_recv, Traffic::cp_ring_kv, kv, (n - 1) * (2 + replay),
                      (n - 1)};
        x.calls[1] = {CollectiveOp::send_recv, Traffic::cp_ring_kv_gradients, kv, n - 1, 0};
        break;
      case CpComm::all_gather:
        x.calls[0] = {CollectiveOp::all_gather, Traffic::cp_kv, n * kv, 2 + replay, 1};
        x.calls[1] = {CollectiveOp::reduce_scatter, Traffic::cp_kv_gradients, n * kv, 1, 0};
        break;
      case CpComm::a2a: {
        // Query width heads × head_dim (q_hidden: not hidden_size when head_dim is explicit).
        // MLA's outputs (d_v) are narrower than its queries (d_qk): the mean of the two is the
        // exact total of the four exchanges, and k and v alike below.
        const Bytes q =
            act_tokens() * ((m_.attention_q_width() + m_.attention_out_width()) / 2) / p_.tp * cb();
        // q and the output (forward), dO and dQ (backward): Transformer Engine >= 2.9's
        // AttnFuncWithCPAndQKVOA2A saves the head-sharded output and exchanges only dO before
        // the attention backward (context_parallel.py; NVIDIA/TransformerEngine#2012), as
        // DeepSpeed-Ulysses' DistributedAttention does (the backward of its _SeqAllToAll of the
        // output and of q); k and v, then dK and dV.
        x.calls[0] = {CollectiveOp::all_to_all, Traffic::cp_a2a_queries_outputs, q, 4 + 2 * replay,
                      2};
        x.calls[1] = {CollectiveOp::all_to_all, Traffic::cp_a2a_kv, kv / 2, 4 + 2 * replay, 2};
        break;
      }
    }
    return x;
  }
  // Seconds of one layer's context-parallel exchanges for one micro-batch on the critical path:
  // forward and backward (with any recompute replay). Ring steps hide behind the attention of the
  // step (1/cp of the layer's attention each, the chunks being balanced), as Transformer Engine
  // overlaps each send with the previous chunk's flash attention; the all-gather and the
  // all-to-alls are exposed (the attention needs their result).
  struct CpSeconds {
    double forward = 0, backward = 0;
  };
  [[nodiscard]] CpSeconds cp_layer_seconds(const PassCosts& layer) const {
    CpSeconds out;
    if (p_.cp <= 1) return out;
    const double slowdown = s_.assumptions.overlap_compute_slowdown;
    auto hide = [slowdown](double comm, double window) {
      return std::max(0.0, comm - window) + slowdown * std::min(comm, window);
    };
    const bool replay = p_.recompute == Recompute::full;
    if (p_.cp_comm == CpComm::p2p) {
      const double steps = static_cast<double>(p_.cp - 1);
      const double cpd = static_cast<double>(p_.cp);
      const Bytes kv = cp_kv_bytes();
      const double fwd_step = collective_seconds(Group::cp, CollectiveOp::send_recv, kv, 1);
      const double bwd_step = collective_seconds(Group::cp, CollectiveOp::send_recv, kv, 2);
      out.forward = steps * hide(fwd_step, layer.attention_forward / cpd);
      out.backward = steps * hide(bwd_step, layer.attention_backward / cpd);
      if (replay) out.backward += out.forward;
      return out;
    }
    for (const CpCall& c : cp_layer_calls().calls) {
      if (c.calls == 0) continue;
      const double one = collective_seconds(Group::cp, c.op, c.bytes, 1);
      out.forward += static_cast<double>(c.forward_calls) * one;
      out.backward += static_cast<double>(c.calls - c.forward_calls) * one;
    }
    return out;
  }

  // `chunk`: only one chunk's units (its layers, and the embedding or LM head it holds), for
  // that chunk's share of the in-pass collectives; the pipeline's sends are left out.
  template <typename Sink>
  void stage_collectives(int st, Sink& out, const StageUnits* chunk = nullptr) const {
    const StageUnits u = chunk ? *chunk : units(st);
    const Count m = stage_passes(p_.schedule, nmb_);  // whole-stage passes per step (layout.h)
    const Count v = p_.virtual_stages;
    const Count pp = p_.pp;
    const Count S = shard();
    const Bytes act = hidden_bytes();
    // A MoE model's dense-MLP layers are layer units as well (the same names).
    const Unit* all_units[] = {&u.layer, &u.dense_layer, &u.embedding, &u.head};
    // Their ids, in the order of all_units.
    static constexpr ParamUnit kUnit[] = {ParamUnit::layers, ParamUnit::layers,
                                          ParamUnit::embedding, ParamUnit::head};
    auto grads = [](int i) { return unit_traffic(UnitTraffic::gradients, kUnit[i]); };
    auto params = [](int i) { return unit_traffic(UnitTraffic::parameters, kUnit[i]); };
    auto gathers = [](int i) {
      return unit_traffic(UnitTraffic::gather_forward_backward, kUnit[i]);
    };

    // Data parallel / ZeRO, unit by unit (docs/communication.md); fine-tuning reduces only what
    // trains (peft_collectives).
    if (t_.peft.enabled()) peft_collectives(st, m, out);
    for (int i = 0; i < 4 && !t_.peft.enabled(); ++i) {
      const Unit& x = *all_units[i];
      if (x.count == 0) continue;
      const Bytes full_g = padded(x.params) * gb();
      const Bytes full_w = padded(x.params) * cb();
      switch (p_.zero_stage) {
        case 0:
          add(out, Group::dp, CollectiveOp::all_reduce, grads(i), full_g, x.count);
          break;
        case 1:
          add(out, Group::dp, CollectiveOp::reduce_scatter, grads(i), full_g, x.count);
          add(out, Group::dp, CollectiveOp::all_gather, params(i), full_w, x.count);
          break;
        case 2:
          add(out, Group::dp, CollectiveOp::reduce_scatter, grads(i), full_g, x.count * m);
          add(out, Group::dp, CollectiveOp::all_gather, params(i), full_w, x.count);
          break;
        default:
          add(out, Group::dp, CollectiveOp::all_gather, gathers(i), full_w, 2 * x.count * m);
          add(out, Group::dp, CollectiveOp::reduce_scatter, grads(i), full_g, x.count * m);
          break;
      }
      if (p_.zero_stage > 0) {
        // Hybrid sharding: shards are all-reduced across the replicas once per step.
        add(out, Group::dp_replicate, CollectiveOp::all_reduce, grads(i),
            ceil_div(x.params, S) * gb(), x.count);
      }
    }

    // MoE (docs/communication.md, "Expert parallel"): each layer's routed experts are a unit of
    // their own, reduced (and ZeRO-sharded) over the expert data-parallel group apart from the
    // dense part; validation keeps ZeRO-3 and hybrid sharding away from MoE models.
    if (moe_.enabled() && u.layer.count > 0) {
      const Count unit = expert_unit_elements();
      const Bytes eg = unit * gb(), ew = unit * cb();
      const Count n = u.layer.count;
      switch (p_.zero_stage) {
        case 0:
          add(out, Group::edp, CollectiveOp::all_reduce,
              unit_traffic(UnitTraffic::gradients, ParamUnit::experts), eg, n);
          break;
        case 1:
          add(out, Group::edp, CollectiveOp::reduce_scatter,
              unit_traffic(UnitTraffic::gradients, ParamUnit::experts), eg, n);
          add(out, Group::edp, CollectiveOp::all_gather,
              unit_traffic(UnitTraffic::parameters, ParamUnit::experts), ew, n);
          break;
        case 2:
          add(out, Group::edp, CollectiveOp::reduce_scatter,
              unit_traffic(UnitTraffic::gradients, ParamUnit::experts), eg, n * m);
          add(out, Group::edp, CollectiveOp::all_gather,
              unit_traffic(UnitTraffic::parameters, ParamUnit::experts), ew, n);
          break;
        default:
          // ZeRO-3 / FSDP of the experts over the expert data-parallel group (torchtitan's
          // FSDP on the dp_shard_mod_ep mesh, Megatron-FSDP's expert shards): each layer's
          // experts gathered before its forward and again before its backward, their gradients
          // reduce-scattered after each backward.
          add(out, Group::edp, CollectiveOp::all_gather,
              unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::experts), ew,
              2 * n * m);
          add(out, Group::edp, CollectiveOp::reduce_scatter,
              unit_traffic(UnitTraffic::gradients, ParamUnit::experts), eg, n * m);
          break;
      }
      // Token all-to-alls per layer and micro-batch (Megatron-Core's MoEAlltoAllTokenDispatcher,
      // the names the training backend records): dispatch and combine forward, their gradients
      // backward; a full-recompute replay repeats the forward pair.
      const Count forward = p_.recompute == Recompute::full ? 2 : 1;
      add(out, Group::ep, CollectiveOp::all_to_all, Traffic::dispatch_forward,
          moe_.all_to_all_bytes, forward * n * m);
      add(out, Group::ep, CollectiveOp::all_to_all, Traffic::combine_forward, moe_.all_to_all_bytes,
          forward * n * m);
      add(out, Group::ep, CollectiveOp::all_to_all, Traffic::combine_backward,
          moe_.all_to_all_bytes, n * m);
      add(out, Group::ep, CollectiveOp::all_to_all, Traffic::dispatch_backward,
          moe_.all_to_all_bytes, n * m);
      // Expert tensor parallelism (Megatron-Core MoEAlltoAllTokenDispatcher, steps (4) and (5):
      // AG(TP) after the dispatch all-to-all, RS(TP) before the combine, over the expert-TP
      // group): the etp ranks of an expert gather the tokens each received, and reduce-scatter
      // the experts' partial outputs back; the backward runs the converse. Buffers are the
      // gathered tokens, etp times one rank's received copies (even routing).
      const Bytes gathered = etp_gather_bytes();
      add(out, Group::etp, CollectiveOp::all_gather, Traffic::expert_tokens_forward, gathered,
          forward * n * m);
      add(out, Group::etp, CollectiveOp::reduce_scatter, Traffic::expert_outputs_forward, gathered,
          forward * n * m);
      add(out, Group::etp, CollectiveOp::all_gather, Traffic::expert_output_gradients_backward,
          gathered, n * m);
      add(out, Group::etp, CollectiveOp::reduce_scatter, Traffic::expert_token_gradients_backward,
          gathered, n * m);
    }

    // Sequence parallel: parameters replicated across TP ranks (norms, row-parallel biases,
    // learned positions) see only this rank's tokens, so their gradients are all-reduced over the
    // TP group, one call per unit, when the unit's gradient is reduced (Megatron-LM's
    // all-reduce of sequence-parallel gradients).
    if (p_.sequence_parallel && p_.tp > 1) {
      const Count per_dp_reduction = p_.zero_stage >= 2 ? m : 1;
      for (int i = 0; i < 4; ++i) {
        const Unit& x = *all_units[i];
        if (x.count == 0) continue;
        const Count replicated = i == 0   ? layer_replicated_
                                 : i == 1 ? dense_replicated_
                                 : i == 2 ? embedding_replicated()
                                          : head_replicated();

        add(out, Group::tp, CollectiveOp::all_reduce,
            unit_traffic(UnitTraffic::sp_gradients, kUnit[i]), replicated * gb(),
            x.count * per_dp_reduction);
      }
    }

    // Tensor parallel: per layer of each kind.
    const TpCalls c = tp_layer_calls(true);
    const TpCalls cd = tp_layer_calls(false);
    const Count L = u.layer.count;
    const Count Ld = u.dense_layer.count;
    add(out, Group::tp, CollectiveOp::all_reduce, Traffic::layer_activations, act,
        (c.all_reduce * L + cd.all_reduce * Ld) * m);
    add(out, Group::tp, CollectiveOp::all_gather, Traffic::layer_activations, act,
        (c.all_gather * L + cd.all_gather * Ld) * m);
    add(out, Group::tp, CollectiveOp::reduce_scatter, Traffic::layer_activations, act,
        (c.reduce_scatter * L + cd.reduce_scatter * Ld) * m);
    if (m_.mla.enabled()) {
      const TpCalls l = tp_latent_calls();
      const Bytes lat = tp_latent_bytes();
      add(out, Group::tp, CollectiveOp::all_reduce, Traffic::attention_latents, lat,
          l.all_reduce * (L + Ld) * m);
      add(out, Group::tp, CollectiveOp::all_gather, Traffic::attention_latents, lat,
          l.all_gather * (L + Ld) * m);
      add(out, Group::tp, CollectiveOp::reduce_scatter, Traffic::attention_latents, lat,
          l.reduce_scatter * (L + Ld) * m);
    }
    if (u.embedding.count > 0) {
      // Vocab-parallel embedding: partial lookups summed (all-reduce, or reduce-scatter into the
      // sequence-parallel region).
      add(out, Group::tp,
          p_.sequence_parallel ? CollectiveOp::reduce_scatter : CollectiveOp::all_reduce,
          Traffic::embedding_output, act, m);
      // Under SP the reduce-scatter's backward all-gathers the output gradient.
      if (p_.sequence_parallel) {
        add(out, Group::tp, CollectiveOp::all_gather, Traffic::embedding_output_gradient, act, m);
      }
    }
    if (u.head.count > 0) {
      if (p_.sequence_parallel) {
        // Gather the final norm's output for the vocab-parallel LM head; in backward, gather it
        // again and reduce-scatter its gradient.
        add(out, Group::tp, CollectiveOp::all_gather, Traffic::head_input, act, 2 * m);
        add(out, Group::tp, CollectiveOp::reduce_scatter, Traffic::head_input_gradient, act, m);
      } else {
        add(out, Group::tp, CollectiveOp::all_reduce, Traffic::head_input_gradient, act, m);
      }
      // Vocab-parallel cross-entropy: max, target logit and sum of exponentials, fp32 per token.
      add(out, Group::tp, CollectiveOp::all_reduce, Traffic::cross_entropy_statistics,
          act_tokens() * 4, 3 * m);
    }

    // Context parallel, per layer and micro-batch (docs/communication.md, "Context parallel").
    if (p_.cp > 1) {
      const CpCalls x = cp_layer_calls();
      for (const CpCall& call : x.calls) {
        if (call.calls > 0)
          add(out, Group::cp, call.op, call.what, call.bytes, call.calls * (L + Ld) * m);
      }
    }

    // Pipeline: activations forward to the next chunk, gradients back to the previous one.
    if (pp > 1 && chunk == nullptr) {
      const Bytes p2p = p2p_bytes();
      // Every chunk sends to the next virtual stage but the last; under a V the last is on
      // stage 0 and the turn at stage pp - 1 stays on the GPU (layout.h, virtual_stage_of).
      // DualPipe's two directions: the same count of m/2 passes each (stage 0 sends chunk 0's
      // activations and chunk 1's gradients, stage pp - 1 the other way).
      const bool vee = two_chunks(p_.schedule);
      const Count fwd_sends =
          vee ? m * (2 - (st == 0) - (st == pp - 1)) : (st == pp - 1 ? m * (v - 1) : m * v);
      const Count bwd_sends = vee ? fwd_sends : (st == 0 ? m * (v - 1) : m * v);
      add(out, Group::pp, CollectiveOp::send_recv, Traffic::activations_forward, p2p, fwd_sends);
      add(out, Group::pp, CollectiveOp::send_recv, Traffic::gradients_backward, p2p, bwd_sends);
      if (scatter_gather_p2p() && !p_.sequence_parallel) {
        // Scatter/gather: each TP rank sends 1/t of the replicated activation; the receivers
        // all-gather it over NVLink (Narayanan et al. 2021, sec. 4.1). One gather per receive
        // (under a V a stage receives as often as it sends).
        const Count fwd_recvs = vee ? fwd_sends : (st == 0 ? m * (v - 1) : m * v);
        const Count bwd_recvs = vee ? bwd_sends : (st == pp - 1 ? m * (v - 1) : m * v);
        add(out, Group::tp, CollectiveOp::all_gather, Traffic::pipeline_receives, act,
            fwd_recvs + bwd_recvs);
      }
      if (bidirectional(p_.schedule)) {
        // DualPipe keeps two copies of every model stage (on stages s and pp - 1 - s): once per
        // step each stage sends its gradients to the other copy's stage and adds what it
        // receives (deepseek-ai/DualPipe examples/example_dualpipe.py sums p0.grad and the
        // mirror's p1.grad, parameter by parameter), before the data-parallel reduction (ZeRO
        // 0/1: full gradients). One send per unit, as the data-parallel reduction goes.
        for (const Unit* x : {&u.layer, &u.dense_layer, &u.embedding, &u.head})
          add(out, Group::pp, CollectiveOp::send_recv, Traffic::mirror_gradients,
              padded(x->params) * gb(), x->count);
        // A MoE layer's routed experts on this rank are a unit of their own; the mirror stage
        // holds the same experts (same ep rank) of the same layers.
        if (moe_.enabled()) {
          add(out, Group::pp, CollectiveOp::send_recv, Traffic::mirror_gradients,
              expert_unit_elements() * gb(), u.layer.count);
        }
      }
      // The last stage's copy of the word embedding (the tied LM head, or the MTP modules'
      // embedding: memory_terms.h, mtp_head_parameters) sums its gradient with the first
      // stage's over the embedding group (Megatron-Core's embedding group holds the MTP ranks).
      if ((m_.tied_embeddings || m_.mtp_layers > 0) && head_stage(p_.schedule, pp) != 0 &&
          (st == 0 || st == pp - 1) && peft_embedding_trains(t_.peft)) {
        add(out, Group::embedding, CollectiveOp::all_reduce,
            m_.tied_embeddings ? Traffic::tied_embedding_gradients
                               : Traffic::mtp_embedding_gradients,
            vocab_ * m_.hidden_size / p_.tp * gb(), 1);
      }
    }
  }

  // Fine-tuning's data-parallel collectives (docs/peft.md, "Communication"): gradients and the
  // ZeRO-1/2 parameter gathers move the trainable part of each unit only (PEFT + DDP / FSDP /
  // DeepSpeed reduce the parameters that require grad; a layer's adapters are a unit of their
  // own, "adapters"); ZeRO-3 gathers the frozen part as well, for the forward and, where a
  // backward passes the unit, again for it.
  template <typename Sink>
  void peft_collectives(int st, Count m, Sink& out) const {
    const StageUnits su = units(st);
    const StageUnitParams up = unit_params(st);
    const PeftUnits x = peft_units(s_, table_, p_.tp, p_.zero_stage, up);
    const bool adapters = t_.peft.adapters();
    const bool below_backward = peft_kind(kBelow).flow.any;
    const bool emb_backward = peft_embedding_trains(t_.peft);
    struct Part {
      Traffic grads, params, gather;
      Count trainable = 0;
      Bytes frozen_gathered = 0;
      Count count = 0;
      bool backward = true;
    };
    const Count S = shard();
    PeftUnit adapter_unit;  // the adapters of a layer, as their own unit
    adapter_unit.trainable = adapters ? x.trained_layer.trainable : 0;
    const PeftUnit& layer_base = x.trained_layer;
    const Part parts[] = {
        // The trained layers' own units (their frozen base under LoRA).
        {unit_traffic(UnitTraffic::gradients, ParamUnit::layers),
         unit_traffic(UnitTraffic::parameters, ParamUnit::layers),
         unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::layers),
         adapters ? 0 : layer_base.trainable, layer_base.frozen_gathered(S), x.trained_layers,
         true},
        {unit_traffic(UnitTraffic::gradients, ParamUnit::adapters),
         unit_traffic(UnitTraffic::parameters, ParamUnit::adapters),
         unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::adapters),
         adapter_unit.trainable, 0, adapters ? x.trained_layers : 0, true},
        // The frozen layers below: nothing trains (grads and params are never sent).
        {unit_traffic(UnitTraffic::gradients, ParamUnit::layers),
         unit_traffic(UnitTraffic::parameters, ParamUnit::layers),
         below_backward ? unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::layers)
                        : unit_traffic(UnitTraffic::gather_forward, ParamUnit::layers),
         0, x.frozen_layer.frozen_gathered(S), x.frozen_layers, below_backward},
        {unit_traffic(UnitTraffic::gradients, ParamUnit::embedding),
         unit_traffic(UnitTraffic::parameters, ParamUnit::embedding),
         emb_backward ? unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::embedding)
                      : unit_traffic(UnitTraffic::gather_forward, ParamUnit::embedding),
         x.embedding.trainable, x.embedding.frozen_gathered(S), su.embedding.count, emb_backward},
        {unit_traffic(UnitTraffic::gradients, ParamUnit::head),
         unit_traffic(UnitTraffic::parameters, ParamUnit::head),
         unit_traffic(UnitTraffic::gather_forward_backward, ParamUnit::head), x.head.trainable,
         x.head.frozen_gathered(S), su.head.count, true}};
    for (const Part& h : parts) {
      if (h.count == 0) continue;
      const Bytes full_g = padded(h.trainable) * x.gradient;
      const Bytes full_w = padded(h.trainable) * x.weight;
      const bool trains = h.trainable > 0;
      switch (p_.zero_stage) {
        case 0:
          if (trains) add(out, Group::dp, CollectiveOp::all_reduce, h.grads, full_g, h.count);
          break;
        case 1:
        case 2:
          if (!trains) break;
          add(out, Group::dp, CollectiveOp::reduce_scatter, h.grads, full_g,
              h.count * (p_.zero_stage == 2 ? m : 1));
          add(out, Group::dp, CollectiveOp::all_gather, h.params, full_w, h.count);
          break;
        default:
          add(out, Group::dp, CollectiveOp::all_gather, h.gather, h.frozen_gathered + full_w,
              (h.backward ? 2 : 1) * h.count * m);
          if (trains)
            add(out, Group::dp, CollectiveOp::reduce_scatter, h.grads, full_g, h.count * m);
          break;
      }
      if (p_.zero_stage > 0 && trains) {
        add(out, Group::dp_replicate, CollectiveOp::all_reduce, h.grads,
            ceil_div(h.trainable, S) * x.gradient, h.count);
      }
    }
  }
  // The tokens the etp ranks of an expert group gather after the all-to-all (and reduce-scatter
  // back): etp times the copies one rank receives under even routing.
  [[nodiscard]] Bytes etp_gather_bytes() const noexcept {
    return p_.etp > 1 ? p_.etp * moe_.all_to_all_bytes : 0;
  }

  // The first layer of stage `st` (v = 1; 0 under virtual stages, where frozen_layers is 0).
  [[nodiscard]] Count stage_first_layer(int st) const noexcept {
    if (p_.virtual_stages != 1) return 0;
    Count first = 0;
    for (int i = 0; i < st; ++i) first += layers_[static_cast<std::size_t>(i)];
    return first;
  }

  // Elements of one MoE layer's routed-experts unit on a rank: its expert parameters, padded to
  // a multiple of the expert data-parallel group under ZeRO (the unit is sharded over it).
  [[nodiscard]] Count expert_unit_elements() const {
    const Count edp = group(Group::edp).size;
    return p_.zero_stage == 0 ? moe_.expert_params : ceil_div(moe_.expert_params, edp) * edp;
  }

  // Bytes one GPU sends per pipeline transfer: the activation, or its 1/t share when it is
  // sharded along the sequence (SP) or scattered across the TP ranks.
  [[nodiscard]] bool scatter_gather_p2p() const noexcept {
    return p_.tp > 1 && s_.assumptions.p2p_scatter_gather;
  }
  [[nodiscard]] Bytes p2p_bytes() const noexcept {
    return p_.sequence_parallel || scatter_gather_p2p() ? hidden_bytes() / p_.tp : hidden_bytes();
  }

  // The op costs of one layer, the embedding and the head: a pure function of the model, the
  // micro-batch shape, tp, SP and the device figures. A search estimates many layouts that share
  // these (they differ in pp, dp, ZeRO, schedule, recompute), so each thread keeps the last two
  // (SP off and on); any change of an input recomputes them.
  struct OpCosts {
    std::array<double, 41> key{};
    bool valid = false;
    PassCosts layer, dense_layer, embedding, head;
    PassCosts window_delta;  // a windowed layer's costs less a full-attention layer's
  };
  [[nodiscard]] const OpCosts& op_costs(const DeviceRates& r) const {
    const ModelSpec& m = m_;
    // A MoE model's table differs from a dense one's of the same shape (planner_layer_table):
    // its experts and shared experts are in the key.
    const std::array<double, 41> key = {
        r.fp8_peak,
        r.fp8_gemm_efficiency,
        static_cast<double>(r.fp8_recipe),
        static_cast<double>(r.kernels),
        static_cast<double>(mixed()),
        static_cast<double>(m.attention_window.size),
        static_cast<double>(m.attention_window.kind),
        static_cast<double>(m.sandwich_norm) + 2.0 * static_cast<double>(m.attention_sinks),
        m.final_logit_softcap,
        static_cast<double>(m.moe.num_experts),
        static_cast<double>(m.moe.num_shared_experts * m.moe.shared_expert_ffn_hidden_size),
        static_cast<double>(p_.cp),
        static_cast<double>(m.hidden_size),
        static_cast<double>(m.num_attention_heads),
        static_cast<double>(m.num_kv_heads),
        static_cast<double>(m.ffn_hidden_size),
        static_cast<double>(vocab_),
        static_cast<double>(m.mlp),
        static_cast<double>(m.norm),
        static_cast<double>(m.position_embedding),
        static_cast<double>(m.bias),
        static_cast<double>(t_.micro_batch_size),
        static_cast<double>(t_.seq_length),
        static_cast<double>(t_.precision),
        static_cast<double>(t_.attention),
        t_.dropout,
        static_cast<double>(p_.tp),
        static_cast<double>(p_.sequence_parallel),
        r.peak,
        r.gemm_efficiency,
        r.k_overhead,
        r.sms,
        r.hbm,
        r.launch,
        r.flash_forward,
        r.flash_backward,
        static_cast<double>(r.element_bytes),
        static_cast<double>(m.max_position_embeddings),
        static_cast<double>(m.explicit_head_dim),
        static_cast<double>(m.qk_norm),
        static_cast<double>(m.embedding_norm)};
    thread_local std::array<OpCosts, 2> memo;
    OpCosts& c = memo[p_.sequence_parallel ? 1 : 0];
    if (!c.valid || c.key != key) {
      const bool sp = p_.sequence_parallel;
      const TrainingSpec local = local_training();
      c.layer = layer_pass_costs(table_, m_, t_, p_.tp, sp, r, p_.cp);
      c.dense_layer =
          mixed() ? layer_pass_costs(dense_table_, m_, t_, p_.tp, sp, r, p_.cp) : PassCosts{};
      c.window_delta = PassCosts{};
      if (m_.attention_window.enabled()) {
        const PassCosts w = layer_pass_costs(table_, m_, t_, p_.tp, sp, r, p_.cp, true);
        PassCosts& d = c.window_delta;
        d.forward = w.forward - c.layer.forward;
        d.backward_input = w.backward_input - c.layer.backward_input;
        d.backward_weight = w.backward_weight - c.layer.backward_weight;
        d.selective_recompute = w.selective_recompute - c.layer.selective_recompute;
        d.selective_op_recompute = w.selective_op_recompute - c.layer.selective_op_recompute;
        d.attention_forward = w.attention_forward - c.layer.attention_forward;
        d.attention_backward = w.attention_backward - c.layer.attention_backward;
      }
      c.embedding = embedding_pass_costs(m_, local, p_.tp, sp, r);
      c.head = head_pass_costs(m_, local, vocab_, p_.tp, sp, r);
      c.key = key;
      c.valid = true;
    }
    return c;
  }

  void communication_and_costs(Estimate& e) {
    const Count pp = p_.pp;
    const DeviceRates rates = device_rates(s_);
    const OpCosts& oc = op_costs(rates);
    const PassCosts& layer = oc.layer;
    const PassCosts& emb = oc.embedding;
    const PassCosts& head = oc.head;
    const PassCosts routed = moe_pass_costs(m_, moe_, rates);
    const double slowdown = s_.assumptions.overlap_compute_slowdown;
    Bytes best = -1;
    int busiest = 0;
    e.stage_costs.resize(static_cast<std::size_t>(pp));
    const Count m = stage_passes(p_.schedule, nmb_);  // whole-stage passes per step (layout.h)
    for (int st = 0; st < pp; ++st) {
      // Middle stages whose chunks hold as many layers of each kind as the previous middle
      // stage's cost exactly the same.
      if (st > 1 && st < pp - 1 && t_.peft.frozen_layers == 0 &&
          chunk_kinds_[static_cast<std::size_t>(st)] ==
              chunk_kinds_[static_cast<std::size_t>(st - 1)]) {
        e.stage_costs[static_cast<std::size_t>(st)] =
            e.stage_costs[static_cast<std::size_t>(st - 1)];
        continue;
      }
      Bytes wire = 0;
      StageCosts& k = e.stage_costs[static_cast<std::size_t>(st)];
      Seconds tp_total = 0;
      // Add up this stage's figures; only the busiest stage's list is kept (below).
      auto tally = [&](const Collective& c) {
        wire = add_bytes(wire, c.wire_bytes_per_gpu_per_step, "/training/global_batch_size",
                         "the bytes one GPU sends per step");
        switch (c.group) {
          case Group::tp:
            tp_total += c.seconds_per_step;
            break;
          case Group::cp:
          case Group::ep:
          case Group::etp:
            break;  // on the critical path inside the passes (cp_layer_seconds, ep below)
          case Group::pp:
            if (c.purpose == Traffic::activations_forward)
              k.p2p = c.seconds_per_step / static_cast<double>(c.calls_per_step);
            // DualPipe's gradient sum between a model stage's two copies: reduced once per step
            // like the data-parallel gradients (the simulator's DP stream).
            if (c.purpose == Traffic::mirror_gradients) k.grad_reduce += c.seconds_per_step;
            break;
          case Group::dp:
          case Group::dp_replicate:
          case Group::embedding:
          case Group::edp:
            if (p_.zero_stage == 3 && c.op == CollectiveOp::all_gather) {
              k.zero3_gather += c.seconds_per_step / static_cast<double>(m);
            } else if (p_.zero_stage >= 1 && c.op == CollectiveOp::all_gather) {
              k.param_gather += c.seconds_per_step;
            } else {
              k.grad_reduce += c.seconds_per_step;
            }
            break;
        }
      };
      stage_collectives(st, tally);
      if (pp > 1 && k.p2p == 0 && m > 0) {
        // The last stage sends no activations forward; it still receives them at the same cost.
        k.p2p = collective_seconds(Group::pp, CollectiveOp::send_recv, p2p_bytes(), 1);
      }
      k.wire_bytes_per_step = wire;
      if (wire > best) {
        best = wire;
        busiest = st;
      }

      // Compute per micro-batch on one GPU of this stage, chunk by chunk: the op costs
      // (docs/time.md) of each chunk's layers and of the embedding or LM head it holds.
      const StageUnits u = units(st);
      const Count v = p_.virtual_stages;
      const double per_mb_tp = m > 0 ? tp_total / static_cast<double>(m) : 0;
      // Forward share of the TP time: the forward collectives' count over all calls.
      double tp_fwd_share = 0;
      {
        const TpCalls c = tp_layer_calls();
        const TpCalls l = tp_latent_calls();
        const double fwd_calls = static_cast<double>(c.fwd_all_reduce * 2 + c.fwd_all_gather +
                                                     c.fwd_reduce_scatter + l.fwd_all_gather);
        const double all_calls =
            static_cast<double>(c.all_reduce * 2 + c.all_gather + c.reduce_scatter +
                                l.all_reduce * 2 + l.all_gather + l.reduce_scatter);
        tp_fwd_share = all_calls > 0 ? fwd_calls / all_calls : 0;
      }
      // Each chunk's units, and its share of the stage's TP time per micro-batch: its own
      // layers', embedding's and head's collectives; what belongs to no chunk (the receives'
      // scatter/gather) in equal shares.
      const Count path = path_length(p_.schedule, pp, v);
      std::vector<StageUnits> chunk_units(static_cast<std::size_t>(v));
      std::vector<double> chunk_tp(static_cast<std::size_t>(v), per_mb_tp);
      for (Count ch = 0; ch < v; ++ch) {
        StageUnits& cu = chunk_units[static_cast<std::size_t>(ch)] = u;
        const Count vs = split_.virtual_stage(st, ch);
        const LayerKinds& kinds =
            chunk_kinds_[static_cast<std::size_t>(st)][static_cast<std::size_t>(ch)];
        cu.layer.count = kinds.main_layers(m_.moe.enabled());
        cu.dense_layer.count = kinds.dense_layers(m_.moe.enabled());
        if (vs != 0) cu.embedding.count = 0;
        if (vs != path - 1) cu.head.count = 0;
      }
      if (v > 1 && m > 0) {
        double own = 0;
        for (Count ch = 0; ch < v; ++ch) {
          Seconds t = 0;
          auto tp_only = [&t](const Collective& c) {
            if (c.group == Group::tp) t += c.seconds_per_step;
          };
          stage_collectives(st, tp_only, &chunk_units[static_cast<std::size_t>(ch)]);
          chunk_tp[static_cast<std::size_t>(ch)] = t / static_cast<double>(m);
          own += chunk_tp[static_cast<std::size_t>(ch)];
        }
        const double rest = std::max(0.0, per_mb_tp - own) / static_cast<double>(v);
        for (double& t : chunk_tp) t += rest;
      }
      // Context-parallel exchanges sit inside every layer's attention (cp_layer_seconds).
      const CpSeconds cps = cp_layer_seconds(layer);
      // MoE: the routed part's all-to-alls per MoE layer and, with etp > 1, the expert-TP gather
      // and reduce-scatter (one of each kind forward, the converse backward), exposed on the
      // critical path (no overlap is modelled for them; docs/moe.md, "Time").
      const double a2a =
          moe_.enabled()
              ? collective_seconds(Group::ep, CollectiveOp::all_to_all, moe_.all_to_all_bytes, 2) +
                    collective_seconds(Group::etp, CollectiveOp::all_gather, etp_gather_bytes(),
                                       1) +
                    collective_seconds(Group::etp, CollectiveOp::reduce_scatter, etp_gather_bytes(),
                                       1)
              : 0.0;
      const PassCosts& dl = oc.dense_layer;   // a MoE model's dense-MLP layers
      const PassCosts& wd = oc.window_delta;  // a windowed layer less a full-attention one
      // Each chunk's pass waits for its send unless sends overlap compute.
      const double blocking_p2p = pp > 1 && !s_.assumptions.overlap_p2p ? k.p2p : 0.0;
      const bool emb_w = peft_embedding_trains(t_.peft), head_w = peft_head_trains();
      k.chunks.assign(static_cast<std::size_t>(v), ChunkCosts{});
      k.forward = k.backward_input = k.backward_weight = k.recompute = 0;
      k.tp_communication = k.cp_communication = k.ep_communication = 0;
      for (Count ch = 0; ch < v; ++ch) {
        const StageUnits& cu = chunk_units[static_cast<std::size_t>(ch)];
        ChunkCosts& x = k.chunks[static_cast<std::size_t>(ch)];
        // The chunk's layers of each kind: L of the layer table's (a MoE model's MoE layers),
        // Ld with the dense MLP, Lw of either with windowed attention.
        const double L = static_cast<double>(cu.layer.count);
        const double Ld = static_cast<double>(cu.dense_layer.count);
        const double Lw = static_cast<double>(
            chunk_kinds_[static_cast<std::size_t>(st)][static_cast<std::size_t>(ch)]
                .windowed_layers);
        double fwd = L * layer.forward + Ld * dl.forward + Lw * wd.forward;
        double bwd_in = L * layer.backward_input + Ld * dl.backward_input + Lw * wd.backward_input;
        double bwd_w =
            L * layer.backward_weight + Ld * dl.backward_weight + Lw * wd.backward_weight;
        double gemm_f = L * layer.gemm_forward + Ld * dl.gemm_forward;
        double gemm_b = L * layer.gemm_backward + Ld * dl.gemm_backward;
        double recompute = 0;
        if (p_.recompute == Recompute::full)
          recompute = L * layer.forward + Ld * dl.forward + Lw * wd.forward;
        if (p_.recompute == Recompute::selective) {
          recompute = L * layer.selective_recompute + Ld * dl.selective_recompute +
                      Lw * wd.selective_recompute;
        }
        if (p_.recompute == Recompute::selective_op) {
          recompute = L * layer.selective_op_recompute + Ld * dl.selective_op_recompute +
                      Lw * wd.selective_op_recompute;
        }
        if (t_.peft.enabled()) {
          // Fine-tuning (a dense model): each layer kind's own costs (no frozen weight
          // gradients, adapters, dequantization), its windowed layers at their own; a layer
          // without a backward recomputes nothing. frozen_layers needs virtual_stages = 1, so a
          // chunk is then the whole stage.
          fwd = bwd_in = bwd_w = gemm_f = gemm_b = recompute = 0;
          const std::array<Count, 3> n = peft_kind_counts(stage_first_layer(st), cu.layer.count);
          const std::array<Count, 3> nw = peft_windowed_counts(split_.chunk_first_layer(st, ch),
                                                               split_.chunk_layers(st, ch), n);
          for (int kind = kBelow; kind <= kAbove; ++kind) {
            const auto i = static_cast<std::size_t>(kind);
            if (n[i] == 0) continue;
            const PeftKindInfo pk = peft_kind(kind);
            const LoraLayer lora = kind == kBelow ? LoraLayer{} : lora_layer(table_, m_, t_.peft);
            for (bool windowed : {false, true}) {
              const double c = static_cast<double>(windowed ? nw[i] : n[i] - nw[i]);
              if (c == 0) continue;
              const PassCosts pc =
                  peft_layer_pass_costs(table_, m_, t_, lora, pk.flow, rates, windowed);
              fwd += c * pc.forward, bwd_in += c * pc.backward_input;
              bwd_w += c * pc.backward_weight;
              gemm_f += c * pc.gemm_forward, gemm_b += c * pc.gemm_backward;
              if (pk.flow.any && p_.recompute == Recompute::full) recompute += c * pc.forward;
              if (pk.flow.any && p_.recompute == Recompute::selective)
                recompute += c * pc.selective_recompute;
            }
          }
        }
        if (cu.embedding.count > 0) fwd += emb.forward, bwd_w += emb_w ? emb.backward_weight : 0.0;
        if (cu.head.count > 0) {
          fwd += head.forward, bwd_in += head.backward_input;
          bwd_w += head_w ? head.backward_weight : 0.0;
          gemm_f += head.gemm_forward, gemm_b += head.gemm_backward;
        }
        const double tp = chunk_tp[static_cast<std::size_t>(ch)];
        double tp_f = tp * tp_fwd_share, tp_b = tp - tp * tp_fwd_share;
        // The passes wait on all of their TP collectives, unless they overlap the GEMMs.
        double tp_waited = tp;
        if (s_.assumptions.tp_comm_overlap) {
          // Collectives chunked against the linear layers' GEMMs (Megatron-LM
          // --tp-comm-overlap): what the GEMMs cannot hide stays exposed, the hidden part slows
          // them down (overlap.h). Only the exposed part is left for an F&B pair to hide again.
          tp_waited = std::max(0.0, tp_f - gemm_f) + std::max(0.0, tp_b - gemm_b);
          tp_f = exposed_after_overlap(tp_f, gemm_f, slowdown);
          tp_b = exposed_after_overlap(tp_b, gemm_b, slowdown);
        }
        // Full recompute replays the forward's collectives; their share is in tp_b already.
        // MoE: the routed part's op costs and its all-to-alls; full recompute replays the
        // forward.
        double ep_f = 0, ep_b = 0;
        if (moe_.enabled()) {
          fwd += L * routed.forward;
          bwd_in += L * routed.backward_input;
          bwd_w += L * routed.backward_weight;
          if (p_.recompute == Recompute::full) recompute += L * routed.forward;
          ep_f = L * a2a;
          ep_b = L * a2a * (p_.recompute == Recompute::full ? 2.0 : 1.0);
        }
        // The attention block (and so the context-parallel exchange) is alike in both kinds.
        const double La = L + Ld;
        x.layers = cu.layer.count + cu.dense_layer.count;
        x.parameters = cu.params() + (moe_.enabled() ? cu.layer.count * moe_.expert_params : 0);
        x.forward = fwd + tp_f + blocking_p2p + La * cps.forward + ep_f;
        x.recompute = recompute;
        x.backward_input = bwd_in + recompute + tp_b + blocking_p2p + La * cps.backward + ep_b;
        x.backward_weight = bwd_w;
        x.tp_communication = tp_waited;
        k.forward += x.forward;
        k.backward_input += x.backward_input;
        k.backward_weight += x.backward_weight;
        k.recompute += x.recompute;
        k.tp_communication += tp_waited;
        k.cp_communication += La * (cps.forward + cps.backward);
        k.ep_communication += ep_f + ep_b;
      }
      // Optimizer: memory bound; reads gradients, reads and writes optimizer state and writes the
      // compute-dtype weights of this GPU's shard.
      const StageMemory& sm = e.memory.stages[static_cast<std::size_t>(st)];
      // ZeRO-1 keeps full gradients but steps only its shard of them.
      const double grads_read = static_cast<double>(
          p_.zero_stage == 1 ? sm.gradients_bytes / shard() : sm.gradients_bytes);
      double touched =
          grads_read + 2.0 * static_cast<double>(sm.optimizer_bytes) +
          static_cast<double>(p_.zero_stage == 3 ? sm.weights_bytes : sm.weights_bytes / shard());
      if (t_.peft.enabled()) {
        // Only the trainable parameters step: their gradients, states and weights.
        const StageUnitParams up = unit_params(st);
        const PeftUnits x = peft_units(s_, table_, p_.tp, p_.zero_stage, up);
        const double trainable =
            static_cast<double>(ceil_div(x.trained_layer.trainable, shard()) * x.trained_layers +
                                ceil_div(x.embedding.trainable, shard()) * u.embedding.count +
                                ceil_div(x.head.trainable, shard()) * u.head.count);
        touched = trainable * static_cast<double>(x.gradient + 2 * x.optimizer + x.weight);
      }
      k.optimizer = memory_seconds(rates, touched, 1);
      if (p_.offload_optimizer != Offload::none) offload_costs(u, k, e.offload);
      if (t_.fp8 != Fp8Recipe::none && u.layer.count + u.dense_layer.count > 0) {
        // FP8: after the step each linear weight is cast to its two fp8 layouts once (TE's
        // weight cache, refreshed on the step's first micro-batch): read in the compute dtype,
        // write two bytes per parameter.
        // A MoE layer's routed experts are cast too; a MoE model's dense layers have their own.
        const double L = static_cast<double>(u.layer.count);
        const double Ld = static_cast<double>(u.dense_layer.count);
        const double w = static_cast<double>(fp8_linear_params_per_rank(table_, p_.tp) +
                                             moe_expert_weight_params(m_, moe_));
        const double wd = static_cast<double>(fp8_linear_params_per_rank(dense_table_, p_.tp));
        k.optimizer += memory_seconds(rates, (L * w + Ld * wd) * (static_cast<double>(cb()) + 2),
                                      4 * (L + Ld));
      }
    }
    // The busiest GPU's collectives, listed once.
    if (best >= 0) {
      e.communication.wire_bytes_per_gpu_per_step = best;
      e.communication.collectives.reserve(24);
      auto keep = [&e](const Collective& c) { e.communication.collectives.push_back(c); };
      stage_collectives(busiest, keep);
    }
  }

  // Offload (docs/time.md, "Offload"): DeepSpeed's ZeRO-Offload step (Ren et al. 2021, sec. 4.1,
  // Fig. 5): each gradient partition is copied to the host as ZeRO reduces it, overlapping the
  // backward like the reduction itself; CPU Adam steps the partition after the backward; the
  // updated compute-dtype partition is copied back, exposed. ZeRO-Infinity (Rajbhandari et al.
  // 2021) adds NVMe: the optimizer partition is read before and written after CPU Adam
  // (DeepSpeed's default pipeline_read = pipeline_write = false: not overlapped), and an offloaded
  // parameter partition is fetched from the host (and NVMe) before each ZeRO-3 gather, prefetched
  // behind compute like the gather. The times fold into the stage costs the simulator schedules.
  void offload_costs(const StageUnits& u, StageCosts& k, OffloadEstimate& out) const {
    const Count S = shard();
    double shard_params = 0;
    for (const Unit* x : {&u.layer, &u.dense_layer, &u.embedding, &u.head}) {
      shard_params += static_cast<double>(ceil_div(x->params, S) * x->count);
    }
    const double m = static_cast<double>(nmb_);
    const double node_gpus = static_cast<double>(gpus_in_node());
    const double pcie = s_.cluster.gpu.pcie_bandwidth * s_.assumptions.pcie_efficiency;
    const double nvme = s_.cluster.nvme_bandwidth / node_gpus;  // this GPU's share of the node's
    const double host_bw = s_.assumptions.cpu_optimizer_bandwidth / node_gpus;
    const double cbv = static_cast<double>(cb());
    // Gradients go down each time ZeRO reduces them: once per step at ZeRO-1, once per
    // micro-batch at ZeRO-2/3 (the reduce-scatter's calls in stage_collectives).
    const double grad_down =
        shard_params * static_cast<double>(gb()) * (p_.zero_stage >= 2 ? m : 1.0);
    const bool params_off = p_.offload_params != Offload::none;
    const double param_up = params_off ? 0.0 : shard_params * cbv;
    // Every forward and backward gather of a unit fetches its partition first.
    const double fetch_per_mb = params_off ? 2.0 * shard_params * cbv : 0.0;
    double nvme_step = 0, nvme_fetch_per_mb = 0;
    if (p_.offload_optimizer == Offload::nvme) {
      nvme_step +=
          2.0 * shard_params * static_cast<double>(nvme_optimizer_bytes_per_param(t_.optimizer));
    }
    if (p_.offload_params == Offload::nvme) {
      nvme_fetch_per_mb = fetch_per_mb;
      nvme_step += shard_params * cbv;  // the updated partition written back once
    }
    const double cpu_opt =
        shard_params * static_cast<double>(cpu_optimizer_bytes_per_param(t_)) / host_bw;
    const double fetch_seconds =
        fetch_per_mb / pcie + (nvme_fetch_per_mb > 0 ? nvme_fetch_per_mb / nvme : 0.0);
    k.grad_reduce += grad_down / pcie;
    k.zero3_gather += fetch_seconds;
    k.optimizer = cpu_opt + (nvme_step > 0 ? nvme_step / nvme : 0.0) + param_up / pcie;
    const double pcie_bytes = grad_down + param_up + m * fetch_per_mb;
    const double nvme_bytes = nvme_step + m * nvme_fetch_per_mb;
    if (pcie_bytes >= 0x1p63 || nvme_bytes * node_gpus >= 0x1p63)
      bytes_overflow("/training/global_batch_size", "the offload traffic of one step");
    if (static_cast<Bytes>(pcie_bytes) >= out.pcie_bytes_per_gpu_per_step) {
      out.pcie_bytes_per_gpu_per_step = static_cast<Bytes>(pcie_bytes);
      out.nvme_bytes_per_node_per_step = static_cast<Bytes>(nvme_bytes * node_gpus);
      out.pcie_seconds = pcie_bytes / pcie;
      out.nvme_seconds = nvme_bytes > 0 ? nvme_bytes / nvme : 0.0;
      out.cpu_optimizer_seconds = cpu_opt;
    }
  }

  // Time ----------------------------------------------------------------------------------------
  // A lower bound of the step (docs/time.md, "One timing engine"). The step's time is the walk of
  // the schedule program over the stage costs (sim::plan); what estimate() alone gives is a bound
  // of that walk from below, for the search to prune with. Each stage's compute stream runs its
  // passes and then its optimizer one at a time, so the step lasts at least that stage's busy
  // time; unless steps overlap (the step is then one stage's span), the stage cannot start
  // before its first input has come through every stage before it, one chunk's forward each with
  // a send between stages; and where a stage's last pass is a whole backward of its first chunk
  // (GPipe, 1F1B, interleaved 1F1B), that gradient still goes back through every stage before it
  // before the first stage can step its optimizer. An F&B pair (DualPipe) hides at most the TP
  // communication its passes wait on; nothing hides computation.
  void time(Estimate& e) {
    const Count pp = p_.pp;
    const double v = static_cast<double>(p_.virtual_stages);
    const double passes = static_cast<double>(stage_passes(p_.schedule, nmb_));
    const bool pairs = bidirectional(p_.schedule) || p_.schedule == Schedule::dualpipe_v;
    const bool overlap = steps_overlap(p_.schedule);
    const bool drains = p_.schedule == Schedule::gpipe || p_.schedule == Schedule::one_f_one_b ||
                        p_.schedule == Schedule::interleaved_1f1b;
    const auto costs = [&e](Count st) -> const StageCosts& {
      return e.stage_costs[static_cast<std::size_t>(st)];
    };
    // from_first[k]: the first micro-batch's forward through one chunk of each stage before k;
    // from_last[k] the same from the last stage (DualPipe's reverse direction); back[k]: a
    // whole backward of one chunk through each stage before k.
    std::vector<double> from_first(static_cast<std::size_t>(pp), 0.0);
    std::vector<double> from_last(static_cast<std::size_t>(pp), 0.0);
    std::vector<double> back(static_cast<std::size_t>(pp), 0.0);
    // A chunk's own passes (StageCosts::chunks; chunks may hold different layer counts): the
    // first virtual stages are chunk 0 of each stage, DualPipe's reverse direction chunk 1.
    const auto chunk = [v](const StageCosts& k, std::size_t c) -> ChunkCosts {
      if (c < k.chunks.size()) return k.chunks[c];
      ChunkCosts x;
      x.forward = k.forward / v;
      x.backward_input = k.backward_input / v;
      x.backward_weight = k.backward_weight / v;
      return x;
    };
    for (Count st = 1; st < pp; ++st) {
      const StageCosts& k = costs(st - 1);
      const ChunkCosts c = chunk(k, 0);
      from_first[static_cast<std::size_t>(st)] =
          from_first[static_cast<std::size_t>(st - 1)] + c.forward + k.p2p;
      back[static_cast<std::size_t>(st)] =
          back[static_cast<std::size_t>(st - 1)] + c.backward_input + c.backward_weight + k.p2p;
    }
    for (Count st = pp - 2; st >= 0; --st) {
      const StageCosts& k = costs(st + 1);
      from_last[static_cast<std::size_t>(st)] =
          from_last[static_cast<std::size_t>(st + 1)] + chunk(k, 1).forward + k.p2p;
    }
    const double first_optimizer = costs(0).optimizer;
    double bound = 0, busy_sum = 0, best_busy = 0, best_wait = 0, best_opt = 0;
    for (Count st = 0; st < pp; ++st) {
      const StageCosts& k = costs(st);
      double busy = passes * (k.forward + k.backward_input + k.backward_weight);
      // Every forward chunk of the stage may pair with a backward (nmb_ of them under DualPipe,
      // v per micro-batch otherwise), each hiding at most its chunk's waited TP time.
      if (pairs) {
        busy -= static_cast<double>(nmb_) * (bidirectional(p_.schedule) ? 1.0 : v) *
                k.tp_communication / v;
      }
      busy = std::max(0.0, busy);
      double fill = 0;
      if (!overlap) {
        fill = bidirectional(p_.schedule) ? std::min(from_first[static_cast<std::size_t>(st)],
                                                     from_last[static_cast<std::size_t>(st)])
                                          : from_first[static_cast<std::size_t>(st)];
      }
      // After its passes: its own optimizer, or the drain to the first stage and that stage's.
      const double tail =
          drains && st > 0
              ? std::max(k.optimizer, back[static_cast<std::size_t>(st)] + first_optimizer)
              : k.optimizer;
      busy_sum += busy + k.optimizer;
      if (fill + busy + tail > bound) {
        bound = fill + busy + tail;
        best_busy = busy, best_wait = fill + tail - k.optimizer, best_opt = k.optimizer;
      }
    }
    TimeEstimate& out = e.time;
    out.engine = TimeEngine::lower_bound;
    out.step_seconds = bound;
    out.compute_seconds = best_busy;
    out.bubble_seconds = best_wait;
    out.bubble_fraction = bound > 0 ? 1.0 - busy_sum / (static_cast<double>(pp) * bound) : 0.0;
    out.exposed_communication_seconds = 0;
    out.optimizer_seconds = best_opt;
    out.tokens_per_second = tokens_per_second(s_, out.step_seconds);
    out.mfu = model_flops_utilization(s_, e.compute.model_flops_per_step, out.step_seconds);
  }

  const Scenario& s_;
  const ModelSpec& m_;
  const TrainingSpec& t_;
  const ParallelSpec& p_;
  LayerTable table_;  // a layer (a MoE model: a MoE layer without its routed experts)
  std::optional<LayerTable> moe_dense_table_;  // a MoE model's dense-MLP layer
  const LayerTable& dense_table_;              // a layer with the dense MLP (a dense model: table_)
  PipelineSplit split_;
  std::vector<Count> layers_;                         // per stage, all chunks
  std::vector<std::vector<Count>> chunk_layers_;      // [stage][chunk], both kinds
  std::vector<std::vector<Count>> chunk_dense_;       // [stage][chunk], dense-MLP layers
  std::vector<std::vector<LayerKinds>> chunk_kinds_;  // [stage][chunk]
  std::vector<StageLayerMix> mix_;                    // per stage: the chunks' kinds summed
  Count layer_params_rank_ = 0;
  Count dense_params_rank_ = 0;
  Count layer_replicated_ = 0;
  Count dense_replicated_ = 0;
  MoeLayerPlan moe_;  // the routed part of a MoE layer; not enabled() for a dense model
  std::array<GroupInfo, 9> groups_{};
  Count vocab_ = 0;
  Count nmb_ = 0;
  LayerFlops lf_;
  double head_fwd_ = 0;
};

}  // namespace

double tokens_per_second(const Scenario& s, Seconds step_seconds) noexcept {
  const double tokens = static_cast<double>(s.training.global_batch_size) *
                        static_cast<double>(s.training.seq_length);
  return step_seconds > 0 ? tokens / step_seconds : 0;
}

double model_flops_utilization(const Scenario& s, Flops model_flops_per_step,
                               Seconds step_seconds) noexcept {
  const double peak = dense_peak(s.cluster.gpu, s.training.precision);
  return step_seconds > 0 && peak > 0
             ? model_flops_per_step /
                   (step_seconds * static_cast<double>(s.cluster.num_gpus) * peak)
             : 0;
}

Estimate estimate(const Scenario& scenario) {
  return Estimator(scenario).run();
}

std::vector<Collective> stage_communication(const Scenario& scenario, int stage) {
  return Estimator(scenario).collectives_of(stage);
}

}  // namespace distplan
