// Tracking allocator: every tensor the backend allocates is tagged with one of DESIGN.md's memory
// categories; live and peak bytes are recorded per tag at the size requested, and the joint peak of
// their sum. Allocator rounding or caching is never counted here (reported apart as reserve).
#pragma once

#include <array>
#include <cstddef>
#include <new>
#include <string>
#include <string_view>

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
};

}  // namespace distplan::backend
