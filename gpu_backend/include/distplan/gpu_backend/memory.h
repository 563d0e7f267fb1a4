// Tracking allocator: every tensor the backend allocates is tagged with one of DESIGN.md's memory
// categories; live and peak bytes are recorded per tag at the size requested, and the joint peak of
// their sum, at the size requested. PyTorch's caching allocator is replayed alongside on the same
// requests (CachingAllocatorModel), giving the bytes it would reserve (stats().peak_reserved).
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distplan/planner/units.h"

namespace distplan::backend {

/// DESIGN.md's categories, plus `temporaries`: tensors that live only inside one op or one
/// layer's forward/backward (activation gradients, unsaved intermediates). The planner does not
/// model them; they are measured and reported apart, and count in the joint peak.
enum class MemoryTag { weights, gradients, optimizer, activations, buffers, temporaries };
inline constexpr int kNumMemoryTags = 6;
[[nodiscard]] std::string_view to_string(MemoryTag t) noexcept;

enum class Device { cpu, cuda };

/// Live and peak bytes per tag plus the joint peak (peak of the sum over tags).
struct MemoryStats {
  std::array<Bytes, kNumMemoryTags> live{};
  std::array<Bytes, kNumMemoryTags> peak{};
  Bytes live_total = 0;
  Bytes peak_total = 0;
  // PyTorch's caching allocator replayed on the same requests (CachingAllocatorModel): the bytes
  // its segments would reserve now and at their peak (it never returns a segment).
  Bytes reserved = 0;
  Bytes peak_reserved = 0;
  [[nodiscard]] Bytes peak_of(MemoryTag t) const noexcept { return peak[static_cast<int>(t)]; }
  [[nodiscard]] Bytes live_of(MemoryTag t) const noexcept { return live[static_cast<int>(t)]; }
};

/// Thrown when the tracked live bytes would exceed the allocator's capacity, or the device has no
/// memory left: a measured "does not fit", not an internal error.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
  [[nodiscard]] const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

/// PyTorch's CUDA caching allocator, bookkeeping only (c10/cuda/CUDACachingAllocator.cpp, the
/// rules in distplan/planner/framework.h `allocator::`): a request rounds up to 512 bytes and takes
/// the smallest cached free block of its pool (small: <= 1 MiB, large: above) that holds it,
/// splitting off the rest when the split rule allows; without one it reserves a new segment
/// (2 MiB, 20 MiB, or the request rounded to 2 MiB). A freed block merges with free neighbours of
/// its segment and stays cached: reserved bytes never fall.
class CachingAllocatorModel {
 public:
  /// Serves `request` bytes for `key` (any unique pointer); returns the block size.
  Bytes allocate(const void* key, Bytes request);
  /// Frees the block of `key` (no-op for an unknown key).
  void free(const void* key) noexcept;
  [[nodiscard]] Bytes reserved() const noexcept { return reserved_; }
  [[nodiscard]] Bytes allocated() const noexcept { return allocated_; }

 private:
  struct Block {
    Bytes size = 0;
    bool free = true;
    bool small = false;
  };
  using Where = std::pair<std::size_t, Bytes>;  // segment, offset
  void make_free(std::size_t seg, Bytes offset, Block b);
  std::vector<std::map<Bytes, Block>> segments_;  // offset -> block, per segment
  std::set<std::pair<Bytes, Where>> pool_[2];     // free blocks by size: [0] small, [1] large
  std::unordered_map<const void*, Where> live_;
  Bytes reserved_ = 0, allocated_ = 0;
};

class TrackingAllocator {
 public:
  /// `capacity_bytes` > 0 bounds the tracked live total (the GPU's memory less the runtime's
  /// reserve); 0: unbounded.
  explicit TrackingAllocator(Device device = Device::cpu, Bytes capacity_bytes = 0)
      : device_(device), capacity_(capacity_bytes) {}
  TrackingAllocator(const TrackingAllocator&) = delete;
  TrackingAllocator& operator=(const TrackingAllocator&) = delete;

  /// Allocates `bytes` (zero-filled) on the allocator's device, counted under `tag`.
  [[nodiscard]] void* allocate(Bytes bytes, MemoryTag tag);
  void deallocate(void* ptr, Bytes bytes, MemoryTag tag) noexcept;

  [[nodiscard]] const MemoryStats& stats() const noexcept { return stats_; }
  [[nodiscard]] Device device() const noexcept { return device_; }
  /// Restarts peak tracking from the current live bytes (start of a measured step).
  void reset_peaks() noexcept;

 private:
  Device device_;
  Bytes capacity_ = 0;
  MemoryStats stats_;
  CachingAllocatorModel caching_;
};

}  // namespace distplan::backend
