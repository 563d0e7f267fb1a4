// Trainer: DualPipe's mirror exchange (trainer_impl.h). Stage s holds model stage s of the
// forward direction (chunk 0) and model stage pp - 1 - s of the reverse one (chunk 1); stage
// pp - 1 - s holds the other copy of each (layout.h, dualpipe_model_stage). DeepSeek-AI's example
// (deepseek-ai/DualPipe examples/example_dualpipe.py) sums the two copies' gradients before the
// optimizer step, so both take the same step and stay identical; the planner counts it as one
// pipeline send of the stage's whole gradient per step (estimate.cpp, kMirrorGradients).
#include "trainer_impl.h"

#include "distplan/planner/estimate.h"

namespace distplan::backend::trainer_detail {

void Trainer::mirror_gradients() {
  const auto t0 = Clock::now();
  const int mirror = static_cast<int>(pp_ - 1 - stage_);
  // This stage's units chunk by chunk (chunk 0's, then chunk 1's, each in build order). The
  // mirror's chunk 0 is the other copy of this stage's chunk 1 and vice versa: the same units in
  // the same order (build_units), so the received buffer holds this stage's chunk 1 gradients
  // first, then chunk 0's.
  std::vector<int> order[2];
  for (std::size_t i = 0; i < units_.size(); ++i)
    order[units_[i].chunk].push_back(static_cast<int>(i));
  Count total = 0;
  for (const Unit& u : units_) total += u.grads.numel();
  // The send buffer goes to the communicator, which drops it once the send has completed.
  auto out =
      std::make_shared<Tensor>(alloc_, std::vector<Count>{total}, gb_, MemoryTag::temporaries);
  Tensor in(alloc_, {total}, gb_, MemoryTag::temporaries);
  Count off = 0;
  for (const int c : {0, 1}) {
    for (const int ui : order[c]) {
      const Unit& u = units_[static_cast<std::size_t>(ui)];
      const Vec g = rd(u.grads);
      out->write(g.data(), u.grads.numel(), off);
      off += u.grads.numel();
    }
  }
  std::vector<P2POp> batch(2);
  const P2PTag t = tag(true, -1, -1);
  batch[0].dir = P2POp::Dir::send;
  batch[1].dir = P2POp::Dir::recv;
  for (P2POp& op : batch) {
    op.peer = mirror;
    op.n = total;
    op.dtype = gb_;
    op.tag = t;
  }
  batch[0].data = out->data();
  batch[0].what = std::string(kMirrorGradients);
  batch[0].keep_alive = std::move(out);
  batch[1].data = in.data();
  g_.pp->send_recv(std::move(batch));
  off = 0;
  for (const int c : {1, 0}) {
    for (const int ui : order[c]) {
      Unit& u = units_[static_cast<std::size_t>(ui)];
      const Count n = u.grads.numel();
      Vec g = rd(u.grads), other(static_cast<std::size_t>(n));
      in.read(other.data(), n, off);
      for (Count i = 0; i < n; ++i)
        g[static_cast<std::size_t>(i)] += other[static_cast<std::size_t>(i)];
      rnd(g, gb_);
      u.grads.write(g.data(), n);
      off += n;
    }
  }
  mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, -1, t0);
}

}  // namespace distplan::backend::trainer_detail
