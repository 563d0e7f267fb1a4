// Trainer: context-parallel attention by parallel.cp_comm (docs/gpu_backend.md, "Context
// parallelism"): the ring (p2p, ring_attention.cpp) or the KV all-gather (all_gather, here), as
// Transformer Engine runs them for Megatron-Core (transformer_engine/pytorch/attention/
// dot_product_attention/context_parallel.py).
#include "distplan/gpu_backend/ring_attention.h"
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

void Trainer::cp_attention_forward(int ui, HostVec& q, HostVec& k, HostVec& v, HostVec& out,
                                   HostVec& lse, HostVec& out_heads) {
  out_heads.clear();
  if (p_.cp_comm == CpComm::all_gather) return all_gather_attention_forward(q, k, v, out, lse);
  if (p_.cp_comm == CpComm::a2a) return a2a_attention_forward(q, k, v, out, lse, out_heads);
  ring_attention_forward(ui, q, k, v, out, lse);
}

void Trainer::cp_attention_backward(int ui, const HostVec& dout, const HostVec& q, const HostVec& k,
                                    const HostVec& v, const HostVec& out, const HostVec& lse,
                                    HostVec& dq, HostVec& dk, HostVec& dv) {
  if (p_.cp_comm == CpComm::all_gather)
    return all_gather_attention_backward(dout, q, k, v, out, lse, dq, dk, dv);
  if (p_.cp_comm == CpComm::a2a) return a2a_attention_backward(dout, q, k, v, out, lse, dq, dk, dv);
  ring_attention_backward(ui, dout, q, k, v, out, lse, dq, dk, dv);
}

namespace {

// Offset in a rank-major buffer (one block of `block` elements per cp rank, holding that rank's
// local rows in its order) of global row p; rows of `row` elements, chunks of c rows, cp ranks.
// Global chunk j < cp is rank j's first local chunk, chunk j >= cp rank 2cp-1-j's second.
Count packed_offset(Count p, Count c, Count cp, Count block, Count row) {
  const Count chunk = p / c;
  const Count rank = chunk < cp ? chunk : 2 * cp - 1 - chunk;
  const Count local = (chunk < cp ? 0 : c) + p % c;
  return rank * block + local * row;
}

constexpr Traffic kQo = Traffic::cp_a2a_queries_outputs;
constexpr Traffic kKv = Traffic::cp_a2a_kv;

}  // namespace

void Trainer::global_kv(const HostVec& gathered, Count kn, HostVec& k, HostVec& v) const {
  const Count s = t_.seq_length, c = sl_ / 2, row = t_.micro_batch_size * g_l_ * d_;
  k.assign(static_cast<std::size_t>(s * row), 0.0f);
  v.assign(k.size(), 0.0f);
  for (Count p = 0; p < s; ++p) {
    const Count at = packed_offset(p, c, cp_, 2 * kn, row);
    std::copy(gathered.begin() + at, gathered.begin() + at + row, k.begin() + p * row);
    std::copy(gathered.begin() + at + kn, gathered.begin() + at + kn + row, v.begin() + p * row);
  }
}

void Trainer::all_gather_attention_forward(const HostVec& q, const HostVec& k, const HostVec& v,
                                           HostVec& out, HostVec& lse) {
  const Count kn = static_cast<Count>(k.size()), b = t_.micro_batch_size;
  const Count r = g_.cp->rank();
  Tensor mine(alloc_, {2 * kn}, cb_, MemoryTag::temporaries);
  mine.write(k.data(), kn, 0);
  mine.write(v.data(), kn, kn);
  // Buffers (the planner's 2 cp kv at the backward's peak): the whole sequence's K and V.
  Tensor all(alloc_, {cp_ * 2 * kn}, cb_, MemoryTag::buffers);
  g_.cp->all_gather(mine.data(), all.data(), 2 * kn, cb_, Traffic::cp_kv);
  HostVec kg, vg;
  global_kv(rd_host(all), kn, kg, vg);
  out.assign(q.size(), 0.0f);
  lse.assign(static_cast<std::size_t>(b * a_l_ * sl_), 0.0f);
  for (int chunk = 0; chunk < 2; ++chunk)
    ring::block_forward(q.data(), kg.data(), vg.data(), out.data(), lse.data(), sl_,
                        ring::all_gather_step(chunk, r, cp_, sl_), b, a_l_, g_l_, d_);
  rnd(out, cb_);
}

void Trainer::all_gather_attention_backward(const HostVec& dout, const HostVec& q, const HostVec& k,
                                            const HostVec& v, const HostVec& out,
                                            const HostVec& lse, HostVec& dq, HostVec& dk,
                                            HostVec& dv) {
  const Count kn = static_cast<Count>(k.size()), b = t_.micro_batch_size;
  const Count r = g_.cp->rank(), c = sl_ / 2, row = b * g_l_ * d_;
  // The layer kept only its local K and V: gather them again (Transformer Engine does).
  Tensor mine(alloc_, {2 * kn}, cb_, MemoryTag::temporaries);
  mine.write(k.data(), kn, 0);
  mine.write(v.data(), kn, kn);
  Tensor all(alloc_, {cp_ * 2 * kn}, cb_, MemoryTag::buffers);
  g_.cp->all_gather(mine.data(), all.data(), 2 * kn, cb_, Traffic::cp_kv);
  HostVec kg, vg;
  global_kv(rd_host(all), kn, kg, vg);
  HostVec dkg(kg.size(), 0.0f), dvg(vg.size(), 0.0f);
  dq.assign(q.size(), 0.0f);
  for (int chunk = 0; chunk < 2; ++chunk)
    ring::block_backward(dout.data(), q.data(), kg.data(), vg.data(), out.data(), lse.data(),
                         dq.data(), dkg.data(), dvg.data(), sl_,
                         ring::all_gather_step(chunk, r, cp_, sl_), b, a_l_, g_l_, d_);
  // The whole sequence's K and V gradients, rank-major, reduce-scattered to their owners.
  HostVec packed(static_cast<std::size_t>(cp_ * 2 * kn), 0.0f);
  for (Count p = 0; p < t_.seq_length; ++p) {
    const Count at = packed_offset(p, c, cp_, 2 * kn, row);
    std::copy(dkg.begin() + p * row, dkg.begin() + (p + 1) * row, packed.begin() + at);
    std::copy(dvg.begin() + p * row, dvg.begin() + (p + 1) * row, packed.begin() + at + kn);
  }
  Tensor grads(alloc_, {cp_ * 2 * kn}, cb_, MemoryTag::buffers);
  grads.fill_from(packed);
  Tensor part(alloc_, {2 * kn}, cb_, MemoryTag::temporaries);
  g_.cp->reduce_scatter(grads.data(), part.data(), 2 * kn, cb_, Traffic::cp_kv_gradients);
  const HostVec got = rd_host(part);
  dk.assign(got.begin(), got.begin() + kn);
  dv.assign(got.begin() + kn, got.end());
}

// DeepSpeed-Ulysses (Jacobs et al. 2023, sec. 3.2) as Transformer Engine's
// AttnFuncWithCPAndQKVOA2A (TE >= 2.9, context_parallel.py): q, k, v all-to-all from this rank's
// rows of every head to every row of 1/cp of the heads, attention over the whole sequence, the
// output back; the forward saves the head-sharded output, so the backward exchanges only dO,
// then sends dQ, dK, dV back: four query-sized all-to-alls per layer (TE before 2.9 exchanged
// [out, dO] in the backward, five).
HostVec Trainer::seq_to_heads(const HostVec& x, Count heads, Traffic what, Tensor& recv,
                              MemoryTag tag) {
  const Count b = t_.micro_batch_size, hc = heads / cp_, c = sl_ / 2;
  const Count row = b * hc * d_, blk = sl_ * row;  // one rank's rows of one head group
  HostVec send(static_cast<std::size_t>(cp_ * blk));
  for (Count j = 0; j < cp_; ++j)  // block j: head group j, for rank j
    for (Count t = 0; t < sl_ * b; ++t)
      std::copy(x.begin() + (t * heads + j * hc) * d_, x.begin() + (t * heads + (j + 1) * hc) * d_,
                send.begin() + j * blk + t * hc * d_);
  Tensor out = pack(send, cb_);
  recv = Tensor(alloc_, {cp_ * blk}, cb_, tag);
  g_.cp->all_to_all(out.data(), recv.data(), blk, cb_, what);
  // Block j holds rank j's rows: into global order (Transformer Engine's reordering).
  const HostVec got = rd_host(recv);
  HostVec y(got.size());
  for (Count p = 0; p < t_.seq_length; ++p) {
    const Count at = packed_offset(p, c, cp_, blk, row);
    std::copy(got.begin() + at, got.begin() + at + row, y.begin() + p * row);
  }
  return y;
}

HostVec Trainer::heads_to_seq(const HostVec& y, Count heads, Traffic what, Tensor* send_keep,
                              MemoryTag tag) {
  const Count b = t_.micro_batch_size, hc = heads / cp_, c = sl_ / 2;
  const Count row = b * hc * d_, blk = sl_ * row;
  HostVec send(y.size());
  for (Count p = 0; p < t_.seq_length; ++p)
    std::copy(y.begin() + p * row, y.begin() + (p + 1) * row,
              send.begin() + packed_offset(p, c, cp_, blk, row));
  Tensor sb = save(send, cb_, tag);
  Tensor recv(alloc_, {cp_ * blk}, cb_, MemoryTag::temporaries);
  g_.cp->all_to_all(sb.data(), recv.data(), blk, cb_, what);
  const HostVec got = rd_host(recv);
  HostVec x(static_cast<std::size_t>(sl_ * b * heads * d_));
  for (Count j = 0; j < cp_; ++j)  // block j: rank j's head group for this rank's rows
    for (Count t = 0; t < sl_ * b; ++t)
      std::copy(got.begin() + j * blk + t * hc * d_, got.begin() + j * blk + (t + 1) * hc * d_,
                x.begin() + (t * heads + j * hc) * d_);
  if (send_keep != nullptr) *send_keep = std::move(sb);
  return x;
}

void Trainer::a2a_attention_forward(HostVec& q, HostVec& k, HostVec& v, HostVec& out, HostVec& lse,
                                    HostVec& out_heads) {
  const Count b = t_.micro_batch_size, s = t_.seq_length, ah = a_l_ / cp_, gh = g_l_ / cp_;
  // Buffers (the planner's 2 q + kv): the exchanged q, k, v and the output.
  Tensor qr, kr, vr, ob;
  HostVec qh = seq_to_heads(q, a_l_, kQo, qr, MemoryTag::buffers);
  HostVec kh = seq_to_heads(k, g_l_, kKv, kr, MemoryTag::buffers);
  HostVec vh = seq_to_heads(v, g_l_, kKv, vr, MemoryTag::buffers);
  HostVec oh(qh.size(), 0.0f), lh(static_cast<std::size_t>(b * ah * s), 0.0f);
  dev::flash_attention_forward(o_.device, qh.data(), kh.data(), vh.data(), oh.data(), lh.data(), s,
                               b, ah, gh, d_);
  rnd(oh, cb_);
  out = heads_to_seq(oh, a_l_, kQo, &ob, MemoryTag::buffers);
  out_heads = std::move(oh);
  q = std::move(qh);
  k = std::move(kh);
  v = std::move(vh);
  lse = std::move(lh);
}

void Trainer::a2a_attention_backward(const HostVec& dout, const HostVec& q, const HostVec& k,
                                     const HostVec& v, const HostVec& out, const HostVec& lse,
                                     HostVec& dq, HostVec& dk, HostVec& dv) {
  const Count s = t_.seq_length, ah = a_l_ / cp_, gh = g_l_ / cp_;
  // `out` is the head-sharded output the forward saved: only dO is exchanged.
  Tensor dor;
  const HostVec doh = seq_to_heads(dout, a_l_, kQo, dor, MemoryTag::temporaries);
  HostVec dqh(q.size(), 0.0f), dkh(k.size(), 0.0f), dvh(v.size(), 0.0f);
  dev::flash_attention_backward(o_.device, doh.data(), q.data(), k.data(), v.data(), out.data(),
                                lse.data(), dqh.data(), dkh.data(), dvh.data(), s,
                                t_.micro_batch_size, ah, gh, d_);
  rnd(dqh, cb_);
  rnd(dkh, cb_);
  rnd(dvh, cb_);
  dq = heads_to_seq(dqh, a_l_, kQo);
  dk = heads_to_seq(dkh, g_l_, kKv);
  dv = heads_to_seq(dvh, g_l_, kKv);
}

}  // namespace distplan::backend::trainer_detail
