#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "distplan/gpu_backend/memory.h"
#include "distplan/gpu_backend/tensor.h"

namespace distplan::backend {
namespace {

TEST(TrackingAllocator, RecordsLivePeakPerTagAndJointPeak) {
  TrackingAllocator alloc;
  {
    Tensor w(alloc, {10, 4}, DType::bf16, MemoryTag::weights);  // 80 bytes
    Tensor a(alloc, {3}, DType::fp32, MemoryTag::activations);  // 12 bytes
    EXPECT_EQ(alloc.stats().live_of(MemoryTag::weights), 80);
    EXPECT_EQ(alloc.stats().live_total, 92);
    a.release();
    Tensor b(alloc, {5}, DType::fp16, MemoryTag::buffers);  // 10 bytes
    EXPECT_EQ(alloc.stats().peak_total, 92);                // 80 + 10 < 80 + 12
  }
  EXPECT_EQ(alloc.stats().live_total, 0);
  EXPECT_EQ(alloc.stats().peak_of(MemoryTag::weights), 80);
  EXPECT_EQ(alloc.stats().peak_of(MemoryTag::activations), 12);
  EXPECT_EQ(alloc.stats().peak_of(MemoryTag::buffers), 10);
  alloc.reset_peaks();
  EXPECT_EQ(alloc.stats().peak_total, 0);
}

TEST(TensorDtype, Bf16AndFp16RoundToNearestEven) {
  // bf16 keeps 8 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and rounds to even (1).
  EXPECT_EQ(round_to(DType::bf16, 1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_to(DType::bf16, 1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  // fp16 keeps 11 bits: 1 + 2^-11 ties to 1; the largest finite value is 65504; beyond, inf.
  EXPECT_EQ(round_to(DType::fp16, 1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(round_to(DType::fp16, 65504.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(round_to(DType::fp16, 70000.0f)));
  // Subnormal fp16: 2^-24 is the smallest step.
  EXPECT_EQ(round_to(DType::fp16, std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));
  EXPECT_EQ(round_to(DType::fp16, -0.333251953125f), -0.333251953125f);  // exactly representable
}

TEST(TensorDtype, WriteRoundsToStorageAndReadsBack) {
  TrackingAllocator alloc;
  Tensor t(alloc, {3}, DType::bf16, MemoryTag::activations);
  EXPECT_EQ(t.bytes(), 6);
  const std::vector<float> v = {0.1f, -3.0f, 1e5f};
  t.fill_from(v);
  const auto back = t.to_vector();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(back[i], round_to(DType::bf16, v[i]));
    EXPECT_NEAR(back[i], v[i], std::abs(v[i]) * 0.004);  // bf16 relative step 2^-8
  }
}

// An expert that receives no tokens reads and writes zero rows through the `data()` of an empty
// vector, which may be null; that must be a no-op (memcpy with a null pointer is undefined even for
// zero bytes, and the sanitizer build fails on it).
TEST(TensorCopy, EmptyReadAndWriteAcceptANullPointer) {
  TrackingAllocator alloc;
  Tensor t(alloc, {4}, DType::fp32, MemoryTag::temporaries);
  t.fill_from(std::vector<float>{1, 2, 3, 4});
  t.read(nullptr, 0, 4);
  t.write(nullptr, 0, 0);
  Tensor h(alloc, {2}, DType::bf16, MemoryTag::temporaries);
  h.read(nullptr, 0, 0);
  h.write(nullptr, 0, 2);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace distplan::backend
