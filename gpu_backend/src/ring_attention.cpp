// Trainer: context parallelism with cp_comm = p2p, ring attention as Transformer Engine runs it
// for Megatron-Core (transformer_engine/pytorch/attention/dot_product_attention/
// context_parallel.py, AttnFuncWithCPAndKVP2P; docs/gpu_backend.md, "Context parallelism").
// The kernels are ring_attention.h's; this file moves the key/value blocks round the cp group
// and keeps the buffers the planner counts (memory_terms.h, cp_attention_buffer_bytes).
#include <limits>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/ring_attention.h"
#include "trainer_impl.h"

namespace distplan::backend::trainer_detail {

namespace {

constexpr Traffic kKv = Traffic::cp_ring_kv;
constexpr Traffic kDkv = Traffic::cp_ring_kv_gradients;

// Both neighbours name a message by what it carries, the layer unit and the ring step.
P2PTag ring_tag(bool grad, Count mb, int ui, Count cp, Count step) {
  P2PTag t;
  t.kind = grad ? P2PTag::Kind::gradient : P2PTag::Kind::activation;
  t.microbatch = mb;
  t.virtual_stage = static_cast<Count>(ui) * cp + step;
  return t;
}

}  // namespace

void Trainer::rope(Vec& x, Count heads, bool backward) const {
  const Count b = t_.micro_batch_size;
  if (cp_ == 1) {
    if (backward) {
      dev::rotary_backward(o_.device, x.data(), sl_, b, heads, d_, 10000.0);
    } else {
      dev::rotary_forward(o_.device, x.data(), sl_, b, heads, d_, 10000.0);
    }
    return;
  }
  // Each chunk keeps its global positions (Megatron-Core slices the rotary table by the same
  // chunk ids, get_pos_emb_on_this_cp_rank).
  cpu::rotary_at(x.data(), positions_.data(), sl_, b, heads, d_, 10000.0, backward ? -1.0 : 1.0);
}

void Trainer::ring_exchange(const std::vector<RingMessage>& send, int to,
                            const std::vector<RingMessage>& recv, int from) {
  std::vector<P2POp> batch;
  for (const RingMessage& m : send) {
    P2POp op;
    op.dir = P2POp::Dir::send;
    op.peer = to;
    op.data = m.buf->data();
    op.n = m.buf->numel();
    op.dtype = cb_;
    op.tag = m.tag;
    op.what = m.what;
    batch.push_back(std::move(op));
  }
  for (const RingMessage& m : recv) {
    P2POp op;
    op.dir = P2POp::Dir::recv;
    op.peer = from;
    op.data = m.buf->data();
    op.n = m.buf->numel();
    op.dtype = cb_;
    op.tag = m.tag;
    batch.push_back(std::move(op));
  }
  g_.cp->send_recv(std::move(batch));
}

void Trainer::ring_attention_forward(int ui, const HostVec& q, HostVec& k, HostVec& v, HostVec& out,
                                     HostVec& lse) {
  const Count n = cp_, r = g_.cp->rank(), b = t_.micro_batch_size;
  const Count kn = static_cast<Count>(k.size());
  const int next = static_cast<int>((r + 1) % n), prev = static_cast<int>((r + n - 1) % n);
  // Buffers (the planner's 2 kv + 2 q): the KV block in use and the one arriving, the step's
  // output and the merged output, all in the compute dtype.
  Tensor kv[2] = {Tensor(alloc_, {2 * kn}, cb_, MemoryTag::buffers),
                  Tensor(alloc_, {2 * kn}, cb_, MemoryTag::buffers)};
  Tensor merged(alloc_, {static_cast<Count>(q.size())}, cb_, MemoryTag::buffers);
  Tensor step_out(alloc_, {static_cast<Count>(q.size())}, cb_, MemoryTag::buffers);
  kv[0].write(k.data(), kn, 0);
  kv[0].write(v.data(), kn, kn);
  lse.assign(static_cast<std::size_t>(b * a_l_ * sl_), -std::numeric_limits<float>::infinity());
  HostVec run(q.size(), 0.0f);
  for (Count i = 0; i < n; ++i) {
    Tensor& cur = kv[i % 2];
    // Step i sends the block it uses on to the next rank and receives the one for step i + 1
    // (cp - 1 exchanges); Transformer Engine overlaps it with this step's attention.
    if (i + 1 < n) {
      ring_exchange({{&cur, ring_tag(false, cur_mb_, ui, n, i), kKv}}, next,
                    {{&kv[(i + 1) % 2], ring_tag(false, cur_mb_, ui, n, i), kKv}}, prev);
    }
    const HostVec blk = rd_host(cur);
    const ring::Step st = ring::step_for_block((r - i + n) % n, r, sl_);
    HostVec os(q.size(), 0.0f), ls(lse.size(), -std::numeric_limits<float>::infinity());
    ring::block_forward(q.data(), blk.data(), blk.data() + kn, os.data(), ls.data(), sl_, st, b,
                        a_l_, g_l_, d_);
    step_out.fill_from(os);
    const HostVec so = rd_host(step_out);
    ring::merge(run.data(), lse.data(), so.data(), ls.data(), sl_, st.q, b, a_l_, d_);
    merged.fill_from(run);
    run = rd_host(merged);
  }
  out = std::move(run);
  // Transformer Engine saves the block the ring ended with (rank r + 1's) for the backward.
  const HostVec last = rd_host(kv[(n - 1) % 2]);
  std::copy(last.begin(), last.begin() + kn, k.begin());
  std::copy(last.begin() + kn, last.end(), v.begin());
}

void Trainer::ring_attention_backward(int ui, const HostVec& dout, const HostVec& q,
                                      const HostVec& k, const HostVec& v, const HostVec& out,
                                      const HostVec& lse, HostVec& dq, HostVec& dk, HostVec& dv) {
  const Count n = cp_, r = g_.cp->rank(), b = t_.micro_batch_size;
  const Count kn = static_cast<Count>(k.size());
  // The backward ring runs the other way (Transformer Engine: send to rank - 1, receive from
  // rank + 1): step i holds rank r + 1 + i's block, the local one last.
  const int to = static_cast<int>((r + n - 1) % n), from = static_cast<int>((r + 1) % n);
  // Buffers (the planner's 4 kv): KV and its gradient, each in use and arriving.
  Tensor kv[2] = {Tensor(alloc_, {2 * kn}, cb_, MemoryTag::buffers),
                  Tensor(alloc_, {2 * kn}, cb_, MemoryTag::buffers)};
  Tensor dkv[2] = {Tensor(alloc_, {2 * kn}, cb_, MemoryTag::buffers),
                   Tensor(alloc_, {2 * kn}, cb_, MemoryTag::buffers)};
  kv[0].write(k.data(), kn, 0);
  kv[0].write(v.data(), kn, kn);
  dq.assign(q.size(), 0.0f);
  for (Count i = 0; i < n; ++i) {
    const Count c = i % 2, nx = (i + 1) % 2;
    // KV on for the next step (all but the last); the KV gradient accumulated at step i - 1 on
    // to the rank that holds that block next (all but the first): cp - 1 messages of each.
    std::vector<RingMessage> send, recv;
    if (i + 1 < n) {
      send.push_back({&kv[c], ring_tag(false, cur_mb_, ui, n, i), kKv});
      recv.push_back({&kv[nx], ring_tag(false, cur_mb_, ui, n, i), kKv});
    }
    if (i > 0) {
      send.push_back({&dkv[c], ring_tag(true, cur_mb_, ui, n, i), kDkv});
      recv.push_back({&dkv[nx], ring_tag(true, cur_mb_, ui, n, i), kDkv});
    }
    if (!send.empty()) ring_exchange(send, to, recv, from);
    const HostVec blk = rd_host(kv[c]);
    const ring::Step st = ring::step_for_block((r + 1 + i) % n, r, sl_);
    HostVec dblk(static_cast<std::size_t>(2 * kn), 0.0f);
    ring::block_backward(dout.data(), q.data(), blk.data(), blk.data() + kn, out.data(), lse.data(),
                         dq.data(), dblk.data(), dblk.data() + kn, sl_, st, b, a_l_, g_l_, d_);
    // The block's gradient so far: what the ranks before this one added (received at this
    // step), plus this step's.
    if (i > 0) {
      const HostVec got = rd_host(dkv[nx]);
      for (std::size_t e = 0; e < dblk.size(); ++e) dblk[e] += got[e];
    }
    dkv[nx].fill_from(dblk);
  }
  // After cp steps the gradient of this rank's own block is home.
  const HostVec mine = rd_host(dkv[n % 2]);
  dk.assign(mine.begin(), mine.begin() + kn);
  dv.assign(mine.begin() + kn, mine.end());
}

}  // namespace distplan::backend::trainer_detail
