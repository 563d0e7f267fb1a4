// The MoE block of the backend (moe_layer.h): its router follows the published conventions
// (checked against hand-derived weights), its backward equals a float64 central finite difference
// of its forward for the router and every expert weight, and split over two expert-parallel ranks
// (two threads exchanging through a Communicator) it computes what one rank computes, with the
// all-to-all bytes the planner's ep_all_to_all_bytes gives for an even routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "distplan/gpu_backend/comm.h"
#include "distplan/gpu_backend/moe_layer.h"
#include "distplan/planner/moe_memory.h"

namespace distplan::backend::moe {
namespace {

// Deterministic values in [-a, a] (a linear congruential sequence; any fixed data would do).
std::vector<double> values(std::size_t n, double a, unsigned seed) {
  std::vector<double> v(n);
  std::uint64_t x = seed * 2654435761u + 1;
  for (double& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    e = a * (static_cast<double>(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  return v;
}

// Softmax router, top-2 of 4: the weights are the chosen probabilities renormalised, which is the
// softmax over the two chosen logits alone (Mixtral: softmax, topk, divide by the sum).
TEST(MoeRouter, SoftmaxTopKRenormalisesTheChosenProbabilities) {
  const RouterConfig c{4, 2, Router::softmax};
  const std::vector<double> z = {0.1, 1.3, -0.4, 0.9};
  const Routing<double> r = route(z.data(), static_cast<const double*>(nullptr), 1, c);
  EXPECT_EQ(r.pick, (std::vector<Count>{1, 3}));
  // By hand: w1 = e^1.3 / (e^1.3 + e^0.9) = 1 / (1 + e^-0.4).
  EXPECT_NEAR(r.weight[0], 1.0 / (1.0 + std::exp(-0.4)), 1e-15);
  EXPECT_NEAR(r.weight[1], 1.0 / (1.0 + std::exp(0.4)), 1e-15);
}

// Sigmoid router with a selection bias (DeepSeek-V3): the bias changes which experts are chosen,
// not their weights, which are the chosen sigmoid scores normalised to sum 1.
TEST(MoeRouter, SigmoidBiasSelectsButDoesNotWeigh) {
  const RouterConfig c{4, 2, Router::sigmoid};
  const std::vector<double> z = {0.1, 1.3, -0.4, 0.9};
  const std::vector<double> bias = {0.0, 0.0, 2.0, 0.0};
  const Routing<double> r = route(z.data(), bias.data(), 1, c);
  EXPECT_EQ(r.pick, (std::vector<Count>{2, 1}));  // s2 + 2 = 2.40, s1 = 0.786
  const double s1 = 1 / (1 + std::exp(-1.3)), s2 = 1 / (1 + std::exp(0.4));
  EXPECT_NEAR(r.weight[0], s2 / (s1 + s2), 1e-15);
  EXPECT_NEAR(r.weight[1], s1 / (s1 + s2), 1e-15);
}

// Equal scores are taken in increasing expert index.
TEST(MoeRouter, TiesGoToTheLowerExpertIndex) {
  const RouterConfig c{4, 2, Router::softmax};
  const std::vector<double> z = {0.5, 0.7, 0.7, 0.7};
  EXPECT_EQ(route(z.data(), static_cast<const double*>(nullptr), 1, c).pick,
            (std::vector<Count>{1, 2}));
}

// A block with E experts of width f on n tokens of width h, weights from `values`.
struct Block {
  Count n = 6, h = 5, f = 3, E = 4, k = 2;
  Router kind = Router::softmax;
  std::vector<double> x, router, bias, dy;
  std::vector<std::vector<double>> w_in, w_out;
  explicit Block(Router r, bool with_bias) : kind(r) {
    x = values(static_cast<std::size_t>(n * h), 1.0, 1);
    router = values(static_cast<std::size_t>(E * h), 0.8, 2);
    if (with_bias) bias = values(static_cast<std::size_t>(E), 0.3, 3);
    dy = values(static_cast<std::size_t>(n * h), 1.0, 4);
    for (Count e = 0; e < E; ++e) {
      w_in.push_back(
          values(static_cast<std::size_t>(2 * f * h), 0.7, 10 + static_cast<unsigned>(e)));
      w_out.push_back(values(static_cast<std::size_t>(h * f), 0.7, 20 + static_cast<unsigned>(e)));
    }
  }
  // Weights of the experts [first, first + local).
  BlockWeights<double> weights(Count first, Count local) const {
    BlockWeights<double> w;
    w.h = h, w.f = f, w.local = local;
    w.router = {E, k, kind};
    w.router_w = router.data();
    w.router_bias = bias.empty() ? nullptr : bias.data();
    for (Count e = first; e < first + local; ++e) {
      w.w_in.push_back(w_in[static_cast<std::size_t>(e)].data());
      w.w_out.push_back(w_out[static_cast<std::size_t>(e)].data());
    }
    return w;
  }
  // The scalar whose gradient the backward gives: sum(dy * forward(x)).
  double loss() const {
    BlockSaved<double> sv;
    const auto y = block_forward(weights(0, E), x.data(), n, sv, local_exchange<double>());
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
    return l;
  }
  // The smallest gap between a token's k-th and (k+1)-th selection score: finite differences are
  // valid only while no step crosses it (top-k is piecewise constant).
  double selection_margin() const {
    std::vector<double> z(static_cast<std::size_t>(n * E));
    for (Count t = 0; t < n; ++t)
      for (Count e = 0; e < E; ++e) {
        double s = 0;
        for (Count c = 0; c < h; ++c) s += x[t * h + c] * router[e * h + c];
        z[t * E + e] = s;
      }
    const Routing<double> r =
        route(z.data(), bias.empty() ? nullptr : bias.data(), n, RouterConfig{E, k, kind});
    double margin = 1e9;
    for (Count t = 0; t < n; ++t) {
      std::vector<double> sel(static_cast<std::size_t>(E));
      for (Count e = 0; e < E; ++e) sel[e] = r.scores[t * E + e] + (bias.empty() ? 0.0 : bias[e]);
      std::sort(sel.begin(), sel.end(), std::greater<>());
      margin = std::min(margin, sel[k - 1] - sel[k]);
    }
    return margin;
  }
};

// Central difference of the loss in one element of `v`.
double central(Block& b, std::vector<double>& v, std::size_t i, double eps) {
  const double keep = v[i];
  v[i] = keep + eps;
  const double up = b.loss();
  v[i] = keep - eps;
  const double down = b.loss();
  v[i] = keep;
  return (up - down) / (2 * eps);
}

// Every gradient of the block (router, every expert's w_in and w_out, the input) against a
// float64 central difference. The step is 1e-6 and the inputs keep every token's top-k at least
// kMargin away from a tie, so no step changes the selection; the difference's error is then
// O(eps^2) ~ 1e-12 plus rounding ~ 1e-16 / 1e-6 = 1e-10, far under the 1e-7 bound, while a wrong
// term of the backward (a dropped renormalisation, a missing router path) is O(0.01-1).
constexpr double kEps = 1e-6, kTol = 1e-7, kMargin = 1e-3;

void expect_backward_matches_finite_differences(Router kind, bool with_bias) {
  Block b(kind, with_bias);
  ASSERT_GT(b.selection_margin(), kMargin) << "inputs too close to a top-k tie";
  BlockSaved<double> sv;
  const auto ex = local_exchange<double>();
  (void)block_forward(b.weights(0, b.E), b.x.data(), b.n, sv, ex);
  BlockGrads<double> g;
  const auto dx = block_backward(b.weights(0, b.E), b.x.data(), b.dy.data(), b.n, sv, g, ex);
  double biggest = 0;
  for (std::size_t i = 0; i < b.router.size(); ++i) {
    EXPECT_NEAR(g.router_w[i], central(b, b.router, i, kEps), kTol) << "router " << i;
    biggest = std::max(biggest, std::abs(g.router_w[i]));
  }
  EXPECT_GT(biggest, 1e-3) << "the router gradient must be exercised";
  for (Count e = 0; e < b.E; ++e) {
    auto& wi = b.w_in[static_cast<std::size_t>(e)];
    auto& wo = b.w_out[static_cast<std::size_t>(e)];
    for (std::size_t i = 0; i < wi.size(); ++i)
      EXPECT_NEAR(g.w_in[e][i], central(b, wi, i, kEps), kTol) << "expert " << e << " w_in " << i;
    for (std::size_t i = 0; i < wo.size(); ++i)
      EXPECT_NEAR(g.w_out[e][i], central(b, wo, i, kEps), kTol) << "expert " << e << " w_out " << i;
  }
  for (std::size_t i = 0; i < b.x.size(); ++i)
    EXPECT_NEAR(dx[i], central(b, b.x, i, kEps), kTol) << "x " << i;
}

TEST(MoeBlock, SoftmaxRouterBackwardMatchesFiniteDifferences) {
  expect_backward_matches_finite_differences(Router::softmax, false);
}

TEST(MoeBlock, SigmoidRouterWithBiasBackwardMatchesFiniteDifferences) {
  expect_backward_matches_finite_differences(Router::sigmoid, true);
}

// A single SwiGLU expert (the shared experts' MLP) against finite differences.
TEST(MoeBlock, ExpertBackwardMatchesFiniteDifferences) {
  const Count r = 3, h = 4, f = 5;
  auto x = values(static_cast<std::size_t>(r * h), 1.0, 31);
  auto wi = values(static_cast<std::size_t>(2 * f * h), 0.8, 32);
  auto wo = values(static_cast<std::size_t>(h * f), 0.8, 33);
  const auto dy = values(static_cast<std::size_t>(r * h), 1.0, 34);
  auto loss = [&] {
    std::vector<double> fc1(static_cast<std::size_t>(r * 2 * f)),
        act(static_cast<std::size_t>(r * f)), y(static_cast<std::size_t>(r * h));
    expert_forward(x.data(), wi.data(), wo.data(), fc1.data(), act.data(), y.data(), r, h, f);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
    return std::make_tuple(l, fc1, act);
  };
  const auto [l0, fc1, act] = loss();
  std::vector<double> dx(x.size()), dwi(wi.size(), 0.0), dwo(wo.size(), 0.0);
  expert_backward(dy.data(), x.data(), wi.data(), wo.data(), fc1.data(), act.data(), dx.data(),
                  dwi.data(), dwo.data(), r, h, f);
  auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double keep = v[i];
    v[i] = keep + kEps;
    const double up = std::get<0>(loss());
    v[i] = keep - kEps;
    const double down = std::get<0>(loss());
    v[i] = keep;
    return (up - down) / (2 * kEps);
  };
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(x, i), kTol) << "x " << i;
  for (std::size_t i = 0; i < wi.size(); ++i) EXPECT_NEAR(dwi[i], fd(wi, i), kTol) << "w_in " << i;
  for (std::size_t i = 0; i < wo.size(); ++i) EXPECT_NEAR(dwo[i], fd(wo, i), kTol) << "w_out " << i;
}

// ---- two expert-parallel ranks as two threads --------------------------------------------------

// All-to-all between threads: each call posts its blocks, waits for every rank, reads its own.
struct Mailbox {
  explicit Mailbox(int n) : sync(n), posted(static_cast<std::size_t>(n)) {}
  std::barrier<> sync;
  std::vector<std::vector<std::vector<char>>> posted;  // [from][to] bytes
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(int rank, int size, CommLog* log, std::shared_ptr<Mailbox> box)
      : Communicator(Group::ep, rank, size, log), box_(std::move(box)) {}
  void barrier() override { box_->sync.arrive_and_wait(); }

 protected:
  void do_all_reduce(void*, Count, DType, ReduceOp) override {}
  void do_reduce_scatter(const void*, void*, Count, DType) override {}
  void do_all_gather(const void*, void*, Count, DType) override {}
  void do_send_recv(std::vector<P2POp>&) override {}
  void do_all_to_all_v(const void* in, const std::vector<Count>& send, void* out,
                       const std::vector<Count>& recv, DType dtype) override {
    const Count b = bytes_of(dtype);
    std::vector<std::vector<char>> mine(static_cast<std::size_t>(size()));
    const char* p = static_cast<const char*>(in);
    for (int r = 0; r < size(); ++r) {
      mine[r].assign(p, p + send[r] * b);
      p += send[r] * b;
    }
    box_->posted[static_cast<std::size_t>(rank())] = std::move(mine);
    box_->sync.arrive_and_wait();
    char* q = static_cast<char*>(out);
    for (int r = 0; r < size(); ++r) {
      const auto& blk = box_->posted[static_cast<std::size_t>(r)][static_cast<std::size_t>(rank())];
      EXPECT_EQ(static_cast<Count>(blk.size()), recv[r] * b);
      std::memcpy(q, blk.data(), blk.size());
      q += blk.size();
    }
    box_->sync.arrive_and_wait();
  }
  std::vector<Count> do_exchange_counts(const std::vector<Count>& send) override {
    // Each Count as two 4-byte words: a plain byte copy.
    std::vector<Count> recv(send.size());
    const std::vector<Count> words(static_cast<std::size_t>(size()),
                                   2 * static_cast<Count>(send.size()) / size());
    do_all_to_all_v(send.data(), words, recv.data(), words, DType::fp32);
    return recv;
  }

 private:
  std::shared_ptr<Mailbox> box_;
};

// The trainer's adapter (trainer_moe.cpp, ep_exchange) in miniature: rows of fp32 through the
// communicator's all_to_all.
Exchange<float> over(Communicator& c) {
  Exchange<float> ex;
  ex.size = c.size();
  ex.rank = c.rank();
  ex.counts = [&c](const std::vector<Count>& s) { return c.exchange_counts(s); };
  ex.rows = [&c](const float* in, const std::vector<Count>& sr, float* out,
                 const std::vector<Count>& rr, Count width, Count token_rows, Traffic what) {
    std::vector<Count> s(sr.size()), r(rr.size());
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = sr[i] * width, r[i] = rr[i] * width;
    c.all_to_all_v(in, s, out, r, DType::fp32, token_rows * width, what);
  };
  return ex;
}

// Router rows +u, -u, +v, -v: each token's two largest logits are |u.x| and |v.x|, one from each
// pair, so with experts {0, 1} on rank 0 and {2, 3} on rank 1 every token sends exactly one of its
// two copies to the other rank: the even split the planner's formula assumes.
TEST(MoeExpertParallel, TwoRanksComputeWhatOneDoesAndSendThePlannersBytes) {
  const Count n = 8, h = 6, f = 4, E = 4, k = 2, ep = 2;
  const auto u = values(static_cast<std::size_t>(h), 1.0, 41),
             v = values(static_cast<std::size_t>(h), 1.0, 42);
  std::vector<float> router;  // rows +u, -u, +v, -v
  for (const auto* row : {&u, &v})
    for (const double sign : {1.0, -1.0})
      for (const double e : *row) router.push_back(static_cast<float>(sign * e));
  std::vector<std::vector<float>> w_in, w_out;
  for (Count e = 0; e < E; ++e) {
    auto a = values(static_cast<std::size_t>(2 * f * h), 0.7, 50 + static_cast<unsigned>(e));
    auto b = values(static_cast<std::size_t>(h * f), 0.7, 60 + static_cast<unsigned>(e));
    w_in.emplace_back(a.begin(), a.end());
    w_out.emplace_back(b.begin(), b.end());
  }
  auto weights = [&](Count first, Count local) {
    BlockWeights<float> w;
    w.h = h, w.f = f, w.local = local;
    w.router = {E, k, Router::softmax};
    w.router_w = router.data();
    for (Count e = first; e < first + local; ++e) {
      w.w_in.push_back(w_in[static_cast<std::size_t>(e)].data());
      w.w_out.push_back(w_out[static_cast<std::size_t>(e)].data());
    }
    return w;
  };
  // Each rank routes its own n tokens; one rank holding all experts computes both ranks' tokens.
  std::vector<std::vector<float>> x(2), dy(2);
  for (unsigned r = 0; r < 2; ++r) {
    auto a = values(static_cast<std::size_t>(n * h), 1.0, 70 + r),
         b = values(static_cast<std::size_t>(n * h), 1.0, 80 + r);
    x[r].assign(a.begin(), a.end());
    dy[r].assign(b.begin(), b.end());
  }
  std::vector<std::vector<float>> y1(2), dx1(2);
  BlockGrads<float> g1;
  for (int r = 0; r < 2; ++r) {
    BlockSaved<float> sv;
    y1[r] = block_forward(weights(0, E), x[r].data(), n, sv, local_exchange<float>());
    dx1[r] = block_backward(weights(0, E), x[r].data(), dy[r].data(), n, sv, g1,
                            local_exchange<float>());
  }
  auto box = std::make_shared<Mailbox>(2);
  std::vector<CommLog> logs(2);
  std::vector<std::vector<float>> y2(2), dx2(2);
  std::vector<BlockGrads<float>> g2(2);
  std::vector<Count> sent_to_other(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator c(r, 2, &logs[static_cast<std::size_t>(r)], box);
      const Exchange<float> ex = over(c);
      BlockSaved<float> sv;
      const auto w = weights(r * (E / ep), E / ep);
      y2[r] = block_forward(w, x[r].data(), n, sv, ex);
      dx2[r] = block_backward(w, x[r].data(), dy[r].data(), n, sv, g2[r], ex);
      sent_to_other[r] = sv.sent() - sv.send_rows[static_cast<std::size_t>(r)];
    });
  }
  for (auto& t : threads) t.join();
  // Same outputs and input gradients (fp32: the per-row arithmetic is identical; sums over
  // tokens may run in another order).
  for (int r = 0; r < 2; ++r)
    for (std::size_t i = 0; i < y1[r].size(); ++i) {
      EXPECT_NEAR(y2[r][i], y1[r][i], 1e-6) << r << " " << i;
      EXPECT_NEAR(dx2[r][i], dx1[r][i], 1e-5) << r << " " << i;
    }
  // Expert e's gradient lives on rank e / 2; the router's is the sum over the ranks (each routed
  // its own tokens; the trainer sums it over the data-parallel ranks).
  for (Count e = 0; e < E; ++e)
    for (std::size_t i = 0; i < g1.w_in[e].size(); ++i)
      EXPECT_NEAR(g2[e / 2].w_in[e % 2][i], g1.w_in[e][i], 1e-5) << e << " " << i;
  for (std::size_t i = 0; i < g1.router_w.size(); ++i)
    EXPECT_NEAR(g2[0].router_w[i] + g2[1].router_w[i], g1.router_w[i], 1e-5) << i;
  // Bytes: every token sends one copy of h fp32 to the other rank, in each of the four calls.
  // By hand: n * 1 * h * 4 = 8 * 6 * 4 = 192 bytes per call; the planner's formula for tokens = n,
  // top_k = 2, ep = 2: n * 2 * h * 4 * (2 - 1) / 2 = 192.
  constexpr Bytes kHand = 8 * 1 * 6 * 4;
  const double planner = ep_all_to_all_bytes(n, k, h, 4, ep);
  EXPECT_EQ(planner, static_cast<double>(kHand));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(sent_to_other[r], n);
    EXPECT_EQ(sent_to_other[r] * h * 4, kHand);  // what crossed ranks: the wire share
    for (Traffic what : {Traffic::dispatch_forward, Traffic::combine_forward,
                         Traffic::combine_backward, Traffic::dispatch_backward}) {
      const CommTotals t = logs[r].entries().at({Group::ep, CollectiveOp::all_to_all, what});
      EXPECT_EQ(t.calls, 1) << to_string(what);
      // Recorded: the token-side buffer, all n * top_k copies, the planner's bytes per call.
      EXPECT_EQ(t.bytes, 8 * 2 * 6 * 4) << to_string(what);
    }
  }
}

}  // namespace
}  // namespace distplan::backend::moe
