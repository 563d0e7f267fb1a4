// Trainer: DualPipe's mirror exchange (trainer_impl.h). Stage s holds model stage s of the
// forward direction (chunk 0) and model stage pp - 1 - s of the reverse one (chunk 1); stage
// pp - 1 - s holds the other copy of each (layout.h, dualpipe_model_stage). DeepSeek-AI's example
// (deepseek-ai/DualPipe examples/example_dualpipe.py) sums the two copies' gradients before the
// optimizer step, so both take the same step and stay identical; the planner counts it as one
// pipeline send per unit of the stage's gradients per step (estimate.cpp, kMirrorGradients), and
// only one unit's copies are alive at a time (temporaries).
#include "trainer_impl.h"

#include "distplan/planner/estimate.h"

namespace distplan::backend::trainer_detail {

void Trainer::mirror_gradients() {
  const auto t0 = now();
  const int mirror = static_cast<int>(pp_ - 1 - stage_);
  // The mirror's chunk c holds the other copy of this stage's chunk 1 - c (the same units in the
  // same order, build_units). Both stages walk the units by model stage, the lower first, so the
  // k-th exchange of each carries the two copies of the same unit: each sends its own (not yet
  // summed) gradient and adds the other's. One exchange per unit, as the data-parallel reduction
  // goes (the planner's count).
  std::vector<int> order[2];
  for (std::size_t i = 0; i < units_.size(); ++i)
    order[units_[i].chunk].push_back(static_cast<int>(i));
  const int lower =
      dualpipe_model_stage(pp_, stage_, 0) < dualpipe_model_stage(pp_, stage_, 1) ? 0 : 1;
  std::vector<int> walk = order[lower];
  walk.insert(walk.end(), order[1 - lower].begin(), order[1 - lower].end());
  for (std::size_t k = 0; k < walk.size(); ++k) {
    Unit& u = units_[static_cast<std::size_t>(walk[k])];
    // The send's copy goes to the communicator, which drops it once the send has completed.
    auto out = std::make_shared<Tensor>(pack_tensor(u.grads));
    Tensor in(alloc_, {u.grads.numel()}, gb_, MemoryTag::temporaries);
    std::vector<P2POp> batch(2);
    batch[0].dir = P2POp::Dir::send;
    batch[0].data = out->data();
    batch[0].what = Traffic::mirror_gradients;
    batch[1].dir = P2POp::Dir::recv;
    batch[1].data = in.data();
    for (P2POp& op : batch) {
      op.peer = mirror;
      op.n = u.grads.numel();
      op.dtype = gb_;
      op.tag = tag(true, -1, static_cast<Count>(k));
    }
    batch[0].keep_alive = std::move(out);
    g_.pp->send_recv(std::move(batch));
    const Vec other = rd(in);
    dev::add_into(o_.device, u.grads, 0, other.data(), u.grads.numel());
  }
  mark(sim::Track::dp, sim::SliceKind::grad_reduce, -1, -1, t0);
}

}  // namespace distplan::backend::trainer_detail
