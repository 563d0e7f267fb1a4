// Trainer: the layer ops (norms, linear layers, attention) on the device of the run and one
// transformer layer forward and backward, following the planner's layer op table (trainer_impl.h).
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

Vec Trainer::norm_fwd(Unit& u, int gi, int bi, const Vec& x, Count n) {
  Vec y = zeros(static_cast<Count>(x.size())), mean = zeros(n), rstd = zeros(n);
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

Vec Trainer::norm_bwd_input(Unit& u, int gi, const Vec& dy, const Vec& x, Count n) {
  const Count nx = static_cast<Count>(x.size());
  Vec dx = zeros(nx), mean = zeros(n), rstd = zeros(n), y = zeros(nx), dg = zeros(h_),
      db = zeros(h_);
  const Vec g = param(u, gi);
  if (m_.norm == Norm::layernorm) {
    const Vec zero = zeros(h_);
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

void Trainer::norm_bwd_weight(Unit& u, int gi, int bi, const Vec& dy, const Vec& x, Count n) {
  const Count nx = static_cast<Count>(x.size());
  Vec dx = zeros(nx), mean = zeros(n), rstd = zeros(n), y = zeros(nx), dg = zeros(h_),
      db = zeros(h_);
  if (ones_.size() != static_cast<std::size_t>(h_))
    ones_ = Vec::from_host(o_.device, HostVec(static_cast<std::size_t>(h_), 1.0f));
  const Vec& g = ones_;
  if (m_.norm == Norm::layernorm) {
    const Vec zero = zeros(h_);
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

Vec Trainer::linear_fwd(Unit& u, int wi, int bi, const Vec& x, Count n, Count in, Count out) {
  if (u.params[static_cast<std::size_t>(wi)].quantized) {  // QLoRA's frozen base
    Vec y = quantized_linear(u, wi, x, n, in, out, false);
    if (bi >= 0) {
      dev::add_bias_rows(o_.device, y.data(), param(u, bi).data(), n, out);
      rnd(y, cb_);
    }
    return y;
  }
  Vec b;
  if (bi >= 0) b = param(u, bi);
  Vec y = zeros(n * out);
  const float* bp = bi >= 0 ? b.data() : nullptr;
  // The weight is read where it lives (no host copy on CUDA).
  dev::linear_forward(o_.device, x.data(), unit_weights(u), param_offset(u, wi), bp, y.data(), n,
                      in, out);
  rnd(y, cb_);
  return y;
}

Vec Trainer::linear_bwd_input(Unit& u, int wi, const Vec& dy, Count n, Count in, Count out) {
  if (u.params[static_cast<std::size_t>(wi)].quantized)
    return quantized_linear(u, wi, dy, n, in, out, true);
  Vec dx = zeros(n * in);
  dev::linear_backward_input(o_.device, dy.data(), unit_weights(u), param_offset(u, wi), dx.data(),
                             n, in, out);
  rnd(dx, cb_);
  return dx;
}

void Trainer::linear_bwd_weight(Unit& u, int wi, int bi, const Vec& dy, const Vec& x, Count n,
                                Count in, Count out) {
  Vec dw = zeros(in * out), db = zeros(out);
  float* dbp = bi >= 0 ? db.data() : nullptr;
  dev::linear_backward_weight(o_.device, cb_, dy.data(), x.data(), dw.data(), dbp, n, in, out);
  add_grad(u, wi, dw);
  if (bi >= 0) add_grad(u, bi, db);
}

void Trainer::attention_fwd(const Vec& q, const Vec& k, const Vec& v, Vec& out, Vec* probs,
                            Vec* lse) {
  const Count s = sl_, b = t_.micro_batch_size;
  out = zeros(static_cast<Count>(q.size()));
  if (lse != nullptr) {
    *lse = zeros(b * a_l_ * s);
    dev::flash_attention_forward(o_.device, q.data(), k.data(), v.data(), out.data(), lse->data(),
                                 s, b, a_l_, g_l_, d_);
  } else {
    *probs = zeros(b * a_l_ * s * s);
    dev::attention_forward(o_.device, q.data(), k.data(), v.data(), out.data(), probs->data(), s, b,
                           a_l_, g_l_, d_);
    rnd(*probs, cb_);
  }
  rnd(out, cb_);
}

bool Trainer::flash() const {
  return t_.attention == Attention::flash;
}

bool Trainer::rotary() const {
  return m_.position_embedding == PositionEmbedding::rotary;
}

Vec Trainer::layer_forward(int ui, const LayerParams& lp, LayerSaved& sv, const Vec& x) {
  Unit& u = units_[static_cast<std::size_t>(ui)];
  const Count kvl = g_l_ * d_, ql = a_l_ * d_;
  // What the layer keeps (the flow of fine-tuning; everything in pre-training): an op keeps its
  // saved tensors only when its backward needs them (peft.h, peft_layer_flow).
  auto keeps = [&lp](int op) { return lp.flow.saves[static_cast<std::size_t>(op)]; };
  Vec ln1 = norm_fwd(u, lp.norm1_g, lp.norm1_b, x, Nl_);
  if (keeps(op_.qkv)) sv.ln1 = save_act(ln1);
  const Vec ln1f = gather_in(ln1, Traffic::layer_activations);
  const Count qkv_w = ql + 2 * kvl;
  Vec qkv = linear_fwd(u, lp.qkv_w, lp.qkv_b, ln1f, N_, h_, qkv_w);
  lora_forward(ui, lp, op_.qkv, ln1f, qkv, sv);
  Vec q = zeros(N_ * ql), k = zeros(N_ * kvl), v = zeros(N_ * kvl);
  dev::copy_block(o_.device, q.data(), ql, qkv.data(), qkv_w, N_, ql);
  dev::copy_block(o_.device, k.data(), kvl, qkv.data() + ql, qkv_w, N_, kvl);
  dev::copy_block(o_.device, v.data(), kvl, qkv.data() + ql + kvl, qkv_w, N_, kvl);
  if (rotary()) {
    rope(q, a_l_, false);
    rope(k, g_l_, false);
    rnd(q, cb_);
    rnd(k, cb_);
  }
  Vec attn, probs, lse;
  if (cp_ > 1) {
    // q, k, v become what the backward reads: the ring's last KV block (p2p), the head-sharded
    // tensors (a2a).
    // Context parallelism runs on the CPU only (check_supported_on): its ring and exchanges work
    // on host arrays.
    HostVec hq = q.to_host(), hk = k.to_host(), hv = v.to_host(), ha, hl, heads;
    cp_attention_forward(ui, hq, hk, hv, ha, hl, heads);
    if (!heads.empty()) sv.attn_heads = save_act(heads);
    q = Vec::from_host(o_.device, hq);
    k = Vec::from_host(o_.device, hk);
    v = Vec::from_host(o_.device, hv);
    attn = Vec::from_host(o_.device, ha);
    lse = Vec::from_host(o_.device, hl);
  } else {
    attention_fwd(q, k, v, attn, flash() ? nullptr : &probs, flash() ? &lse : nullptr);
  }
  if (keeps(op_.attention)) {
    sv.q = save_act(q);
    sv.k = save_act(k);
    sv.v = save_act(v);
    if (flash()) {
      sv.lse = save(lse, DType::fp32);
    } else if (p_.recompute != Recompute::selective) {
      sv.probs = save_act(probs);
    }
  }
  // The attention output: attention_out's saved input, and flash attention's backward reads it.
  if (keeps(op_.attn_out) || (flash() && keeps(op_.attention))) sv.attn = save_act(attn);
  Vec proj = linear_fwd(u, lp.out_w, -1, attn, N_, ql, h_);
  lora_forward(ui, lp, op_.attn_out, attn, proj, sv);
  proj = reduce_out(std::move(proj), Traffic::layer_activations);
  Vec x2 = residual(u, lp.out_b, x, proj);
  if (keeps(op_.norm2)) sv.x2 = save_act(x2);
  Vec ln2 = norm_fwd(u, lp.norm2_g, lp.norm2_b, x2, Nl_);
  if (keeps(op_.mlp_in) || lp.moe) sv.ln2 = save_act(ln2);
  if (lp.moe) {  // a MoE layer's MLP (trainer_moe.cpp; on the CPU only, check_moe_supported)
    const Vec o = Vec::from_host(o_.device, moe_forward(u, lp, sv, ln2.to_host()));
    Vec y = zeros(static_cast<Count>(x2.size()));
    dev::add(o_.device, x2.data(), o.data(), y.data(), static_cast<Count>(y.size()));
    rnd(y, cb_);
    return y;
  }
  const Vec ln2f = gather_in(ln2, Traffic::layer_activations);
  Vec fc1 = linear_fwd(u, lp.in_w, lp.in_b, ln2f, N_, h_, mi_l_);
  lora_forward(ui, lp, op_.mlp_in, ln2f, fc1, sv);
  if (keeps(op_.activation)) sv.fc1 = save_act(fc1);
  Vec act = zeros(N_ * f_l_);
  if (m_.mlp == Mlp::swiglu) {
    Vec gate = zeros(N_ * f_l_), up = zeros(N_ * f_l_);
    split_halves(fc1, gate, up);
    dev::swiglu_forward(o_.device, gate.data(), up.data(), act.data(), N_ * f_l_);
  } else {
    dev::gelu_forward(o_.device, fc1.data(), act.data(), N_ * f_l_);
  }
  rnd(act, cb_);
  if (keeps(op_.mlp_out)) sv.act = save_act(act);
  Vec o = linear_fwd(u, lp.mlp_out_w, -1, act, N_, f_l_, h_);
  lora_forward(ui, lp, op_.mlp_out, act, o, sv);
  o = reduce_out(std::move(o), Traffic::layer_activations);
  return residual(u, lp.mlp_out_b, x2, o);
}

Vec Trainer::residual(Unit& u, int bi, const Vec& x, Vec& branch) {
  if (bi >= 0) dev::add_bias_rows(o_.device, branch.data(), param(u, bi).data(), Nl_, h_);
  Vec y = zeros(static_cast<Count>(x.size()));
  dev::add(o_.device, x.data(), branch.data(), y.data(), static_cast<Count>(y.size()));
  rnd(y, cb_);
  return y;
}

void Trainer::split_halves(const Vec& fc1, Vec& gate, Vec& up) const {
  dev::copy_block(o_.device, gate.data(), f_l_, fc1.data(), mi_l_, N_, f_l_);
  dev::copy_block(o_.device, up.data(), f_l_, fc1.data() + f_l_, mi_l_, N_, f_l_);
}

Vec Trainer::layer_backward(int ui, const LayerParams& lp, LayerSaved& sv, const Vec& dy,
                            std::vector<std::function<void()>>& jobs) {
  Unit& u = units_[static_cast<std::size_t>(ui)];
  const Count s = sl_, b = t_.micro_batch_size, kvl = g_l_ * d_, ql = a_l_ * d_;
  LayerSaved* S = &sv;
  // Fine-tuning's flow (peft.h): an op's input gradient only where something below trains, its
  // weight gradient only where its weights train. The flow is monotone, so once an op needs no
  // input gradient nothing below it does: the layer's backward ends there (an empty result).
  auto bin = [&lp](int op) { return lp.flow.backward_input[static_cast<std::size_t>(op)]; };
  auto bw = [&lp](int op) { return lp.flow.backward_weight[static_cast<std::size_t>(op)]; };
  // MLP (a MoE layer's in trainer_moe.cpp).
  Vec dln2;
  if (lp.moe) {
    dln2 = Vec::from_host(o_.device, moe_backward(ui, lp, sv, dy.to_host(), jobs));
  } else {
    const Vec dyf = gather_in(dy, Traffic::layer_activations);
    Vec dact;
    if (bin(op_.mlp_out)) dact = linear_bwd_input(u, lp.mlp_out_w, dyf, N_, f_l_, h_);
    if (bw(op_.mlp_out)) {
      jobs.push_back([this, ui, lp, dyf, S, dy] {
        Unit& uu = units_[static_cast<std::size_t>(ui)];
        linear_bwd_weight(uu, lp.mlp_out_w, -1, dyf, rd(S->act), N_, f_l_, h_);
        if (lp.mlp_out_b >= 0) add_grad(uu, lp.mlp_out_b, col_sum(dy, Nl_));
      });
    }
    lora_backward(ui, lp, op_.mlp_out, dyf, sv.act.empty() ? Vec{} : rd(sv.act), sv,
                  bin(op_.mlp_out) ? &dact : nullptr, jobs);
    if (!bin(op_.mlp_out)) return {};
    const Vec fc1 = rd(sv.fc1);
    Vec dfc1 = zeros(static_cast<Count>(fc1.size()));
    if (m_.mlp == Mlp::swiglu) {
      Vec gate = zeros(N_ * f_l_), up = zeros(N_ * f_l_), dg = zeros(N_ * f_l_),
          du = zeros(N_ * f_l_);
      split_halves(fc1, gate, up);
      dev::swiglu_backward(o_.device, dact.data(), gate.data(), up.data(), dg.data(), du.data(),
                           N_ * f_l_);
      dev::copy_block(o_.device, dfc1.data(), mi_l_, dg.data(), f_l_, N_, f_l_);
      dev::copy_block(o_.device, dfc1.data() + f_l_, mi_l_, du.data(), f_l_, N_, f_l_);
    } else {
      dev::gelu_backward(o_.device, dact.data(), fc1.data(), dfc1.data(), N_ * f_l_);
    }
    rnd(dfc1, cb_);
    Vec dln2f;
    if (bin(op_.mlp_in)) dln2f = linear_bwd_input(u, lp.in_w, dfc1, N_, h_, mi_l_);
    if (bw(op_.mlp_in)) {
      jobs.push_back([this, ui, lp, dfc1, S] {
        Unit& uu = units_[static_cast<std::size_t>(ui)];
        linear_bwd_weight(uu, lp.in_w, lp.in_b, dfc1,
                          gather_in(rd(S->ln2), Traffic::layer_activations), N_, h_, mi_l_);
      });
    }
    lora_backward(ui, lp, op_.mlp_in, dfc1, sv.ln2.empty() ? Vec{} : rd(sv.ln2), sv,
                  bin(op_.mlp_in) ? &dln2f : nullptr, jobs);
    if (!bin(op_.mlp_in)) return {};
    dln2 = reduce_out(std::move(dln2f), Traffic::layer_activations);
  }
  if (bw(op_.norm2)) {
    jobs.push_back([this, ui, lp, dln2, S] {
      norm_bwd_weight(units_[static_cast<std::size_t>(ui)], lp.norm2_g, lp.norm2_b, dln2, rd(S->x2),
                      Nl_);
    });
  }
  if (!bin(op_.norm2)) return {};
  const Vec x2 = rd(sv.x2);
  Vec dx2 = norm_bwd_input(u, lp.norm2_g, dln2, x2, Nl_);
  dev::add(o_.device, dx2.data(), dy.data(), dx2.data(), static_cast<Count>(dx2.size()));
  rnd(dx2, cb_);
  // Attention.
  const Vec dx2f = gather_in(dx2, Traffic::layer_activations);
  Vec dattn;
  if (bin(op_.attn_out)) dattn = linear_bwd_input(u, lp.out_w, dx2f, N_, ql, h_);
  if (bw(op_.attn_out)) {
    jobs.push_back([this, ui, lp, dx2f, dx2, S, ql] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.out_w, -1, dx2f, rd(S->attn), N_, ql, h_);
      if (lp.out_b >= 0) add_grad(uu, lp.out_b, col_sum(dx2, Nl_));
    });
  }
  lora_backward(ui, lp, op_.attn_out, dx2f, sv.attn.empty() ? Vec{} : rd(sv.attn), sv,
                bin(op_.attn_out) ? &dattn : nullptr, jobs);
  if (!bin(op_.attn_out)) return {};
  const Vec q = rd(sv.q), k = rd(sv.k), v = rd(sv.v);
  Vec dq = zeros(static_cast<Count>(q.size())), dk = zeros(static_cast<Count>(k.size())),
      dv = zeros(static_cast<Count>(v.size()));
  if (cp_ > 1) {  // on the CPU only, as the forward
    HostVec hdq, hdk, hdv;
    const Tensor& out = p_.cp_comm == CpComm::a2a ? sv.attn_heads : sv.attn;
    cp_attention_backward(ui, dattn.to_host(), q.to_host(), k.to_host(), v.to_host(),
                          rd(out).to_host(), rd(sv.lse).to_host(), hdq, hdk, hdv);
    dq = Vec::from_host(o_.device, hdq);
    dk = Vec::from_host(o_.device, hdk);
    dv = Vec::from_host(o_.device, hdv);
  } else if (flash()) {
    const Vec out = rd(sv.attn), lse = rd(sv.lse);
    dev::flash_attention_backward(o_.device, dattn.data(), q.data(), k.data(), v.data(), out.data(),
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
    rope(dq, a_l_, true);
    rope(dk, g_l_, true);
  }
  const Count qkv_w = ql + 2 * kvl;
  Vec dqkv = zeros(N_ * qkv_w);
  dev::copy_block(o_.device, dqkv.data(), qkv_w, dq.data(), ql, N_, ql);
  dev::copy_block(o_.device, dqkv.data() + ql, qkv_w, dk.data(), kvl, N_, kvl);
  dev::copy_block(o_.device, dqkv.data() + ql + kvl, qkv_w, dv.data(), kvl, N_, kvl);
  rnd(dqkv, cb_);
  Vec dln1f;
  if (bin(op_.qkv)) dln1f = linear_bwd_input(u, lp.qkv_w, dqkv, N_, h_, qkv_w);
  if (bw(op_.qkv)) {
    jobs.push_back([this, ui, lp, dqkv, S, qkv_w] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.qkv_w, lp.qkv_b, dqkv,
                        gather_in(rd(S->ln1), Traffic::layer_activations), N_, h_, qkv_w);
    });
  }
  lora_backward(ui, lp, op_.qkv, dqkv, sv.ln1.empty() ? Vec{} : rd(sv.ln1), sv,
                bin(op_.qkv) ? &dln1f : nullptr, jobs);
  if (!bin(op_.qkv)) return {};
  Vec dln1 = reduce_out(std::move(dln1f), Traffic::layer_activations);
  if (bw(op_.norm1)) {
    jobs.push_back([this, ui, lp, dln1, S] {
      norm_bwd_weight(units_[static_cast<std::size_t>(ui)], lp.norm1_g, lp.norm1_b, dln1, rd(S->x),
                      Nl_);
    });
  }
  if (!bin(op_.norm1)) return {};
  const Vec x = rd(sv.x);
  Vec dx = norm_bwd_input(u, lp.norm1_g, dln1, x, Nl_);
  dev::add(o_.device, dx.data(), dx2.data(), dx.data(), static_cast<Count>(dx.size()));
  rnd(dx, cb_);
  return dx;
}

Vec Trainer::col_sum(const Vec& x, Count n) const {
  Vec out = zeros(h_);
  dev::col_sum(o_.device, x.data(), out.data(), n, h_);
  return out;
}

}  // namespace distplan::backend::trainer_detail
