// Trainer: the end of a step: fp16 overflow, the gradient dump, Adam/AdamW/SGD and the
// gathers of updated ZeRO shards (trainer_impl.h).
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

void Trainer::dump_gradients() const {
  std::vector<GradientRecord> out;
  for (const Unit& u : units_) {
    if (u.frozen) continue;  // fine-tuning: no gradient
    const Count lo = opt_begin(u), n = opt_count(u);
    HostVec gv(static_cast<std::size_t>(n));
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

void Trainer::dump_weights() const {
  std::vector<GradientRecord> out;
  for (const Unit& u : units_) {
    // ZeRO-3 holds a shard of the padded unit; otherwise the whole unit.
    const bool z3 = p_.zero_stage >= 3;
    const Count lo = z3 ? opt_begin(u) : 0, n = z3 ? u.shard : u.padded;
    HostVec wv(static_cast<std::size_t>(n));
    u.weights.read(wv.data(), n, 0);
    for (const Param& p : u.params) {
      if (p.quantized) continue;  // below, as stored
      const Count a = std::max(lo, p.offset), b = std::min(lo + n, p.offset + p.numel());
      if (a >= b) continue;
      GradientRecord r;
      r.param = p.uid;
      for (Count j = a; j < b; ++j) {
        r.index.push_back(p.global_index(j - p.offset));
        r.value.push_back(wv[static_cast<std::size_t>(j - lo)]);
      }
      out.push_back(std::move(r));
    }
    // A quantized weight (QLoRA): its stored values, dequantized.
    for (const Unit::QuantSegment& q : u.quant) {
      const Param& p = u.params[static_cast<std::size_t>(q.param)];
      HostVec w(static_cast<std::size_t>(q.rows * p.cols));
      q.w->dequantize(w.data());
      GradientRecord r;
      r.param = p.uid;
      for (Count i = 0; i < q.rows * p.cols; ++i) {
        r.index.push_back(p.global_index(q.row0 * p.cols + i));
        r.value.push_back(w[static_cast<std::size_t>(i)]);
      }
      out.push_back(std::move(r));
    }
  }
  write_gradient_dump(o_.dump_weights + "/rank" + std::to_string(g_.world_rank) + ".weights", out);
}

void Trainer::optimizer_step_on_device(Unit& u) {
  const Count lo = opt_begin(u), n = opt_count(u);
  const Count woff = p_.zero_stage >= 3 ? 0 : lo;
  dev::OptimizerOnDevice a;
  a.grads = &u.grads;
  a.grad_off = p_.zero_stage >= 2 ? 0 : lo;
  a.master = u.wdt != DType::fp32 ? &u.master : &u.weights;
  a.master_off = u.wdt != DType::fp32 ? 0 : woff;
  a.m = &u.m;
  a.v = t_.optimizer == Optimizer::sgd ? nullptr : &u.v;
  a.sgd = t_.optimizer == Optimizer::sgd;
  a.weights = u.wdt != DType::fp32 ? &u.weights : nullptr;
  a.weights_off = woff;
  a.n = n;
  a.config.lr = o_.learning_rate;
  a.config.weight_decay = o_.weight_decay;
  a.config.decoupled = t_.optimizer == Optimizer::adamw;
  a.step = opt_steps_;
  a.grad_scale = 1.0f / loss_scale_;
  dev::optimizer_step_on_device(o_.device, a);
}

void Trainer::optimizer_step(Unit& u) {
  if (o_.device == Device::cuda) {
    optimizer_step_on_device(u);
    gather_updated_shards(u);
    return;
  }
  const Count lo = opt_begin(u), n = opt_count(u);
  const bool z3 = p_.zero_stage >= 3;
  HostVec g(static_cast<std::size_t>(n));
  u.grads.read(g.data(), n, p_.zero_stage >= 2 ? 0 : lo);
  // Master weights: the fp32 copy, or the fp32 weights themselves.
  HostVec w(static_cast<std::size_t>(n));
  if (u.wdt != DType::fp32) {
    u.master.read(w.data(), n);
  } else {
    u.weights.read(w.data(), n, z3 ? 0 : lo);
  }
  const float gscale = 1.0f / loss_scale_;
  if (t_.optimizer == Optimizer::sgd) {
    cpu::sgd_step(w.data(), g.data(), u.m.f32(), n, o_.learning_rate, 0.9f, gscale);
  } else {
    cpu::AdamConfig c;
    c.lr = o_.learning_rate;
    c.weight_decay = o_.weight_decay;
    c.decoupled = t_.optimizer == Optimizer::adamw;
    cpu::adam_step(w.data(), g.data(), u.m.f32(), u.v.f32(), n, c, opt_steps_, gscale);
  }
  if (u.wdt != DType::fp32) u.master.write(w.data(), n);
  u.weights.write(w.data(), n, z3 ? 0 : lo);
  gather_updated_shards(u);
}

void Trainer::gather_updated_shards(Unit& u) {
  const Count lo = opt_begin(u);
  if (p_.zero_stage < 3 && shard_size(u) > 1) {
    Tensor mine(alloc_, {u.shard}, u.wdt, MemoryTag::temporaries);
    const char* src = static_cast<const char*>(u.weights.data()) + lo * bytes_of(u.wdt);
    dev::copy_bytes(o_.device, mine.data(), src, static_cast<std::size_t>(mine.bytes()));
    const auto t0 = now();
    shard_comm(u).all_gather(mine.data(), u.weights.data(), u.shard, u.wdt,
                             unit_traffic(UnitTraffic::parameters, u.kind));
    mark(sim::Track::dp, sim::SliceKind::param_gather, -1, u.chunk, t0);
  }
}

}  // namespace distplan::backend::trainer_detail
