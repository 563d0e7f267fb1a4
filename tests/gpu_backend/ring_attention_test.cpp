// Ring attention kernels (ring_attention.h) in double precision, with the ring and the KV
// all-gather simulated in one process: every CP rank's merged output and log-sum-exp, and the
// summed gradients of every rank's steps, equal the full-sequence causal flash attention
// (cpu_ops.h, itself checked by finite differences in cpu_ops_test.cpp); the ring's own gradient
// equals a central finite difference of its forward; the load-balanced chunks cover the sequence
// once.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "distplan/gpu_backend/cpu_ops.h"
#include "distplan/gpu_backend/ring_attention.h"

namespace distplan::backend {
namespace {

using V = std::vector<double>;

V random_vec(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  V x(n);
  for (double& e : x) e = u(gen);
  return x;
}

struct Shape {
  Count s, b, a, g, d;
};

// Rows of a (s,b,heads,d) tensor at the global positions of CP rank r's local sequence.
V local_rows(const V& full, const Shape& sh, Count heads, Count cp, Count r) {
  const Count sl = sh.s / cp, row = sh.b * heads * sh.d;
  V out(static_cast<std::size_t>(sl * row));
  for (Count i = 0; i < sl; ++i) {
    const Count gpos = ring::global_position(i, sl, cp, r);
    std::copy(full.begin() + gpos * row, full.begin() + (gpos + 1) * row, out.begin() + i * row);
  }
  return out;
}

// Rank r's forward: cp steps, step i on rank (r - i) mod cp's block, merged.
void ring_forward(const std::vector<V>& q, const std::vector<V>& k, const std::vector<V>& v,
                  const Shape& sh, Count cp, Count r, V& out, V& lse) {
  const Count sl = sh.s / cp;
  out.assign(q[static_cast<std::size_t>(r)].size(), 0.0);
  lse.assign(static_cast<std::size_t>(sh.b * sh.a * sl), -std::numeric_limits<double>::infinity());
  for (Count i = 0; i < cp; ++i) {
    const Count j = (r - i + cp) % cp;
    const ring::Step st = ring::step_for_block(j, r, sl);
    V os(out.size(), 0.0), ls(lse.size(), 0.0);
    ring::block_forward(q[r].data(), k[j].data(), v[j].data(), os.data(), ls.data(), sl, st, sh.b,
                        sh.a, sh.g, sh.d);
    ring::merge(out.data(), lse.data(), os.data(), ls.data(), sl, st.q, sh.b, sh.a, sh.d);
  }
}

TEST(RingAttention, LoadBalancedChunksCoverTheSequenceOnce) {
  // Hand count, s = 8, cp = 2 (chunks of 2): rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const std::vector<Count> r0 = {0, 1, 6, 7}, r1 = {2, 3, 4, 5};
  for (Count i = 0; i < 4; ++i) {
    EXPECT_EQ(ring::global_position(i, 4, 2, 0), r0[static_cast<std::size_t>(i)]);
    EXPECT_EQ(ring::global_position(i, 4, 2, 1), r1[static_cast<std::size_t>(i)]);
  }
  for (Count cp : {1, 2, 3, 4}) {
    const Count s = 24, sl = s / cp;
    std::set<Count> seen;
    for (Count r = 0; r < cp; ++r)
      for (Count i = 0; i < sl; ++i)
        EXPECT_TRUE(seen.insert(ring::global_position(i, sl, cp, r)).second);
    EXPECT_EQ(static_cast<Count>(seen.size()), s);
    EXPECT_EQ(*seen.rbegin(), s - 1);
  }
}

// Rounding only: double sums in another order (1e-12 relative to values of order 1).
constexpr double kTol = 1e-12;

TEST(RingAttention, RingAndAllGatherEqualFullSequenceAttentionForwardAndBackward) {
  const Shape sh{24, 2, 4, 2, 4};  // grouped KV heads: 2 query heads per KV head
  const auto qn = static_cast<std::size_t>(sh.s * sh.b * sh.a * sh.d);
  const auto kn = static_cast<std::size_t>(sh.s * sh.b * sh.g * sh.d);
  const V q = random_vec(qn, 1), k = random_vec(kn, 2), v = random_vec(kn, 3),
          dout = random_vec(qn, 4);
  V out(qn), lse(static_cast<std::size_t>(sh.b * sh.a * sh.s)), dq(qn), dk(kn), dv(kn);
  cpu::flash_attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), sh.s, sh.b,
                               sh.a, sh.g, sh.d);
  cpu::flash_attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                dq.data(), dk.data(), dv.data(), sh.s, sh.b, sh.a, sh.g, sh.d);
  V allg_dk, allg_dv;
  for (Count cp : {2, 3, 4}) {
    SCOPED_TRACE("cp = " + std::to_string(cp));
    const Count sl = sh.s / cp;
    std::vector<V> ql, kl, vl, dol;
    for (Count r = 0; r < cp; ++r) {
      ql.push_back(local_rows(q, sh, sh.a, cp, r));
      kl.push_back(local_rows(k, sh, sh.g, cp, r));
      vl.push_back(local_rows(v, sh, sh.g, cp, r));
      dol.push_back(local_rows(dout, sh, sh.a, cp, r));
    }
    std::vector<V> outs(cp), lses(cp), dqs(cp), dks(cp), dvs(cp);
    for (Count r = 0; r < cp; ++r) {
      ring_forward(ql, kl, vl, sh, cp, r, outs[r], lses[r]);
      const V want = local_rows(out, sh, sh.a, cp, r);
      for (std::size_t e = 0; e < want.size(); ++e) ASSERT_NEAR(outs[r][e], want[e], kTol) << e;
      for (Count bi = 0; bi < sh.b; ++bi)
        for (Count h = 0; h < sh.a; ++h)
          for (Count i = 0; i < sl; ++i)
            ASSERT_NEAR(lses[r][(bi * sh.a + h) * sl + i],
                        lse[(bi * sh.a + h) * sh.s + ring::global_position(i, sl, cp, r)], kTol);
      dqs[r].assign(ql[r].size(), 0.0);
      dks[r].assign(kl[r].size(), 0.0);
      dvs[r].assign(vl[r].size(), 0.0);
    }
    // The KV all-gather: each local chunk against the gathered keys up to its own end.
    for (Count r = 0; r < cp; ++r) {
      V o(ql[r].size(), 0.0), l(lses[r].size(), 0.0), dqa(ql[r].size(), 0.0), dka(kn, 0.0),
          dva(kn, 0.0);
      for (int chunk = 0; chunk < 2; ++chunk)
        ring::block_forward(ql[r].data(), k.data(), v.data(), o.data(), l.data(), sl,
                            ring::all_gather_step(chunk, r, cp, sl), sh.b, sh.a, sh.g, sh.d);
      for (std::size_t e = 0; e < o.size(); ++e) ASSERT_NEAR(o[e], outs[r][e], kTol) << e;
      for (std::size_t e = 0; e < l.size(); ++e) ASSERT_NEAR(l[e], lses[r][e], kTol) << e;
      for (int chunk = 0; chunk < 2; ++chunk)
        ring::block_backward(dol[r].data(), ql[r].data(), k.data(), v.data(), o.data(), l.data(),
                             dqa.data(), dka.data(), dva.data(), sl,
                             ring::all_gather_step(chunk, r, cp, sl), sh.b, sh.a, sh.g, sh.d);
      const V wq = local_rows(dq, sh, sh.a, cp, r);
      for (std::size_t e = 0; e < wq.size(); ++e) ASSERT_NEAR(dqa[e], wq[e], kTol) << e;
      // dka, dva: this rank's share of the whole sequence's K and V gradients, summed below.
      allg_dk.resize(kn, 0.0);
      allg_dv.resize(kn, 0.0);
      for (std::size_t e = 0; e < kn; ++e) allg_dk[e] += dka[e], allg_dv[e] += dva[e];
    }
    for (std::size_t e = 0; e < kn; ++e) {
      ASSERT_NEAR(allg_dk[e], dk[e], kTol) << e;
      ASSERT_NEAR(allg_dv[e], dv[e], kTol) << e;
    }
    allg_dk.clear();
    allg_dv.clear();
    // Every rank's step on every block adds to the block's KV gradient (the ring carries it home).
    for (Count r = 0; r < cp; ++r)
      for (Count j = 0; j < cp; ++j)
        ring::block_backward(dol[r].data(), ql[r].data(), kl[j].data(), vl[j].data(),
                             outs[r].data(), lses[r].data(), dqs[r].data(), dks[j].data(),
                             dvs[j].data(), sl, ring::step_for_block(j, r, sl), sh.b, sh.a, sh.g,
                             sh.d);
    for (Count r = 0; r < cp; ++r) {
      const V wq = local_rows(dq, sh, sh.a, cp, r), wk = local_rows(dk, sh, sh.g, cp, r),
              wv = local_rows(dv, sh, sh.g, cp, r);
      for (std::size_t e = 0; e < wq.size(); ++e) ASSERT_NEAR(dqs[r][e], wq[e], kTol) << e;
      for (std::size_t e = 0; e < wk.size(); ++e) ASSERT_NEAR(dks[r][e], wk[e], kTol) << e;
      for (std::size_t e = 0; e < wv.size(); ++e) ASSERT_NEAR(dvs[r][e], wv[e], kTol) << e;
    }
  }
}

TEST(RingAttention, GradientMatchesFiniteDifferenceOfTheRing) {
  // L = sum over ranks of w . out_r, with every rank's output from the ring.
  const Shape sh{8, 1, 2, 1, 4};
  const Count cp = 2, sl = sh.s / cp;
  const auto qn = static_cast<std::size_t>(sl * sh.b * sh.a * sh.d);
  const auto kn = static_cast<std::size_t>(sl * sh.b * sh.g * sh.d);
  std::vector<V> q, k, v, w;
  for (Count r = 0; r < cp; ++r) {
    q.push_back(random_vec(qn, 10 + static_cast<unsigned>(r)));
    k.push_back(random_vec(kn, 20 + static_cast<unsigned>(r)));
    v.push_back(random_vec(kn, 30 + static_cast<unsigned>(r)));
    w.push_back(random_vec(qn, 40 + static_cast<unsigned>(r)));
  }
  auto loss = [&] {
    double l = 0;
    for (Count r = 0; r < cp; ++r) {
      V out, lse;
      ring_forward(q, k, v, sh, cp, r, out, lse);
      for (std::size_t e = 0; e < out.size(); ++e) l += w[r][e] * out[e];
    }
    return l;
  };
  std::vector<V> dq(cp, V(qn, 0.0)), dk(cp, V(kn, 0.0)), dv(cp, V(kn, 0.0));
  for (Count r = 0; r < cp; ++r) {
    V out, lse;
    ring_forward(q, k, v, sh, cp, r, out, lse);
    for (Count j = 0; j < cp; ++j)
      ring::block_backward(w[r].data(), q[r].data(), k[j].data(), v[j].data(), out.data(),
                           lse.data(), dq[r].data(), dk[j].data(), dv[j].data(), sl,
                           ring::step_for_block(j, r, sl), sh.b, sh.a, sh.g, sh.d);
  }
  // Central difference: truncation O(eps^2) = 1e-12, cancellation about 1e-16 / eps = 1e-10.
  const double eps = 1e-6, tol = 1e-8;
  for (Count r = 0; r < cp; ++r) {
    for (auto [x, g] :
         {std::pair{&q[r], &dq[r]}, std::pair{&k[r], &dk[r]}, std::pair{&v[r], &dv[r]}}) {
      for (std::size_t e = 0; e < x->size(); ++e) {
        const double keep = (*x)[e];
        (*x)[e] = keep + eps;
        const double up = loss();
        (*x)[e] = keep - eps;
        const double down = loss();
        (*x)[e] = keep;
        EXPECT_NEAR((*g)[e], (up - down) / (2 * eps), tol) << "rank " << r << " element " << e;
      }
    }
  }
}

}  // namespace
}  // namespace distplan::backend
