// Trainer: the pipeline executor: data, chunks, point-to-point messages and the step that
// runs the stage's schedule program action by action (trainer_impl.h).
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

std::int32_t Trainer::token(Count step, Count sample, Count j) const {
  if (o_.repeat_batch) step = 1;
  const std::uint64_t hsh = mix(o_.seed * 7919 + mix(static_cast<std::uint64_t>(step) << 40 ^
                                                     static_cast<std::uint64_t>(sample) << 16 ^
                                                     static_cast<std::uint64_t>(j)));
  return static_cast<std::int32_t>(hsh % static_cast<std::uint64_t>(m_.vocab_size));
}

std::vector<std::int32_t> Trainer::batch_tokens(Count step, Count mb, Count shift) const {
  // This rank's rows of each sequence: all of it, or under cp its two chunks (positions_).
  const Count b = t_.micro_batch_size;
  std::vector<std::int32_t> out(static_cast<std::size_t>(N_));
  for (Count si = 0; si < sl_; ++si)
    for (Count bi = 0; bi < b; ++bi) {
      const Count sample = (g_.coords.dp * nmb_ + mb) * b + bi;
      out[static_cast<std::size_t>(si * b + bi)] =
          token(step, sample, positions_[static_cast<std::size_t>(si)] + shift);
    }
  return out;
}

P2PTag Trainer::tag(bool grad, Count mb, Count vs) {
  P2PTag t;
  t.kind = grad ? P2PTag::Kind::gradient : P2PTag::Kind::activation;
  t.microbatch = mb;
  t.virtual_stage = vs;
  return t;
}

void Trainer::post_send(const Vec& x, int peer, P2PTag t, Traffic what, sim::Track track,
                        sim::SliceKind kind, Count mb, Count c) {
  DISTPLAN_CHECK(!outbox_, "a pipeline send is already waiting");
  outbox_ = OutMessage{std::make_shared<Tensor>(pack(x, cb_)), peer, t, what, track, kind, mb, c};
}

void Trainer::exchange(Tensor* in, int peer, P2PTag t) {
  std::optional<OutMessage> out;
  out.swap(outbox_);
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
    op.stream = stream_of(out->tag);
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
    op.stream = stream_of(t);
    batch.push_back(std::move(op));
  }
  if (batch.empty()) return;
  const auto t0 = now();
  g_.pp->send_recv(std::move(batch));
  if (out) mark(out->track, out->kind, out->mb, out->chunk, t0);
}

int Trainer::stream_of(const P2PTag& t) const {
  // Under a V, stage s sends stage s + 1 chunk 0's activations and chunk 1's gradients, each in
  // micro-batch order, but the two interleave differently on the two stages' programs: each kind
  // is its own stream. DualPipe likewise: from stage s to s + 1 go direction 0's activations and
  // direction 1's gradients, each in micro-batch order (and the reverse way the other two).
  // The other schedules keep one order for all (NCCL's).
  if (!vee_ && !bidir_) return 0;
  return t.kind == P2PTag::Kind::activation ? 1 : 2;
}

void Trainer::flush_sends() {
  exchange(nullptr, 0, P2PTag{});
}

bool Trainer::receives_first(const sim::Action& a) const {
  const Chunk& ch = chunks_[static_cast<std::size_t>(a.chunk)];
  const Count vs = vstage(a.chunk);
  if (a.op == sim::Op::forward) return !ch.first && stage_of(vs - 1) != stage_;
  if (a.op == sim::Op::backward || a.op == sim::Op::backward_input)
    return !ch.last && stage_of(vs + 1) != stage_;
  return false;
}

Count Trainer::vstage(Count c) const {
  if (bidir_) return c * pp_ + dualpipe_model_stage(pp_, stage_, c);
  return virtual_stage_of(vee_, pp_, stage_, c);
}

Count Trainer::pipeline_length() const {
  return bidir_ ? pp_ : pp_ * v_;
}

int Trainer::stage_of(Count vs) const {
  if (bidir_) return static_cast<int>(dualpipe_locate(pp_, vs % pp_, vs / pp_).stage);
  return static_cast<int>(locate_virtual_stage(vee_, pp_, vs).stage);
}

void Trainer::keep_local(const Vec& x, P2PTag t) {
  const auto key = std::make_tuple(static_cast<int>(t.kind), t.microbatch, t.virtual_stage);
  DISTPLAN_CHECK(!local_.count(key), "a stage-local hand-over is already waiting");
  local_.emplace(key, pack(x, cb_));
}

Vec Trainer::take_local(P2PTag t) {
  const auto it =
      local_.find(std::make_tuple(static_cast<int>(t.kind), t.microbatch, t.virtual_stage));
  // The program runs the receiving chunk before the one that produces its input.
  if (it == local_.end())
    throw std::runtime_error("schedule program: stage " + std::to_string(stage_) + " needs the " +
                             to_string(t) + " before its own chunk produced it");
  Vec x = rd(it->second);
  local_.erase(it);
  return x;
}

std::vector<int> Trainer::chunk_units(const Chunk& ch) const {
  std::vector<int> us;
  if (ch.embedding >= 0) us.push_back(ch.embedding);
  us.insert(us.end(), ch.layer_units.begin(), ch.layer_units.end());
  if (ch.head >= 0) us.push_back(ch.head);
  return us;
}

void Trainer::acquire_in_pass(const std::vector<int>& pass, std::size_t i) {
  acquire(pass[i]);
  for (Count k = 1; k <= s_.assumptions.zero3_prefetch_layers && i + k < pass.size(); ++k)
    acquire(pass[i + static_cast<std::size_t>(k)]);
}

void Trainer::forward(Count step, Count mb, Count c) {
  const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  ChunkState& st = states_[{mb, c}];
  const std::vector<int> pass = chunk_units(ch);
  std::size_t pi = 0;
  Vec x;
  if (ch.first) {
    acquire_in_pass(pass, pi);
    Unit& u = units_[static_cast<std::size_t>(ch.embedding)];
    // The micro-batch's token ids go to the device once, as a data loader's batch does.
    st.ids = DeviceIds::from_host(o_.device, batch_tokens(step, mb, 0));
    Vec e = zeros(N_ * h_);
    dev::embedding_forward(o_.device, st.ids.data(), unit_weights(u), param_offset(u, 0), e.data(),
                           N_, h_, g_.coords.tp * vl_, vl_);
    rnd(e, cb_);
    if (tp_ > 1) {
      if (sp_) {
        e = tp_reduce_scatter(e, Traffic::embedding_output);
      } else {
        tp_all_reduce(e, Traffic::embedding_output, cb_);
      }
    }
    if (m_.position_embedding == PositionEmbedding::learned) add_positions(u, e);
    rnd(e, cb_);
    x = std::move(e);
    release(pass[pi++]);
  } else if (const int from = stage_of(vstage(c) - 1); from == stage_) {
    x = take_local(tag(false, mb, vstage(c)));
  } else {
    Tensor in(alloc_, {Nl_ * h_}, cb_, MemoryTag::temporaries);
    exchange(&in, from, tag(false, mb, vstage(c)));
    x = rd(in);
  }
  st.layers.resize(static_cast<std::size_t>(ch.num_layers));
  for (Count l = 0; l < ch.num_layers; ++l, ++pi) {
    acquire_in_pass(pass, pi);
    LayerSaved& sv = st.layers[static_cast<std::size_t>(l)];
    const LayerParams& lp = ch.layer_params[static_cast<std::size_t>(l)];
    // The layer's input: its input norm's saved tensor, and what full recomputation restarts
    // from; a layer without a backward (fine-tuning: below the adapters) keeps nothing.
    if (lp.flow.saves[static_cast<std::size_t>(op_.norm1)] ||
        (p_.recompute == Recompute::full && lp.flow.any))
      sv.x = save_act(x);
    Vec y = layer_forward(ch.layer_units[static_cast<std::size_t>(l)], lp, sv, x);
    x = std::move(y);
    if (p_.recompute == Recompute::full) {
      Tensor keep = std::move(sv.x);
      sv = LayerSaved{};
      sv.x = std::move(keep);
    }
    release(pass[pi]);
  }
  if (ch.last) {
    acquire_in_pass(pass, pi);
    head_forward(ch, st, x, step, mb);
    release(pass[pi]);
  } else if (const int to = stage_of(vstage(c) + 1); to == stage_) {
    keep_local(x, tag(false, mb, vstage(c) + 1));
  } else {
    post_send(x, to, tag(false, mb, vstage(c) + 1), Traffic::activations_forward,
              sim::Track::send_next, sim::SliceKind::send_activation, mb, c);
  }
}

const DeviceIds& Trainer::position_ids() {
  if (position_ids_.empty()) {
    // Under SP this rank holds rows [r*sl/t, (r+1)*sl/t) of its sl rows, at positions_.
    const Count s0 = sp_ ? g_.coords.tp * (sl_ / tp_) : 0;
    const Count sl = sp_ ? sl_ / tp_ : sl_, b = t_.micro_batch_size;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(sl * b));
    for (Count i = 0; i < sl; ++i)
      for (Count bi = 0; bi < b; ++bi)
        ids[static_cast<std::size_t>(i * b + bi)] =
            static_cast<std::int32_t>(positions_[static_cast<std::size_t>(s0 + i)]);
    position_ids_ = DeviceIds::from_host(o_.device, ids);
  }
  return position_ids_;
}

void Trainer::add_positions(Unit& u, Vec& e) {
  // Each token's row of the position table, looked up as an embedding of its position.
  const Param& p = u.params[1];
  const DeviceIds& ids = position_ids();
  const Count n = static_cast<Count>(ids.size());
  Vec pos = zeros(n * h_);
  dev::embedding_forward(o_.device, ids.data(), unit_weights(u), p.offset, pos.data(), n, h_, 0,
                         p.numel() / h_);
  dev::add(o_.device, e.data(), pos.data(), e.data(), n * h_);
}

void Trainer::head_forward(const Chunk& ch, ChunkState& st, const Vec& x, Count step, Count mb) {
  Unit& u = units_[static_cast<std::size_t>(ch.head)];
  const bool ln = m_.norm == Norm::layernorm;
  HeadSaved hs;
  hs.x = save_act(x);
  const Vec y = norm_fwd(u, 0, ln ? 1 : -1, x, Nl_);
  // The LM head keeps its input for its weight gradient only (a frozen head needs W alone).
  if (!units_[static_cast<std::size_t>(head_w_unit_)].frozen) hs.ln = save_act(y);
  const Vec yf = gather_in(y, Traffic::head_input);
  Vec logits = linear_fwd(units_[static_cast<std::size_t>(head_w_unit_)], head_w_param_, -1, yf, N_,
                          h_, vl_);
  hs.logits = save(logits, cb_, MemoryTag::buffers);
  hs.targets = DeviceIds::from_host(o_.device, batch_tokens(step, mb, 1));
  // Vocab-parallel cross-entropy: max, target logit and sum of exponentials over the TP group.
  Vec mx = zeros(N_), tl = zeros(N_), se = zeros(N_);
  dev::ce_local_max(o_.device, logits.data(), mx.data(), N_, vl_);
  if (tp_ > 1) tp_all_reduce_max(mx, Traffic::cross_entropy_statistics);
  dev::ce_local_target(o_.device, logits.data(), hs.targets.data(), tl.data(), N_, vl_,
                       g_.coords.tp * vl_);
  if (tp_ > 1) tp_all_reduce(tl, Traffic::cross_entropy_statistics, DType::fp32);
  dev::ce_local_sumexp(o_.device, logits.data(), mx.data(), se.data(), N_, vl_);
  if (tp_ > 1) tp_all_reduce(se, Traffic::cross_entropy_statistics, DType::fp32);
  // The fp32 softmax, kept to the backward; its gradient is softmax - onehot.
  Vec sm = zeros(static_cast<Count>(logits.size()));
  dev::ce_softmax(o_.device, logits.data(), mx.data(), se.data(), sm.data(), N_, vl_);
  hs.softmax = save(sm, DType::fp32, MemoryTag::buffers);
  // The loss statistics wait on the device; the host reads them once, at the end of the step.
  if (g_.coords.tp == 0) pending_loss_.push_back({std::move(mx), std::move(se), std::move(tl)});
  st.head = std::move(hs);
}

Vec Trainer::head_loss_grad(ChunkState& st) {
  HeadSaved& hs = *st.head;
  // d loss / d logit = (softmax - onehot) * scale / tokens in the global batch.
  const float dl = loss_scale_ / static_cast<float>(t_.global_batch_size * t_.seq_length);
  Vec dlogits = rd(hs.softmax);
  dev::ce_softmax_grad(o_.device, dlogits.data(), hs.targets.data(), N_, vl_, g_.coords.tp * vl_,
                       dl);
  rnd(dlogits, cb_);
  hs.logits.release();
  hs.softmax.release();
  return dlogits;
}

Vec Trainer::head_backward(const Chunk& ch, ChunkState& st, const Vec& dlogits,
                           std::vector<std::function<void()>>& jobs) {
  const int ui = ch.head;
  Unit& u = units_[static_cast<std::size_t>(ui)];
  const bool ln = m_.norm == Norm::layernorm;
  HeadSaved& hs = *st.head;
  const int wu = head_w_unit_, wi = head_w_param_;
  Vec dyf = linear_bwd_input(units_[static_cast<std::size_t>(wu)], wi, dlogits, N_, h_, vl_);
  Vec dy;
  if (tp_ > 1 && sp_) {
    dy = tp_reduce_scatter(dyf, Traffic::head_input_gradient);
  } else {
    if (tp_ > 1) tp_all_reduce(dyf, Traffic::head_input_gradient, cb_);
    dy = dyf;
  }
  HeadSaved* H = &hs;
  if (!units_[static_cast<std::size_t>(wu)].frozen) {
    jobs.push_back([this, wu, wi, dlogits, H] {
      linear_bwd_weight(units_[static_cast<std::size_t>(wu)], wi, -1, dlogits,
                        gather_in(rd(H->ln), Traffic::head_input), N_, h_, vl_);
    });
  }
  const Vec x = rd(hs.x);
  Vec dx = norm_bwd_input(u, 0, dy, x, Nl_);
  if (!u.frozen) {
    jobs.push_back([this, ui, ln, dy, H] {
      norm_bwd_weight(units_[static_cast<std::size_t>(ui)], 0, ln ? 1 : -1, dy, rd(H->x), Nl_);
    });
  }
  rnd(dx, cb_);
  return dx;
}

void Trainer::embedding_backward(const Chunk& ch, ChunkState& st, const Vec& dx,
                                 std::vector<std::function<void()>>& jobs) {
  const int ui = ch.embedding;
  auto ids = st.ids;
  jobs.push_back([this, ui, dx, ids] {
    Unit& u = units_[static_cast<std::size_t>(ui)];
    if (m_.position_embedding == PositionEmbedding::learned) {
      // The position table's gradient: each token's gradient summed into its position's row.
      const DeviceIds& pos = position_ids();
      const Count np = u.params[1].numel();
      Vec dpos = zeros(np);
      dev::embedding_backward(o_.device, pos.data(), dx.data(), dpos.data(),
                              static_cast<Count>(pos.size()), h_, 0, np / h_);
      add_grad(u, 1, dpos);
    }
    // Backward of the reduce-scatter into the sequence-parallel region: an all-gather.
    const Vec dxf = gather_in(dx, Traffic::embedding_output_gradient);
    Vec dt = zeros(vl_ * h_);
    dev::embedding_backward(o_.device, ids.data(), dxf.data(), dt.data(), N_, h_,
                            g_.coords.tp * vl_, vl_);
    add_grad(u, 0, dt);
  });
}

void Trainer::backward(Count mb, Count c, bool split) {
  const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
  ChunkState& st = states_.at({mb, c});
  std::vector<int> pass = chunk_units(ch);
  std::reverse(pass.begin(), pass.end());
  // Fine-tuning: a unit no backward passes (a frozen embedding, layers below the adapters) is
  // not gathered again.
  std::erase_if(pass, [this](int ui) { return !units_[static_cast<std::size_t>(ui)].backward; });
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
    dy = head_backward(ch, st, dlogits, jobs);
    flush(jobs, pass[pi]);
    release(pass[pi++]);
  } else if (const int from = stage_of(vstage(c) + 1); from == stage_) {
    dy = take_local(tag(true, mb, vstage(c)));
  } else {
    Tensor in(alloc_, {Nl_ * h_}, cb_, MemoryTag::temporaries);
    exchange(&in, from, tag(true, mb, vstage(c)));
    dy = rd(in);
  }
  for (Count l = ch.num_layers - 1; l >= 0; --l) {
    const int ui = ch.layer_units[static_cast<std::size_t>(l)];
    if (!units_[static_cast<std::size_t>(ui)].backward) continue;  // no gradient reaches it
    acquire_in_pass(pass, pi);
    LayerSaved& sv = st.layers[static_cast<std::size_t>(l)];
    const LayerParams& lp = ch.layer_params[static_cast<std::size_t>(l)];
    if (p_.recompute == Recompute::full) (void)layer_forward(ui, lp, sv, rd(sv.x));  // rebuild
    dy = layer_backward(ui, lp, sv, dy, jobs);
    flush(jobs, ui);
    if (!split) sv = LayerSaved{};
    release(pass[pi++]);
  }
  // Fine-tuning: below the first layer that trains no gradient goes on; the schedule's send
  // still happens (zeros), as the planner counts it.
  if (dy.size() == 0) dy = zeros(Nl_ * h_);
  if (ch.first) {
    if (units_[static_cast<std::size_t>(ch.embedding)].backward) {
      acquire_in_pass(pass, pi);
      embedding_backward(ch, st, dy, jobs);
      flush(jobs, pass[pi]);
      release(pass[pi]);
    }
  } else if (const int to = stage_of(vstage(c) - 1); to == stage_) {
    keep_local(dy, tag(true, mb, vstage(c) - 1));
  } else {
    post_send(dy, to, tag(true, mb, vstage(c) - 1), Traffic::gradients_backward,
              sim::Track::send_prev, sim::SliceKind::send_gradient, mb, c);
  }
  if (!split) states_.erase({mb, c});
}

void Trainer::backward_weight(Count mb, Count c) {
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

std::pair<double, bool> Trainer::train_step(Count step) {
  loss_sum_ = 0;
  pending_loss_.clear();
  moe_routing_ = MoeRouting{};
  for (Unit& u : units_)
    if (!u.frozen) u.grads.zero();
  for (const sim::Action& a : program_.programs[static_cast<std::size_t>(stage_)]) {
    const auto t0 = now();
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
  const auto t0 = now();
  if (bidir_) mirror_gradients();
  // Tied embeddings (pp > 1): the first stage's word embedding and the last stage's copy sum
  // their gradients over the embedding group, once per step (Megatron-LM's
  // _allreduce_word_embedding_grads), before the data-parallel reduction.
  if (m_.tied_embeddings && head_stage(p_.schedule, pp_) != 0 &&
      (stage_ == 0 || stage_ == pp_ - 1) && peft_embedding_trains(t_.peft)) {
    const auto te = now();
    Unit& u = units_[static_cast<std::size_t>(stage_ == 0 ? chunks_.front().embedding
                                                          : chunks_.back().head)];
    const Param& w = stage_ == 0 ? u.params.front() : u.params.back();
    char* base = static_cast<char*>(u.grads.data());
    g_.embedding->all_reduce(base + w.offset * bytes_of(gb_), w.numel(), gb_, ReduceOp::sum,
                             Traffic::tied_embedding_gradients);
    mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, stage_ == 0 ? 0 : v_ - 1, te);
  }
  // Data-parallel reduction (ZeRO 0/1: once per step, unit by unit).
  for (Unit& u : units_) {
    if (u.frozen) continue;              // fine-tuning: nothing to reduce
    if (u.kind == ParamUnit::experts) {  // routed experts: over the expert data-parallel group
      reduce_expert_grads(u);
      continue;
    }
    const auto tu = now();
    const bool replicas = p_.zero_stage > 0 && g_.dp_replicate->size() > 1;
    // The dp group holds the data- and context-parallel ranks (comm.h, group_split).
    const bool dp_group = g_.dp->size() > 1;
    const bool reduces = (p_.zero_stage <= 1 && sp_) || dp_group || replicas;
    if (p_.zero_stage <= 1) sp_reduce_partials(u, u.grads);
    const DType gd = u.gdt;
    if (dp_group) {
      const Traffic what = unit_traffic(UnitTraffic::gradients, u.kind);
      if (p_.zero_stage == 0) {
        g_.dp->all_reduce(u.grads.data(), u.grads.numel(), gd, ReduceOp::sum, what);
      } else if (p_.zero_stage == 1) {
        Tensor part(alloc_, {u.shard}, gd, MemoryTag::temporaries);
        g_.dp->reduce_scatter(u.grads.data(), part.data(), u.shard, gd, what);
        char* dst = static_cast<char*>(u.grads.data()) + opt_begin(u) * bytes_of(gd);
        dev::copy_bytes(o_.device, dst, part.data(), static_cast<std::size_t>(part.bytes()));
      }
    }
    // Hybrid sharding: each shard is summed over the dp/S replicas holding it, once per step.
    if (replicas) {
      char* base = static_cast<char*>(u.grads.data());
      const Count off = p_.zero_stage >= 2 ? 0 : opt_begin(u);
      g_.dp_replicate->all_reduce(base + off * bytes_of(gd), u.shard, gd, ReduceOp::sum,
                                  unit_traffic(UnitTraffic::gradients, u.kind));
    }
    if (reduces) mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, u.chunk, tu);
  }
  if (step == 1 && !o_.dump_gradients.empty()) dump_gradients();
  const auto t_opt = now();
  // fp16: skip the step when any gradient overflowed (all ranks agree).
  double overflow = 0;
  if (t_.precision == DType::fp16) {
    for (Unit& u : units_) {
      if (u.frozen) continue;
      const Count off = p_.zero_stage >= 2 ? 0 : opt_begin(u);
      if (dev::has_overflow(o_.device, u.grads, off, opt_count(u))) overflow = 1;
    }
    g_.world_reduce(&overflow, 1, ReduceOp::max);
  }
  if (overflow == 0) {
    ++opt_steps_;
    for (Unit& u : units_)
      if (!u.frozen) optimizer_step(u);
    if (t_.precision == DType::fp16 && ++good_steps_ % 1000 == 0) loss_scale_ *= 2.0f;
  } else {
    loss_scale_ /= 2.0f;
    good_steps_ = 0;
  }
  optimizer_seconds_ = since(t0);
  mark(sim::Track::compute, sim::SliceKind::optimizer, -1, -1, t_opt);
  // Each micro-batch's loss, in the order they ran, from the statistics read back now.
  for (const LossStats& l : pending_loss_) {
    const HostVec mx = l.max.to_host(), se = l.sumexp.to_host(), tl = l.target.to_host();
    HostVec loss(mx.size());
    cpu::ce_loss(mx.data(), se.data(), tl.data(), loss.data(), static_cast<Count>(mx.size()));
    for (float v : loss) loss_sum_ += v;
  }
  pending_loss_.clear();
  double loss = loss_sum_;
  g_.world_reduce(&loss, 1, ReduceOp::sum);
  return {loss / static_cast<double>(t_.global_batch_size * t_.seq_length), overflow != 0};
}

}  // namespace distplan::backend::trainer_detail
