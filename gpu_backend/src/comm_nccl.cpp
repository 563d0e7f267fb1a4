// NCCL communicators on device buffers; each group's ncclUniqueId is created by its first rank
// and shared through MPI (the MPI groups are split exactly as comm_mpi.cpp's). Compiled only with
// CUDA, NCCL and MPI. Sends are ncclSend on the group's stream: NCCL matches messages between a
// pair in issue order, which the schedule programs respect (every pair exchanges in one order).
#include <mpi.h>
#include <nccl.h>

#include <memory>

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
    DISTPLAN_CUDA_CHECK(cudaStreamCreate(&stream_));
    MPI_Comm_free(&mpi);
  }
  ~NcclCommunicator() override {
    (void)cudaStreamSynchronize(stream_);
    (void)ncclCommDestroy(comm_);
    (void)cudaStreamDestroy(stream_);
  }
  void barrier() override {
    // An all-reduce of one float stands for a barrier on the group's stream.
    float* one = nullptr;
    DISTPLAN_CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
    DISTPLAN_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DISTPLAN_CUDA_CHECK(cudaFree(one));
  }

 protected:
  void do_all_reduce(void* data, Count n, DType dtype, ReduceOp op) override {
    DISTPLAN_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(n), nccl_type(dtype),
                                      op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_reduce_scatter(const void* in, void* out, Count n, DType dtype) override {
    DISTPLAN_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<std::size_t>(n), nccl_type(dtype),
                                          ncclSum, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_all_gather(const void* in, void* out, Count n, DType dtype) override {
    DISTPLAN_NCCL_CHECK(
        ncclAllGather(in, out, static_cast<std::size_t>(n), nccl_type(dtype), comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_send(const void* data, Count n, DType dtype, int dst, int /*tag*/) override {
    DISTPLAN_NCCL_CHECK(
        ncclSend(data, static_cast<std::size_t>(n), nccl_type(dtype), dst, comm_, stream_));
  }
  void do_recv(void* data, Count n, DType dtype, int src, int /*tag*/) override {
    DISTPLAN_NCCL_CHECK(
        ncclRecv(data, static_cast<std::size_t>(n), nccl_type(dtype), src, comm_, stream_));
    DISTPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
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
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<ProcessGroups> make_nccl_groups(const ParallelSpec& p) {
  return make_groups_over_mpi(p, [](Group grp, MPI_Comm comm, CommLog* log) {
    return std::make_unique<NcclCommunicator>(grp, comm, log);
  });
}

}  // namespace distplan::backend
