// MPI communicators for CPU ranks. 16-bit buffers are reduced in fp32 and rounded back.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <stdexcept>
#include <string>
#include <vector>

#include "distplan/gpu_backend/comm.h"
#include "distplan/gpu_backend/tensor.h"
#include "distplan/planner/check.h"

#ifdef DISTPLAN_HAVE_MPI
#include <mpi.h>

#include "mpi_groups.h"
#endif

namespace distplan::backend {

#ifdef DISTPLAN_HAVE_MPI
namespace {

void to_float(const void* in, float* out, Count n, DType dtype) {
  const auto* s = static_cast<const std::uint16_t*>(in);
  if (dtype == DType::fp32) {
    std::memcpy(out, in, static_cast<std::size_t>(n) * 4);
  } else if (dtype == DType::bf16) {
    for (Count i = 0; i < n; ++i) out[i] = bf16_to_float(s[i]);
  } else {
    for (Count i = 0; i < n; ++i) out[i] = fp16_to_float(s[i]);
  }
}

void from_float(const float* in, void* out, Count n, DType dtype) {
  auto* d = static_cast<std::uint16_t*>(out);
  if (dtype == DType::fp32) {
    std::memcpy(out, in, static_cast<std::size_t>(n) * 4);
  } else if (dtype == DType::bf16) {
    for (Count i = 0; i < n; ++i) d[i] = float_to_bf16(in[i]);
  } else {
    for (Count i = 0; i < n; ++i) d[i] = float_to_fp16(in[i]);
  }
}

int icount(Count n) {
  DISTPLAN_CHECK(n <= 0x7FFFFFFF, "MPI message over 2^31 elements");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Group g, MPI_Comm comm, CommLog* log)
      : Communicator(g, comm_rank(comm), comm_size(comm), log), comm_(comm) {
    // Point-to-point messages travel on a duplicate whose errors return (a message longer than
    // the receive is reported by name, not aborted); the collectives keep MPI's fatal handler.
    MPI_Comm_dup(comm_, &p2p_);
    MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    complete_sends();
    MPI_Comm_free(&p2p_);
    MPI_Comm_free(&comm_);
  }
  void barrier() override {
    complete_sends();
    MPI_Barrier(comm_);
  }

 protected:
  void do_all_reduce(void* data, Count n, DType dtype, ReduceOp op) override {
    std::vector<float> buf(static_cast<std::size_t>(n));
    to_float(data, buf.data(), n, dtype);
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), icount(n), MPI_FLOAT,
                  op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_);
    from_float(buf.data(), data, n, dtype);
  }
  void do_reduce_scatter(const void* in, void* out, Count n, DType dtype) override {
    std::vector<float> src(static_cast<std::size_t>(n * size())), dst(static_cast<std::size_t>(n));
    to_float(in, src.data(), n * size(), dtype);
    MPI_Reduce_scatter_block(src.data(), dst.data(), icount(n), MPI_FLOAT, MPI_SUM, comm_);
    from_float(dst.data(), out, n, dtype);
  }
  void do_all_gather(const void* in, void* out, Count n, DType dtype) override {
    const Count bytes = n * bytes_of(dtype);
    std::vector<char> mine(static_cast<const char*>(in), static_cast<const char*>(in) + bytes);
    MPI_Allgather(mine.data(), icount(bytes), MPI_BYTE, out, icount(bytes), MPI_BYTE, comm_);
  }
  void do_all_to_all(const void* in, void* out, Count n, DType dtype) override {
    const Count bytes = n * bytes_of(dtype);
    MPI_Alltoall(in, icount(bytes), MPI_BYTE, out, icount(bytes), MPI_BYTE, comm_);
  }
  void do_all_to_all_v(const void* in, const std::vector<Count>& send_counts, void* out,
                       const std::vector<Count>& recv_counts, DType dtype) override {
    const Count b = bytes_of(dtype);
    std::vector<int> sc(send_counts.size()), sd(sc.size()), rc(sc.size()), rd(sc.size());
    Count so = 0, ro = 0;
    for (std::size_t r = 0; r < sc.size(); ++r) {
      sc[r] = icount(send_counts[r] * b), sd[r] = icount(so), so += send_counts[r] * b;
      rc[r] = icount(recv_counts[r] * b), rd[r] = icount(ro), ro += recv_counts[r] * b;
    }
    MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, comm_);
  }
  std::vector<Count> do_exchange_counts(const std::vector<Count>& send) override {
    std::vector<Count> recv(send.size());
    const int per = icount(static_cast<Count>(send.size()) / size());
    static_assert(sizeof(Count) == sizeof(std::int64_t));
    MPI_Alltoall(send.data(), per, MPI_INT64_T, recv.data(), per, MPI_INT64_T, comm_);
    return recv;
  }
  // Each message is a header naming what it carries, then the payload. Messages between a pair
  // match in the order they were issued (MPI's non-overtaking rule, one tag per P2POp::stream:
  // stream 0, one order for all, as NCCL matches them), so a receive that the schedule pairs with
  // a different send fails here too.
  void do_send_recv(std::vector<P2POp>& batch) override {
    std::vector<MPI_Request> reqs;
    std::vector<std::size_t> recv_of;
    std::vector<std::vector<char>> staged(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      P2POp& op = batch[i];
      const auto bytes = static_cast<std::size_t>(op.n * bytes_of(op.dtype));
      if (op.dir == P2POp::Dir::send) {
        auto& p = pending_.emplace_back();
        p.data.resize(sizeof(Header) + bytes);
        const Header h = header_of(op.tag, bytes);
        std::memcpy(p.data.data(), &h, sizeof h);
        std::memcpy(p.data.data() + sizeof h, op.data, bytes);
        check_p2p(MPI_Isend(p.data.data(), icount(static_cast<Count>(p.data.size())), MPI_BYTE,
                            op.peer, kP2PTag + op.stream, p2p_, &p.req),
                  "MPI_Isend", op);
        op.keep_alive.reset();  // the payload is copied out
      } else {
        staged[i].resize(sizeof(Header) + bytes);
        reqs.emplace_back();
        recv_of.push_back(i);
        check_p2p(MPI_Irecv(staged[i].data(), icount(static_cast<Count>(staged[i].size())),
                            MPI_BYTE, op.peer, kP2PTag + op.stream, p2p_, &reqs.back()),
                  "MPI_Irecv", op);
      }
    }
    std::vector<MPI_Status> st(reqs.size());
    const int rc = MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), st.data());
    for (std::size_t k = 0; k < recv_of.size(); ++k) {
      const P2POp& op = batch[recv_of[k]];
      const std::vector<char>& buf = staged[recv_of[k]];
      const std::string where = "pipeline receive on rank " + std::to_string(rank()) + " of its " +
                                std::string(to_string(group())) + " group from rank " +
                                std::to_string(op.peer) + ": expected the " + to_string(op.tag);
      if (rc != MPI_SUCCESS && st[k].MPI_ERROR != MPI_SUCCESS) {
        throw P2POrderError(
            where + " (" + std::to_string(buf.size()) +
            " bytes with its header), but MPI reports: " + mpi_error_string(st[k].MPI_ERROR) +
            "; the sender's message differs in size");
      }
      int got = 0;
      MPI_Get_count(&st[k], MPI_BYTE, &got);
      Header h{};
      if (static_cast<std::size_t>(got) >= sizeof h) std::memcpy(&h, buf.data(), sizeof h);
      const P2PTag sent = tag_of(h);
      if (static_cast<std::size_t>(got) != buf.size() || !(sent == op.tag) ||
          h.bytes != static_cast<std::int64_t>(buf.size() - sizeof h)) {
        throw P2POrderError(where + " (" + std::to_string(buf.size() - sizeof h) +
                            " bytes), received the " + to_string(sent) + " (" +
                            std::to_string(h.bytes) +
                            " bytes): the two ranks' schedule programs order their messages "
                            "differently");
      }
      std::memcpy(op.data, buf.data() + sizeof h, buf.size() - sizeof h);
    }
    if (rc != MPI_SUCCESS) throw std::runtime_error("MPI_Waitall failed on a pipeline exchange");
    // Reap finished sends so the staging copies do not pile up.
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

 private:
  static int comm_rank(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int comm_size(MPI_Comm c) {
    int s = 0;
    MPI_Comm_size(c, &s);
    return s;
  }
  void complete_sends() {
    for (auto& p : pending_) MPI_Wait(&p.req, MPI_STATUS_IGNORE);
    pending_.clear();
  }
  struct Header {
    std::int64_t kind, microbatch, virtual_stage, bytes;
  };
  static constexpr int kP2PTag = 0;
  static Header header_of(const P2PTag& t, std::size_t bytes) {
    return {t.kind == P2PTag::Kind::activation ? 0 : 1, t.microbatch, t.virtual_stage,
            static_cast<std::int64_t>(bytes)};
  }
  static P2PTag tag_of(const Header& h) {
    P2PTag t;
    t.kind = h.kind == 0 ? P2PTag::Kind::activation : P2PTag::Kind::gradient;
    t.microbatch = h.microbatch;
    t.virtual_stage = h.virtual_stage;
    return t;
  }
  static std::string mpi_error_string(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    return std::string(text, static_cast<std::size_t>(len));
  }
  void check_p2p(int rc, const char* call, const P2POp& op) const {
    if (rc == MPI_SUCCESS) return;
    throw std::runtime_error(std::string(call) + " to/from rank " + std::to_string(op.peer) +
                             " for the " + to_string(op.tag) + ": " + mpi_error_string(rc));
  }
  struct Pending {
    std::vector<char> data;
    MPI_Request req{};
  };
  MPI_Comm comm_;
  MPI_Comm p2p_ = MPI_COMM_NULL;
  std::list<Pending> pending_;
};

}  // namespace

bool mpi_available() noexcept {
  return true;
}

int mpi_init_if_needed() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) MPI_Init(nullptr, nullptr);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void mpi_finalize_if_initialised() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

int mpi_world_rank() noexcept {
  int init = 0, rank = 0;
  MPI_Initialized(&init);
  if (init) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int mpi_local_rank() noexcept {
  int init = 0, rank = 0;
  MPI_Initialized(&init);
  if (!init) return 0;
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS)
    return 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

void mpi_abort(int code) noexcept {
  int init = 0;
  MPI_Initialized(&init);
  if (init) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::vector<std::string> gather_measurements(const std::string& s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int len = static_cast<int>(s.size());
  std::vector<int> lens(static_cast<std::size_t>(size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> displs(static_cast<std::size_t>(size), 0);
  int total = 0;
  for (int i = 0; i < size; ++i) displs[i] = total, total += lens[i];
  std::vector<char> all(static_cast<std::size_t>(rank == 0 ? total : 0));
  MPI_Gatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0) {
    for (int i = 0; i < size; ++i) out.emplace_back(all.data() + displs[i], lens[i]);
  }
  return out;
}

std::unique_ptr<ProcessGroups> make_groups_over_mpi(const ParallelSpec& p,
                                                    const MakeCommunicator& make_comm,
                                                    bool expert_groups) {
  auto g = std::make_unique<ProcessGroups>();
  MPI_Comm_rank(MPI_COMM_WORLD, &g->world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g->world_size);
  DISTPLAN_CHECK(g->world_size == p.tp * p.cp * p.dp * p.pp,
                 "MPI world size differs from tp*cp*dp*pp");
  const RankCoords c = rank_coords(p, g->world_rank);
  g->coords = c;
  // Colour = the coordinates the group does not span; key = the spanned one (its rank in it).
  auto make = [&](Group grp) {
    const GroupSplit sp = group_split(p, c, grp);
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, sp.colour, sp.key, &comm);
    return make_comm(grp, comm, &g->log);
  };
  g->tp = make(Group::tp);
  g->dp = make(Group::dp);
  g->pp = make(Group::pp);
  g->dp_replicate = make(Group::dp_replicate);
  g->embedding = make(Group::embedding);
  g->cp = make(Group::cp);
  if (expert_groups) {
    g->ep = make(Group::ep);
    g->edp = make(Group::edp);
  }
  g->world_reduce = [](double* x, int n, ReduceOp op) {
    MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                  MPI_COMM_WORLD);
  };
  g->gather_to_root = gather_measurements;
  return g;
}

std::unique_ptr<ProcessGroups> make_mpi_groups(const ParallelSpec& p) {
  return make_groups_over_mpi(p, [](Group grp, MPI_Comm comm, CommLog* log) {
    return std::make_unique<MpiCommunicator>(grp, comm, log);
  });
}

#else

bool mpi_available() noexcept {
  return false;
}
int mpi_init_if_needed() {
  return 1;
}
void mpi_finalize_if_initialised() {}
int mpi_world_rank() noexcept {
  return 0;
}
int mpi_local_rank() noexcept {
  return 0;
}
void mpi_abort(int code) noexcept {
  std::_Exit(code);
}
std::vector<std::string> gather_measurements(const std::string& mine) {
  return {mine};
}
std::unique_ptr<ProcessGroups> make_mpi_groups(const ParallelSpec&) {
  throw std::runtime_error("distplan was built without MPI");
}

#endif

}  // namespace distplan::backend
