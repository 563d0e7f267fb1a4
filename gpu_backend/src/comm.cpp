#include "distplan/gpu_backend/comm.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {

void CommLog::record(Group g, CollectiveOp op, Traffic what, Bytes bytes) {
  CommTotals& t = entries_[Key{g, op, what}];
  t.bytes += bytes;
  t.calls += 1;
}

CommTotals CommLog::total(Group g, CollectiveOp op) const {
  CommTotals t;
  for (const auto& [k, v] : entries_) {
    if (std::get<0>(k) == g && std::get<1>(k) == op) {
      t.bytes += v.bytes;
      t.calls += v.calls;
    }
  }
  return t;
}

void Communicator::all_reduce(void* data, Count n, DType dtype, ReduceOp op, Traffic what) {
  log_->record(group_, CollectiveOp::all_reduce, what, n * bytes_of(dtype));
  do_all_reduce(data, n, dtype, op);
}
void Communicator::reduce_scatter(const void* in, void* out, Count n, DType dtype, Traffic what) {
  log_->record(group_, CollectiveOp::reduce_scatter, what, n * size_ * bytes_of(dtype));
  do_reduce_scatter(in, out, n, dtype);
}
void Communicator::all_gather(const void* in, void* out, Count n, DType dtype, Traffic what) {
  log_->record(group_, CollectiveOp::all_gather, what, n * size_ * bytes_of(dtype));
  do_all_gather(in, out, n, dtype);
}
void Communicator::all_to_all(const void* in, void* out, Count n, DType dtype, Traffic what) {
  log_->record(group_, CollectiveOp::all_to_all, what, n * size_ * bytes_of(dtype));
  do_all_to_all(in, out, n, dtype);
}
void Communicator::do_all_to_all(const void*, void*, Count, DType) {
  throw std::runtime_error(std::string("all-to-all is not implemented on the ") +
                           std::string(to_string(group_)) + " group of this communicator");
}
void Communicator::send_recv(std::vector<P2POp> batch) {
  for (const P2POp& op : batch) {
    DISTPLAN_CHECK(op.peer >= 0 && op.peer < size_, "point-to-point peer outside the group");
    if (op.dir == P2POp::Dir::send)
      log_->record(group_, CollectiveOp::send_recv, op.what, op.n * bytes_of(op.dtype));
  }
  do_send_recv(batch);
}

void Communicator::all_to_all_v(const void* in, const std::vector<Count>& send_counts, void* out,
                                const std::vector<Count>& recv_counts, DType dtype, Count recorded,
                                Traffic what) {
  DISTPLAN_CHECK(static_cast<int>(send_counts.size()) == size_ &&
                     static_cast<int>(recv_counts.size()) == size_,
                 "all_to_all needs one count per rank of the group");
  log_->record(group_, CollectiveOp::all_to_all, what, recorded * bytes_of(dtype));
  do_all_to_all_v(in, send_counts, out, recv_counts, dtype);
}

std::vector<Count> Communicator::exchange_counts(const std::vector<Count>& send) {
  DISTPLAN_CHECK(send.size() % static_cast<std::size_t>(size_) == 0,
                 "exchange_counts needs one equal block per rank");
  return do_exchange_counts(send);
}

void Communicator::do_all_to_all_v(const void* in, const std::vector<Count>& send_counts, void* out,
                                   const std::vector<Count>& recv_counts, DType dtype) {
  if (size_ != 1) {
    throw std::runtime_error("this communicator does not implement all_to_all (the " +
                             std::string(to_string(group_)) + " group has " +
                             std::to_string(size_) + " ranks)");
  }
  DISTPLAN_CHECK(send_counts == recv_counts, "a group of one receives what it sends");
  std::memmove(out, in, static_cast<std::size_t>(send_counts.front() * bytes_of(dtype)));
}

std::vector<Count> Communicator::do_exchange_counts(const std::vector<Count>& send) {
  if (size_ != 1) {
    throw std::runtime_error("this communicator does not implement exchange_counts (the " +
                             std::string(to_string(group_)) + " group has " +
                             std::to_string(size_) + " ranks)");
  }
  return send;
}

std::string to_string(const P2PTag& t) {
  return std::string(t.kind == P2PTag::Kind::activation ? "activation" : "gradient") +
         " of micro-batch " + std::to_string(t.microbatch) + " for virtual stage " +
         std::to_string(t.virtual_stage);
}

RankCoords rank_coords(const ParallelSpec& p, int world_rank) noexcept {
  // Megatron-Core's order "tp-cp-dp-pp" (planner/src/layout.cpp, group_link).
  RankCoords c;
  c.tp = static_cast<int>(world_rank % p.tp);
  c.cp = static_cast<int>((world_rank / p.tp) % p.cp);
  c.dp = static_cast<int>((world_rank / (p.tp * p.cp)) % p.dp);
  c.pp = static_cast<int>(world_rank / (p.tp * p.cp * p.dp));
  return c;
}

int world_rank_of(const ParallelSpec& p, RankCoords c) noexcept {
  return static_cast<int>(c.tp + p.tp * (c.cp + p.cp * (c.dp + p.dp * c.pp)));
}

GroupSplit group_split(const ParallelSpec& p, RankCoords c, Group g) noexcept {
  const int tp = static_cast<int>(p.tp), dp = static_cast<int>(p.dp), pp = static_cast<int>(p.pp);
  const int cp = static_cast<int>(p.cp);
  const int S =
      p.zero_stage == 0 || p.fsdp_shard_size <= 0 ? dp : static_cast<int>(p.fsdp_shard_size);
  const int world = tp * cp * dp * pp;
  switch (g) {
    case Group::tp:
      return {c.cp + cp * (c.dp + dp * c.pp), c.tp, tp};
    case Group::dp:
      // Megatron-Core's data-and-context-parallel group (parallel_state.py,
      // get_data_parallel_group(with_context_parallel=True)): gradients are reduced and the
      // distributed optimizer shards over it; cp is the faster coordinate in it.
      return {c.tp + tp * (c.pp + pp * (c.dp / S)), c.cp + cp * (c.dp % S), S * cp};
    case Group::dp_replicate:
      return {c.tp + tp * (c.cp + cp * (c.pp + pp * (c.dp % S))), c.dp / S, dp / S};
    case Group::pp:
      return {c.tp + tp * (c.cp + cp * c.dp), c.pp, pp};
    case Group::embedding:
      if (pp > 1 && (c.pp == 0 || c.pp == pp - 1))
        return {c.tp + tp * (c.cp + cp * c.dp), c.pp == 0 ? 0 : 1, 2};
      return {world + world_rank_of(p, c), 0, 1};
    case Group::cp:
      return {c.tp + tp * (c.dp + dp * c.pp), c.cp, cp};
    case Group::ep:
    case Group::edp:
    case Group::etp: {
      // MoE parallel folding inside the stage (GroupSplit's comment).
      const int ep = static_cast<int>(p.ep), etp = static_cast<int>(p.etp);
      const int stage = tp * cp * dp, i = c.tp + tp * (c.cp + cp * c.dp);
      const int etp_rank = i % etp, ep_rank = (i / etp) % ep, edp_rank = i / (etp * ep);
      const int edp = stage / (etp * ep);
      if (g == Group::ep) return {c.pp * stage + etp_rank + etp * edp_rank, ep_rank, ep};
      if (g == Group::etp) return {c.pp * stage + ep_rank + ep * edp_rank, etp_rank, etp};
      return {c.pp * stage + etp_rank + etp * ep_rank, edp_rank, edp};
    }
  }
  return {};
}

namespace {

// Byte moves on the buffers' device.
void move_bytes(Device d, void* dst, const void* src, std::size_t bytes) {
#ifdef DISTPLAN_HAVE_CUDA
  if (d == Device::cuda) return cuda::copy_on_device(dst, src, bytes);
#endif
  (void)d;
  std::memmove(dst, src, bytes);
}
void zero_bytes(Device d, void* dst, std::size_t bytes) {
#ifdef DISTPLAN_HAVE_CUDA
  if (d == Device::cuda) return cuda::zero_on_device(dst, bytes);
#endif
  (void)d;
  std::memset(dst, 0, bytes);
}

class EmulatedCommunicator final : public Communicator {
 public:
  EmulatedCommunicator(Group g, int rank, int size, CommLog* log, Device device)
      : Communicator(g, rank, size, log), device_(device) {}
  void barrier() override {}

 protected:
  // Shapes and byte counts are kept by the caller's buffers; no data moves. A reduce-scatter
  // leaves this rank's own slice of the input (as if the other ranks contributed zeros), an
  // all-gather places this rank's input at its slice of the output.
  void do_all_reduce(void*, Count, DType, ReduceOp) override {}
  void do_reduce_scatter(const void* in, void* out, Count n, DType dtype) override {
    const auto bytes = static_cast<std::size_t>(n * bytes_of(dtype));
    move_bytes(device_, out,
               static_cast<const char*>(in) + bytes * static_cast<std::size_t>(rank()), bytes);
  }
  void do_all_gather(const void* in, void* out, Count n, DType dtype) override {
    const auto bytes = static_cast<std::size_t>(n * bytes_of(dtype));
    move_bytes(device_, static_cast<char*>(out) + bytes * static_cast<std::size_t>(rank()), in,
               bytes);
  }
  void do_all_to_all(const void* in, void* out, Count n, DType dtype) override {
    // This rank's own block stays; the others' blocks are zeros.
    const auto bytes = static_cast<std::size_t>(n * bytes_of(dtype));
    for (int j = 0; j < size(); ++j)
      if (j != rank()) zero_bytes(device_, static_cast<char*>(out) + bytes * j, bytes);
    move_bytes(device_, static_cast<char*>(out) + bytes * static_cast<std::size_t>(rank()),
               static_cast<const char*>(in) + bytes * static_cast<std::size_t>(rank()), bytes);
  }
  void do_send_recv(std::vector<P2POp>& batch) override {
    for (const P2POp& op : batch)
      if (op.dir == P2POp::Dir::recv)
        zero_bytes(device_, op.data, static_cast<std::size_t>(op.n * bytes_of(op.dtype)));
  }

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<ProcessGroups> make_emulated_groups(const ParallelSpec& p, int world_rank,
                                                    Device device) {
  auto g = std::make_unique<ProcessGroups>();
  g->coords = rank_coords(p, world_rank);
  g->world_rank = world_rank;
  g->world_size = static_cast<int>(p.tp * p.cp * p.dp * p.pp);
  auto make = [&](Group grp) {
    const GroupSplit sp = group_split(p, g->coords, grp);
    return std::make_unique<EmulatedCommunicator>(grp, sp.key, sp.size, &g->log, device);
  };
  g->tp = make(Group::tp);
  g->dp = make(Group::dp);
  g->pp = make(Group::pp);
  g->dp_replicate = make(Group::dp_replicate);
  g->embedding = make(Group::embedding);
  g->cp = make(Group::cp);
  g->ep = make(Group::ep);
  g->edp = make(Group::edp);
  g->world_reduce = [](double*, int, ReduceOp) {};
  g->gather_to_root = [](const std::string& s) { return std::vector<std::string>{s}; };
  return g;
}

}  // namespace distplan::backend
