// Trainer: parameters and their sharding (units, TP splits, ZeRO shards), the tensor and
// communication helpers, ZeRO-3 gathers and the per-unit gradient reduction (trainer_impl.h).
#include "trainer_impl.h"

#include "distplan/planner/moe.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan::backend::trainer_detail {

std::uint64_t Trainer::uid(Count layer, int slot) const {
  return static_cast<std::uint64_t>(layer) * 64 + static_cast<std::uint64_t>(slot);
}

std::function<Count(Count)> Trainer::column_rows(std::vector<Count> parts, Count cols) const {
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

std::function<Count(Count)> Trainer::row_cols(Count full_cols) const {
  const Count r = g_.coords.tp, lc = full_cols / tp_;
  return [r, lc, full_cols](Count i) { return (i / lc) * full_cols + r * lc + i % lc; };
}

std::function<Count(Count)> Trainer::identity() {
  return [](Count i) { return i; };
}

Unit Trainer::make_layer_unit(Count layer, LayerParams& lp) {
  Unit u;
  u.kind = ParamUnit::layers;
  const bool ln = m_.norm == Norm::layernorm;
  const Count kvh = m_.kv_hidden();
  const Count qh = m_.q_hidden();  // heads × head_dim: hidden_size unless head_dim is explicit
  const Count f = m_.ffn_hidden_size;
  auto idx = [&](Param&) { return static_cast<int>(u.params.size()) - 1; };
  // Order of the layer op table: input_norm, qkv, attention_out, post_attention_norm, mlp_in,
  // mlp_out (weight then bias).
  idx(u.add(1, h_, Init::one, uid(layer, 0), identity(), sp_)), lp.norm1_g = idx(u.params.back());
  if (ln)
    u.add(1, h_, Init::zero, uid(layer, 1), identity(), sp_), lp.norm1_b = idx(u.params.back());
  u.add((qh + 2 * kvh) / tp_, h_, Init::normal, uid(layer, 2), column_rows({qh, kvh, kvh}, h_));
  lp.qkv_w = idx(u.params.back());
  if (m_.bias || m_.qkv_bias) {  // Qwen2: biases on q, k and v only
    u.add((qh + 2 * kvh) / tp_, 1, Init::zero, uid(layer, 3), column_rows({qh, kvh, kvh}, 1));
    lp.qkv_b = idx(u.params.back());
  }
  u.add(h_, qh / tp_, Init::normal, uid(layer, 4), row_cols(qh)), lp.out_w = idx(u.params.back());
  if (m_.bias)
    u.add(1, h_, Init::zero, uid(layer, 5), identity(), sp_), lp.out_b = idx(u.params.back());
  u.add(1, h_, Init::one, uid(layer, 6), identity(), sp_), lp.norm2_g = idx(u.params.back());
  if (ln)
    u.add(1, h_, Init::zero, uid(layer, 7), identity(), sp_), lp.norm2_b = idx(u.params.back());
  if (is_moe_layer(m_, layer)) {  // router and shared experts in place of the dense MLP
    add_moe_params(layer, u, lp);
    return u;
  }
  const std::vector<Count> in_parts =
      m_.mlp == Mlp::swiglu ? std::vector<Count>{f, f} : std::vector<Count>{f};
  u.add(mi_l_, h_, Init::normal, uid(layer, 8), column_rows(in_parts, h_));
  lp.in_w = idx(u.params.back());
  if (m_.bias)
    u.add(mi_l_, 1, Init::zero, uid(layer, 9), column_rows(in_parts, 1)),
        lp.in_b = idx(u.params.back());
  u.add(h_, f_l_, Init::normal, uid(layer, 10), row_cols(f)), lp.mlp_out_w = idx(u.params.back());
  if (m_.bias)
    u.add(1, h_, Init::zero, uid(layer, 11), identity(), sp_), lp.mlp_out_b = idx(u.params.back());
  return u;
}

void Trainer::build_units() {
  // The planner's split (pipeline_split.h): each chunk's layers, any count per chunk.
  const PipelineSplit split = pipeline_split(s_);
  const Count rank_row0 = g_.coords.tp * vl_;
  for (Count c = 0; c < v_; ++c) {
    Chunk ch;
    // Interleaved and V: virtual stage vs of the one pipeline; DualPipe: model stage vs mod pp
    // of direction vs / pp (vstage()).
    const Count vs = vstage(c);
    ch.first_layer = split.chunk_first_layer(stage_, c);
    ch.num_layers = split.chunk_layers(stage_, c);
    const Count per_chunk = ch.num_layers;
    ch.first = vs % pipeline_length() == 0;
    ch.last = vs % pipeline_length() == pipeline_length() - 1;
    if (ch.first) {
      Unit u;
      u.kind = ParamUnit::embedding;
      u.add(vl_, h_, Init::normal, uid(100000, 0),
            [=, this](Count i) { return rank_row0 * h_ + i; });
      if (m_.position_embedding == PositionEmbedding::learned) {
        u.add(m_.max_position_embeddings, h_, Init::normal, uid(100000, 1), identity(), sp_);
      }
      u.chunk = static_cast<int>(c);
      peft_unit(u, -1);
      ch.embedding = static_cast<int>(units_.size());
      units_.push_back(std::move(u));
    }
    for (Count l = 0; l < per_chunk; ++l) {
      LayerParams lp;
      units_.push_back(make_layer_unit(ch.first_layer + l, lp));
      units_.back().chunk = static_cast<int>(c);
      peft_unit(units_.back(), ch.first_layer + l);
      ch.layer_units.push_back(static_cast<int>(units_.size()) - 1);
      add_lora_unit(ch.first_layer + l, lp);  // fine-tuning: its flow, and its adapters
      if (lp.moe) {  // the layer's routed experts on this rank (trainer_moe.cpp)
        units_.push_back(make_expert_unit(ch.first_layer + l));
        units_.back().chunk = static_cast<int>(c);
        peft_unit(units_.back(), ch.first_layer + l);
        lp.experts = static_cast<int>(units_.size()) - 1;
      }
      ch.layer_params.push_back(lp);
    }
    if (ch.last) {
      Unit u;
      u.kind = ParamUnit::head;
      u.add(1, h_, Init::one, uid(100001, 0), identity(), sp_);
      if (m_.norm == Norm::layernorm) u.add(1, h_, Init::zero, uid(100001, 1), identity(), sp_);
      // Tied embeddings: when the head is on another stage (pp > 1, not a V) that stage holds a
      // copy of the word embedding (same parameter id, so the same initial values); on the
      // embedding's own stage (pp = 1, or stage 0 of a V) the LM head is the embedding
      // (memory_terms.h, stage_unit_params).
      const bool copy = pp_ > 1 && !vee_;
      if (!m_.tied_embeddings) {
        u.add(vl_, h_, Init::normal, uid(100001, 2),
              [=, this](Count i) { return rank_row0 * h_ + i; });
      } else if (copy) {
        u.add(vl_, h_, Init::normal, uid(100000, 0),
              [=, this](Count i) { return rank_row0 * h_ + i; });
      }
      u.chunk = static_cast<int>(c);
      peft_unit(u, -1);
      ch.head = static_cast<int>(units_.size());
      const bool own = !m_.tied_embeddings || copy;
      head_w_unit_ = own ? ch.head : chunks_.empty() ? ch.embedding : chunks_.front().embedding;
      head_w_param_ = own ? static_cast<int>(u.params.size()) - 1 : 0;
      units_.push_back(std::move(u));
    }
    chunks_.push_back(std::move(ch));
  }
  // Storage and initial values.
  for (Unit& u : units_) {
    if (!u.quant.empty()) quantize_unit(u);  // QLoRA: the linear weights leave the flat buffer
    const Count S = shard_size(u);
    u.padded = p_.zero_stage == 0 ? u.numel : (u.numel + S - 1) / S * S;
    u.shard = u.padded / S;
    HostVec init(static_cast<std::size_t>(u.padded), 0.0f);
    for (const Param& p : u.params) {
      if (p.quantized) continue;  // stored in the unit's quantized segments
      for (Count i = 0; i < p.numel(); ++i)
        init[static_cast<std::size_t>(p.offset + i)] = initial_value(p, i);
    }
    const bool z3 = p_.zero_stage >= 3;
    const Count lo = opt_begin(u), n_opt = opt_count(u);
    u.weights = Tensor(alloc_, {z3 ? u.shard : u.padded}, u.wdt, MemoryTag::weights);
    u.weights.write(init.data() + (z3 ? lo : 0), z3 ? u.shard : u.padded);
    if (u.frozen) continue;  // fine-tuning: weights only
    u.grads =
        Tensor(alloc_, {p_.zero_stage >= 2 ? u.shard : u.padded}, u.gdt, MemoryTag::gradients);
    if (u.wdt != DType::fp32) {
      u.master = Tensor(alloc_, {n_opt}, DType::fp32, MemoryTag::optimizer);
      u.master.write(init.data() + lo, n_opt);
    }
    u.m = Tensor(alloc_, {n_opt}, DType::fp32, MemoryTag::optimizer);
    if (t_.optimizer != Optimizer::sgd)
      u.v = Tensor(alloc_, {n_opt}, DType::fp32, MemoryTag::optimizer);
  }
}

float Trainer::initial_value(const Param& p, Count i) const {
  if (p.init == Init::one) return 1.0f;
  if (p.init == Init::zero) return 0.0f;
  // Uniform with the standard deviation 0.02 of GPT-2's init: half-width 0.02*sqrt(3).
  return 0.0346410f *
         uniform_pm1(mix(o_.seed ^ mix(p.uid) ^ static_cast<std::uint64_t>(p.global_index(i))));
}

void Trainer::quantize_unit(Unit& u) {
  const PeftSpec& pe = t_.peft;
  if (pe.double_quant && nested_code_.data() == nullptr) {
    const std::vector<float> code = QuantizedWeight::nested_code_values();
    nested_code_ = TrackedBytes(alloc_, kBnbDynamicCodeBytes, MemoryTag::weights);
    std::memcpy(nested_code_.data(), code.data(), sizeof(float) * code.size());
  }
  const auto* nested = static_cast<const float*>(nested_code_.data());
  for (Unit::QuantSegment& q : u.quant) {
    const Param& p = u.params[static_cast<std::size_t>(q.param)];
    HostVec w(static_cast<std::size_t>(q.rows * p.cols));
    for (Count i = 0; i < q.rows * p.cols; ++i)
      w[static_cast<std::size_t>(i)] = initial_value(p, q.row0 * p.cols + i);
    q.w = std::make_unique<QuantizedWeight>(alloc_, pe.base_storage, pe.double_quant, w.data(),
                                            q.rows, p.cols, nested);
  }
  // The flat buffer keeps the other parameters (norms, biases), packed in their order.
  Count off = 0;
  for (Param& p : u.params) {
    if (p.quantized) continue;
    p.offset = off;
    off += p.numel();
  }
  u.numel = off;
}

Count Trainer::opt_begin(const Unit& u) const {
  return p_.zero_stage == 0 ? 0 : static_cast<Count>(shard_comm(u).rank()) * u.shard;
}

Count Trainer::opt_count(const Unit& u) const {
  return p_.zero_stage == 0 ? u.padded : u.shard;
}

Clock::time_point Trainer::now() const {
  dev::synchronize(o_.device);
  return Clock::now();
}

Seconds Trainer::since(Clock::time_point t0) const {
  return std::chrono::duration<double>(now() - t0).count();
}

void Trainer::mark(sim::Track track, sim::SliceKind kind, Count mb, Count chunk,
                   Clock::time_point t0) {
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

Vec Trainer::zeros(Count n) const {
  return Vec(o_.device, n);
}

Vec Trainer::rd(const Tensor& t) const {
  Vec out = zeros(t.numel());
  dev::read_tensor(o_.device, t, 0, out.data(), t.numel());
  return out;
}

void Trainer::rnd(Vec& x, DType d) const {
  dev::round_to(o_.device, x.data(), static_cast<Count>(x.size()), d);
}

Tensor Trainer::save(const Vec& x, DType d, MemoryTag tag) {
  Tensor t(alloc_, {static_cast<Count>(x.size())}, d, tag);
  dev::write_tensor(o_.device, t, 0, x.data(), static_cast<Count>(x.size()));
  return t;
}

Tensor Trainer::save_act(const Vec& x) {
  return save(x, cb_);
}

HostVec Trainer::rd_host(const Tensor& t) const {
  return t.to_vector();
}

Tensor Trainer::save(const HostVec& x, DType d, MemoryTag tag) {
  Tensor t(alloc_, {static_cast<Count>(x.size())}, d, tag);
  t.write(x.data(), static_cast<Count>(x.size()));
  return t;
}

Tensor Trainer::save_act(const HostVec& x) {
  return save(x, cb_);
}

Tensor Trainer::pack(const HostVec& x, DType d) {
  return save(x, d, MemoryTag::temporaries);
}

void Trainer::rnd(HostVec& x, DType d) const {
  dev::round_to(Device::cpu, x.data(), static_cast<Count>(x.size()), d);  // host memory
}

HostVec Trainer::gather_in(const HostVec& x, Traffic what) {
  return gather_in(Vec::from_host(o_.device, x), what).to_host();
}

HostVec Trainer::reduce_out(const HostVec& x, Traffic what) {
  return reduce_out(Vec::from_host(o_.device, x), what).to_host();
}

HostVec Trainer::param_host(Unit& u, int i) {
  return param(u, i).to_host();
}

void Trainer::add_grad(Unit& u, int i, const HostVec& g) {
  if (i >= 0) add_grad(u, i, Vec::from_host(o_.device, g));
}

Tensor Trainer::pack(const Vec& x, DType d) {
  return save(x, d, MemoryTag::temporaries);
}

Tensor Trainer::pack_tensor(const Tensor& t) {
  Tensor out(alloc_, {t.numel()}, t.dtype(), MemoryTag::temporaries);
  dev::copy_bytes(o_.device, out.data(), t.data(), static_cast<std::size_t>(t.bytes()));
  return out;
}

void Trainer::tp_all_reduce(Vec& x, Traffic what, DType d) {
  if (tp_ == 1) return;
  Tensor t = pack(x, d);
  g_.tp->all_reduce(t.data(), t.numel(), d, ReduceOp::sum, what);
  dev::read_tensor(o_.device, t, 0, x.data(), t.numel());
}

void Trainer::tp_all_reduce_max(Vec& x, Traffic what) {
  Tensor t = pack(x, DType::fp32);
  g_.tp->all_reduce(t.data(), t.numel(), DType::fp32, ReduceOp::max, what);
  dev::read_tensor(o_.device, t, 0, x.data(), t.numel());
}

Vec Trainer::tp_reduce_scatter(const Vec& x, Traffic what) {
  Tensor in = pack(x, cb_);
  Tensor out(alloc_, {in.numel() / tp_}, cb_, MemoryTag::temporaries);
  g_.tp->reduce_scatter(in.data(), out.data(), out.numel(), cb_, what);
  return rd(out);
}

Vec Trainer::tp_all_gather(const Vec& x, Traffic what) {
  Tensor in = pack(x, cb_);
  Tensor out(alloc_, {in.numel() * tp_}, cb_, MemoryTag::temporaries);
  g_.tp->all_gather(in.data(), out.data(), in.numel(), cb_, what);
  return rd(out);
}

Vec Trainer::reduce_out(Vec x, Traffic what) {
  if (tp_ == 1) return x;
  if (sp_) return tp_reduce_scatter(x, what);
  tp_all_reduce(x, what, cb_);
  return x;
}

Vec Trainer::gather_in(const Vec& x, Traffic what) {
  return sp_ ? tp_all_gather(x, what) : x;
}

const Tensor& Trainer::unit_weights(Unit& u) {
  return p_.zero_stage >= 3 ? u.gathered : u.weights;
}

Count Trainer::param_offset(const Unit& u, int i) const {
  return u.params[static_cast<std::size_t>(i)].offset;
}

Vec Trainer::param(Unit& u, int i) {
  const Param& p = u.params[static_cast<std::size_t>(i)];
  Vec w = zeros(p.numel());
  dev::read_tensor(o_.device, unit_weights(u), p.offset, w.data(), p.numel());
  return w;
}

void Trainer::add_grad(Unit& u, int i, const Vec& g) {
  if (i < 0) return;
  const Param& p = u.params[static_cast<std::size_t>(i)];
  DISTPLAN_CHECK(!u.frozen, "a gradient of a frozen parameter");
  Tensor& dst = p_.zero_stage >= 2 ? u.unit_grad : u.grads;
  DISTPLAN_CHECK(static_cast<Count>(g.size()) == p.numel(), "gradient size");
  dev::add_into(o_.device, dst, p.offset, g.data(), p.numel());
}

void Trainer::acquire(int ui) {
  if (p_.zero_stage < 3) return;
  Unit& u = units_[static_cast<std::size_t>(ui)];
  if (!u.gathered.empty()) return;
  u.gathered = Tensor(alloc_, {u.padded}, u.wdt, MemoryTag::buffers);
  if (S_ > 1) {
    const auto t0 = now();
    // A unit no backward passes (fine-tuning's frozen embedding and layers below the adapters)
    // is gathered for the forward only.
    g_.dp->all_gather(u.weights.data(), u.gathered.data(), u.shard, u.wdt,
                      unit_traffic(u.backward ? UnitTraffic::gather_forward_backward
                                              : UnitTraffic::gather_forward,
                                   u.kind));
    mark(sim::Track::zero3, sim::SliceKind::zero3_gather, cur_mb_, u.chunk, t0);
  } else {
    dev::copy_bytes(o_.device, u.gathered.data(), u.weights.data(),
                    static_cast<std::size_t>(u.weights.bytes()));
  }
  if (u.adapters >= 0) acquire(u.adapters);  // a layer's adapters with it
}

void Trainer::release(int ui) {
  if (p_.zero_stage < 3) return;
  Unit& u = units_[static_cast<std::size_t>(ui)];
  u.gathered.release();
  if (u.adapters >= 0) release(u.adapters);
}

void Trainer::begin_unit_grad(int ui) {
  if (ui < 0 || (ui = grad_unit(ui)) < 0) return;  // a frozen unit has no gradient
  Unit& u = units_[static_cast<std::size_t>(ui)];
  if (p_.zero_stage >= 2 && u.unit_grad.empty()) {
    u.unit_grad = Tensor(alloc_, {u.padded}, u.gdt, MemoryTag::buffers);
  }
}

void Trainer::end_unit_grad(int ui) {
  if (p_.zero_stage < 2 || ui < 0 || (ui = grad_unit(ui)) < 0) return;
  Unit& u = units_[static_cast<std::size_t>(ui)];
  sp_reduce_partials(u, u.unit_grad);
  Tensor part(alloc_, {u.shard}, u.gdt, MemoryTag::temporaries);
  if (S_ > 1) {
    const auto t0 = now();
    g_.dp->reduce_scatter(u.unit_grad.data(), part.data(), u.shard, u.gdt,
                          unit_traffic(UnitTraffic::gradients, u.kind));
    mark(sim::Track::dp, sim::SliceKind::grad_reduce, cur_mb_, u.chunk, t0);
  } else {
    dev::copy_bytes(o_.device, part.data(), u.unit_grad.data(),
                    static_cast<std::size_t>(part.bytes()));
  }
  const Vec add = rd(part);
  dev::add_into(o_.device, u.grads, 0, add.data(), u.shard);
  u.unit_grad.release();
}

void Trainer::sp_reduce_partials(Unit& u, Tensor& grad) {
  if (!sp_) return;
  Count total = 0;
  for (const Param& p : u.params)
    if (p.sp_partial) total += p.numel();
  if (total == 0) return;
  Vec flat = zeros(total);
  Count at = 0;
  for (const Param& p : u.params) {
    if (!p.sp_partial) continue;
    dev::read_tensor(o_.device, grad, p.offset, flat.data() + at, p.numel());
    at += p.numel();
  }
  tp_all_reduce(flat, unit_traffic(UnitTraffic::sp_gradients, u.kind), gb_);
  at = 0;
  for (const Param& p : u.params) {
    if (!p.sp_partial) continue;
    dev::write_tensor(o_.device, grad, p.offset, flat.data() + at, p.numel());
    at += p.numel();
  }
}

}  // namespace distplan::backend::trainer_detail
