#include "distplan/gpu_backend/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "distplan/planner/check.h"
#include "distplan/planner/framework.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {

std::string_view to_string(MemoryTag t) noexcept {
  switch (t) {
    case MemoryTag::weights:
      return "weights";
    case MemoryTag::gradients:
      return "gradients";
    case MemoryTag::optimizer:
      return "optimizer";
    case MemoryTag::activations:
      return "activations";
    case MemoryTag::buffers:
      return "buffers";
    case MemoryTag::temporaries:
      return "temporaries";
  }
  return "?";
}

Bytes CachingAllocatorModel::allocate(const void* key, Bytes request) {
  const Bytes size = allocator::block_bytes(request);
  const bool small = size <= allocator::kSmallSize;
  auto& pool = pool_[small ? 0 : 1];
  // The smallest cached block that holds the request (the allocator's best fit by size).
  auto it = pool.lower_bound({size, {0, 0}});
  Where at;
  Block b;
  if (it != pool.end()) {
    at = it->second;
    pool.erase(it);
    b = segments_[at.first].at(at.second);
  } else {
    const Bytes seg = allocator::segment_bytes(size);
    segments_.emplace_back();
    at = {segments_.size() - 1, 0};
    b = {seg, true, small};
    reserved_ += seg;
  }
  auto& blocks = segments_[at.first];
  if (allocator::splits(b.size, size)) {
    make_free(at.first, at.second + size, {b.size - size, true, small});
    b.size = size;
  }
  b.free = false;
  blocks[at.second] = b;
  live_[key] = at;
  allocated_ += b.size;
  return b.size;
}

void CachingAllocatorModel::make_free(std::size_t seg, Bytes offset, Block b) {
  b.free = true;
  segments_[seg][offset] = b;
  pool_[b.small ? 0 : 1].insert({b.size, {seg, offset}});
}

void CachingAllocatorModel::free(const void* key) noexcept {
  const auto found = live_.find(key);
  if (found == live_.end()) return;
  auto [seg, offset] = found->second;
  live_.erase(found);
  auto& blocks = segments_[seg];
  auto it = blocks.find(offset);
  Block b = it->second;
  allocated_ -= b.size;
  auto& pool = pool_[b.small ? 0 : 1];
  // Merge with a free block after it and one before it (try_merge_blocks).
  if (auto next = std::next(it); next != blocks.end() && next->second.free) {
    pool.erase({next->second.size, {seg, next->first}});
    b.size += next->second.size;
    blocks.erase(next);
  }
  if (it != blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      pool.erase({prev->second.size, {seg, prev->first}});
      b.size += prev->second.size;
      offset = prev->first;
      blocks.erase(it);
      it = prev;
    }
  }
  blocks.erase(it);
  make_free(seg, offset, b);
}

void* TrackingAllocator::allocate(Bytes bytes, MemoryTag tag) {
  DISTPLAN_CHECK(bytes >= 0, "negative allocation");
  if (capacity_ > 0 && stats_.live_total + bytes > capacity_) {
    throw OutOfMemory("out of memory: " + std::to_string(stats_.live_total) + " bytes live + " +
                      std::to_string(bytes) + " requested (" + std::string(to_string(tag)) +
                      ") > capacity " + std::to_string(capacity_));
  }
  void* p = nullptr;
  const auto n = static_cast<std::size_t>(std::max<Bytes>(bytes, 1));
  if (device_ == Device::cpu) {
    p = std::calloc(n, 1);
    if (p == nullptr) throw std::bad_alloc();
  } else {
#ifdef DISTPLAN_HAVE_CUDA
    // From the device block cache: a cudaMalloc or cudaFree per tensor would synchronise the
    // device each time a saved activation or a communication buffer comes and goes.
    p = cuda::pool_alloc(n);
#else
    DISTPLAN_CHECK(false, "built without CUDA");
#endif
  }
  const int i = static_cast<int>(tag);
  stats_.live[i] += bytes;
  stats_.live_total += bytes;
  stats_.peak[i] = std::max(stats_.peak[i], stats_.live[i]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
  caching_.allocate(p, bytes);
  stats_.reserved = caching_.reserved();
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return p;
}

void TrackingAllocator::deallocate(void* ptr, Bytes bytes, MemoryTag tag) noexcept {
  if (ptr == nullptr) return;
  caching_.free(ptr);
  if (device_ == Device::cpu) {
    std::free(ptr);
  } else {
#ifdef DISTPLAN_HAVE_CUDA
    cuda::pool_free(ptr, static_cast<std::size_t>(std::max<Bytes>(bytes, 1)));
#endif
  }
  const int i = static_cast<int>(tag);
  stats_.live[i] -= bytes;
  stats_.live_total -= bytes;
}

void TrackingAllocator::reset_peaks() noexcept {
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
  stats_.peak_reserved = stats_.reserved;
}

}  // namespace distplan::backend
