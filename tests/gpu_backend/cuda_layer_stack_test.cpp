// The device-resident GPT layer stack (cuda.h: time_layer_stack) runs forward + backward on a small
// shape and counts FLOPs as Narayanan et al. 2021 (Megatron-LM at scale, FLOP count without
// recomputation, LM head excluded): per layer and step
// 72 B s h^2 (1 + s / (6h)) with f = 4h, of which the GEMMs are 72 B s h^2. Skips without a GPU.
#include <gtest/gtest.h>

#include "distplan/gpu_backend/cuda.h"
#include "distplan/gpu_backend/run.h"

namespace distplan::backend {
namespace {

TEST(CudaLayerStack, RunsForwardAndBackwardAndCountsMegatronFlops) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible";
  cuda::LayerStackConfig c;
  c.hidden = 128, c.heads = 4, c.seq = 64, c.batch = 2, c.layers = 2, c.reps = 2;
  const cuda::LayerStackTiming t = cuda::time_layer_stack(c);
  const double B = 2, s = 64, h = 128, L = 2;
  EXPECT_DOUBLE_EQ(t.gemm_flops, 72 * B * s * L * h * h);
  EXPECT_NEAR(t.model_flops, 72 * B * s * L * h * h * (1 + s / (6 * h)), 1e-6 * t.model_flops);
  EXPECT_GT(t.seconds, 0);
  // Weights bf16 12h^2 and fp32 gradients 12h^2 per layer at least.
  EXPECT_GE(t.device_bytes, L * 12 * h * h * (2 + 4));
  c.gemm_only = true;
  const cuda::LayerStackTiming g = cuda::time_layer_stack(c);
  EXPECT_GT(g.seconds, 0);
  EXPECT_DOUBLE_EQ(g.gemm_flops, t.gemm_flops);
}

}  // namespace
}  // namespace distplan::backend
