// Communicators: one interface, three implementations. MPI moves data between CPU ranks; NCCL
// between GPUs (unique id shared through MPI); emulated moves nothing but keeps every call's shape
// and byte count, so one process can stand for rank r of a layout of any size.
// Every call records the bytes handed to it under (group, op, traffic): the same typed keys as the
// planner's Collective list (estimate.h). Groups follow Megatron-Core's rank order "tp-cp-dp-pp"
// rank = tp + TP*(cp + CP*(dp + DP*pp)) (DESIGN.md, "Ranks and groups"; planner/src/layout.cpp,
// group_link).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "distplan/gpu_backend/memory.h"
#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"

namespace distplan::backend {

enum class ReduceOp { sum, max };

/// Bytes handed to a collective and how many calls, summed over the measured step.
struct CommTotals {
  Bytes bytes = 0;
  Count calls = 0;
  bool operator==(const CommTotals&) const = default;
};

class CommLog {
 public:
  using Key = std::tuple<Group, CollectiveOp, Traffic>;
  void record(Group g, CollectiveOp op, Traffic what, Bytes bytes);
  void clear() { entries_.clear(); }
  [[nodiscard]] const std::map<Key, CommTotals>& entries() const noexcept { return entries_; }
  /// Totals per (group, op) over every `what`.
  [[nodiscard]] CommTotals total(Group g, CollectiveOp op) const;

 private:
  std::map<Key, CommTotals> entries_;
};

/// What a pipeline message carries: the receiver's virtual stage, its micro-batch and whether it
/// is a forward activation or a backward gradient. The sender and the receiver each name it from
/// the schedule program; the MPI communicator checks that they agree.
struct P2PTag {
  enum class Kind { activation, gradient };
  Kind kind = Kind::activation;
  Count microbatch = 0;
  Count virtual_stage = 0;
  bool operator==(const P2PTag&) const = default;
};
[[nodiscard]] std::string to_string(const P2PTag& t);

/// One send or receive of a batched exchange (Communicator::send_recv). `peer` is a rank of the
/// group; `data` holds `n` elements of `dtype` on the communicator's device. A send may hand over
/// ownership of its buffer in `keep_alive`: the communicator drops it once the send has completed
/// on its stream, so the buffer is never freed while in flight.
struct P2POp {
  enum class Dir { send, recv };
  Dir dir = Dir::send;
  int peer = 0;
  void* data = nullptr;
  Count n = 0;
  DType dtype = DType::fp32;
  P2PTag tag;
  Traffic what = Traffic::probe;  // sends: the CommLog entry
  std::shared_ptr<void> keep_alive;
  /// Messages between a pair match in issue order within a stream. Stream 0 is the one NCCL has
  /// (every message in one order); the V schedules and DualPipe send activations and gradients
  /// each in their own order (stream 1 + kind), which the MPI path keeps apart (its own MPI tag
  /// per stream).
  int stream = 0;
};

/// A receive got a different message than the schedule program pairs it with.
class P2POrderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A communicator over one group. Buffers hold `n` elements of `dtype`. How 16-bit types are
/// summed is the implementation's: the MPI one sums in fp32 and rounds once; NCCL's kernels add
/// two elements at a time in fp32 and round each partial sum back to the buffer's type, so a
/// ring's result can differ from the fp32 sum in the last bits. Counts are per rank: reduce_scatter
/// reads n*size and writes n; all_gather reads n and writes n*size. The recorded bytes are the full
/// buffer (n*size elements for reduce-scatter and all-gather), as the planner's bytes_per_call
/// (docs/communication.md).
class Communicator {
 public:
  Communicator(Group group, int rank, int size, CommLog* log)
      : group_(group), rank_(rank), size_(size), log_(log) {}
  virtual ~Communicator() = default;
  [[nodiscard]] Group group() const noexcept { return group_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }

  void all_reduce(void* data, Count n, DType dtype, ReduceOp op, Traffic what);
  void reduce_scatter(const void* in, void* out, Count n, DType dtype, Traffic what);
  void all_gather(const void* in, void* out, Count n, DType dtype, Traffic what);
  /// All-to-all: `in` holds size() blocks of n elements, block j for rank j; block j of `out`
  /// receives rank j's block for this rank. Recorded: the full buffer (n*size elements), the
  /// planner's bytes_per_call for all_to_all (the local tensor exchanged).
  void all_to_all(const void* in, void* out, Count n, DType dtype, Traffic what);
  /// One step's point-to-point exchange, issued together: every send and receive of the batch is
  /// in flight at once (one NCCL group; MPI_Isend/MPI_Irecv + MPI_Waitall), so a send never waits
  /// on a receive of the same batch being posted first (docs/gpu_backend.md, "Pipeline messages").
  /// Returns when every receive's data is usable by later work on the compute stream; sends may
  /// still be in flight, their buffers kept alive by P2POp::keep_alive. Messages between a pair
  /// match in issue order; the MPI communicator checks each receive's tag against the sender's
  /// and throws P2POrderError naming both. Sends are recorded as send_recv under their `what`.
  void send_recv(std::vector<P2POp> batch);
  /// All-to-all with per-rank counts (MPI_Alltoallv): sends send_counts[r] elements to rank r
  /// (consecutive blocks of `in`, in rank order) and receives recv_counts[r] from rank r into
  /// `out`. Recorded as all_to_all with `recorded` elements: the caller names the buffer the
  /// planner counts (the MoE layer: its token-side buffer of tokens·top_k rows, which the
  /// routing does not change; the rows that crossed ranks are measured apart, moe_routing).
  void all_to_all_v(const void* in, const std::vector<Count>& send_counts, void* out,
                    const std::vector<Count>& recv_counts, DType dtype, Count recorded,
                    Traffic what);
  /// Each rank sends `send` (size() blocks of equal length, block r to rank r) and receives the
  /// blocks addressed to it in rank order: the row counts of an all_to_all, metadata that is not
  /// recorded (as Megatron-Core's token dispatcher exchanges its tokens_per_expert).
  [[nodiscard]] std::vector<Count> exchange_counts(const std::vector<Count>& send);
  /// Completes outstanding sends, then synchronises the group.
  virtual void barrier() = 0;

 protected:
  virtual void do_all_reduce(void* data, Count n, DType dtype, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* in, void* out, Count n, DType dtype) = 0;
  virtual void do_all_gather(const void* in, void* out, Count n, DType dtype) = 0;
  /// Implemented by the MPI and emulated communicators (context parallelism's a2a runs on the CPU
  /// only); others throw.
  virtual void do_all_to_all(const void* in, void* out, Count n, DType dtype);
  virtual void do_send_recv(std::vector<P2POp>& batch) = 0;
  /// A group of one copies its own block; larger groups need a communicator that moves data
  /// (MPI). The emulated and NCCL communicators do not implement it (the backend refuses MoE
  /// there, check_moe_supported).
  virtual void do_all_to_all_v(const void* in, const std::vector<Count>& send_counts, void* out,
                               const std::vector<Count>& recv_counts, DType dtype);
  virtual std::vector<Count> do_exchange_counts(const std::vector<Count>& send);

 private:
  Group group_;
  int rank_;
  int size_;
  CommLog* log_;
};

/// This rank's coordinates in the layout.
struct RankCoords {
  int tp = 0, dp = 0, pp = 0;
  int cp = 0;  // context-parallel rank (its two load-balanced sequence chunks)
};
[[nodiscard]] RankCoords rank_coords(const ParallelSpec& p, int world_rank) noexcept;
[[nodiscard]] int world_rank_of(const ParallelSpec& p, RankCoords c) noexcept;

/// How the world splits into one group: ranks with equal `colour` form it, ordered by `key` (this
/// rank's index in it), `size` members. Megatron-Core order (DESIGN.md, "Ranks and groups"), with
/// S = the ZeRO shard size in dp ranks (dp under ZeRO 0, else Scenario::shard_size()):
/// dp = the cp ranks of S consecutive dp ranks (S·cp ranks, cp fastest: Megatron-Core's
/// data-and-context-parallel group, over which gradients are reduced and the optimizer sharded),
/// dp_replicate = the dp/S ranks holding the same shard (hybrid sharding), cp = the cp ranks at
/// equal (tp, dp, pp), embedding = first and last stage at equal (tp, cp, dp) when pp > 1 (tied
/// embeddings; a group of one elsewhere). The expert groups regroup a stage's tp*cp*dp ranks in
/// Megatron-Core's MoE parallel folding order (docs/layout.md): with i = tp + TP*(cp + CP*dp) the
/// rank's index in its stage, i = etp_rank + etp*(ep_rank + ep*edp_rank); ep = the ep ranks of
/// equal (etp_rank, edp_rank), edp = the edp ranks of equal (etp_rank, ep_rank).
struct GroupSplit {
  int colour = 0, key = 0, size = 1;
};
[[nodiscard]] GroupSplit group_split(const ParallelSpec& p, RankCoords c, Group g) noexcept;

enum class CommBackend { emulated, mpi, nccl };

/// The groups one rank belongs to. A group of size 1 still exists; the model never calls it.
struct ProcessGroups {
  RankCoords coords;
  int world_rank = 0;
  int world_size = 1;
  std::unique_ptr<Communicator> tp, dp, pp, dp_replicate, embedding, cp;
  /// The expert groups of MoE layers (group_split: Group::ep and Group::edp).
  std::unique_ptr<Communicator> ep, edp;
  CommLog log;
  /// Sum (or max) of a few doubles over all ranks, for the loss and overflow flag; not recorded.
  std::function<void(double*, int, ReduceOp)> world_reduce;
  /// Rank 0 receives every rank's string (measurement gathering); others get an empty vector.
  std::function<std::vector<std::string>(const std::string&)> gather_to_root;
};

/// Emulated groups for `world_rank` of the layout: every collective keeps its shape, moves nothing.
/// `device`: where the buffers handed to the collectives live.
[[nodiscard]] std::unique_ptr<ProcessGroups> make_emulated_groups(const ParallelSpec& p,
                                                                  int world_rank,
                                                                  Device device = Device::cpu);
/// MPI groups (MPI_COMM_WORLD split by Megatron order); MPI must be initialised and the world size
/// equal tp*cp*dp*pp. Throws std::runtime_error when built without MPI.
[[nodiscard]] std::unique_ptr<ProcessGroups> make_mpi_groups(const ParallelSpec& p);
[[nodiscard]] bool mpi_available() noexcept;
/// NCCL groups on device buffers (unique ids shared through MPI); built only with CUDA, NCCL and
/// MPI (DISTPLAN_HAVE_NCCL).
[[nodiscard]] std::unique_ptr<ProcessGroups> make_nccl_groups(const ParallelSpec& p);
/// MPI_Init once (thread level single) when not yet initialised; returns the world size.
int mpi_init_if_needed();
void mpi_finalize_if_initialised();
/// This process's rank in MPI_COMM_WORLD (0 without MPI or before MPI_Init).
[[nodiscard]] int mpi_world_rank() noexcept;
/// This process's rank among the ranks on its host (MPI_Comm_split_type shared memory, whatever
/// started the job: mpirun, srun, a user's launcher); 0 without MPI or before MPI_Init.
[[nodiscard]] int mpi_local_rank() noexcept;
/// Stops every rank of the job with `code` (MPI_Abort); std::_Exit without MPI.
[[noreturn]] void mpi_abort(int code) noexcept;
/// Rank 0 of MPI_COMM_WORLD receives every rank's string in rank order; others get an empty vector.
[[nodiscard]] std::vector<std::string> gather_measurements(const std::string& mine);

}  // namespace distplan::backend
