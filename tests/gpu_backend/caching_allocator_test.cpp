// The caching-allocator model (memory.h) against hand-worked request sequences under PyTorch's
// rules (c10/cuda/CUDACachingAllocator.cpp): rounding, segment sizes, block splitting, merging of
// freed neighbours, and segments that are never returned.
#include <gtest/gtest.h>

#include <vector>

#include "distplan/gpu_backend/memory.h"

namespace distplan::backend {
namespace {

constexpr Bytes kMiB = Bytes{1} << 20;

// Distinct keys for the model (it never dereferences them).
const void* key(int i) {
  static std::vector<char> keys(64);
  return &keys[static_cast<std::size_t>(i)];
}

TEST(CachingAllocatorModel, SmallRequestsShareATwoMiBSegment) {
  CachingAllocatorModel a;
  EXPECT_EQ(a.allocate(key(0), 100), 512);  // rounded to 512 bytes
  EXPECT_EQ(a.reserved(), 2 * kMiB);
  EXPECT_EQ(a.allocate(key(1), 1000), 1024);
  EXPECT_EQ(a.reserved(), 2 * kMiB);  // split off the same segment
  EXPECT_EQ(a.allocated(), 1536);
}

TEST(CachingAllocatorModel, LargeRequestsSplitOnlyAboveOneMiB) {
  CachingAllocatorModel a;
  a.allocate(key(0), 3 * kMiB);  // (1, 10) MiB: a 20 MiB segment, 17 MiB split off
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  a.allocate(key(1), 16 * kMiB);  // served by the 17 MiB remainder; 1 MiB left is not split off
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  EXPECT_EQ(a.allocated(), 3 * kMiB + 17 * kMiB);
  a.free(key(0));
  a.free(key(1));  // merges with the freed 3 MiB block: one 20 MiB free block
  EXPECT_EQ(a.allocated(), 0);
  EXPECT_EQ(a.reserved(), 20 * kMiB);  // segments are kept
  a.allocate(key(2), 19 * kMiB);       // fits the merged block
  EXPECT_EQ(a.reserved(), 20 * kMiB);
}

TEST(CachingAllocatorModel, FragmentationReservesMoreThanThePeakAllocated) {
  CachingAllocatorModel a;
  a.allocate(key(0), 12 * kMiB);  // own segment, rounded to 2 MiB: 12 MiB
  a.allocate(key(1), 12 * kMiB);
  a.free(key(0));
  a.allocate(key(2), 14 * kMiB);  // no cached block holds it: a new 14 MiB segment
  EXPECT_EQ(a.allocated(), 26 * kMiB);
  EXPECT_EQ(a.reserved(), 38 * kMiB);
  a.allocate(key(3), 11 * kMiB);  // the cached 12 MiB block; 1 MiB remainder stays with it
  EXPECT_EQ(a.reserved(), 38 * kMiB);
  EXPECT_EQ(a.allocated(), 38 * kMiB);
}

TEST(CachingAllocatorModel, TrackingAllocatorReportsReservedPeak) {
  TrackingAllocator t;
  void* p = t.allocate(3 * kMiB, MemoryTag::activations);
  void* q = t.allocate(100, MemoryTag::buffers);
  EXPECT_EQ(t.stats().peak_total, 3 * kMiB + 100);
  EXPECT_EQ(t.stats().peak_reserved, 22 * kMiB);  // a 20 MiB and a 2 MiB segment
  t.deallocate(p, 3 * kMiB, MemoryTag::activations);
  t.deallocate(q, 100, MemoryTag::buffers);
  t.reset_peaks();
  EXPECT_EQ(t.stats().peak_reserved, 22 * kMiB);  // cached segments stay reserved
}

}  // namespace
}  // namespace distplan::backend
