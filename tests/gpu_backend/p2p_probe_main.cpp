// Two ranks (pp = 2) exercise the pipeline group's batched send_recv under mpirun; the
// gpu_backend_comm_test drives it and reads what it prints. Scenarios (argv[1]):
//   paired      1F1B's crossing pair, each rank sending and receiving in one batch, messages far
//               over the eager limit; received data checked element by element.
//   misordered  rank 0 sends micro-batches 0 then 1; rank 1 receives 1 then 0 (a schedule pair
//               that disagrees): every receive must fail with P2POrderError.
//   sizes       rank 0 sends twice the elements rank 1 expects: a named error, not an abort.
//   streams     the V's two streams (P2POp::stream): rank 0 sends activation 0 then gradient 0,
//               rank 1 receives the gradient first; each stream keeps its own order, both arrive.
// With "--nccl" the communicator is NCCL's on device buffers (one GPU per rank; skips with fewer).
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "distplan/gpu_backend/comm.h"
#ifdef DISTPLAN_HAVE_CUDA
#include "distplan/gpu_backend/cuda.h"
#endif

using namespace distplan;
using namespace distplan::backend;

namespace {

P2PTag act(Count mb) {
  P2PTag t;
  t.kind = P2PTag::Kind::activation;
  t.microbatch = mb;
  t.virtual_stage = 1;
  return t;
}
P2PTag grad(Count mb) {
  P2PTag t;
  t.kind = P2PTag::Kind::gradient;
  t.microbatch = mb;
  t.virtual_stage = 0;
  return t;
}
P2POp op(P2POp::Dir d, int peer, void* data, Count n, P2PTag t) {
  P2POp o;
  o.dir = d;
  o.peer = peer;
  o.data = data;
  o.n = n;
  o.dtype = DType::fp32;
  o.tag = t;
  o.what = Traffic::probe;
  return o;
}
// The value element i of a message from `rank` in round `r` carries.
float pattern(int rank, int r, Count i) {
  return static_cast<float>(rank * 1000003 + r * 7919) + static_cast<float>(i % 4093);
}

// Host or device buffers of the chosen communicator.
struct Buffers {
  bool device = false;
  std::vector<float> host(Count n) const { return std::vector<float>(static_cast<std::size_t>(n)); }
  float* alloc(Count n) const {
#ifdef DISTPLAN_HAVE_CUDA
    if (device) return static_cast<float*>(cuda::device_alloc_zeroed(sizeof(float) * n));
#endif
    return new float[static_cast<std::size_t>(n)]();
  }
  void free(float* p) const {
#ifdef DISTPLAN_HAVE_CUDA
    if (device) return cuda::device_free(p);
#endif
    delete[] p;
  }
  void put(float* dst, const std::vector<float>& src) const {
#ifdef DISTPLAN_HAVE_CUDA
    if (device) return cuda::copy_to_device(dst, src.data(), src.size() * sizeof(float));
#endif
    std::memcpy(dst, src.data(), src.size() * sizeof(float));
  }
  std::vector<float> get(const float* src, Count n) const {
    std::vector<float> out(static_cast<std::size_t>(n));
#ifdef DISTPLAN_HAVE_CUDA
    if (device) {
      cuda::copy_to_host(out.data(), src, out.size() * sizeof(float));
      return out;
    }
#endif
    std::memcpy(out.data(), src, out.size() * sizeof(float));
    return out;
  }
};

// Stage 0: send activation r+1, receive gradient r; stage 1: send gradient r, receive
// activation r+1 (1F1B's steady state with p = 2). The send buffer is handed over, as the trainer
// does, so the communicator decides when it may go.
int paired(ProcessGroups& g, const Buffers& b) {
  const int me = g.pp->rank(), peer = 1 - me;
  const Count n = Count{8} << 20;  // 32 MiB: far beyond any eager or vader fragment limit
  const int rounds = 3;
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (Count i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = pattern(me, r, i);
    float* out = b.alloc(n);
    b.put(out, v);
    std::shared_ptr<void> keep(out, [b](void* p) { b.free(static_cast<float*>(p)); });
    float* in = b.alloc(n);
    std::vector<P2POp> batch;
    batch.push_back(op(P2POp::Dir::send, peer, out, n, me == 0 ? act(r + 1) : grad(r)));
    batch.back().keep_alive = std::move(keep);
    batch.push_back(op(P2POp::Dir::recv, peer, in, n, me == 0 ? grad(r) : act(r + 1)));
    g.pp->send_recv(std::move(batch));
    const std::vector<float> got = b.get(in, n);
    for (Count i = 0; i < n; ++i)
      if (got[static_cast<std::size_t>(i)] != pattern(peer, r, i)) ++bad;
    b.free(in);
  }
  g.pp->barrier();
  const CommTotals t = g.log.total(Group::pp, CollectiveOp::send_recv);
  std::printf("rank %d: mismatched elements %d, recorded %lld bytes in %lld sends\n", me, bad,
              static_cast<long long>(t.bytes), static_cast<long long>(t.calls));
  const bool ok = bad == 0 && t.bytes == rounds * n * 4 && t.calls == rounds;
  if (ok) std::printf("rank %d: PAIRED OK\n", me);
  return ok ? 0 : 1;
}

// Rank 0 sends micro-batches 0 and 1 (each its own batch); rank 1 expects them as 1, 0, or
// (sizes) expects half of what is sent.
int misordered(ProcessGroups& g, const Buffers& b, bool sizes) {
  const int me = g.pp->rank();
  const Count n = 1024;
  float* buf = b.alloc(2 * n);
  int errors = 0;
  if (me == 0) {
    for (Count mb = 0; mb < 2; ++mb) {
      std::vector<P2POp> one;
      one.push_back(op(P2POp::Dir::send, 1, buf, sizes ? 2 * n : n, act(mb)));
      g.pp->send_recv(std::move(one));
    }
  } else {
    for (Count mb : {Count{1}, Count{0}}) {
      std::vector<P2POp> one;
      one.push_back(op(P2POp::Dir::recv, 0, buf, n, act(sizes ? 1 - mb : mb)));
      try {
        g.pp->send_recv(std::move(one));
      } catch (const P2POrderError& e) {
        ++errors;
        std::printf("P2POrderError: %s\n", e.what());
      }
    }
  }
  g.pp->barrier();
  b.free(buf);
  std::printf("rank %d: %d order errors\n", me, errors);
  return errors;
}

int streams(ProcessGroups& g, const Buffers& b) {
  const int me = g.pp->rank();
  const Count n = 1024;
  float* buf = b.alloc(n);
  int received = 0;
  P2PTag gr = act(0);
  gr.kind = P2PTag::Kind::gradient;
  const P2PTag order[2] = {me == 0 ? act(0) : gr, me == 0 ? gr : act(0)};
  for (const P2PTag& t : order) {
    std::vector<P2POp> one;
    one.push_back(op(me == 0 ? P2POp::Dir::send : P2POp::Dir::recv, 1 - me, buf, n, t));
    one.back().stream = t.kind == P2PTag::Kind::activation ? 1 : 2;
    g.pp->send_recv(std::move(one));
    if (me == 1) ++received;
  }
  g.pp->barrier();
  b.free(buf);
  if (me == 1 && received == 2) std::printf("rank 1: STREAMS OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const bool nccl = argc > 2 && std::string(argv[2]) == "--nccl";
  mpi_init_if_needed();
  int rc = 0;
  try {
    ParallelSpec p;
    p.pp = 2;
    std::unique_ptr<ProcessGroups> g;
    Buffers b;
    if (nccl) {
#ifdef DISTPLAN_HAVE_NCCL
      if (cuda::device_count() < 2) {
        std::printf("SKIP: NCCL needs one GPU per rank; %d visible\n", cuda::device_count());
        mpi_finalize_if_initialised();
        return 0;
      }
      cuda::set_device(mpi_world_rank());
      g = make_nccl_groups(p);
      b.device = true;
#else
      std::printf("SKIP: built without NCCL\n");
      mpi_finalize_if_initialised();
      return 0;
#endif
    } else {
      g = make_mpi_groups(p);
    }
    if (what == "paired")
      rc = paired(*g, b);
    else if (what == "misordered")
      rc = misordered(*g, b, false);
    else if (what == "sizes")
      rc = misordered(*g, b, true);
    else if (what == "streams")
      rc = streams(*g, b);
    else
      rc = 64;
    std::fflush(stdout);
    g.reset();
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    mpi_abort(70);
  }
  mpi_finalize_if_initialised();
  return rc;
}
