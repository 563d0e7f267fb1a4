#include "distplan/gpu_backend/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "distplan/planner/check.h"

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
    p = cuda::device_alloc_zeroed(n);
#else
    DISTPLAN_CHECK(false, "built without CUDA");
#endif
  }
  const int i = static_cast<int>(tag);
  stats_.live[i] += bytes;
  stats_.live_total += bytes;
  stats_.peak[i] = std::max(stats_.peak[i], stats_.live[i]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
  return p;
}

void TrackingAllocator::deallocate(void* ptr, Bytes bytes, MemoryTag tag) noexcept {
  if (ptr == nullptr) return;
  if (device_ == Device::cpu) {
    std::free(ptr);
  } else {
#ifdef DISTPLAN_HAVE_CUDA
    cuda::device_free(ptr);
#endif
  }
  const int i = static_cast<int>(tag);
  stats_.live[i] -= bytes;
  stats_.live_total -= bytes;
}

void TrackingAllocator::reset_peaks() noexcept {
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
}

}  // namespace distplan::backend
