// NCCL communicators on device buffers; each group's ncclUniqueId is created by its first rank
// and shared through MPI (the MPI groups are split exactly as comm_mpi.cpp's). Compiled only with
// CUDA, NCCL and MPI. Sends are ncclSend on the group's stream: NCCL matches messages between a
// pair in issue order, which the schedule programs respect (every pair exchanges in one order).
#include <mpi.h>
#include <nccl.h>

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "distplan/gpu_backend/comm.h"
#include "distplan/planner/check.h"
#include "mpi_groups.h"

namespace distplan::backend {
namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::bf16:
      return ncclBfloat16;
    case DType::fp16:
      return ncclFloat16;
    default:
      return ncclFloat32;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Group g, MPI_Comm mpi, CommLog* log)
      : Communicator(g, rank_of(mpi), size_of(mpi), log) {
    ncclUniqueId id{};
    if (rank() == 0) DISTPLAN_NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi);
    DISTPLAN_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
    // Non-blocking: a blocking stream would be serialised with the legacy default stream, so
    // no communication could overlap compute.
    DISTPLAN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DISTPLAN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    DISTPLAN_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    DISTPLAN_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
    MPI_Comm_free(&mpi);
  }
  ~NcclCommunicator() override {
    (void)cudaStreamSynchronize(stream_);
    in_flight_.clear();
    (void)ncclCommDestroy(comm_);
    (void)cudaFree(barrier_word_);
    (void)cudaEventDestroy(compute_done_);
    (void)cudaStreamDestroy(stream_);
  }
  void barrier() override {
    // An all-reduce of one float on the group's stream stands for a barrier; it also completes
    // every send issued before it, so their buffers can go.
    after_compute();
    DISTPLAN_NCCL_CHECK(
        ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    in_flight_.clear();
  }

 protected:
  void do_all_reduce(void* data, Count n, DType dtype, ReduceOp op) override {
    after_compute();
    DISTPLAN_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(n), nccl_type(dtype),
                                      op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_reduce_scatter(const void* in, void* out, Count n, DType dtype) override {
    after_compute();
    DISTPLAN_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<std::size_t>(n), nccl_type(dtype),
                                          ncclSum, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_all_gather(const void* in, void* out, Count n, DType dtype) override {
    after_compute();
    DISTPLAN_NCCL_CHECK(
        ncclAllGather(in, out, static_cast<std::size_t>(n), nccl_type(dtype), comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_send_recv(std::vector<P2POp>& batch) override {
    reap();
    after_compute();
    bool receives = false;
    DISTPLAN_NCCL_CHECK(ncclGroupStart());
    for (const P2POp& op : batch) {
      const auto n = static_cast<std::size_t>(op.n);
      if (op.dir == P2POp::Dir::send) {
        DISTPLAN_NCCL_CHECK(ncclSend(op.data, n, nccl_type(op.dtype), op.peer, comm_, stream_));
      } else {
        receives = true;
        DISTPLAN_NCCL_CHECK(ncclRecv(op.data, n, nccl_type(op.dtype), op.peer, comm_, stream_));
      }
    }
    DISTPLAN_NCCL_CHECK(ncclGroupEnd());
    InFlight f;
    DISTPLAN_CUDA_CHECK(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming));
    DISTPLAN_CUDA_CHECK(cudaEventRecord(f.done, stream_));
    // Compute issued from here on (on the default stream) sees the received data.
    if (receives) DISTPLAN_CUDA_CHECK(cudaStreamWaitEvent(0, f.done, 0));
    for (P2POp& op : batch)
      if (op.keep_alive) f.buffers.push_back(std::move(op.keep_alive));
    in_flight_.push_back(std::move(f));
  }

 private:
  static int rank_of(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int size_of(MPI_Comm c) {
    int s = 0;
    MPI_Comm_size(c, &s);
    return s;
  }
  // The group's stream waits for the compute issued so far on the default stream.
  void after_compute() {
    DISTPLAN_CUDA_CHECK(cudaEventRecord(compute_done_, 0));
    DISTPLAN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
  }
  // Drops the buffers of exchanges whose completion event has fired (a query, never a wait).
  void reap() {
    while (!in_flight_.empty()) {
      const cudaError_t e = cudaEventQuery(in_flight_.front().done);
      if (e == cudaErrorNotReady) return;
      DISTPLAN_CUDA_CHECK(e);
      in_flight_.pop_front();
    }
  }
  // An issued exchange: its completion event and the send buffers it must outlive.
  struct InFlight {
    cudaEvent_t done = nullptr;
    std::vector<std::shared_ptr<void>> buffers;
    InFlight() = default;
    InFlight(InFlight&& o) noexcept
        : done(std::exchange(o.done, nullptr)), buffers(std::move(o.buffers)) {}
    InFlight& operator=(InFlight&&) = delete;
    ~InFlight() {
      buffers.clear();
      if (done != nullptr) (void)cudaEventDestroy(done);
    }
  };
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  float* barrier_word_ = nullptr;
  std::deque<InFlight> in_flight_;
};

}  // namespace

std::unique_ptr<ProcessGroups> make_nccl_groups(const ParallelSpec& p) {
  // No expert groups: the CUDA device does not run MoE layers (check_moe_supported), and each
  // would cost an NCCL communicator.
  return make_groups_over_mpi(
      p,
      [](Group grp, MPI_Comm comm, CommLog* log) {
        return std::make_unique<NcclCommunicator>(grp, comm, log);
      },
      /*expert_groups=*/false);
}

}  // namespace distplan::backend
