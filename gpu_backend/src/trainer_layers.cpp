// Trainer: the layer ops (norms, linear layers, attention) on the device of the run and one
// transformer layer forward and backward, following the planner's layer op table (trainer_impl.h).
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

Vec Trainer::norm_fwd(Unit& u, int gi, int bi, const Vec& x, Count n) {
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

Vec Trainer::norm_bwd_input(Unit& u, int gi, const Vec& dy, const Vec& x, Count n) {
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

void Trainer::norm_bwd_weight(Unit& u, int gi, int bi, const Vec& dy, const Vec& x, Count n) {
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

Vec Trainer::linear_fwd(Unit& u, int wi, int bi, const Vec& x, Count n, Count in, Count out) {
  Vec b;
  if (bi >= 0) b = param(u, bi);
  Vec y(static_cast<std::size_t>(n * out));
  const float* bp = bi >= 0 ? b.data() : nullptr;
  // The weight is read where it lives (no host copy on CUDA).
  dev::linear_forward(o_.device, x.data(), unit_weights(u), param_offset(u, wi), bp, y.data(), n,
                      in, out);
  rnd(y, cb_);
  return y;
}

Vec Trainer::linear_bwd_input(Unit& u, int wi, const Vec& dy, Count n, Count in, Count out) {
  Vec dx(static_cast<std::size_t>(n * in));
  dev::linear_backward_input(o_.device, dy.data(), unit_weights(u), param_offset(u, wi), dx.data(),
                             n, in, out);
  rnd(dx, cb_);
  return dx;
}

void Trainer::linear_bwd_weight(Unit& u, int wi, int bi, const Vec& dy, const Vec& x, Count n,
                                Count in, Count out) {
  Vec dw(static_cast<std::size_t>(in * out), 0.0f), db(static_cast<std::size_t>(out), 0.0f);
  float* dbp = bi >= 0 ? db.data() : nullptr;
  dev::linear_backward_weight(o_.device, dy.data(), x.data(), dw.data(), dbp, n, in, out);
  add_grad(u, wi, dw);
  if (bi >= 0) add_grad(u, bi, db);
}

void Trainer::attention_fwd(const Vec& q, const Vec& k, const Vec& v, Vec& out, Vec* probs,
                            Vec* lse) {
  const Count s = sl_, b = t_.micro_batch_size;
  out.assign(q.size(), 0.0f);
  if (lse != nullptr) {
    lse->assign(static_cast<std::size_t>(b * a_l_ * s), 0.0f);
    dev::flash_attention_forward(o_.device, q.data(), k.data(), v.data(), out.data(), lse->data(),
                                 s, b, a_l_, g_l_, d_);
  } else {
    probs->assign(static_cast<std::size_t>(b * a_l_ * s * s), 0.0f);
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

Vec Trainer::layer_forward(int ui, const LayerParams& lp, LayerSaved& sv) {
  Unit& u = units_[static_cast<std::size_t>(ui)];
  const Count kvl = g_l_ * d_, ql = a_l_ * d_;
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
    rope(q, a_l_, false);
    rope(k, g_l_, false);
    rnd(q, cb_);
    rnd(k, cb_);
  }
  Vec attn, probs, lse;
  if (cp_ > 1) {
    // q, k, v become what the backward reads: the ring's last KV block (p2p), the head-sharded
    // tensors (a2a).
    cp_attention_forward(ui, q, k, v, attn, lse);
  } else {
    attention_fwd(q, k, v, attn, flash() ? nullptr : &probs, flash() ? &lse : nullptr);
  }
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
    for (Count c = 0; c < h_; ++c) x2[n * h_ + c] += proj[n * h_ + c] + (ob.empty() ? 0.0f : ob[c]);
  rnd(x2, cb_);
  sv.x2 = save_act(x2);
  Vec ln2 = norm_fwd(u, lp.norm2_g, lp.norm2_b, x2, Nl_);
  sv.ln2 = save_act(ln2);
  if (lp.moe) {  // a MoE layer's MLP (trainer_moe.cpp)
    const Vec o = moe_forward(u, lp, sv, ln2);
    Vec y = x2;
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += o[i];
    rnd(y, cb_);
    return y;
  }
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
  const Vec o = reduce_out(linear_fwd(u, lp.mlp_out_w, -1, act, N_, f_l_, h_), "layer activations");
  const Vec b2 = lp.mlp_out_b >= 0 ? param(u, lp.mlp_out_b) : Vec();
  Vec y = x2;
  for (Count n = 0; n < Nl_; ++n)
    for (Count c = 0; c < h_; ++c) y[n * h_ + c] += o[n * h_ + c] + (b2.empty() ? 0.0f : b2[c]);
  rnd(y, cb_);
  return y;
}

void Trainer::split_halves(const Vec& fc1, Vec& gate, Vec& up) const {
  for (Count n = 0; n < N_; ++n) {
    std::copy(fc1.data() + n * mi_l_, fc1.data() + n * mi_l_ + f_l_, gate.data() + n * f_l_);
    std::copy(fc1.data() + n * mi_l_ + f_l_, fc1.data() + (n + 1) * mi_l_, up.data() + n * f_l_);
  }
}

Vec Trainer::layer_backward(int ui, const LayerParams& lp, LayerSaved& sv, const Vec& dy,
                            std::vector<std::function<void()>>& jobs) {
  Unit& u = units_[static_cast<std::size_t>(ui)];
  const Count s = sl_, b = t_.micro_batch_size, kvl = g_l_ * d_, ql = a_l_ * d_;
  LayerSaved* S = &sv;
  // MLP (a MoE layer's in trainer_moe.cpp).
  Vec dln2;
  if (lp.moe) {
    dln2 = moe_backward(ui, lp, sv, dy, jobs);
  } else {
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
    dln2 = reduce_out(linear_bwd_input(u, lp.in_w, dfc1, N_, h_, mi_l_), "layer activations");
    jobs.push_back([this, ui, lp, dfc1, S] {
      Unit& uu = units_[static_cast<std::size_t>(ui)];
      linear_bwd_weight(uu, lp.in_w, lp.in_b, dfc1, gather_in(rd(S->ln2), "layer activations"), N_,
                        h_, mi_l_);
    });
  }
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
  if (cp_ > 1) {
    cp_attention_backward(ui, dattn, q, k, v, rd(sv.attn), rd(sv.lse), dq, dk, dv);
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
    linear_bwd_weight(uu, lp.qkv_w, lp.qkv_b, dqkv, gather_in(rd(S->ln1), "layer activations"), N_,
                      h_, qkv_w);
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

Vec Trainer::col_sum(const Vec& x, Count n) const {
  Vec out(static_cast<std::size_t>(h_), 0.0f);
  for (Count i = 0; i < n; ++i)
    for (Count c = 0; c < h_; ++c) out[c] += x[i * h_ + c];
  return out;
}

}  // namespace distplan::backend::trainer_detail
