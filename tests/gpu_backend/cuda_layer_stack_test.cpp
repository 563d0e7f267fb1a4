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
  EXPECT_NEAR(t.noncausal_model_flops, 72 * B * s * L * h * h * (1 + s / (6 * h)),
              1e-6 * t.model_flops);
  // Causal: half the score matrix plus its diagonal.
  EXPECT_NEAR(t.model_flops, 72 * B * s * L * h * h + 6 * L * B * h * s * (s + 1),
              1e-6 * t.model_flops);
  EXPECT_GT(t.seconds, 0);
  // Weights bf16 12h^2 and fp32 gradients 12h^2 per layer at least.
  EXPECT_GE(t.device_bytes, L * 12 * h * h * (2 + 4));
  c.gemm_only = true;
  const cuda::LayerStackTiming g = cuda::time_layer_stack(c);
  EXPECT_GT(g.seconds, 0);
  EXPECT_DOUBLE_EQ(g.gemm_flops, t.gemm_flops);
}

// The count itself, without a GPU, against loops over every GEMM and every causal (query, key)
// pair of a small odd shape (h = 6, 3 heads, f = 10, s = 5, b = 2, 3 layers).
TEST(CudaLayerStack, FlopCountEqualsALoopOverTheOps) {
  cuda::LayerStackConfig c;
  c.hidden = 6, c.heads = 3, c.ffn = 10, c.seq = 5, c.batch = 2, c.layers = 3;
  const int h = 6, a = 3, d = h / a, f = 10, s = 5, b = 2, L = 3, N = s * b;
  double gemm = 0, causal = 0, full = 0;
  // (out, in) of qkv, attention out, mlp in, mlp out: 2 * N * out * in each, forward.
  const int shapes[4][2] = {{3 * h, h}, {h, h}, {f, h}, {h, f}};
  for (int l = 0; l < L; ++l) {
    for (const auto& w : shapes) gemm += 2.0 * N * w[0] * w[1];
    for (int bi = 0; bi < b; ++bi)
      for (int head = 0; head < a; ++head)
        for (int i = 0; i < s; ++i)
          for (int j = 0; j < s; ++j) {
            full += 2.0 * d * 2;  // q.k and p*v
            if (j <= i) causal += 2.0 * d * 2;
          }
  }
  const cuda::LayerStackFlops fl = cuda::layer_stack_flops(c);
  EXPECT_DOUBLE_EQ(fl.gemm, 3 * gemm);  // forward + backward (2 x forward)
  EXPECT_DOUBLE_EQ(fl.attention_causal, 3 * causal);
  EXPECT_DOUBLE_EQ(fl.attention_full, 3 * full);
}

}  // namespace
}  // namespace distplan::backend
