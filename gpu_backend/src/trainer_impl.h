// The trainer: the sharded model and its training step (docs/gpu_backend.md), one class whose
// members are defined by concern: trainer.cpp (construction, the run), trainer_params.cpp
// (parameters, sharding, ZeRO gathers and gradient reduction), trainer_layers.cpp (the layer ops
// and one transformer layer), trainer_pipeline.cpp (data, chunks, pipeline messages and the step's
// schedule executor) and trainer_optimizer.cpp (overflow check, optimizer, shard gathers). Private
// to the library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <tuple>
#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/device_array.h"
#include "distplan/gpu_backend/device_ops.h"
#include "distplan/gpu_backend/gradient_dump.h"
#include "distplan/gpu_backend/moe_layer.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/peft.h"
#include "quantized_weight.h"

namespace distplan::backend::trainer_detail {

// The working fp32 arrays of the run's device (device_array.h): activations and their
// gradients never visit the host on CUDA.
using Vec = DeviceFloats;
using HostVec = std::vector<float>;
using Clock = std::chrono::steady_clock;

inline sim::SliceKind slice_kind(sim::Op op) {
  switch (op) {
    case sim::Op::forward:
      return sim::SliceKind::forward;
    case sim::Op::backward:
      return sim::SliceKind::backward;
    case sim::Op::backward_input:
      return sim::SliceKind::backward_input;
    case sim::Op::backward_weight:
      return sim::SliceKind::backward_weight;
  }
  return sim::SliceKind::forward;
}

// Counter-based hash (splitmix64): any element of any parameter can be generated on its own, so
// every shard of every layout initialises to the same full model.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline float uniform_pm1(std::uint64_t h) {
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

enum class Init { normal, one, zero };

// One parameter of a unit, as held by this TP rank: `rows` x `cols` at `offset` in the unit's flat
// buffer. `global_index(local)` maps a local element to its index in the unsharded tensor.
struct Param {
  std::uint64_t uid = 0;
  Count offset = 0, rows = 0, cols = 1;
  Init init = Init::normal;
  bool sp_partial = false;  // gradient is a partial sum over TP ranks under sequence parallelism
  // Fine-tuning's quantized base (QLoRA): the weight lives in the unit's `quant` segments, not in
  // its flat buffer (offset is meaningless).
  bool quantized = false;
  std::function<Count(Count)> global_index;
  [[nodiscard]] Count numel() const { return rows * cols; }
};

struct Unit {
  // A layer's own parameters, the embedding, the final norm and LM head, a MoE layer's routed
  // experts on this rank, or a layer's LoRA adapters (fine-tuning).
  ParamUnit kind = ParamUnit::layers;
  int chunk = 0;  // the model chunk holding it
  // Fine-tuning (training.peft, planner/peft.h): the dtypes of the weights and gradients (the
  // compute and gradient dtypes, but a frozen base and the adapters have their own), a frozen
  // unit (weights only: no gradients, no optimizer states), the adapter unit of a layer
  // (gathered and released with it), and whether a backward passes the unit (ZeRO-3 gathers it
  // again there).
  DType wdt = DType::bf16, gdt = DType::bf16;
  bool frozen = false;
  int adapters = -1;
  bool backward = true;
  // A quantized frozen weight is stored tensor by tensor as bitsandbytes stores the Hugging Face
  // model's (q, k, v apart for llama names): rows [row0, row0 + rows) of parameter `param`.
  struct QuantSegment {
    int param = -1;
    Count row0 = 0, rows = 0;
    std::unique_ptr<QuantizedWeight> w;
  };
  std::vector<QuantSegment> quant;
  std::vector<Param> params;
  Count numel = 0;      // per TP rank
  Count padded = 0;     // rounded up to a multiple of the ZeRO shard size (planner: padded())
  Count shard = 0;      // padded / S
  Tensor weights;       // compute dtype: full padded, or this rank's shard under ZeRO-3
  Tensor grads;         // grad dtype: full padded (ZeRO 0/1) or shard (2/3)
  Tensor master, m, v;  // fp32 optimizer state over the optimizer's range
  Tensor gathered;      // ZeRO-3: the full unit while in use (buffers)
  Tensor unit_grad;     // ZeRO-2/3: the unit's full gradient before its reduce-scatter (buffers)
  Param& add(Count rows, Count cols, Init init, std::uint64_t uid, std::function<Count(Count)> g,
             bool sp_partial = false) {
    Param p;
    p.uid = uid;
    p.offset = numel;
    p.rows = rows;
    p.cols = cols;
    p.init = init;
    p.sp_partial = sp_partial;
    p.global_index = std::move(g);
    numel += p.numel();
    params.push_back(std::move(p));
    return params.back();
  }
};

// Indices of a layer's parameters inside its unit.
struct LayerParams {
  int norm1_g = -1, norm1_b = -1, qkv_w = -1, qkv_b = -1, out_w = -1, out_b = -1;
  int norm2_g = -1, norm2_b = -1, in_w = -1, in_b = -1, mlp_out_w = -1, mlp_out_b = -1;
  // A MoE layer (trainer_moe.cpp): its router and shared experts in the layer's unit, its routed
  // experts in unit `experts` (two parameters per local expert: w_in, w_out).
  bool moe = false;
  int router_w = -1, router_b = -1, shared_in = -1, shared_out = -1, experts = -1;
  // Fine-tuning: each LoRA adapter's A (r x in) and B (out x r) in the layer's adapter unit, the
  // layer-table op it sits on and the columns of that op's output it adds to; which backward
  // halves run and what is kept (peft_layer_flow; everything without fine-tuning).
  struct Lora {
    int a = -1, b = -1, op = -1;
    Count in = 0, out = 0;
    Count col = 0, ld = 0;  // its columns [col, col + out) of the op's output (ld wide)
  };
  std::vector<Lora> lora;
  PeftLayerFlow flow;
};

// Tensors one layer keeps from forward to backward: exactly the layer op table's saved entries.
struct LayerSaved {
  Tensor x;           // input_norm.input           (sp)
  Tensor ln1;         // qkv.input                  (sp)
  Tensor q, k, v;     // attention.q/k/v            (tp)
  Tensor probs;       // attention.probs (standard) (tp), dropped by selective recompute
  Tensor lse;         // attention.logsumexp (flash, fp32)
  Tensor attn;        // attention_out.input        (tp)
  Tensor attn_heads;  // cp_comm a2a: the attention output head-sharded, for its backward (tp)
  Tensor x2;          // post_attention_norm.input  (sp)
  Tensor ln2;         // mlp_in.input               (sp)
  Tensor fc1;         // activation.input           (tp)
  Tensor act;         // mlp_out.input              (tp)
  // MoE layers: fc1/act above are the shared experts'; the routed block keeps its index maps
  // here and its tensors (router scores, expert inputs, expert FFN, returned outputs) below.
  std::shared_ptr<moe::BlockSaved<float>> moe;
  Tensor moe_scores, moe_x_in, moe_fc1, moe_act, moe_y_back;
  std::vector<Tensor> lora_ax;  // each adapter's A x (b*s, r): B's saved input
};

struct HeadSaved {
  Tensor x;        // final norm input (sp)
  Tensor ln;       // LM head input (sp)
  Tensor logits;   // compute dtype (buffers)
  Tensor softmax;  // fp32 (buffers)
  DeviceIds targets;
};

struct ChunkState {
  std::vector<LayerSaved> layers;
  std::optional<HeadSaved> head;
  DeviceIds ids;
  std::vector<std::function<void()>> weight_jobs;  // deferred to backward_weight (ZB)
  std::vector<int> weight_job_units;               // unit finished after each job (-1: none)
};

class Trainer {
 public:
  Trainer(const Scenario& s, const RunOptions& o, ProcessGroups& g);

  Measurement train();

 private:
  // ---- parameters ---------------------------------------------------------------------------
  std::uint64_t uid(Count layer, int slot) const;

  // Column-parallel weight of `parts` stacked blocks (qkv: q, k, v; SwiGLU mlp_in: gate, up),
  // each split t ways by rows.
  std::function<Count(Count)> column_rows(std::vector<Count> parts, Count cols) const;
  // Row-parallel weight (rows x full_cols) split t ways by columns.
  std::function<Count(Count)> row_cols(Count full_cols) const;
  static std::function<Count(Count)> identity();

  Unit make_layer_unit(Count layer, LayerParams& lp);

  void build_units();

  // The optimizer's range of a unit: all of it (ZeRO 0) or this rank's shard.
  // The shard index is this rank's place in its shard group (S consecutive dp ranks).
  Count opt_begin(const Unit& u) const;
  Count opt_count(const Unit& u) const;

  // ---- timeline -------------------------------------------------------------------------------
  // The step's clock. On CUDA it reads once the device has finished the work queued so far
  // (dev::synchronize), so an interval is the device's time for the work inside it rather than
  // the host's time to launch it; on the CPU it is the plain clock.
  Clock::time_point now() const;
  Seconds since(Clock::time_point t0) const;
  void mark(sim::Track track, sim::SliceKind kind, Count mb, Count chunk, Clock::time_point t0);

  // ---- tensors and communication helpers ------------------------------------------------------
  // n zeros on the run's device.
  Vec zeros(Count n) const;
  Vec rd(const Tensor& t) const;
  void rnd(Vec& x, DType d) const;
  Tensor save(const Vec& x, DType d = DType::fp32, MemoryTag tag = MemoryTag::activations);
  Tensor save_act(const Vec& x);
  // The same on host arrays, for the CPU-only paths (context parallelism, MoE layers).
  HostVec rd_host(const Tensor& t) const;
  Tensor save(const HostVec& x, DType d = DType::fp32, MemoryTag tag = MemoryTag::activations);
  Tensor save_act(const HostVec& x);
  Tensor pack(const HostVec& x, DType d);
  void rnd(HostVec& x, DType d) const;
  HostVec gather_in(const HostVec& x, Traffic what);
  HostVec reduce_out(const HostVec& x, Traffic what);
  HostVec param_host(Unit& u, int i);
  void add_grad(Unit& u, int i, const HostVec& g);

  // Packs fp32 values into a tracked temporary of dtype `d` for a collective and back.
  Tensor pack(const Vec& x, DType d);
  // A temporary copy of a tensor in its own dtype (a send's buffer).
  Tensor pack_tensor(const Tensor& t);

  void tp_all_reduce(Vec& x, Traffic what, DType d);
  void tp_all_reduce_max(Vec& x, Traffic what);
  // (N,h) -> (N/t,h) summed over the TP group (sequence-parallel reduce-scatter along s).
  Vec tp_reduce_scatter(const Vec& x, Traffic what);
  // (N/t,h) -> (N,h) gathered along s.
  Vec tp_all_gather(const Vec& x, Traffic what);
  // Row-parallel output: all-reduce, or reduce-scatter into the sequence-parallel region.
  Vec reduce_out(Vec x, Traffic what);
  // Column-parallel input: the sequence-parallel shard gathered (identity without SP).
  Vec gather_in(const Vec& x, Traffic what);

  // ---- weights of a unit as fp32 ------------------------------------------------------------
  const Tensor& unit_weights(Unit& u);
  Vec param(Unit& u, int i);
  /// Element offset of parameter `i` in unit_weights(u).
  [[nodiscard]] Count param_offset(const Unit& u, int i) const;
  // Accumulates a parameter gradient into the unit's gradient (full buffer, or the unit gradient
  // buffer before its reduce-scatter under ZeRO-2/3).
  void add_grad(Unit& u, int i, const Vec& g);

  // ZeRO-3 gathers (one pass keeps at most 1 + prefetch units gathered) and the ZeRO-2/3 unit
  // gradient buffer.
  void acquire(int ui);
  void release(int ui);
  void begin_unit_grad(int ui);
  // ZeRO-2/3: reduce-scatter the unit's gradient of this micro-batch into the gradient shard.
  void end_unit_grad(int ui);
  // Sequence parallel: norm weights, row-parallel biases and the position embedding see only
  // this rank's tokens; their gradients are summed over the TP group (Megatron-LM's
  // allreduce of sequence-parallel gradients), one call per unit on the concatenated gradients.
  void sp_reduce_partials(Unit& u, Tensor& grad);

  // ---- ops ----------------------------------------------------------------------------------
  struct NormOut {
    Vec y;
  };
  Vec norm_fwd(Unit& u, int gi, int bi, const Vec& x, Count n);
  // The norm saves only its input; mean and rstd are recomputed here (layer op table).
  Vec norm_bwd_input(Unit& u, int gi, const Vec& dy, const Vec& x, Count n);
  // The weight half reads no parameter: d gamma = sum(dy * x_hat) and d beta = sum(dy) do not
  // depend on gamma, and the dx the kernel also writes is discarded. So a zero-bubble W pass
  // needs no ZeRO-3 gather (its unit's parameters were released after the B pass).
  void norm_bwd_weight(Unit& u, int gi, int bi, const Vec& dy, const Vec& x, Count n);
  Vec linear_fwd(Unit& u, int wi, int bi, const Vec& x, Count n, Count in, Count out);
  Vec linear_bwd_input(Unit& u, int wi, const Vec& dy, Count n, Count in, Count out);
  void linear_bwd_weight(Unit& u, int wi, int bi, const Vec& dy, const Vec& x, Count n, Count in,
                         Count out);
  void attention_fwd(const Vec& q, const Vec& k, const Vec& v, Vec& out, Vec* probs, Vec* lse);

  // ---- context parallelism (cp_attention.cpp, ring_attention.cpp) ------------------------------
  // Attention of layer unit `ui` under cp > 1 by parallel.cp_comm. The forward may replace k and
  // v by what the backward starts from (the ring's last block); under a2a it also returns the
  // head-sharded output in `out_heads`, which the layer saves and the backward reads as `out`
  // (for p2p and all_gather `out_heads` stays empty and `out` is the output the layer saved).
  void cp_attention_forward(int ui, HostVec& q, HostVec& k, HostVec& v, HostVec& out, HostVec& lse,
                            HostVec& out_heads);
  void cp_attention_backward(int ui, const HostVec& dout, const HostVec& q, const HostVec& k,
                             const HostVec& v, const HostVec& out, const HostVec& lse, HostVec& dq,
                             HostVec& dk, HostVec& dv);
  // KV all-gather (cp_comm all_gather): the whole sequence's K and V in global row order, from a
  // buffer holding every cp rank's packed local (K | V) in rank order.
  void global_kv(const HostVec& gathered, Count kn, HostVec& k, HostVec& v) const;
  void all_gather_attention_forward(const HostVec& q, const HostVec& k, const HostVec& v,
                                    HostVec& out, HostVec& lse);
  void all_gather_attention_backward(const HostVec& dout, const HostVec& q, const HostVec& k,
                                     const HostVec& v, const HostVec& out, const HostVec& lse,
                                     HostVec& dq, HostVec& dk, HostVec& dv);
  // DeepSpeed-Ulysses (cp_comm a2a): x (this rank's rows, `heads` heads) to every row of this
  // rank's heads / cp heads in global order, the received all-to-all buffer kept in `recv`
  // (tagged `tag`); and back.
  HostVec seq_to_heads(const HostVec& x, Count heads, Traffic what, Tensor& recv, MemoryTag tag);
  HostVec heads_to_seq(const HostVec& y, Count heads, Traffic what, Tensor* send_keep = nullptr,
                       MemoryTag tag = MemoryTag::temporaries);
  // The forward replaces q, k, v and lse by their head-sharded forms and returns the output in
  // both layouts (`out` by rows for the out projection, `out_heads` as the attention wrote it),
  // which the layer saves (Transformer Engine >= 2.9 saves the exchanged tensors and the output
  // before its all-to-all back) and the backward reads.
  void a2a_attention_forward(HostVec& q, HostVec& k, HostVec& v, HostVec& out, HostVec& lse,
                             HostVec& out_heads);
  void a2a_attention_backward(const HostVec& dout, const HostVec& q, const HostVec& k,
                              const HostVec& v, const HostVec& out, const HostVec& lse, HostVec& dq,
                              HostVec& dk, HostVec& dv);
  // Rotary embedding of q or k (N,heads,d) at this rank's positions (global ones under cp).
  void rope(Vec& x, Count heads, bool backward) const;
  // One ring exchange on the cp group: `send` to rank `to`, `recv` from rank `from`, as one batch.
  struct RingMessage {
    Tensor* buf = nullptr;
    P2PTag tag;
    Traffic what = Traffic::probe;
  };
  void ring_exchange(const std::vector<RingMessage>& send, int to,
                     const std::vector<RingMessage>& recv, int from);
  // Ring attention (cp_comm p2p) of layer unit `ui`: out and lse of this rank's rows; k and v are
  // replaced by the KV block the ring ends with, which the backward starts from (as Transformer
  // Engine saves it).
  void ring_attention_forward(int ui, const HostVec& q, HostVec& k, HostVec& v, HostVec& out,
                              HostVec& lse);
  // Its backward: KV travels the other way round the ring, with the KV gradients accumulating
  // on their way home.
  void ring_attention_backward(int ui, const HostVec& dout, const HostVec& q, const HostVec& k,
                               const HostVec& v, const HostVec& out, const HostVec& lse,
                               HostVec& dq, HostVec& dk, HostVec& dv);

  // ---- one transformer layer ------------------------------------------------------------------
  bool flash() const;
  bool rotary() const;

  // Forward of one layer from its input x; fills `sv` with what the layer keeps (lp.flow) and
  // returns the output (Nl,h).
  Vec layer_forward(int ui, const LayerParams& lp, LayerSaved& sv, const Vec& x);

  // ---- fine-tuning (trainer_lora.cpp) ---------------------------------------------------------
  // The layer-table indices of the ops a layer runs (fine-tuning's flow is per op).
  struct OpIndex {
    int norm1 = 0, qkv = 1, attention = 2, attn_out = 3, norm2 = 5, mlp_in = 6, activation = 7,
        mlp_out = 8;
  };
  // Adds the adapters on op `op` to its output y (N, out of the op): y[:, col:col+out] +=
  // (alpha / r) B A x; keeps each A x in sv.lora_ax.
  void lora_forward(int ui, const LayerParams& lp, int op, const Vec& x, Vec& y, LayerSaved& sv);
  // The adapters' backward on op `op` from the op's output gradient dy (N, out of the op) and its
  // input x: dB and dA go to `jobs`; B's input gradient always, and A's added into dx when dx is
  // non-null (the gradient goes on below).
  void lora_backward(int ui, const LayerParams& lp, int op, const Vec& dy, const Vec& x,
                     LayerSaved& sv, Vec* dx, std::vector<std::function<void()>>& jobs);
  // A GEMM of a quantized frozen weight (QLoRA), tensor by tensor: forward y = x W^T, or with
  // `backward` the input gradient dx = dy W.
  Vec quantized_linear(Unit& u, int wi, const Vec& v, Count n, Count in, Count out, bool backward);
  // The unit whose gradient a layer's backward fills: its adapters, itself, or none (frozen).
  [[nodiscard]] int grad_unit(int ui) const;
  // Fine-tuning's dtypes and frozen flags of a built unit, and a layer's adapters and flow.
  void peft_unit(Unit& u, Count layer) const;
  void add_lora_unit(Count layer, LayerParams& lp);

  // x + branch (+ bias bi of unit u, added to the branch first, -1: none), rounded to the
  // compute dtype: the residual connection after a row-parallel projection.
  Vec residual(Unit& u, int bi, const Vec& x, Vec& branch);

  // SwiGLU's fused mlp_in output (N, 2f/t) holds [gate | up] per token.
  void split_halves(const Vec& fc1, Vec& gate, Vec& up) const;

  // Backward of one layer: returns dx (Nl,h). Weight-gradient work goes to `jobs` (run at once
  // unless the schedule splits B and W).
  Vec layer_backward(int ui, const LayerParams& lp, LayerSaved& sv, const Vec& dy,
                     std::vector<std::function<void()>>& jobs);

  Vec col_sum(const Vec& x, Count n) const;

  // ---- Mixture of Experts (trainer_moe.cpp) ---------------------------------------------------
  // The ZeRO shard group of a unit and its size: dp (S_) for the dense units, the expert
  // data-parallel group for routed experts.
  Communicator& shard_comm(const Unit& u) const;
  Count shard_size(const Unit& u) const;
  // A MoE layer's router and shared experts, added to its unit in place of the dense MLP.
  void add_moe_params(Count layer, Unit& u, LayerParams& lp);
  // This rank's routed experts of a MoE layer: num_experts / ep of them.
  Unit make_expert_unit(Count layer);
  moe::BlockWeights<float> block_weights(Unit& u, const LayerParams& lp);
  moe::Exchange<float> ep_exchange();
  // The MoE MLP of one layer on its input ln2 (Nl,h): shared plus routed experts' output (Nl,h).
  HostVec moe_forward(Unit& u, const LayerParams& lp, LayerSaved& sv, const HostVec& ln2);
  // Its backward from dy (Nl,h): returns d ln2 (Nl,h); weight gradients go to `jobs`.
  HostVec moe_backward(int ui, const LayerParams& lp, LayerSaved& sv, const HostVec& dy,
                       std::vector<std::function<void()>>& jobs);
  // Once per step: the routed experts' gradients over the expert data-parallel group.
  void reduce_expert_grads(Unit& u);

  // ---- data -----------------------------------------------------------------------------------
  // Token j of global sample `sample` of step `step` (s + 1 tokens: inputs and shifted targets).
  std::int32_t token(Count step, Count sample, Count j) const;
  // Ids or targets of micro-batch `mb` (sequence-major: token n = s_i*b + b_i).
  std::vector<std::int32_t> batch_tokens(Count step, Count mb, Count shift) const;

  // ---- chunks: forward and backward of one (micro-batch, chunk) --------------------------------
  struct Chunk {
    Count first_layer = 0, num_layers = 0;
    bool first = false, last = false;
    int embedding = -1, head = -1;
    std::vector<int> layer_units;
    std::vector<LayerParams> layer_params;
  };

  // What virtual stage `vs` receives for micro-batch `mb`.
  static P2PTag tag(bool grad, Count mb, Count vs);

  // ---- pipeline messages ----------------------------------------------------------------------
  // A chunk's output (its activation, or its input gradient) waits in the outbox until the next
  // action of the program starts, and goes out in one exchange with that action's receive: 1F1B's
  // "send activation, receive gradient" and "send gradient, receive activation" pairs, as
  // Megatron-LM's send_forward_recv_backward / send_backward_recv_forward
  // (megatron/core/pipeline_parallel/p2p_communication.py). Issued one by one, the two stages of
  // p = 2 would each wait in a send for a receive the other posts only after its own send.
  struct OutMessage {
    // Shared with the communicator until the send completes; the step's closing barrier
    // completes every send, so none outlives the step (nor this trainer's allocator).
    std::shared_ptr<Tensor> buf;
    int peer = 0;
    P2PTag tag;
    Traffic what = Traffic::probe;
    sim::Track track = sim::Track::send_next;
    sim::SliceKind kind = sim::SliceKind::send_activation;
    Count mb = 0, chunk = 0;
  };
  void post_send(const Vec& x, int peer, P2PTag t, Traffic what, sim::Track track,
                 sim::SliceKind kind, Count mb, Count c);
  // Issues the waiting send (if any) and the receive into `in` (if given) as one exchange.
  void exchange(Tensor* in, int peer, P2PTag t);
  void flush_sends();
  // The P2POp::stream of a message (comm.h).
  int stream_of(const P2PTag& t) const;
  // Whether action `a` starts by receiving from a neighbouring stage.
  bool receives_first(const sim::Action& a) const;
  // Virtual stage of this stage's chunk c (layout.h: interleaved, or a V under v_shape()).
  // Under DualPipe each direction is a pipeline of pp model stages: chunk c of this stage is
  // virtual stage c * pp + dualpipe_model_stage(pp, stage, c), so the two directions' tags and
  // neighbours never mix.
  Count vstage(Count c) const;
  // Virtual stages of one pipeline a micro-batch runs through: pp * v, or pp under DualPipe.
  Count pipeline_length() const;
  // The stage holding virtual stage vs, where a chunk's input comes from or its output goes.
  int stage_of(Count vs) const;
  // The V's turn (virtual stage p - 1 to p) stays on the stage: the output waits here, keyed by
  // the receiving virtual stage's tag, and is never sent.
  void keep_local(const Vec& x, P2PTag t);
  Vec take_local(P2PTag t);

  // Units of a chunk in forward order.
  std::vector<int> chunk_units(const Chunk& ch) const;
  // ZeRO-3 with prefetch: gathers the unit at position i of a pass and the next one.
  void acquire_in_pass(const std::vector<int>& pass, std::size_t i);

  void forward(Count step, Count mb, Count c);

  // The learned position embedding: e += the position table's row of each token (sequence-major
  // tokens, this rank's positions; under SP its share of them).
  void add_positions(Unit& u, Vec& e);
  const DeviceIds& position_ids();

  void head_forward(const Chunk& ch, ChunkState& st, const Vec& x, Count step, Count mb);

  // d loss / d logits of the LM head. Reads no parameter, so it runs before the head's ZeRO-3
  // gather and frees the logits workspace first: the two are never alive together
  // (docs/memory.md, buffers).
  Vec head_loss_grad(ChunkState& st);

  // Backward of the LM head from d loss / d logits: returns the gradient of the final norm's
  // input (Nl,h).
  Vec head_backward(const Chunk& ch, ChunkState& st, const Vec& dlogits,
                    std::vector<std::function<void()>>& jobs);

  void embedding_backward(const Chunk& ch, ChunkState& st, const Vec& dx,
                          std::vector<std::function<void()>>& jobs);

  // Backward (or its input half) of one (micro-batch, chunk).
  void backward(Count mb, Count c, bool split);

  void backward_weight(Count mb, Count c);

  // ---- the step -------------------------------------------------------------------------------
  std::pair<double, bool> train_step(Count step);

  // DualPipe (trainer_dualpipe.cpp): once per step, before the data-parallel reduction, the
  // gradients of this stage's two model stages are exchanged with the stage holding their other
  // copies (pp - 1 - stage) and summed, so both copies take the same optimizer step.
  void mirror_gradients();

  // The reduced gradient this rank holds (the optimizer's range of every unit, as
  // optimizer_step reads it), element by element with its parameter and index in the unsharded
  // tensor; ZeRO padding is left out (RunOptions::dump_gradients).
  void dump_gradients() const;
  // The weights this rank holds after the last step (RunOptions::dump_weights), as the gradient
  // dump's records.
  void dump_weights() const;

  // Adam/AdamW or SGD on the device: gradients, fp32 master weights and the moments never leave
  // it; the compute-dtype weights are a cast of the master weights (round to nearest even, as
  // Tensor::write on the CPU).
  void optimizer_step_on_device(Unit& u);

  void optimizer_step(Unit& u);

  // ZeRO-1/2: every rank gathers the updated shards into its full weights.
  void gather_updated_shards(Unit& u);

  const Scenario& s_;
  const ModelSpec& m_;
  const TrainingSpec& t_;
  const ParallelSpec& p_;
  const RunOptions& o_;
  ProcessGroups& g_;
  TrackingAllocator alloc_;
  DType cb_ = DType::bf16, gb_ = DType::bf16;
  Count tp_ = 1, S_ = 1, pp_ = 1, v_ = 1, nmb_ = 1, N_ = 0, Nl_ = 0, h_ = 0, vocab_ = 0, vl_ = 0;
  // Context parallelism: cp ranks, this rank's sequence rows (sl_ = s/cp) and their global
  // positions (the load-balanced chunks r and 2cp-1-r; identity under cp = 1).
  Count cp_ = 1, sl_ = 0;
  std::vector<Count> positions_;
  Count a_l_ = 0, g_l_ = 0, d_ = 0, f_l_ = 0, mi_l_ = 0;
  int stage_ = 0;
  bool sp_ = false;
  bool vee_ = false;  // V placement: chunk 0 at virtual stage s, chunk 1 at 2p - 1 - s
  // DualPipe's bidirectional placement: chunk c is direction c's model stage (vstage()).
  bool bidir_ = false;
  sim::SchedulePrograms program_;
  std::vector<Unit> units_;
  std::vector<Chunk> chunks_;
  std::map<std::pair<Count, Count>, ChunkState> states_;
  std::optional<OutMessage> outbox_;
  std::map<std::tuple<int, Count, Count>, Tensor> local_;  // (kind, micro-batch, virtual stage)
  std::vector<ExecutedAction> executed_;
  std::vector<sim::TraceEvent> timeline_;
  Clock::time_point step_t0_ = Clock::now();
  Count cur_mb_ = -1;
  int head_w_unit_ = -1, head_w_param_ = -1;  // the LM head weight: (unit, parameter)
  MoeRouting moe_routing_;                    // this step's dispatched token copies
  DeviceIds position_ids_;                    // position_ids(), built on first use
  // Per micro-batch of this step on the last stage (TP rank 0): the cross-entropy's row max, sum
  // of exponentials and target logit, turned into the loss at the end of the step.
  struct LossStats {
    Vec max, sumexp, target;
  };
  std::vector<LossStats> pending_loss_;
  Vec ones_;  // h ones on the device: the norms' unit gamma in their weight-gradient pass
  OpIndex op_;
  LayerTable table_;  // the planner's layer op table of this model and training
  // QLoRA's double quantization: the 8-bit code every quantized weight shares (one per device,
  // as bitsandbytes caches it), tracked under weights.
  TrackedBytes nested_code_;
  // Stores a layer unit's linear weights quantized (QLoRA) and takes them out of its flat buffer.
  void quantize_unit(Unit& u);
  // Element i of parameter p's initial value on this rank (the same full model on every layout).
  [[nodiscard]] float initial_value(const Param& p, Count i) const;
  double loss_sum_ = 0;
  float loss_scale_ = 1.0f;
  Count opt_steps_ = 0, good_steps_ = 0;
  Seconds optimizer_seconds_ = 0;
};

}  // namespace distplan::backend::trainer_detail
