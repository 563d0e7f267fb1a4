// The sharded model and its training step (docs/gpu_backend.md). Layers follow the planner's
// layer op table (planner/src/layer_ops.cpp) op by op and save exactly its tensors; parameters are
// grouped in units (each layer, the embedding, the LM head) as the planner's ZeRO model shards,
// gathers and reduces them (planner/src/estimate.cpp).
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

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/device_ops.h"
#include "distplan/gpu_backend/gradient_dump.h"
#include "distplan/gpu_backend/run.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/layer_ops.h"
#include "distplan/planner/layout.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {
namespace {

using Vec = std::vector<float>;
using Clock = std::chrono::steady_clock;

Seconds since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

sim::SliceKind slice_kind(sim::Op op) {
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
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
float uniform_pm1(std::uint64_t h) {
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
  std::function<Count(Count)> global_index;
  [[nodiscard]] Count numel() const { return rows * cols; }
};

const char* unit_label(int kind) {
  static const char* kNames[] = {"layers", "embedding", "lm head"};
  return kNames[kind];
}

struct Unit {
  int kind = 0;   // 0 layer, 1 embedding, 2 head
  int chunk = 0;  // the model chunk holding it
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
};

// Tensors one layer keeps from forward to backward: exactly the layer op table's saved entries.
struct LayerSaved {
  Tensor x;        // input_norm.input           (sp)
  Tensor ln1;      // qkv.input                  (sp)
  Tensor q, k, v;  // attention.q/k/v            (tp)
  Tensor probs;    // attention.probs (standard) (tp), dropped by selective recompute
  Tensor lse;      // attention.logsumexp (flash, fp32)
  Tensor attn;     // attention_out.input        (tp)
  Tensor x2;       // post_attention_norm.input  (sp)
  Tensor ln2;      // mlp_in.input               (sp)
  Tensor fc1;      // activation.input           (tp)
  Tensor act;      // mlp_out.input              (tp)
};

struct HeadSaved {
  Tensor x;        // final norm input (sp)
  Tensor ln;       // LM head input (sp)
  Tensor logits;   // compute dtype (buffers)
  Tensor softmax;  // fp32 (buffers)
  std::vector<std::int32_t> targets;
};

struct ChunkState {
  std::vector<LayerSaved> layers;
  std::optional<HeadSaved> head;
  std::vector<std::int32_t> ids;
  std::vector<std::function<void()>> weight_jobs;  // deferred to backward_weight (ZB)
  std::vector<int> weight_job_units;               // unit finished after each job (-1: none)
};

class Trainer {
 public:
  Trainer(const Scenario& s, const RunOptions& o, ProcessGroups& g)
      : s_(s),
        m_(s.model),
        t_(s.training),
        p_(s.parallel),
        o_(o),
        g_(g),
        alloc_(o.device, o.capacity_bytes) {
    cb_ = t_.precision;
    gb_ = t_.grad_accumulation_dtype;
    tp_ = p_.tp;
    S_ = p_.zero_stage == 0 ? 1 : s.shard_size();
    sp_ = p_.sequence_parallel && tp_ > 1;
    stage_ = g.coords.pp;
    pp_ = p_.pp;
    v_ = p_.virtual_stages;
    nmb_ = s.num_microbatches();
    N_ = t_.micro_batch_size * t_.seq_length;
    Nl_ = sp_ ? N_ / tp_ : N_;
    h_ = m_.hidden_size;
    vocab_ = padded_vocab(s);
    vl_ = vocab_ / tp_;
    a_l_ = m_.num_attention_heads / tp_;
    g_l_ = m_.num_kv_heads / tp_;
    d_ = m_.head_dim();
    f_l_ = m_.ffn_hidden_size / tp_;
    mi_l_ = (m_.mlp == Mlp::swiglu ? 2 : 1) * f_l_;
    program_ = sim::make_schedule(p_.schedule, pp_, nmb_, v_);
    build_units();
    if (t_.precision == DType::fp16) loss_scale_ = 65536.0f;
  }

  Measurement train() {
    Measurement out;
    RankMeasurement rm;
    for (Count step = 1; step <= o_.steps; ++step) {
      g_.log.clear();
      alloc_.reset_peaks();
      executed_.clear();
      timeline_.clear();
      const auto t0 = Clock::now();
      step_t0_ = t0;
      const auto [loss, skipped] = train_step(step);
      rm.step_seconds = since(t0);
      out.losses.push_back(loss);
      out.skipped.push_back(skipped);
    }
    rm.rank = g_.world_rank;
    rm.coords = g_.coords;
    rm.memory = alloc_.stats();
    rm.actions = executed_;
    rm.timeline = timeline_;
    rm.communication = g_.log.entries();
    rm.optimizer_seconds = optimizer_seconds_;
    out.ranks.push_back(std::move(rm));
    return out;
  }

 private:
  // ---- parameters ---------------------------------------------------------------------------
  std::uint64_t uid(Count layer, int slot) const {
    return static_cast<std::uint64_t>(layer) * 64 + static_cast<std::uint64_t>(slot);
  }

  // Column-parallel weight of `parts` stacked blocks (qkv: q, k, v; SwiGLU mlp_in: gate, up),
  // each split t ways by rows.
  std::function<Count(Count)> column_rows(std::vector<Count> parts, Count cols) const {
    const Count r = g_.coords.tp, t = tp_;
    return [parts, cols, r, t](Count i) {
      Count row = i / cols, col = i % cols, base = 0;
      for (Count p : parts) {
        const Count local = p / t;
        if (row < local) return (base + r * local + row) * cols + col;
        row -= local;
        base += p;
      }
      return Count{-1};
    };
  }
  // Row-parallel weight (rows x full_cols) split t ways by columns.
  std::function<Count(Count)> row_cols(Count full_cols) const {
    const Count r = g_.coords.tp, lc = full_cols / tp_;
    return [r, lc, full_cols](Count i) { return (i / lc) * full_cols + r * lc + i % lc; };
  }
  static std::function<Count(Count)> identity() {
    return [](Count i) { return i; };
  }

  Unit make_layer_unit(Count layer, LayerParams& lp) {
    Unit u;
    u.kind = 0;
    const bool ln = m_.norm == Norm::layernorm;
    const Count kvh = m_.kv_hidden();
    const Count f = m_.ffn_hidden_size;
    auto idx = [&](Param&) { return static_cast<int>(u.params.size()) - 1; };
    // Order of the layer op table: input_norm, qkv, attention_out, post_attention_norm, mlp_in,
    // mlp_out (weight then bias).
    idx(u.add(1, h_, Init::one, uid(layer, 0), identity(), sp_)), lp.norm1_g = idx(u.params.back());
    if (ln)
      u.add(1, h_, Init::zero, uid(layer, 1), identity(), sp_), lp.norm1_b = idx(u.params.back());
    u.add((h_ + 2 * kvh) / tp_, h_, Init::normal, uid(layer, 2), column_rows({h_, kvh, kvh}, h_));
    lp.qkv_w = idx(u.params.back());
    if (m_.bias || m_.qkv_bias) {  // Qwen2: biases on q, k and v only
      u.add((h_ + 2 * kvh) / tp_, 1, Init::zero, uid(layer, 3), column_rows({h_, kvh, kvh}, 1));
      lp.qkv_b = idx(u.params.back());
    }
    u.add(h_, h_ / tp_, Init::normal, uid(layer, 4), row_cols(h_)), lp.out_w = idx(u.params.back());
    if (m_.bias)
      u.add(1, h_, Init::zero, uid(layer, 5), identity(), sp_), lp.out_b = idx(u.params.back());
    u.add(1, h_, Init::one, uid(layer, 6), identity(), sp_), lp.norm2_g = idx(u.params.back());
    if (ln)
      u.add(1, h_, Init::zero, uid(layer, 7), identity(), sp_), lp.norm2_b = idx(u.params.back());
    const std::vector<Count> in_parts =
        m_.mlp == Mlp::swiglu ? std::vector<Count>{f, f} : std::vector<Count>{f};
    u.add(mi_l_, h_, Init::normal, uid(layer, 8), column_rows(in_parts, h_));
    lp.in_w = idx(u.params.back());
    if (m_.bias)
      u.add(mi_l_, 1, Init::zero, uid(layer, 9), column_rows(in_parts, 1)),
          lp.in_b = idx(u.params.back());
    u.add(h_, f_l_, Init::normal, uid(layer, 10), row_cols(f)), lp.mlp_out_w = idx(u.params.back());
    if (m_.bias)
      u.add(1, h_, Init::zero, uid(layer, 11), identity(), sp_),
          lp.mlp_out_b = idx(u.params.back());
    return u;
  }

  void build_units() {
    const std::vector<Count> counts = stage_layer_counts(s_);
    const Count per_chunk = counts[static_cast<std::size_t>(stage_)] / v_;
    const Count rank_row0 = g_.coords.tp * vl_;
    for (Count c = 0; c < v_; ++c) {
      Chunk ch;
      const Count vs = c * pp_ + stage_;
      if (v_ == 1) {
        Count first = 0;
        for (int st = 0; st < stage_; ++st) first += counts[static_cast<std::size_t>(st)];
        ch.first_layer = first;
      } else {
        ch.first_layer = vs * per_chunk;
      }
      ch.num_layers = per_chunk;
      ch.first = vs == 0;
      ch.last = vs == pp_ * v_ - 1;
      if (ch.first) {
        Unit u;
        u.kind = 1;
        u.add(vl_, h_, Init::normal, uid(100000, 0),
              [=, this](Count i) { return rank_row0 * h_ + i; });
        if (m_.position_embedding == PositionEmbedding::learned) {
          u.add(m_.max_position_embeddings, h_, Init::normal, uid(100000, 1), identity(), sp_);
        }
        u.chunk = static_cast<int>(c);
        ch.embedding = static_cast<int>(units_.size());
        units_.push_back(std::move(u));
      }
      for (Count l = 0; l < per_chunk; ++l) {
        LayerParams lp;
        units_.push_back(make_layer_unit(ch.first_layer + l, lp));
        units_.back().chunk = static_cast<int>(c);
        ch.layer_units.push_back(static_cast<int>(units_.size()) - 1);
        ch.layer_params.push_back(lp);
      }
      if (ch.last) {
        Unit u;
        u.kind = 2;
        u.add(1, h_, Init::one, uid(100001, 0), identity(), sp_);
        if (m_.norm == Norm::layernorm) u.add(1, h_, Init::zero, uid(100001, 1), identity(), sp_);
        // Tied embeddings: with pp > 1 the last stage holds a copy of the word embedding (same
        // parameter id, so the same initial values); with pp = 1 the LM head is the embedding.
        if (!m_.tied_embeddings) {
          u.add(vl_, h_, Init::normal, uid(100001, 2),
                [=, this](Count i) { return rank_row0 * h_ + i; });
        } else if (pp_ > 1) {
          u.add(vl_, h_, Init::normal, uid(100000, 0),
                [=, this](Count i) { return rank_row0 * h_ + i; });
        }
        u.chunk = static_cast<int>(c);
        ch.head = static_cast<int>(units_.size());
        const bool own = !m_.tied_embeddings || pp_ > 1;
        head_w_unit_ = own ? ch.head : chunks_.empty() ? ch.embedding : chunks_.front().embedding;
        head_w_param_ = own ? static_cast<int>(u.params.size()) - 1 : 0;
        units_.push_back(std::move(u));
      }
      chunks_.push_back(std::move(ch));
    }
    // Storage and initial values.
    for (Unit& u : units_) {
      u.padded = p_.zero_stage == 0 ? u.numel : (u.numel + S_ - 1) / S_ * S_;
      u.shard = u.padded / S_;
      Vec init(static_cast<std::size_t>(u.padded), 0.0f);
      for (const Param& p : u.params) {
        for (Count i = 0; i < p.numel(); ++i) {
          float x = 0.0f;
          if (p.init == Init::one) x = 1.0f;
          if (p.init == Init::normal) {
            // Uniform with the standard deviation 0.02 of GPT-2's init: half-width 0.02*sqrt(3).
            x = 0.0346410f * uniform_pm1(mix(o_.seed ^ mix(p.uid) ^
                                             static_cast<std::uint64_t>(p.global_index(i))));
          }
          init[static_cast<std::size_t>(p.offset + i)] = x;
        }
      }
      const bool z3 = p_.zero_stage >= 3;
      const Count lo = opt_begin(u), n_opt = opt_count(u);
      u.weights = Tensor(alloc_, {z3 ? u.shard : u.padded}, cb_, MemoryTag::weights);
      u.weights.write(init.data() + (z3 ? lo : 0), z3 ? u.shard : u.padded);
      u.grads =
          Tensor(alloc_, {p_.zero_stage >= 2 ? u.shard : u.padded}, gb_, MemoryTag::gradients);
      if (cb_ != DType::fp32) {
        u.master = Tensor(alloc_, {n_opt}, DType::fp32, MemoryTag::optimizer);
        u.master.write(init.data() + lo, n_opt);
      }
      u.m = Tensor(alloc_, {n_opt}, DType::fp32, MemoryTag::optimizer);
      if (t_.optimizer != Optimizer::sgd)
        u.v = Tensor(alloc_, {n_opt}, DType::fp32, MemoryTag::optimizer);
    }
  }

  // The optimizer's range of a unit: all of it (ZeRO 0) or this rank's shard.
  // The shard index is this rank's place in its shard group (S consecutive dp ranks).
  Count opt_begin(const Unit& u) const {
    return p_.zero_stage == 0 ? 0 : static_cast<Count>(g_.dp->rank()) * u.shard;
  }
  Count opt_count(const Unit& u) const { return p_.zero_stage == 0 ? u.padded : u.shard; }

  // ---- timeline -------------------------------------------------------------------------------
  void mark(sim::Track track, sim::SliceKind kind, Count mb, Count chunk, Clock::time_point t0) {
    sim::TraceEvent e;
    e.stage = static_cast<std::int32_t>(stage_);
    e.track = track;
    e.kind = kind;
    e.microbatch = static_cast<std::int32_t>(mb);
    e.chunk = static_cast<std::int32_t>(chunk);
    e.start = std::chrono::duration<double>(t0 - step_t0_).count();
    e.duration = since(t0);
    timeline_.push_back(e);
  }

  // ---- tensors and communication helpers ------------------------------------------------------
  Vec rd(const Tensor& t) const { return t.to_vector(); }
  void rnd(Vec& x, DType d) const {
    if (d == DType::fp32) return;
    for (float& e : x) e = round_to(d, e);
  }
  Tensor save(const Vec& x, DType d = DType::fp32, MemoryTag tag = MemoryTag::activations) {
    Tensor t(alloc_, {static_cast<Count>(x.size())}, d, tag);
    t.write(x.data(), static_cast<Count>(x.size()));
    return t;
  }
  Tensor save_act(const Vec& x) { return save(x, cb_); }

  // Packs fp32 values into a tracked temporary of dtype `d` for a collective and back.
  Tensor pack(const Vec& x, DType d) { return save(x, d, MemoryTag::temporaries); }

  void tp_all_reduce(Vec& x, const char* what, DType d) {
    if (tp_ == 1) return;
    Tensor t = pack(x, d);
    g_.tp->all_reduce(t.data(), t.numel(), d, ReduceOp::sum, what);
    t.read(x.data(), t.numel());
  }
  void tp_all_reduce_max(Vec& x, const char* what) {
    Tensor t = pack(x, DType::fp32);
    g_.tp->all_reduce(t.data(), t.numel(), DType::fp32, ReduceOp::max, what);
    t.read(x.data(), t.numel());
  }
  // (N,h) -> (N/t,h) summed over the TP group (sequence-parallel reduce-scatter along s).
  Vec tp_reduce_scatter(const Vec& x, const char* what) {
    Tensor in = pack(x, cb_);
    Tensor out(alloc_, {in.numel() / tp_}, cb_, MemoryTag::temporaries);
    g_.tp->reduce_scatter(in.data(), out.data(), out.numel(), cb_, what);
    return rd(out);
  }
  // (N/t,h) -> (N,h) gathered along s.
  Vec tp_all_gather(const Vec& x, const char* what) {
    Tensor in = pack(x, cb_);
    Tensor out(alloc_, {in.numel() * tp_}, cb_, MemoryTag::temporaries);
    g_.tp->all_gather(in.data(), out.data(), in.numel(), cb_, what);
    return rd(out);
  }
  // Row-parallel output: all-reduce, or reduce-scatter into the sequence-parallel region.
  Vec reduce_out(Vec x, const char* what) {
    if (tp_ == 1) return x;
    if (sp_) return tp_reduce_scatter(x, what);
    tp_all_reduce(x, what, cb_);
    return x;
  }
  // Column-parallel input: the sequence-parallel shard gathered (identity without SP).
  Vec gather_in(const Vec& x, const char* what) { return sp_ ? tp_all_gather(x, what) : x; }

  // ---- weights of a unit as fp32 ------------------------------------------------------------
  const Tensor& unit_weights(Unit& u) { return p_.zero_stage >= 3 ? u.gathered : u.weights; }
  Vec param(Unit& u, int i) {
    const Param& p = u.params[static_cast<std::size_t>(i)];
    Vec w(static_cast<std::size_t>(p.numel()));
    unit_weights(u).read(w.data(), p.numel(), p.offset);
    return w;
  }
  // Accumulates a parameter gradient into the unit's gradient (full buffer, or the unit gradient
  // buffer before its reduce-scatter under ZeRO-2/3).
  void add_grad(Unit& u, int i, const Vec& g) {
    if (i < 0) return;
    const Param& p = u.params[static_cast<std::size_t>(i)];
    Tensor& dst = p_.zero_stage >= 2 ? u.unit_grad : u.grads;
    Vec cur(static_cast<std::size_t>(p.numel()));
    dst.read(cur.data(), p.numel(), p.offset);
    for (std::size_t k = 0; k < cur.size(); ++k) cur[k] += g[k];
    dst.write(cur.data(), p.numel(), p.offset);
  }

  // ZeRO-3 gathers (one pass keeps at most 1 + prefetch units gathered) and the ZeRO-2/3 unit
  // gradient buffer.
  void acquire(int ui) {
    if (p_.zero_stage < 3) return;
    Unit& u = units_[static_cast<std::size_t>(ui)];
    if (!u.gathered.empty()) return;
    u.gathered = Tensor(alloc_, {u.padded}, cb_, MemoryTag::buffers);
    if (S_ > 1) {
      const auto t0 = Clock::now();
      g_.dp->all_gather(u.weights.data(), u.gathered.data(), u.shard, cb_,
                        std::string("parameters (") + unit_label(u.kind) + ", forward+backward)");
      mark(sim::Track::zero3, sim::SliceKind::zero3_gather, cur_mb_, u.chunk, t0);
    } else {
      u.gathered.fill_from(u.weights.to_vector());
    }
  }
  void release(int ui) {
    if (p_.zero_stage >= 3) units_[static_cast<std::size_t>(ui)].gathered.release();
  }
  void begin_unit_grad(int ui) {
    Unit& u = units_[static_cast<std::size_t>(ui)];
    if (p_.zero_stage >= 2 && u.unit_grad.empty()) {
      u.unit_grad = Tensor(alloc_, {u.padded}, gb_, MemoryTag::buffers);
    }
  }
  // ZeRO-2/3: reduce-scatter the unit's gradient of this micro-batch into the gradient shard.
  void end_unit_grad(int ui) {
    if (p_.zero_stage < 2) return;
    Unit& u = units_[static_cast<std::size_t>(ui)];
    sp_reduce_partials(u, u.unit_grad);
    Tensor part(alloc_, {u.shard}, gb_, MemoryTag::temporaries);
    if (S_ > 1) {
      const auto t0 = Clock::now();
      g_.dp->reduce_scatter(u.unit_grad.data(), part.data(), u.shard, gb_,
                            std::string("gradients (") + unit_label(u.kind) + ")");
      mark(sim::Track::dp, sim::SliceKind::grad_reduce, cur_mb_, u.chunk, t0);
    } else {
      part.fill_from(u.unit_grad.to_vector());
    }
    Vec acc = rd(u.grads), add = rd(part);
    for (std::size_t k = 0; k < acc.size(); ++k) acc[k] += add[k];
    u.grads.fill_from(acc);
    u.unit_grad.release();
  }
  // Sequence parallel: norm weights, row-parallel biases and the position embedding see only
  // this rank's tokens; their gradients are summed over the TP group (Megatron-LM's
  // allreduce of sequence-parallel gradients), one call per unit on the concatenated gradients.
  void sp_reduce_partials(Unit& u, Tensor& grad) {
    if (!sp_) return;
    Count total = 0;
    for (const Param& p : u.params)
      if (p.sp_partial) total += p.numel();
    if (total == 0) return;
    Vec flat(static_cast<std::size_t>(total));
    Count at = 0;
    for (const Param& p : u.params) {
      if (!p.sp_partial) continue;
      grad.read(flat.data() + at, p.numel(), p.offset);
      at += p.numel();
    }
    tp_all_reduce(flat, "sequence-parallel gradients", gb_);
    at = 0;
    for (const Param& p : u.params) {
      if (!p.sp_partial) continue;
      grad.write(flat.data() + at, p.numel(), p.offset);
      at += p.numel();
    }
  }

  // ---- ops ----------------------------------------------------------------------------------
  struct NormOut {
    Vec y;
  };
  Vec norm_fwd(Unit& u, int gi, int bi, const Vec& x, Count n) {
    Vec y(x.size()), mean(n), rstd(n);
    const Vec g = param(u, gi);
    if (m_.norm == Norm::layernorm) {
      const Vec b = param(u, bi);
      dev::layernorm_forward(o_.device, x.data(), g.data(), b.data(), y.data(), mean.data(),
                             rstd.data(), n, h_, 1e-5);
    } else {
      dev::rmsnorm_forward(o_.device, x.data(), g.data(), y.data(), rstd.data(), n, h_, 1e-5);
    }
    rnd(y, cb_);
    return y;
  }
  // The norm saves only its input; mean and rstd are recomputed here (layer op table).
  Vec norm_bwd_input(Unit& u, int gi, const Vec& dy, const Vec& x, Count n) {
    Vec dx(x.size()), mean(n), rstd(n), y(x.size()), dg(h_, 0.0f), db(h_, 0.0f);
    const Vec g = param(u, gi);
    if (m_.norm == Norm::layernorm) {
      Vec zero(h_, 0.0f);
      dev::layernorm_forward(o_.device, x.data(), g.data(), zero.data(), y.data(), mean.data(),
                             rstd.data(), n, h_, 1e-5);
      dev::layernorm_backward(o_.device, dy.data(), x.data(), g.data(), mean.data(), rstd.data(),
                              dx.data(), dg.data(), db.data(), n, h_);
    } else {
      dev::rmsnorm_forward(o_.device, x.data(), g.data(), y.data(), rstd.data(), n, h_, 1e-5);
      dev::rmsnorm_backward(o_.device, dy.data(), x.data(), g.data(), rstd.data(), dx.data(),
                            dg.data(), n, h_);
    }
    return dx;
  }
  // The weight half reads no parameter: d gamma = sum(dy * x_hat) and d beta = sum(dy) do not
  // depend on gamma, and the dx the kernel also writes is discarded. So a zero-bubble W pass
  // needs no ZeRO-3 gather (its unit's parameters were released after the B pass).
  void norm_bwd_weight(Unit& u, int gi, int bi, const Vec& dy, const Vec& x, Count n) {
    Vec dx(x.size()), mean(n), rstd(n), y(x.size()), dg(h_, 0.0f), db(h_, 0.0f);
    const Vec g(static_cast<std::size_t>(h_), 1.0f);
    if (m_.norm == Norm::layernorm) {
      Vec zero(h_, 0.0f);
      dev::layernorm_forward(o_.device, x.data(), g.data(), zero.data(), y.data(), mean.data(),
                             rstd.data(), n, h_, 1e-5);
      dev::layernorm_backward(o_.device, dy.data(), x.data(), g.data(), mean.data(), rstd.data(),
                              dx.data(), dg.data(), db.data(), n, h_);
    } else {
      dev::rmsnorm_forward(o_.device, x.data(), g.data(), y.data(), rstd.data(), n, h_, 1e-5);
      dev::rmsnorm_backward(o_.device, dy.data(), x.data(), g.data(), rstd.data(), dx.data(),
                            dg.data(), n, h_);
    }
    add_grad(u, gi, dg);
    if (bi >= 0) add_grad(u, bi, db);
  }
  Vec linear_fwd(Unit& u, int wi, int bi, const Vec& x, Count n, Count in, Count out) {
    const Vec w = param(u, wi);
    Vec b;
    if (bi >= 0) b = param(u, bi);
    Vec y(static_cast<std::size_t>(n * out));
    const float* bp = bi >= 0 ? b.data() : nullptr;
#ifdef DISTPLAN_HAVE_CUDA
    if (o_.device == Device::cuda) {
      cuda::linear_forward_host(x.data(), w.data(), bp, y.data(), ii(n), ii(in), ii(out));
    } else
#endif
      cpu::linear_forward(x.data(), w.data(), bp, y.data(), n, in, out);
    rnd(y, cb_);
    return y;
  }
  static int ii(Count v) {
    DISTPLAN_CHECK(v <= 0x7FFFFFFF, "GEMM dimension over 2^31");
    return static_cast<int>(v);
  }
  Vec linear_bwd_input(Unit& u, int wi, const Vec& dy, Count n, Count in, Count out) {
    const Vec w = param(u, wi);
    Vec dx(static_cast<std::size_t>(n * in));
#ifdef DISTPLAN_HAVE_CUDA
    if (o_.device == Device::cuda) {
      cuda::linear_backward_input_host(dy.data(), w.data(), dx.data(), ii(n), ii(in), ii(out));
    } else
#endif
      cpu::linear_backward_input(dy.data(), w.data(), dx.data(), n, in, out);
    rnd(dx, cb_);
    return dx;
  }
  void linear_bwd_weight(Unit& u, int wi, int bi, const Vec& dy, const Vec& x, Count n, Count in,
                         Count out) {
    Vec dw(static_cast<std::size_t>(in * out), 0.0f), db(static_cast<std::size_t>(out), 0.0f);
    float* dbp = bi >= 0 ? db.data() : nullptr;
#ifdef DISTPLAN_HAVE_CUDA
    if (o_.device == Device::cuda) {
      cuda::linear_backward_weight_host(dy.data(), x.data(), dw.data(), dbp, ii(n), ii(in),
                                        ii(out));
    } else
#endif
      cpu::linear_backward_weight(dy.data(), x.data(), dw.data(), dbp, n, in, out);
    add_grad(u, wi, dw);
    if (bi >= 0) add_grad(u, bi, db);
  }
  void attention_fwd(const Vec& q, const Vec& k, const Vec& v, Vec& out, Vec* probs, Vec* lse) {
    const Count s = t_.seq_length, b = t_.micro_batch_size;
    out.assign(q.size(), 0.0f);
    if (lse != nullptr) {
      lse->assign(static_cast<std::size_t>(b * a_l_ * s), 0.0f);
      cpu::flash_attention_forward(q.data(), k.data(), v.data(), out.data(), lse->data(), s, b,
                                   a_l_, g_l_, d_);
    } else {
      probs->assign(static_cast<std::size_t>(b * a_l_ * s * s), 0.0f);
      dev::attention_forward(o_.device, q.data(), k.data(), v.data(), out.data(), probs->data(), s,
                             b, a_l_, g_l_, d_);
      rnd(*probs, cb_);
    }
    rnd(out, cb_);
  }

  // ---- one transformer layer ------------------------------------------------------------------
  bool flash() const {
    return t_.attention == Attention::flash;
  }
  bool rotary() const {
    return m_.position_embedding == PositionEmbedding::rotary;
  }

  // Forward of one layer from its saved input sv.x; fills `sv` and returns the output (Nl,h).
  Vec layer_forward(int ui, const LayerParams& lp, LayerSaved& sv) {
    Unit& u = units_[static_cast<std::size_t>(ui)];
    const Count s = t_.seq_length, b = t_.micro_batch_size, kvl = g_l_ * d_, ql = a_l_ * d_;
    const Vec x = rd(sv.x);
    Vec ln1 = norm_fwd(u, lp.norm1_g, lp.norm1_b, x, Nl_);
    sv.ln1 = save_act(ln1);
    const Vec ln1f = gather_in(ln1, "layer activations");
    const Count qkv_w = ql + 2 * kvl;
    const Vec qkv = linear_fwd(u, lp.qkv_w, lp.qkv_b, ln1f, N_, h_, qkv_w);
    Vec q(static_cast<std::size_t>(N_ * ql)), k(static_cast<std::size_t>(N_ * kvl)), v(k.size());
    for (Count n = 0; n < N_; ++n) {
      const float* r = qkv.data() + n * qkv_w;
      std::copy(r, r + ql, q.data() + n * ql);
      std::copy(r + ql, r + ql + kvl, k.data() + n * kvl);
      std::copy(r + ql + kvl, r + qkv_w, v.data() + n * kvl);
    }
    if (rotary()) {
      cpu::rotary_forward(q.data(), s, b, a_l_, d_, 10000.0);
      cpu::rotary_forward(k.data(), s, b, g_l_, d_, 10000.0);
      rnd(q, cb_);
      rnd(k, cb_);
    }
    Vec attn, probs, lse;
    attention_fwd(q, k, v, attn, flash() ? nullptr : &probs, flash() ? &lse : nullptr);
    sv.q = save_act(q);
    sv.k = save_act(k);
    sv.v = save_act(v);
    if (flash()) {
      sv.lse = save(lse, DType::fp32);
    } else if (p_.recompute != Recompute::selective) {
      sv.probs = save_act(probs);
    }
    sv.attn = save_act(attn);
    Vec proj = reduce_out(linear_fwd(u, lp.out_w, -1, attn, N_, ql, h_), "layer activations");
    Vec x2 = x;
    const Vec ob = lp.out_b >= 0 ? param(u, lp.out_b) : Vec();
    for (Count n = 0; n < Nl_; ++n)
      for (Count c = 0; c < h_; ++c)
        x2[n * h_ + c] += proj[n * h_ + c] + (ob.empty() ? 0.0f : ob[c]);
    rnd(x2, cb_);
    sv.x2 = save_act(x2);
    Vec ln2 = norm_fwd(u, lp.norm2_g, lp.norm2_b, x2, Nl_);
    sv.ln2 = save_act(ln2);
    const Vec ln2f = gather_in(ln2, "layer activations");
    const Vec fc1 = linear_fwd(u, lp.in_w, lp.in_b, ln2f, N_, h_, mi_l_);
    sv.fc1 = save_act(fc1);
    Vec act(static_cast<std::size_t>(N_ * f_l_));
    if (m_.mlp == Mlp::swiglu) {
      Vec gate(act.size()), up(act.size());
      split_halves(fc1, gate, up);
      dev::swiglu_forward(o_.device, gate.data(), up.data(), act.data(), N_ * f_l_);
    } else {
      dev::gelu_forward(o_.device, fc1.data(), act.data(), N_ * f_l_);
    }
    rnd(act, cb_);
    sv.act = save_act(act);
    const Vec o =
        reduce_out(linear_fwd(u, lp.mlp_out_w, -1, act, N_, f_l_, h_), "layer activations");
    const Vec b2 = lp.mlp_out_b >= 0 ? param(u, lp.mlp_out_b) : Vec();
    Vec y = x2;
    for (Count n = 0; n < Nl_; ++n)
      for (Count c = 0; c < h_; ++c) y[n * h_ + c] += o[n * h_ + c] + (b2.empty() ? 0.0f : b2[c]);
    rnd(y, cb_);
    return y;
  }

  // SwiGLU's fused mlp_in output (N, 2f/t) holds [gate | up] per token.
  void split_halves(const Vec& fc1, Vec& gate, Vec& up) const {
    for (Count n = 0; n < N_; ++n) {
      std::copy(fc1.data() + n * mi_l_, fc1.data() + n * mi_l_ + f_l_, gate.data() + n * f_l_);
      std::copy(fc1.data() + n * mi_l_ + f_l_, fc1.data() + (n + 1) * mi_l_, up.data() + n * f_l_);
    }
  }

  // Backward of one layer: returns dx (Nl,h). Weight-gradient work goes to `jobs` (run at once
  // unless the schedule splits B and W).
  Vec layer_backward(int ui, const LayerParams& lp, LayerSaved& sv, const Vec& dy,
                     std::vector<std::function<void()>>& jobs) {
    Unit& u = units_[static_cast<std::size_t>(ui)];
    const Count s = t_.seq_length, b = t_.micro_batch_size, kvl = g_l_ * d_, ql = a_l_ * d_;
    LayerSaved* S = &sv;
    // MLP.
    const Vec dyf = gather_in(dy, "layer activations");
    const Vec act = rd(sv.act);
    const Vec dact = linear_bwd_input(u, lp.mlp_out_w, dyf, N_, f_l_, h_);
    jobs.push_back([this, ui, lp, dyf, S, dy] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.mlp_out_w, -1, dyf, rd(S->act), N_, f_l_, h_);
      if (lp.mlp_out_b >= 0) add_grad(uu, lp.mlp_out_b, col_sum(dy, Nl_));
    });
    const Vec fc1 = rd(sv.fc1);
    Vec dfc1(fc1.size());
    if (m_.mlp == Mlp::swiglu) {
      Vec gate(static_cast<std::size_t>(N_ * f_l_)), up(gate.size()), dg(gate.size()),
          du(gate.size());
      split_halves(fc1, gate, up);
      dev::swiglu_backward(o_.device, dact.data(), gate.data(), up.data(), dg.data(), du.data(),
                           N_ * f_l_);
      for (Count n = 0; n < N_; ++n) {
        std::copy(dg.data() + n * f_l_, dg.data() + (n + 1) * f_l_, dfc1.data() + n * mi_l_);
        std::copy(du.data() + n * f_l_, du.data() + (n + 1) * f_l_, dfc1.data() + n * mi_l_ + f_l_);
      }
    } else {
      dev::gelu_backward(o_.device, dact.data(), fc1.data(), dfc1.data(), N_ * f_l_);
    }
    rnd(dfc1, cb_);
    Vec dln2 = reduce_out(linear_bwd_input(u, lp.in_w, dfc1, N_, h_, mi_l_), "layer activations");
    jobs.push_back([this, ui, lp, dfc1, S] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.in_w, lp.in_b, dfc1, gather_in(rd(S->ln2), "layer activations"), N_,
                        h_, mi_l_);
    });
    const Vec x2 = rd(sv.x2);
    Vec dx2 = norm_bwd_input(u, lp.norm2_g, dln2, x2, Nl_);
    jobs.push_back([this, ui, lp, dln2, S] {
      norm_bwd_weight(units_[static_cast<std::size_t>(ui)], lp.norm2_g, lp.norm2_b, dln2, rd(S->x2),
                      Nl_);
    });
    for (std::size_t i = 0; i < dx2.size(); ++i) dx2[i] += dy[i];
    rnd(dx2, cb_);
    // Attention.
    const Vec dx2f = gather_in(dx2, "layer activations");
    const Vec dattn = linear_bwd_input(u, lp.out_w, dx2f, N_, ql, h_);
    jobs.push_back([this, ui, lp, dx2f, dx2, S, ql] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.out_w, -1, dx2f, rd(S->attn), N_, ql, h_);
      if (lp.out_b >= 0) add_grad(uu, lp.out_b, col_sum(dx2, Nl_));
    });
    const Vec q = rd(sv.q), k = rd(sv.k), v = rd(sv.v);
    Vec dq(q.size()), dk(k.size()), dv(v.size());
    if (flash()) {
      const Vec out = rd(sv.attn), lse = rd(sv.lse);
      cpu::flash_attention_backward(dattn.data(), q.data(), k.data(), v.data(), out.data(),
                                    lse.data(), dq.data(), dk.data(), dv.data(), s, b, a_l_, g_l_,
                                    d_);
    } else {
      Vec probs;
      Tensor rebuilt;          // selective recompute's working set, alive for this layer's backward
      if (sv.probs.empty()) {  // selective recompute: rebuild the softmax from q and k
        Vec out;
        attention_fwd(q, k, v, out, &probs, nullptr);
        rebuilt = save_act(probs);
      } else {
        probs = rd(sv.probs);
      }
      dev::attention_backward(o_.device, dattn.data(), q.data(), k.data(), v.data(), probs.data(),
                              dq.data(), dk.data(), dv.data(), s, b, a_l_, g_l_, d_);
    }
    if (rotary()) {
      cpu::rotary_backward(dq.data(), s, b, a_l_, d_, 10000.0);
      cpu::rotary_backward(dk.data(), s, b, g_l_, d_, 10000.0);
    }
    const Count qkv_w = ql + 2 * kvl;
    Vec dqkv(static_cast<std::size_t>(N_ * qkv_w));
    for (Count n = 0; n < N_; ++n) {
      float* r = dqkv.data() + n * qkv_w;
      std::copy(dq.data() + n * ql, dq.data() + (n + 1) * ql, r);
      std::copy(dk.data() + n * kvl, dk.data() + (n + 1) * kvl, r + ql);
      std::copy(dv.data() + n * kvl, dv.data() + (n + 1) * kvl, r + ql + kvl);
    }
    rnd(dqkv, cb_);
    Vec dln1 = reduce_out(linear_bwd_input(u, lp.qkv_w, dqkv, N_, h_, qkv_w), "layer activations");
    jobs.push_back([this, ui, lp, dqkv, S, qkv_w] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.qkv_w, lp.qkv_b, dqkv, gather_in(rd(S->ln1), "layer activations"),
                        N_, h_, qkv_w);
    });
    const Vec x = rd(sv.x);
    Vec dx = norm_bwd_input(u, lp.norm1_g, dln1, x, Nl_);
    jobs.push_back([this, ui, lp, dln1, S] {
      norm_bwd_weight(units_[static_cast<std::size_t>(ui)], lp.norm1_g, lp.norm1_b, dln1, rd(S->x),
                      Nl_);
    });
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dx2[i];
    rnd(dx, cb_);
    return dx;
  }

  Vec col_sum(const Vec& x, Count n) const {
    Vec out(static_cast<std::size_t>(h_), 0.0f);
    for (Count i = 0; i < n; ++i)
      for (Count c = 0; c < h_; ++c) out[c] += x[i * h_ + c];
    return out;
  }

  // ---- data -----------------------------------------------------------------------------------
  // Token j of global sample `sample` of step `step` (s + 1 tokens: inputs and shifted targets).
  std::int32_t token(Count step, Count sample, Count j) const {
    if (o_.repeat_batch) step = 1;
    const std::uint64_t hsh = mix(o_.seed * 7919 + mix(static_cast<std::uint64_t>(step) << 40 ^
                                                       static_cast<std::uint64_t>(sample) << 16 ^
                                                       static_cast<std::uint64_t>(j)));
    return static_cast<std::int32_t>(hsh % static_cast<std::uint64_t>(m_.vocab_size));
  }
  // Ids or targets of micro-batch `mb` (sequence-major: token n = s_i*b + b_i).
  std::vector<std::int32_t> batch_tokens(Count step, Count mb, Count shift) const {
    const Count b = t_.micro_batch_size, s = t_.seq_length;
    std::vector<std::int32_t> out(static_cast<std::size_t>(N_));
    for (Count si = 0; si < s; ++si)
      for (Count bi = 0; bi < b; ++bi) {
        const Count sample = (g_.coords.dp * nmb_ + mb) * b + bi;
        out[static_cast<std::size_t>(si * b + bi)] = token(step, sample, si + shift);
      }
    return out;
  }

  // ---- chunks: forward and backward of one (micro-batch, chunk) --------------------------------
  struct Chunk {
    Count first_layer = 0, num_layers = 0;
    bool first = false, last = false;
    int embedding = -1, head = -1;
    std::vector<int> layer_units;
    std::vector<LayerParams> layer_params;
  };

  // What virtual stage `vs` receives for micro-batch `mb`.
  static P2PTag tag(bool grad, Count mb, Count vs) {
    P2PTag t;
    t.kind = grad ? P2PTag::Kind::gradient : P2PTag::Kind::activation;
    t.microbatch = mb;
    t.virtual_stage = vs;
    return t;
  }

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
    const char* what = "";
    sim::Track track = sim::Track::send_next;
    sim::SliceKind kind = sim::SliceKind::send_activation;
    Count mb = 0, chunk = 0;
  };
  void post_send(const Vec& x, int peer, P2PTag t, const char* what, sim::Track track,
                 sim::SliceKind kind, Count mb, Count c) {
    DISTPLAN_CHECK(!outbox_, "a pipeline send is already waiting");
    outbox_ = OutMessage{std::make_shared<Tensor>(pack(x, cb_)), peer, t, what, track, kind, mb, c};
  }
  // Issues the waiting send (if any) and the receive into `in` (if given) as one exchange.
  void exchange(Tensor* in, int peer, P2PTag t) {
    std::optional<OutMessage> out = std::move(outbox_);
    outbox_.reset();
    std::vector<P2POp> batch;
    if (out) {
      P2POp op;
      op.dir = P2POp::Dir::send;
      op.peer = out->peer;
      op.data = out->buf->data();
      op.n = out->buf->numel();
      op.dtype = cb_;
      op.tag = out->tag;
      op.what = out->what;
      op.keep_alive = out->buf;
      batch.push_back(std::move(op));
    }
    if (in != nullptr) {
      P2POp op;
      op.dir = P2POp::Dir::recv;
      op.peer = peer;
      op.data = in->data();
      op.n = in->numel();
      op.dtype = cb_;
      op.tag = t;
      batch.push_back(std::move(op));
    }
    if (batch.empty()) return;
    const auto t0 = Clock::now();
    g_.pp->send_recv(std::move(batch));
    if (out) mark(out->track, out->kind, out->mb, out->chunk, t0);
  }
  void flush_sends() {
    exchange(nullptr, 0, P2PTag{});
  }
  // Whether action `a` starts by receiving from a neighbouring stage.
  bool receives_first(const sim::Action& a) const {
    const Chunk& ch = chunks_[static_cast<std::size_t>(a.chunk)];
    if (a.op == sim::Op::forward) return !ch.first;
    if (a.op == sim::Op::backward || a.op == sim::Op::backward_input) return !ch.last;
    return false;
  }
  Count vstage(Count c) const {
    return c * pp_ + stage_;
  }
  int prev_stage() const {
    return static_cast<int>((stage_ + pp_ - 1) % pp_);
  }
  int next_stage() const {
    return static_cast<int>((stage_ + 1) % pp_);
  }

  // Units of a chunk in forward order.
  std::vector<int> chunk_units(const Chunk& ch) const {
    std::vector<int> us;
    if (ch.embedding >= 0) us.push_back(ch.embedding);
    us.insert(us.end(), ch.layer_units.begin(), ch.layer_units.end());
    if (ch.head >= 0) us.push_back(ch.head);
    return us;
  }
  // ZeRO-3 with prefetch: gathers the unit at position i of a pass and the next one.
  void acquire_in_pass(const std::vector<int>& pass, std::size_t i) {
    acquire(pass[i]);
    for (Count k = 1; k <= s_.assumptions.zero3_prefetch_layers && i + k < pass.size(); ++k)
      acquire(pass[i + static_cast<std::size_t>(k)]);
  }

  void forward(Count step, Count mb, Count c) {
    const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    ChunkState& st = states_[{mb, c}];
    const std::vector<int> pass = chunk_units(ch);
    std::size_t pi = 0;
    Vec x;
    if (ch.first) {
      acquire_in_pass(pass, pi);
      Unit& u = units_[static_cast<std::size_t>(ch.embedding)];
      st.ids = batch_tokens(step, mb, 0);
      Vec table = param(u, 0);
      Vec e(static_cast<std::size_t>(N_ * h_));
      dev::embedding_forward(o_.device, st.ids.data(), table.data(), e.data(), N_, h_,
                             g_.coords.tp * vl_, vl_);
      rnd(e, cb_);
      if (tp_ > 1) {
        if (sp_) {
          e = tp_reduce_scatter(e, "embedding output");
        } else {
          tp_all_reduce(e, "embedding output", cb_);
        }
      }
      if (m_.position_embedding == PositionEmbedding::learned) add_positions(u, e, true);
      rnd(e, cb_);
      x = std::move(e);
      release(pass[pi++]);
    } else {
      x.assign(static_cast<std::size_t>(Nl_ * h_), 0.0f);
      Tensor in(alloc_, {Nl_ * h_}, cb_, MemoryTag::temporaries);
      exchange(&in, prev_stage(), tag(false, mb, vstage(c)));
      x = rd(in);
    }
    st.layers.resize(static_cast<std::size_t>(ch.num_layers));
    for (Count l = 0; l < ch.num_layers; ++l, ++pi) {
      acquire_in_pass(pass, pi);
      LayerSaved& sv = st.layers[static_cast<std::size_t>(l)];
      sv.x = save_act(x);
      x = layer_forward(ch.layer_units[static_cast<std::size_t>(l)],
                        ch.layer_params[static_cast<std::size_t>(l)], sv);
      if (p_.recompute == Recompute::full) {
        Tensor keep = std::move(sv.x);
        sv = LayerSaved{};
        sv.x = std::move(keep);
      }
      release(pass[pi]);
    }
    if (ch.last) {
      acquire_in_pass(pass, pi);
      head_forward(st, x, step, mb);
      release(pass[pi]);
    } else {
      post_send(x, next_stage(), tag(false, mb, vstage(c) + 1), "activations (forward)",
                sim::Track::send_next, sim::SliceKind::send_activation, mb, c);
    }
  }

  void add_positions(Unit& u, Vec& e, bool fwd_dir) {
    // Under SP this rank holds sequence positions [r*s/t, (r+1)*s/t).
    const Count s0 = sp_ ? g_.coords.tp * (t_.seq_length / tp_) : 0;
    const Count sl = sp_ ? t_.seq_length / tp_ : t_.seq_length;
    (void)fwd_dir;
    const Param& p = u.params[1];
    Vec pos(static_cast<std::size_t>(sl * h_));
    unit_weights(u).read(pos.data(), sl * h_, p.offset + s0 * h_);
    cpu::add_position_forward(pos.data(), e.data(), sl, t_.micro_batch_size, h_);
  }

  void head_forward(ChunkState& st, const Vec& x, Count step, Count mb) {
    const Chunk& ch = chunks_.back();
    Unit& u = units_[static_cast<std::size_t>(ch.head)];
    const bool ln = m_.norm == Norm::layernorm;
    HeadSaved hs;
    hs.x = save_act(x);
    const Vec y = norm_fwd(u, 0, ln ? 1 : -1, x, Nl_);
    hs.ln = save_act(y);
    const Vec yf = gather_in(y, "lm head input");
    Vec logits = linear_fwd(units_[static_cast<std::size_t>(head_w_unit_)], head_w_param_, -1, yf,
                            N_, h_, vl_);
    hs.logits = save(logits, cb_, MemoryTag::buffers);
    hs.targets = batch_tokens(step, mb, 1);
    // Vocab-parallel cross-entropy: max, target logit and sum of exponentials over the TP group.
    Vec mx(N_), tl(N_), se(N_), loss(N_);
    dev::ce_local_max(o_.device, logits.data(), mx.data(), N_, vl_);
    if (tp_ > 1) tp_all_reduce_max(mx, "cross-entropy statistics");
    dev::ce_local_target(o_.device, logits.data(), hs.targets.data(), tl.data(), N_, vl_,
                         g_.coords.tp * vl_);
    if (tp_ > 1) tp_all_reduce(tl, "cross-entropy statistics", DType::fp32);
    dev::ce_local_sumexp(o_.device, logits.data(), mx.data(), se.data(), N_, vl_);
    if (tp_ > 1) tp_all_reduce(se, "cross-entropy statistics", DType::fp32);
    cpu::ce_loss(mx.data(), se.data(), tl.data(), loss.data(), N_);
    // The fp32 softmax, kept to the backward; its gradient is softmax - onehot.
    Vec sm(logits.size());
    for (Count n = 0; n < N_; ++n)
      for (Count j = 0; j < vl_; ++j)
        sm[n * vl_ + j] =
            static_cast<float>(std::exp(static_cast<double>(logits[n * vl_ + j]) - mx[n]) / se[n]);
    hs.softmax = save(sm, DType::fp32, MemoryTag::buffers);
    if (g_.coords.tp == 0) {
      for (float l : loss) loss_sum_ += l;
    }
    st.head = std::move(hs);
  }

  // d loss / d logits of the LM head. Reads no parameter, so it runs before the head's ZeRO-3
  // gather and frees the logits workspace first: the two are never alive together
  // (docs/memory.md, buffers).
  Vec head_loss_grad(ChunkState& st) {
    HeadSaved& hs = *st.head;
    // d loss / d logit = (softmax - onehot) * scale / tokens in the global batch.
    const float dl = loss_scale_ / static_cast<float>(t_.global_batch_size * t_.seq_length);
    Vec dlogits = rd(hs.softmax);
    const Count v0 = g_.coords.tp * vl_;
    for (Count n = 0; n < N_; ++n) {
      const Count tj = hs.targets[static_cast<std::size_t>(n)] - v0;
      if (tj >= 0 && tj < vl_) dlogits[n * vl_ + tj] -= 1.0f;
      for (Count j = 0; j < vl_; ++j) dlogits[n * vl_ + j] *= dl;
    }
    rnd(dlogits, cb_);
    hs.logits.release();
    hs.softmax.release();
    return dlogits;
  }

  // Backward of the LM head from d loss / d logits: returns the gradient of the final norm's
  // input (Nl,h).
  Vec head_backward(ChunkState& st, const Vec& dlogits, std::vector<std::function<void()>>& jobs) {
    const Chunk& ch = chunks_.back();
    const int ui = ch.head;
    Unit& u = units_[static_cast<std::size_t>(ui)];
    const bool ln = m_.norm == Norm::layernorm;
    HeadSaved& hs = *st.head;
    const int wu = head_w_unit_, wi = head_w_param_;
    Vec dyf = linear_bwd_input(units_[static_cast<std::size_t>(wu)], wi, dlogits, N_, h_, vl_);
    Vec dy;
    if (tp_ > 1 && sp_) {
      dy = tp_reduce_scatter(dyf, "lm head input gradient");
    } else {
      if (tp_ > 1) tp_all_reduce(dyf, "lm head input gradient", cb_);
      dy = dyf;
    }
    HeadSaved* H = &hs;
    jobs.push_back([this, wu, wi, dlogits, H] {
      linear_bwd_weight(units_[static_cast<std::size_t>(wu)], wi, -1, dlogits,
                        gather_in(rd(H->ln), "lm head input"), N_, h_, vl_);
    });
    const Vec x = rd(hs.x);
    Vec dx = norm_bwd_input(u, 0, dy, x, Nl_);
    jobs.push_back([this, ui, ln, dy, H] {
      norm_bwd_weight(units_[static_cast<std::size_t>(ui)], 0, ln ? 1 : -1, dy, rd(H->x), Nl_);
    });
    rnd(dx, cb_);
    return dx;
  }

  void embedding_backward(ChunkState& st, const Vec& dx, std::vector<std::function<void()>>& jobs) {
    const int ui = chunks_.front().embedding;
    auto ids = st.ids;
    jobs.push_back([this, ui, dx, ids] {
      Unit& u = units_[static_cast<std::size_t>(ui)];
      if (m_.position_embedding == PositionEmbedding::learned) {
        const Count s0 = sp_ ? g_.coords.tp * (t_.seq_length / tp_) : 0;
        const Count sl = sp_ ? t_.seq_length / tp_ : t_.seq_length;
        Vec dpos(static_cast<std::size_t>(u.params[1].numel()), 0.0f);
        cpu::add_position_backward(dx.data(), dpos.data() + s0 * h_, sl, t_.micro_batch_size, h_);
        add_grad(u, 1, dpos);
      }
      // Backward of the reduce-scatter into the sequence-parallel region: an all-gather.
      const Vec dxf = gather_in(dx, "embedding output gradient");
      Vec dt(static_cast<std::size_t>(vl_ * h_), 0.0f);
      dev::embedding_backward(o_.device, ids.data(), dxf.data(), dt.data(), N_, h_,
                              g_.coords.tp * vl_, vl_);
      add_grad(u, 0, dt);
    });
  }

  // Backward (or its input half) of one (micro-batch, chunk).
  void backward(Count mb, Count c, bool split) {
    const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    ChunkState& st = states_.at({mb, c});
    std::vector<int> pass = chunk_units(ch);
    std::reverse(pass.begin(), pass.end());
    std::size_t pi = 0;
    Vec dy;
    // Each unit's weight jobs are run at once (non-split) or queued with the unit they complete.
    auto flush = [&](std::vector<std::function<void()>>& jobs, int ui) {
      if (!split) {
        begin_unit_grad(ui);
        for (auto& j : jobs) j();
        end_unit_grad(ui);
      } else {
        for (auto& j : jobs) {
          st.weight_jobs.push_back(std::move(j));
          st.weight_job_units.push_back(-1);
        }
        if (!st.weight_job_units.empty()) st.weight_job_units.back() = ui;
      }
      jobs.clear();
    };
    std::vector<std::function<void()>> jobs;
    if (ch.last) {
      const Vec dlogits = head_loss_grad(st);
      acquire_in_pass(pass, pi);
      dy = head_backward(st, dlogits, jobs);
      flush(jobs, pass[pi]);
      release(pass[pi++]);
    } else {
      Tensor in(alloc_, {Nl_ * h_}, cb_, MemoryTag::temporaries);
      exchange(&in, next_stage(), tag(true, mb, vstage(c)));
      dy = rd(in);
    }
    for (Count l = ch.num_layers - 1; l >= 0; --l, ++pi) {
      acquire_in_pass(pass, pi);
      LayerSaved& sv = st.layers[static_cast<std::size_t>(l)];
      const int ui = ch.layer_units[static_cast<std::size_t>(l)];
      const LayerParams& lp = ch.layer_params[static_cast<std::size_t>(l)];
      if (p_.recompute == Recompute::full) (void)layer_forward(ui, lp, sv);  // rebuild the layer
      dy = layer_backward(ui, lp, sv, dy, jobs);
      flush(jobs, ui);
      if (!split) sv = LayerSaved{};
      release(pass[pi]);
    }
    if (ch.first) {
      acquire_in_pass(pass, pi);
      embedding_backward(st, dy, jobs);
      flush(jobs, pass[pi]);
      release(pass[pi]);
    } else {
      post_send(dy, prev_stage(), tag(true, mb, vstage(c) - 1), "gradients (backward)",
                sim::Track::send_prev, sim::SliceKind::send_gradient, mb, c);
    }
    if (!split) states_.erase({mb, c});
  }

  void backward_weight(Count mb, Count c) {
    ChunkState& st = states_.at({mb, c});
    int open = -1;
    for (std::size_t i = 0; i < st.weight_jobs.size(); ++i) {
      if (open < 0) {
        // The unit this run of jobs completes.
        for (std::size_t k = i; k < st.weight_jobs.size(); ++k)
          if (st.weight_job_units[k] >= 0) {
            open = st.weight_job_units[k];
            break;
          }
        begin_unit_grad(open);
      }
      st.weight_jobs[i]();
      if (st.weight_job_units[i] >= 0) {
        end_unit_grad(st.weight_job_units[i]);
        open = -1;
      }
    }
    states_.erase({mb, c});
  }

  // ---- the step -------------------------------------------------------------------------------
  std::pair<double, bool> train_step(Count step) {
    loss_sum_ = 0;
    for (Unit& u : units_) u.grads.zero();
    for (const sim::Action& a : program_.programs[static_cast<std::size_t>(stage_)]) {
      const auto t0 = Clock::now();
      cur_mb_ = a.microbatch;
      if (!receives_first(a)) flush_sends();
      switch (a.op) {
        case sim::Op::forward:
          forward(step, a.microbatch, a.chunk);
          break;
        case sim::Op::backward:
          backward(a.microbatch, a.chunk, false);
          break;
        case sim::Op::backward_input:
          backward(a.microbatch, a.chunk, true);
          break;
        case sim::Op::backward_weight:
          backward_weight(a.microbatch, a.chunk);
          break;
      }
      executed_.push_back({a, since(t0)});
      mark(sim::Track::compute, slice_kind(a.op), a.microbatch, a.chunk, t0);
    }
    cur_mb_ = -1;
    flush_sends();
    g_.pp->barrier();
    const auto t0 = Clock::now();
    // Tied embeddings (pp > 1): the first stage's word embedding and the last stage's copy sum
    // their gradients over the embedding group, once per step (Megatron-LM's
    // _allreduce_word_embedding_grads), before the data-parallel reduction.
    if (m_.tied_embeddings && pp_ > 1 && (stage_ == 0 || stage_ == pp_ - 1)) {
      const auto te = Clock::now();
      Unit& u = units_[static_cast<std::size_t>(stage_ == 0 ? chunks_.front().embedding
                                                            : chunks_.back().head)];
      const Param& w = stage_ == 0 ? u.params.front() : u.params.back();
      char* base = static_cast<char*>(u.grads.data());
      g_.embedding->all_reduce(base + w.offset * bytes_of(gb_), w.numel(), gb_, ReduceOp::sum,
                               "tied embedding gradients");
      mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, stage_ == 0 ? 0 : v_ - 1, te);
    }
    // Data-parallel reduction (ZeRO 0/1: once per step, unit by unit).
    for (Unit& u : units_) {
      const auto tu = Clock::now();
      const bool replicas = p_.zero_stage > 0 && g_.dp_replicate->size() > 1;
      const bool reduces =
          (p_.zero_stage <= 1 && sp_) || S_ > 1 || (p_.zero_stage == 0 && p_.dp > 1) || replicas;
      if (p_.zero_stage <= 1) sp_reduce_partials(u, u.grads);
      if (S_ > 1 || (p_.zero_stage == 0 && p_.dp > 1)) {
        const std::string what = std::string("gradients (") + unit_label(u.kind) + ")";
        if (p_.zero_stage == 0) {
          g_.dp->all_reduce(u.grads.data(), u.grads.numel(), gb_, ReduceOp::sum, what);
        } else if (p_.zero_stage == 1) {
          Tensor part(alloc_, {u.shard}, gb_, MemoryTag::temporaries);
          g_.dp->reduce_scatter(u.grads.data(), part.data(), u.shard, gb_, what);
          Vec pv = rd(part);
          u.grads.write(pv.data(), u.shard, opt_begin(u));
        }
      }
      // Hybrid sharding: each shard is summed over the dp/S replicas holding it, once per step.
      if (replicas) {
        char* base = static_cast<char*>(u.grads.data());
        const Count off = p_.zero_stage >= 2 ? 0 : opt_begin(u);
        g_.dp_replicate->all_reduce(base + off * bytes_of(gb_), u.shard, gb_, ReduceOp::sum,
                                    std::string("gradients (") + unit_label(u.kind) + ")");
      }
      if (reduces) mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, u.chunk, tu);
    }
    if (step == 1 && !o_.dump_gradients.empty()) dump_gradients();
    const auto t_opt = Clock::now();
    // fp16: skip the step when any gradient overflowed (all ranks agree).
    double overflow = 0;
    if (t_.precision == DType::fp16) {
      for (Unit& u : units_) {
        const Count off = p_.zero_stage >= 2 ? 0 : opt_begin(u);
#ifdef DISTPLAN_HAVE_CUDA
        if (o_.device == Device::cuda) {
          DeviceF32 tmp;
          if (cuda::has_overflow(fp32_view(u.grads, off, opt_count(u), tmp),
                                 static_cast<std::size_t>(opt_count(u))))
            overflow = 1;
          continue;
        }
#endif
        Vec gv(static_cast<std::size_t>(opt_count(u)));
        u.grads.read(gv.data(), opt_count(u), off);
        if (cpu::has_overflow(gv.data(), opt_count(u))) overflow = 1;
      }
      g_.world_reduce(&overflow, 1, ReduceOp::max);
    }
    if (overflow == 0) {
      ++opt_steps_;
      for (Unit& u : units_) optimizer_step(u);
      if (t_.precision == DType::fp16 && ++good_steps_ % 1000 == 0) loss_scale_ *= 2.0f;
    } else {
      loss_scale_ /= 2.0f;
      good_steps_ = 0;
    }
    optimizer_seconds_ = since(t0);
    mark(sim::Track::compute, sim::SliceKind::optimizer, -1, -1, t_opt);
    double loss = loss_sum_;
    g_.world_reduce(&loss, 1, ReduceOp::sum);
    return {loss / static_cast<double>(t_.global_batch_size * t_.seq_length), overflow != 0};
  }

  // The reduced gradient this rank holds (the optimizer's range of every unit, as
  // optimizer_step reads it), element by element with its parameter and index in the unsharded
  // tensor; ZeRO padding is left out (RunOptions::dump_gradients).
  void dump_gradients() const {
    std::vector<GradientRecord> out;
    for (const Unit& u : units_) {
      const Count lo = opt_begin(u), n = opt_count(u);
      Vec gv(static_cast<std::size_t>(n));
      u.grads.read(gv.data(), n, p_.zero_stage >= 2 ? 0 : lo);
      for (const Param& p : u.params) {
        const Count a = std::max(lo, p.offset), b = std::min(lo + n, p.offset + p.numel());
        if (a >= b) continue;
        GradientRecord r;
        r.param = p.uid;
        for (Count j = a; j < b; ++j) {
          r.index.push_back(p.global_index(j - p.offset));
          r.value.push_back(gv[static_cast<std::size_t>(j - lo)] / loss_scale_);
        }
        out.push_back(std::move(r));
      }
    }
    write_gradient_dump(o_.dump_gradients + "/rank" + std::to_string(g_.world_rank) + ".grad", out);
  }

#ifdef DISTPLAN_HAVE_CUDA
  // A raw fp32 device buffer outside the tracking allocator (a cast's scratch), freed with the
  // scope.
  class DeviceF32 {
   public:
    DeviceF32() = default;
    DeviceF32(const DeviceF32&) = delete;
    DeviceF32& operator=(const DeviceF32&) = delete;
    ~DeviceF32() {
      if (p_ != nullptr) cuda::device_free(p_);
    }
    float* allocate(Count n) {
      DISTPLAN_CHECK(p_ == nullptr && n >= 0, "scratch buffer allocated twice");
      p_ = static_cast<float*>(
          cuda::device_alloc_zeroed(static_cast<std::size_t>(std::max<Count>(n, 1)) * 4));
      return p_;
    }

   private:
    float* p_ = nullptr;
  };
  static cuda::Type cuda_type(DType d) {
    return static_cast<cuda::Type>(static_cast<int>(d));
  }
  // Elements [off, off + n) of a device tensor as fp32 on the device: the tensor itself when it is
  // fp32, else a cast into `scratch`.
  static const float* fp32_view(const Tensor& t, Count off, Count n, DeviceF32& scratch) {
    DISTPLAN_CHECK(off >= 0 && off + n <= t.numel(), "device view out of range");
    if (t.dtype() == DType::fp32) return t.f32() + off;
    float* out = scratch.allocate(n);
    const char* src = static_cast<const char*>(t.data()) + off * bytes_of(t.dtype());
    cuda::cast(cuda_type(t.dtype()), src, cuda::Type::fp32, out, static_cast<std::size_t>(n));
    return out;
  }
  // Adam/AdamW on the device: gradients, fp32 master weights and both moments never leave it; the
  // compute-dtype weights are a cast of the master weights (round to nearest even, as
  // Tensor::write on the CPU).
  void adam_step_on_device(Unit& u) {
    const Count lo = opt_begin(u), n = opt_count(u);
    const Count woff = p_.zero_stage >= 3 ? 0 : lo;
    DISTPLAN_CHECK(u.m.numel() == n && u.v.numel() == n, "optimizer state size");
    DeviceF32 scratch;
    const float* g = fp32_view(u.grads, p_.zero_stage >= 2 ? 0 : lo, n, scratch);
    float* w = cb_ != DType::fp32 ? u.master.f32() : u.weights.f32() + woff;
    cpu::AdamConfig c;
    c.lr = o_.learning_rate;
    c.weight_decay = o_.weight_decay;
    c.decoupled = t_.optimizer == Optimizer::adamw;
    cuda::adam_step(w, g, u.m.f32(), u.v.f32(), static_cast<std::size_t>(n), c.lr, c.beta1, c.beta2,
                    c.eps, c.weight_decay, c.decoupled, opt_steps_, 1.0f / loss_scale_);
    if (cb_ != DType::fp32) {
      char* dst = static_cast<char*>(u.weights.data()) + woff * bytes_of(cb_);
      cuda::cast(cuda::Type::fp32, w, cuda_type(cb_), dst, static_cast<std::size_t>(n));
    }
  }
#endif

  void optimizer_step(Unit& u) {
#ifdef DISTPLAN_HAVE_CUDA
    if (o_.device == Device::cuda && t_.optimizer != Optimizer::sgd) {
      adam_step_on_device(u);
      gather_updated_shards(u);
      return;
    }
#endif
    const Count lo = opt_begin(u), n = opt_count(u);
    const bool z3 = p_.zero_stage >= 3;
    Vec g(static_cast<std::size_t>(n));
    u.grads.read(g.data(), n, p_.zero_stage >= 2 ? 0 : lo);
    // Master weights: the fp32 copy, or the fp32 weights themselves.
    Vec w(static_cast<std::size_t>(n));
    if (cb_ != DType::fp32) {
      u.master.read(w.data(), n);
    } else {
      u.weights.read(w.data(), n, z3 ? 0 : lo);
    }
    const float gscale = 1.0f / loss_scale_;
    if (t_.optimizer == Optimizer::sgd) {
      if (o_.device == Device::cuda) {  // no SGD kernel: the momentum makes a host round trip
        Vec mom = rd(u.m);
        cpu::sgd_step(w.data(), g.data(), mom.data(), n, o_.learning_rate, 0.9f, gscale);
        u.m.fill_from(mom);
      } else {
        cpu::sgd_step(w.data(), g.data(), u.m.f32(), n, o_.learning_rate, 0.9f, gscale);
      }
    } else {
      cpu::AdamConfig c;
      c.lr = o_.learning_rate;
      c.weight_decay = o_.weight_decay;
      c.decoupled = t_.optimizer == Optimizer::adamw;
      cpu::adam_step(w.data(), g.data(), u.m.f32(), u.v.f32(), n, c, opt_steps_, gscale);
    }
    if (cb_ != DType::fp32) u.master.write(w.data(), n);
    u.weights.write(w.data(), n, z3 ? 0 : lo);
    gather_updated_shards(u);
  }

  // ZeRO-1/2: every rank gathers the updated shards into its full weights.
  void gather_updated_shards(Unit& u) {
    const Count lo = opt_begin(u);
    if (p_.zero_stage < 3 && S_ > 1) {
      Tensor mine(alloc_, {u.shard}, cb_, MemoryTag::temporaries);
      const char* src = static_cast<const char*>(u.weights.data()) + lo * bytes_of(cb_);
#ifdef DISTPLAN_HAVE_CUDA
      if (o_.device == Device::cuda) {
        cuda::copy_on_device(mine.data(), src, static_cast<std::size_t>(mine.bytes()));
      } else
#endif
        std::memcpy(mine.data(), src, static_cast<std::size_t>(mine.bytes()));
      const auto t0 = Clock::now();
      g_.dp->all_gather(mine.data(), u.weights.data(), u.shard, cb_,
                        std::string("parameters (") + unit_label(u.kind) + ")");
      mark(sim::Track::dp, sim::SliceKind::param_gather, -1, u.chunk, t0);
    }
  }

  const Scenario& s_;
  const ModelSpec& m_;
  const TrainingSpec& t_;
  const ParallelSpec& p_;
  const RunOptions& o_;
  ProcessGroups& g_;
  TrackingAllocator alloc_;
  DType cb_ = DType::bf16, gb_ = DType::bf16;
  Count tp_ = 1, S_ = 1, pp_ = 1, v_ = 1, nmb_ = 1, N_ = 0, Nl_ = 0, h_ = 0, vocab_ = 0, vl_ = 0;
  Count a_l_ = 0, g_l_ = 0, d_ = 0, f_l_ = 0, mi_l_ = 0;
  int stage_ = 0;
  bool sp_ = false;
  sim::SchedulePrograms program_;
  std::vector<Unit> units_;
  std::vector<Chunk> chunks_;
  std::map<std::pair<Count, Count>, ChunkState> states_;
  std::optional<OutMessage> outbox_;
  std::vector<ExecutedAction> executed_;
  std::vector<sim::TraceEvent> timeline_;
  Clock::time_point step_t0_ = Clock::now();
  Count cur_mb_ = -1;
  int head_w_unit_ = -1, head_w_param_ = -1;  // the LM head weight: (unit, parameter)
  double loss_sum_ = 0;
  float loss_scale_ = 1.0f;
  Count opt_steps_ = 0, good_steps_ = 0;
  Seconds optimizer_seconds_ = 0;
};

}  // namespace

void check_supported(const Scenario& s) {
  // The trainer places chunk c of stage s at virtual stage c*p + s and routes its messages so;
  // a V program would run with the wrong layers and neighbours.
  if (v_shape(s.parallel.schedule)) {
    throw InputError("/parallel/schedule",
                     "the backend does not run the V-shape schedule " +
                         std::string(to_string(s.parallel.schedule)) +
                         " (chunks s and 2p - 1 - s on stage s); simulate it, or train with "
                         "zb_h1, zb_h2 or interleaved_1f1b");
  }
  if (s.parallel.schedule == Schedule::zb_auto) {
    // Its order comes from the heuristic on the planner's stage times, which the trainer's ranks
    // would each have to rebuild identically; not done.
    throw InputError("/parallel/schedule",
                     "the backend does not run zb_auto (its order depends on the stage times); "
                     "simulate it, or train with zb_h1 or zb_h2");
  }
  if (s.training.dropout > 0)
    throw InputError("/training/dropout", "the backend trains without dropout");
  if (s.model.tied_embeddings && s.parallel.zero_stage >= 2) {
    throw InputError("/model/tied_embeddings",
                     "the backend implements tied embeddings with ZeRO 0 and 1 only");
  }
  if (s.parallel.zero_stage > 0 && s.parallel.dp % s.shard_size() != 0) {
    throw InputError("/parallel/fsdp_shard_size", "fsdp_shard_size must divide dp");
  }
  if (s.parallel.sequence_parallel && s.training.seq_length % s.parallel.tp != 0) {
    throw InputError("/training/seq_length",
                     "sequence parallelism needs seq_length divisible by tp");
  }
  const auto counts = stage_layer_counts(s);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] % s.parallel.virtual_stages != 0) {
      throw InputError("/parallel/virtual_stages",
                       "every stage's layers must split evenly into chunks");
    }
  }
}

Measurement run(const Scenario& s, const RunOptions& opts) {
  check_supported(s);
  // The CUDA device keeps every tensor in device memory (measured by the tracking allocator over
  // cudaMalloc); the trainer's arithmetic reaches it through Tensor::read/write. Multi-rank CUDA
  // runs need the NCCL groups.
  std::unique_ptr<ProcessGroups> groups;
  if (opts.comm == CommBackend::emulated) {
    groups = make_emulated_groups(s.parallel, opts.emulate_rank, opts.device);
  } else if (opts.device == Device::cuda) {
#ifdef DISTPLAN_HAVE_NCCL
    // One GPU per local rank (Open MPI's local rank; Slurm's as a fallback).
    const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (lr == nullptr) lr = std::getenv("SLURM_LOCALID");
    check_nccl_pipeline(s.parallel);
    cuda::set_device((lr ? std::atoi(lr) : 0) % std::max(cuda::device_count(), 1));
    groups = make_nccl_groups(s.parallel);
#else
    throw std::runtime_error("multi-rank CUDA runs need a build with NCCL and MPI");
#endif
  } else {
    groups = make_mpi_groups(s.parallel);
  }
  return run_on_groups(s, opts, *groups);
}

void check_nccl_pipeline(const ParallelSpec& p) {
  if (p.pp > 1 && (p.schedule == Schedule::interleaved_1f1b || p.schedule == Schedule::zb_h2)) {
    throw InputError("/parallel/schedule",
                     "multi-GPU runs over NCCL take gpipe, 1f1b and zb_h1 pipelines; this "
                     "schedule's point-to-point exchanges can wait on each other on one NCCL "
                     "stream (run it on the CPU with MPI, or one rank with --emulate-rank)");
  }
}

Measurement run_on_groups(const Scenario& s, const RunOptions& opts, ProcessGroups& groups) {
  check_supported(s);
  Trainer trainer(s, opts, groups);
  return trainer.train();
}

}  // namespace distplan::backend
