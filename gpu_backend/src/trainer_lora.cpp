// Trainer: fine-tuning (training.peft; planner/peft.h, docs/peft.md): frozen units, a layer's
// LoRA adapters (Hu et al. 2021: y = W x + (alpha / r) B A x, as PEFT's lora.Linear computes it)
// and the gradient flow that decides what a layer keeps and computes (trainer_impl.h).
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

namespace {

DType dtype_of(BaseStorage s) {
  return s == BaseStorage::fp32 ? DType::fp32 : s == BaseStorage::fp16 ? DType::fp16 : DType::bf16;
}

}  // namespace

void Trainer::peft_unit(Unit& u, Count layer) const {
  u.wdt = cb_;
  u.gdt = gb_;
  const PeftSpec& pe = t_.peft;
  if (!pe.enabled()) return;
  const bool adapters = pe.adapters();
  switch (u.kind) {
    case ParamUnit::layers:  // a layer's own parameters: LoRA's frozen base, or full fine-tuning's
                             // layer
      u.frozen = adapters || !peft_layer_trains(pe, layer);
      // QLoRA: the flat buffer keeps the norms (and biases) in base_dtype; the linear weights
      // are quantized apart.
      if (adapters) u.wdt = pe.quantized() ? pe.base_dtype : dtype_of(pe.base_storage);
      break;
    case ParamUnit::embedding:  // the embedding: its backward is its weight gradient only
      u.frozen = !peft_embedding_trains(pe);
      u.backward = !u.frozen;
      if (adapters) u.wdt = pe.base_dtype;
      break;
    case ParamUnit::head:  // final norm and LM head (a tied copy freezes with the embedding:
                           // check_supported)
      u.frozen = adapters;
      if (adapters) u.wdt = pe.base_dtype;
      break;
    default:
      break;
  }
}

void Trainer::add_lora_unit(Count layer, LayerParams& lp) {
  const PeftSpec& pe = t_.peft;
  const bool trains = peft_layer_trains(pe, layer);
  const LoraLayer lora = trains ? lora_layer(table_, m_, pe) : LoraLayer{};
  if (!pe.enabled()) {
    lp.flow.backward_input.fill(true);
    lp.flow.backward_weight.fill(true);
    lp.flow.saves.fill(true);
    lp.flow.any = true;
  } else {
    lp.flow = peft_layer_flow(table_, lora, trains && !pe.adapters(), peft_grad_reaches(pe, layer),
                              pe.dropout > 0);
  }
  const int base = static_cast<int>(units_.size()) - 1;  // the layer's unit, just added
  units_.back().backward = lp.flow.any;
  if (pe.quantized() && !lp.moe) {
    // QLoRA: the frozen linear weights in bitsandbytes' storage, one tensor per Hugging Face
    // module (quantize_unit fills them when the unit's storage is made).
    Unit& u = units_.back();
    const Count ql = a_l_ * d_, kvl = g_l_ * d_;
    auto quantize = [&u](int param, std::initializer_list<Count> rows) {
      u.params[static_cast<std::size_t>(param)].quantized = true;
      Count row0 = 0;
      for (Count r : rows) {
        Unit::QuantSegment q;
        q.param = param;
        q.row0 = row0;
        q.rows = r;
        u.quant.push_back(std::move(q));
        row0 += r;
      }
    };
    if (pe.naming == PeftNaming::llama) {
      quantize(lp.qkv_w, {ql, kvl, kvl});
    } else {
      quantize(lp.qkv_w, {ql + 2 * kvl});
    }
    quantize(lp.out_w, {h_});
    if (m_.mlp == Mlp::swiglu) {
      quantize(lp.in_w, {f_l_, f_l_});
    } else {
      quantize(lp.in_w, {f_l_});
    }
    quantize(lp.mlp_out_w, {h_});
  }
  if (lora.count == 0) return;
  // The adapters of the layer, one unit: A (r x in) then B (out x r) per adapter. B starts like
  // every other weight of the backend (not PEFT's zeros), so the first step's gradient of A is
  // not zero and every gradient is checked from the first step (docs/gpu_backend.md).
  Unit u;
  u.kind = ParamUnit::adapters;
  u.wdt = pe.adapter_dtype;
  u.gdt = pe.adapter_dtype == DType::fp32 ? DType::fp32 : gb_;
  const Count r = pe.rank, ql = a_l_ * d_, kvl = g_l_ * d_;
  int slot = 0;
  for (const LoraModule& x : lora) {
    LayerParams::Lora a;
    a.op = x.op;
    a.in = x.in;
    a.out = x.out;
    // Its columns of the op's output: qkv is [q | k | v], SwiGLU's mlp_in [gate | up].
    if (x.op == op_.qkv) {
      a.ld = ql + 2 * kvl;
      a.col = x.target == peft_k ? ql : x.target == peft_v ? ql + kvl : 0;
    } else if (x.op == op_.mlp_in) {
      a.ld = mi_l_;
      a.col = x.target == peft_up && m_.mlp == Mlp::swiglu ? f_l_ : 0;
    } else {
      a.ld = h_;
    }
    u.add(r, x.in, Init::normal, uid(layer, 20 + slot++), identity());
    a.a = static_cast<int>(u.params.size()) - 1;
    u.add(x.out, r, Init::normal, uid(layer, 20 + slot++), identity());
    a.b = static_cast<int>(u.params.size()) - 1;
    lp.lora.push_back(a);
  }
  u.chunk = units_.back().chunk;
  units_.push_back(std::move(u));
  units_[static_cast<std::size_t>(base)].adapters = static_cast<int>(units_.size()) - 1;
}

Vec Trainer::quantized_linear(Unit& u, int wi, const Vec& v, Count n, Count in, Count out,
                              bool backward) {
  // bitsandbytes' MatMul4Bit (autograd/_functions.py, v0.49): each weight dequantized to the
  // compute dtype (a transient in buffers, one tensor at a time), then the GEMM; again for the
  // input gradient. Forward: v = x (n, in) -> y (n, out); backward: v = dy (n, out) -> dx (n, in).
  Vec r = zeros(n * (backward ? in : out));
  for (const Unit::QuantSegment& q : u.quant) {
    if (q.param != wi) continue;
    HostVec w(static_cast<std::size_t>(q.rows * in));
    q.w->dequantize(w.data());
    Tensor t(alloc_, {q.rows * in}, cb_, MemoryTag::buffers);
    t.write(w.data(), q.rows * in);
    if (!backward) {
      Vec y = zeros(n * q.rows);
      dev::linear_forward(o_.device, v.data(), t, 0, nullptr, y.data(), n, in, q.rows);
      dev::copy_block(o_.device, r.data() + q.row0, out, y.data(), q.rows, n, q.rows);
    } else {
      Vec dy = zeros(n * q.rows), dx = zeros(n * in);
      dev::copy_block(o_.device, dy.data(), q.rows, v.data() + q.row0, out, n, q.rows);
      dev::linear_backward_input(o_.device, dy.data(), t, 0, dx.data(), n, in, q.rows);
      dev::add(o_.device, r.data(), dx.data(), r.data(), n * in);
    }
  }
  rnd(r, cb_);
  return r;
}

int Trainer::grad_unit(int ui) const {
  const Unit& u = units_[static_cast<std::size_t>(ui)];
  if (u.adapters >= 0) return u.adapters;
  return u.frozen ? -1 : ui;
}

void Trainer::lora_forward(int ui, const LayerParams& lp, int op, const Vec& x, Vec& y,
                           LayerSaved& sv) {
  if (lp.lora.empty()) return;
  Unit& au = units_[static_cast<std::size_t>(units_[static_cast<std::size_t>(ui)].adapters)];
  const Count r = t_.peft.rank;
  const auto scale = static_cast<float>(t_.peft.alpha / static_cast<double>(r));
  sv.lora_ax.resize(lp.lora.size());
  bool any = false;
  for (std::size_t k = 0; k < lp.lora.size(); ++k) {
    const LayerParams::Lora& a = lp.lora[k];
    if (a.op != op) continue;
    // x (N, in) -> A x (N, r), kept for B's weight gradient -> B A x (N, out), scaled, added to
    // the op's output columns.
    const Vec ax = linear_fwd(au, a.a, -1, x, N_, a.in, r);
    sv.lora_ax[k] = save_act(ax);
    Vec bax = linear_fwd(au, a.b, -1, ax, N_, r, a.out);
    dev::scale(o_.device, bax.data(), scale, N_ * a.out);
    Vec block = zeros(N_ * a.out);
    dev::copy_block(o_.device, block.data(), a.out, y.data() + a.col, a.ld, N_, a.out);
    dev::add(o_.device, block.data(), bax.data(), block.data(), N_ * a.out);
    dev::copy_block(o_.device, y.data() + a.col, a.ld, block.data(), a.out, N_, a.out);
    any = true;
  }
  if (any) rnd(y, cb_);
}

void Trainer::lora_backward(int ui, const LayerParams& lp, int op, const Vec& dy, const Vec& x,
                            LayerSaved& sv, Vec* dx, std::vector<std::function<void()>>& jobs) {
  if (lp.lora.empty()) return;
  const int aui = units_[static_cast<std::size_t>(ui)].adapters;
  Unit& au = units_[static_cast<std::size_t>(aui)];
  const Count r = t_.peft.rank;
  const auto scale = static_cast<float>(t_.peft.alpha / static_cast<double>(r));
  bool any = false;
  for (std::size_t k = 0; k < lp.lora.size(); ++k) {
    const LayerParams::Lora a = lp.lora[k];
    if (a.op != op) continue;
    // d(B A x) = scale * dy[:, col:col+out]; d(A x) = d(B A x) B; dx += d(A x) A.
    Vec dbax = zeros(N_ * a.out);
    dev::copy_block(o_.device, dbax.data(), a.out, dy.data() + a.col, a.ld, N_, a.out);
    dev::scale(o_.device, dbax.data(), scale, N_ * a.out);
    rnd(dbax, cb_);
    const Vec ax = rd(sv.lora_ax[k]);
    const Vec dax = linear_bwd_input(au, a.b, dbax, N_, r, a.out);
    if (dx != nullptr) {
      const Vec dxa = linear_bwd_input(au, a.a, dax, N_, a.in, r);
      dev::add(o_.device, dx->data(), dxa.data(), dx->data(), N_ * a.in);
      any = true;
    }
    jobs.push_back([this, aui, a, dbax, dax, ax, x, r] {
      Unit& uu = units_[static_cast<std::size_t>(aui)];
      linear_bwd_weight(uu, a.b, -1, dbax, ax, N_, r, a.out);  // dB (out, r) = d(BAx)^T Ax
      linear_bwd_weight(uu, a.a, -1, dax, x, N_, a.in, r);     // dA (r, in) = d(Ax)^T x
    });
  }
  if (any) rnd(*dx, cb_);
}

}  // namespace distplan::backend::trainer_detail
