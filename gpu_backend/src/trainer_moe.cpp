// Trainer: Mixture-of-Experts layers (docs/gpu_backend.md, "Mixture of Experts"). A MoE layer's
// unit holds its norms, attention, router (and selection bias) and shared experts; its routed
// experts form a unit of their own on each rank (num_experts / ep of them), sharded by ZeRO over
// the expert data-parallel group and reduced over it, apart from the dense data-parallel group
// (Megatron-Core's MoE parallel folding; megatron/core/parallel_state.py). The routed block runs
// on the rank's sequence-parallel shard of tokens and reaches the experts through the ep group's
// all-to-all (moe_layer.h); the shared experts are a tensor-parallel SwiGLU MLP like the dense one.
#include "trainer_impl.h"

#include "distplan/planner/moe.h"

namespace distplan::backend::trainer_detail {

namespace {

// Parameter ids of the routed experts: apart from uid()'s 64 slots per layer, one pair per
// expert of the whole model, so every layout initialises expert e of layer l alike.
std::uint64_t expert_uid(Count layer, Count expert, int which) {
  return (std::uint64_t{1} << 40) + static_cast<std::uint64_t>(layer) * (std::uint64_t{1} << 20) +
         static_cast<std::uint64_t>(expert) * 2 + static_cast<std::uint64_t>(which);
}

// uid() slots of a MoE layer's dense additions (the dense layer uses 0..11).
constexpr int kRouterSlot = 12, kRouterBiasSlot = 13, kSharedInSlot = 14, kSharedOutSlot = 15;

}  // namespace

Communicator& Trainer::shard_comm(const Unit& u) const {
  return u.kind == ParamUnit::experts ? *g_.edp : *g_.dp;
}

Count Trainer::shard_size(const Unit& u) const {
  if (u.kind != ParamUnit::experts) return S_;
  return p_.zero_stage == 0 ? 1 : g_.edp->size();
}

void Trainer::add_moe_params(Count layer, Unit& u, LayerParams& lp) {
  const MoeSpec& e = m_.moe;
  lp.moe = true;
  auto last = [&] { return static_cast<int>(u.params.size()) - 1; };
  // The router h -> E, replicated on the TP ranks (Megatron-Core's TopKRouter weight); under
  // sequence parallelism each rank routes its own tokens, so its gradient is a partial sum.
  u.add(e.num_experts, h_, Init::normal, uid(layer, kRouterSlot), identity(), sp_);
  lp.router_w = last();
  if (e.router_bias) {
    // DeepSeek-V3's selection bias: no gradient reaches it (the selection is piecewise
    // constant); its load-balancing update rule is not run, so it stays at its initial 0.
    u.add(1, e.num_experts, Init::zero, uid(layer, kRouterBiasSlot), identity(), sp_);
    lp.router_b = last();
  }
  if (e.num_shared_experts > 0) {
    // The shared experts as one SwiGLU MLP of their summed width (the same function and
    // parameter count: DeepSeek-V2/V3 build them so, intermediate_size * n_shared_experts),
    // column-parallel in and row-parallel out.
    const Count fs = e.num_shared_experts * e.shared_expert_ffn_hidden_size;
    u.add(2 * fs / tp_, h_, Init::normal, uid(layer, kSharedInSlot), column_rows({fs, fs}, h_));
    lp.shared_in = last();
    u.add(h_, fs / tp_, Init::normal, uid(layer, kSharedOutSlot), row_cols(fs));
    lp.shared_out = last();
  }
}

Unit Trainer::make_expert_unit(Count layer) {
  Unit u;
  u.kind = ParamUnit::experts;
  const Count f = m_.moe.expert_ffn_hidden_size;
  const Count local = m_.moe.num_experts / p_.ep;
  const Count first = g_.ep->rank() * local;
  for (Count le = 0; le < local; ++le) {
    u.add(2 * f, h_, Init::normal, expert_uid(layer, first + le, 0), identity());
    u.add(h_, f, Init::normal, expert_uid(layer, first + le, 1), identity());
  }
  return u;
}

moe::BlockWeights<float> Trainer::block_weights(Unit& u, const LayerParams& lp) {
  // Views into unit_weights(): fp32 runs read the weights in place; 16-bit ones would need a
  // cast (check_moe_supported keeps MoE to fp32 storage).
  moe::BlockWeights<float> w;
  w.h = h_;
  w.f = m_.moe.expert_ffn_hidden_size;
  w.local = m_.moe.num_experts / p_.ep;
  w.router = {m_.moe.num_experts, m_.moe.top_k, m_.moe.router};
  const auto* base = static_cast<const float*>(unit_weights(u).data());
  w.router_w = base + u.params[static_cast<std::size_t>(lp.router_w)].offset;
  if (lp.router_b >= 0)
    w.router_bias = base + u.params[static_cast<std::size_t>(lp.router_b)].offset;
  Unit& x = units_[static_cast<std::size_t>(lp.experts)];
  const auto* eb = static_cast<const float*>(unit_weights(x).data());
  for (Count le = 0; le < w.local; ++le) {
    w.w_in.push_back(eb + x.params[static_cast<std::size_t>(2 * le)].offset);
    w.w_out.push_back(eb + x.params[static_cast<std::size_t>(2 * le + 1)].offset);
  }
  return w;
}

moe::Exchange<float> Trainer::ep_exchange() {
  moe::Exchange<float> ex;
  ex.size = g_.ep->size();
  ex.rank = g_.ep->rank();
  ex.counts = [this](const std::vector<Count>& send) { return g_.ep->exchange_counts(send); };
  ex.rows = [this](const float* in, const std::vector<Count>& send_rows, float* out,
                   const std::vector<Count>& recv_rows, Count width, Count token_rows,
                   Traffic what) {
    std::vector<Count> sc(send_rows.size()), rc(recv_rows.size());
    Count ns = 0, nr = 0;
    for (std::size_t r = 0; r < sc.size(); ++r) {
      sc[r] = send_rows[r] * width, ns += sc[r];
      rc[r] = recv_rows[r] * width, nr += rc[r];
    }
    // The rows travel in the compute dtype, in tracked buffers (temporaries).
    Tensor sbuf(alloc_, {ns}, cb_, MemoryTag::temporaries);
    sbuf.write(in, ns);
    Tensor rbuf(alloc_, {nr}, cb_, MemoryTag::temporaries);
    g_.ep->all_to_all_v(sbuf.data(), sc, rbuf.data(), rc, cb_, token_rows * width, what);
    rbuf.read(out, nr);
  };
  return ex;
}

HostVec Trainer::moe_forward(Unit& u, const LayerParams& lp, LayerSaved& sv, const HostVec& ln2) {
  HostVec out(static_cast<std::size_t>(Nl_ * h_), 0.0f);
  // Shared experts on the gathered tokens, reduced back into the sequence-parallel shard.
  if (lp.shared_in >= 0) {
    const Count fs_l = m_.moe.num_shared_experts * m_.moe.shared_expert_ffn_hidden_size / tp_;
    const HostVec xf = gather_in(ln2, Traffic::layer_activations);
    const HostVec wi = param_host(u, lp.shared_in), wo = param_host(u, lp.shared_out);
    HostVec fc1(static_cast<std::size_t>(N_ * 2 * fs_l)), act(static_cast<std::size_t>(N_ * fs_l)),
        y(static_cast<std::size_t>(N_ * h_));
    moe::expert_forward(xf.data(), wi.data(), wo.data(), fc1.data(), act.data(), y.data(), N_, h_,
                        fs_l);
    sv.fc1 = save_act(fc1);
    sv.act = save_act(act);
    out = reduce_out(y, Traffic::layer_activations);
  }
  // Routed experts on this rank's tokens.
  auto bs = std::make_shared<moe::BlockSaved<float>>();
  const HostVec routed =
      moe::block_forward(block_weights(u, lp), ln2.data(), Nl_, *bs, ep_exchange());
  const auto self = static_cast<std::size_t>(g_.ep->rank());
  moe_routing_.copies += bs->sent();
  moe_routing_.to_other_ranks += bs->sent() - bs->send_rows[self];
  moe_routing_.received += bs->received();
  // Its tensors go to tracked storage until the backward; the index maps stay with `moe`.
  sv.moe_scores = save(bs->routing.scores);
  sv.moe_x_in = save_act(bs->x_in);
  sv.moe_fc1 = save_act(bs->fc1);
  sv.moe_act = save_act(bs->act);
  sv.moe_y_back = save_act(bs->y_back);
  for (auto* v : {&bs->routing.scores, &bs->x_in, &bs->fc1, &bs->act, &bs->y_back})
    HostVec().swap(*v);
  sv.moe = std::move(bs);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] += routed[i];
  return out;
}

HostVec Trainer::moe_backward(int ui, const LayerParams& lp, LayerSaved& sv, const HostVec& dy,
                              std::vector<std::function<void()>>& jobs) {
  Unit& u = units_[static_cast<std::size_t>(ui)];
  const HostVec ln2 = rd_host(sv.ln2);
  HostVec dx(static_cast<std::size_t>(Nl_ * h_), 0.0f);
  if (lp.shared_in >= 0) {
    const Count fs_l = m_.moe.num_shared_experts * m_.moe.shared_expert_ffn_hidden_size / tp_;
    const HostVec dyf = gather_in(dy, Traffic::layer_activations);
    const HostVec xf = gather_in(ln2, Traffic::layer_activations);
    const HostVec wi = param_host(u, lp.shared_in), wo = param_host(u, lp.shared_out);
    const HostVec fc1 = rd_host(sv.fc1), act = rd_host(sv.act);
    HostVec dxf(static_cast<std::size_t>(N_ * h_)), dwi(wi.size(), 0.0f), dwo(wo.size(), 0.0f);
    moe::expert_backward(dyf.data(), xf.data(), wi.data(), wo.data(), fc1.data(), act.data(),
                         dxf.data(), dwi.data(), dwo.data(), N_, h_, fs_l);
    dx = reduce_out(dxf, Traffic::layer_activations);
    jobs.push_back([this, ui, lp, dwi, dwo] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      add_grad(uu, lp.shared_in, dwi);
      add_grad(uu, lp.shared_out, dwo);
    });
  }
  moe::BlockSaved<float>& bs = *sv.moe;
  bs.routing.scores = rd_host(sv.moe_scores);
  bs.x_in = rd_host(sv.moe_x_in);
  bs.fc1 = rd_host(sv.moe_fc1);
  bs.act = rd_host(sv.moe_act);
  bs.y_back = rd_host(sv.moe_y_back);
  auto g = std::make_shared<moe::BlockGrads<float>>();
  const HostVec dr =
      moe::block_backward(block_weights(u, lp), ln2.data(), dy.data(), Nl_, bs, *g, ep_exchange());
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dr[i];
  jobs.push_back([this, ui, lp, g] {
    add_grad(units_[static_cast<std::size_t>(ui)], lp.router_w, g->router_w);
    Unit& x = units_[static_cast<std::size_t>(lp.experts)];
    for (std::size_t le = 0; le < g->w_in.size(); ++le) {
      add_grad(x, static_cast<int>(2 * le), g->w_in[le]);
      add_grad(x, static_cast<int>(2 * le + 1), g->w_out[le]);
    }
  });
  rnd(dx, cb_);
  return dx;
}

void Trainer::reduce_expert_grads(Unit& u) {
  if (g_.edp->size() == 1) return;
  const auto t0 = now();
  const Traffic what = unit_traffic(UnitTraffic::gradients, ParamUnit::experts);
  if (p_.zero_stage == 0) {
    g_.edp->all_reduce(u.grads.data(), u.grads.numel(), gb_, ReduceOp::sum, what);
  } else {
    Tensor part(alloc_, {u.shard}, gb_, MemoryTag::temporaries);
    g_.edp->reduce_scatter(u.grads.data(), part.data(), u.shard, gb_, what);
    HostVec pv = rd_host(part);
    u.grads.write(pv.data(), u.shard, opt_begin(u));
  }
  mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, u.chunk, t0);
}

}  // namespace distplan::backend::trainer_detail

namespace distplan::backend {

void check_moe_supported(const Scenario& s, Device device, CommBackend comm) {
  const MoeSpec& e = s.model.moe;
  const ParallelSpec& p = s.parallel;
  if (!e.enabled()) return;
  if (device == Device::cuda) {
    throw InputError("/model/moe",
                     "the CUDA device does not run MoE layers; train the model on the CPU (MPI)");
  }
  if (comm == CommBackend::emulated && p.ep > 1) {
    throw InputError("/parallel/ep",
                     "an emulated rank cannot stand for expert parallelism: the tokens it "
                     "receives depend on the other ranks' routing; run it under MPI");
  }
  if (p.cp > 1) {
    throw InputError("/parallel/cp",
                     "the backend does not run MoE layers with context parallelism; validate a "
                     "MoE layout with cp = 1");
  }
  if (e.capacity_factor) {
    throw InputError("/model/moe/capacity_factor",
                     "the backend trains dropless MoE only (capacity_factor null); token "
                     "dropping is not implemented");
  }
  if (s.model.mlp != Mlp::swiglu)
    throw InputError("/model/mlp", "the backend's experts are SwiGLU MLPs (mlp: swiglu)");
  if (s.model.bias)
    throw InputError("/model/bias", "the backend's MoE layers have no linear biases");
  if (e.shared_expert_gate) {
    throw InputError("/model/moe/shared_expert_gate",
                     "the backend does not implement Qwen2-MoE's shared-expert gate");
  }
  if (s.model.mla.enabled())
    throw InputError("/model/mla", "the backend does not implement multi-head latent attention");
  if (s.model.mtp_layers > 0)
    throw InputError("/model/mtp_layers", "the backend does not train multi-token prediction");
  if (s.training.precision != DType::fp32) {
    throw InputError("/training/precision",
                     "the backend trains MoE layers in fp32 storage only (their expert GEMMs "
                     "read the weights in place)");
  }
  if (p.etp > 1)
    throw InputError("/parallel/etp", "the backend trains MoE layers with etp = 1 only");
  if (p.zero_stage >= 2) {
    throw InputError("/parallel/zero_stage",
                     "the backend trains MoE layers with ZeRO 0 and 1 only");
  }
  if (p.tp > 1 && !p.sequence_parallel) {
    // Megatron-Core refuses it too (megatron/core/transformer/moe/moe_layer.py, MoELayer.forward:
    // "performance may degrade if MoE and tensor parallelism are enabled without also enabling
    // sequence parallelism"): each TP rank routes its own sequence shard.
    throw InputError("/parallel/sequence_parallel",
                     "MoE layers with tp > 1 need sequence_parallel (each TP rank routes its "
                     "sequence shard, as Megatron-Core requires)");
  }
  if (p.recompute != Recompute::none) {
    throw InputError("/parallel/recompute",
                     "the backend trains MoE layers without activation recomputation");
  }
}

}  // namespace distplan::backend
