// Trainer: context-parallel attention by parallel.cp_comm (docs/gpu_backend.md, "Context
// parallelism"): the ring (p2p, ring_attention.cpp) or the KV all-gather (all_gather, here), as
// Transformer Engine runs them for Megatron-Core (transformer_engine/pytorch/attention/
// dot_product_attention/context_parallel.py).
#include "distplan/gpu_backend/ring_attention.h"
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

void Trainer::cp_attention_forward(int ui, const Vec& q, Vec& k, Vec& v, Vec& out, Vec& lse) {
  if (p_.cp_comm == CpComm::all_gather) return all_gather_attention_forward(q, k, v, out, lse);
  ring_attention_forward(ui, q, k, v, out, lse);
}

void Trainer::cp_attention_backward(int ui, const Vec& dout, const Vec& q, const Vec& k,
                                    const Vec& v, const Vec& out, const Vec& lse, Vec& dq, Vec& dk,
                                    Vec& dv) {
  if (p_.cp_comm == CpComm::all_gather)
    return all_gather_attention_backward(dout, q, k, v, out, lse, dq, dk, dv);
  ring_attention_backward(ui, dout, q, k, v, out, lse, dq, dk, dv);
}

namespace {

// Offset in a rank-major buffer of packed local (K | V) blocks (2 kn elements per rank) of the
// first K element of global row p; rows of `row` elements, chunks of c rows, cp ranks. Global
// chunk j < cp is rank j's first local chunk, chunk j >= cp rank 2cp-1-j's second.
Count packed_offset(Count p, Count c, Count cp, Count kn, Count row) {
  const Count chunk = p / c;
  const Count rank = chunk < cp ? chunk : 2 * cp - 1 - chunk;
  const Count local = (chunk < cp ? 0 : c) + p % c;
  return rank * 2 * kn + local * row;
}

}  // namespace

void Trainer::global_kv(const Vec& gathered, Count kn, Vec& k, Vec& v) const {
  const Count s = t_.seq_length, c = sl_ / 2, row = t_.micro_batch_size * g_l_ * d_;
  k.assign(static_cast<std::size_t>(s * row), 0.0f);
  v.assign(k.size(), 0.0f);
  for (Count p = 0; p < s; ++p) {
    const Count at = packed_offset(p, c, cp_, kn, row);
    std::copy(gathered.begin() + at, gathered.begin() + at + row, k.begin() + p * row);
    std::copy(gathered.begin() + at + kn, gathered.begin() + at + kn + row, v.begin() + p * row);
  }
}

void Trainer::all_gather_attention_forward(const Vec& q, const Vec& k, const Vec& v, Vec& out,
                                           Vec& lse) {
  const Count kn = static_cast<Count>(k.size()), b = t_.micro_batch_size;
  const Count r = g_.cp->rank();
  Tensor mine(alloc_, {2 * kn}, cb_, MemoryTag::temporaries);
  mine.write(k.data(), kn, 0);
  mine.write(v.data(), kn, kn);
  // Buffers (the planner's 2 cp kv at the backward's peak): the whole sequence's K and V.
  Tensor all(alloc_, {cp_ * 2 * kn}, cb_, MemoryTag::buffers);
  g_.cp->all_gather(mine.data(), all.data(), 2 * kn, cb_, "cp: keys and values");
  Vec kg, vg;
  global_kv(rd(all), kn, kg, vg);
  out.assign(q.size(), 0.0f);
  lse.assign(static_cast<std::size_t>(b * a_l_ * sl_), 0.0f);
  for (int chunk = 0; chunk < 2; ++chunk)
    ring::block_forward(q.data(), kg.data(), vg.data(), out.data(), lse.data(), sl_,
                        ring::all_gather_step(chunk, r, cp_, sl_), b, a_l_, g_l_, d_);
  rnd(out, cb_);
}

void Trainer::all_gather_attention_backward(const Vec& dout, const Vec& q, const Vec& k,
                                            const Vec& v, const Vec& out, const Vec& lse, Vec& dq,
                                            Vec& dk, Vec& dv) {
  const Count kn = static_cast<Count>(k.size()), b = t_.micro_batch_size;
  const Count r = g_.cp->rank(), c = sl_ / 2, row = b * g_l_ * d_;
  // The layer kept only its local K and V: gather them again (Transformer Engine does).
  Tensor mine(alloc_, {2 * kn}, cb_, MemoryTag::temporaries);
  mine.write(k.data(), kn, 0);
  mine.write(v.data(), kn, kn);
  Tensor all(alloc_, {cp_ * 2 * kn}, cb_, MemoryTag::buffers);
  g_.cp->all_gather(mine.data(), all.data(), 2 * kn, cb_, "cp: keys and values");
  Vec kg, vg;
  global_kv(rd(all), kn, kg, vg);
  Vec dkg(kg.size(), 0.0f), dvg(vg.size(), 0.0f);
  dq.assign(q.size(), 0.0f);
  for (int chunk = 0; chunk < 2; ++chunk)
    ring::block_backward(dout.data(), q.data(), kg.data(), vg.data(), out.data(), lse.data(),
                         dq.data(), dkg.data(), dvg.data(), sl_,
                         ring::all_gather_step(chunk, r, cp_, sl_), b, a_l_, g_l_, d_);
  // The whole sequence's K and V gradients, rank-major, reduce-scattered to their owners.
  Vec packed(static_cast<std::size_t>(cp_ * 2 * kn), 0.0f);
  for (Count p = 0; p < t_.seq_length; ++p) {
    const Count at = packed_offset(p, c, cp_, kn, row);
    std::copy(dkg.begin() + p * row, dkg.begin() + (p + 1) * row, packed.begin() + at);
    std::copy(dvg.begin() + p * row, dvg.begin() + (p + 1) * row, packed.begin() + at + kn);
  }
  Tensor grads(alloc_, {cp_ * 2 * kn}, cb_, MemoryTag::buffers);
  grads.fill_from(packed);
  Tensor part(alloc_, {2 * kn}, cb_, MemoryTag::temporaries);
  g_.cp->reduce_scatter(grads.data(), part.data(), 2 * kn, cb_, "cp: key and value gradients");
  const Vec got = rd(part);
  dk.assign(got.begin(), got.begin() + kn);
  dv.assign(got.begin() + kn, got.end());
}

}  // namespace distplan::backend::trainer_detail
