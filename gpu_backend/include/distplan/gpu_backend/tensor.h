// A tensor: a shape, a storage dtype (fp32, bf16 or fp16) and bytes owned through the tracking
// allocator under one memory tag. On the CPU arithmetic is fp32: ops read storage into fp32 and
// round results back to the storage dtype (dtype.h), as a GPU kernel does in its registers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "distplan/gpu_backend/memory.h"
#include "distplan/planner/spec.h"

namespace distplan::backend {

/// Rounds fp32 to bf16 / fp16 storage (round to nearest even) and back.
[[nodiscard]] std::uint16_t float_to_bf16(float f) noexcept;
[[nodiscard]] float bf16_to_float(std::uint16_t b) noexcept;
[[nodiscard]] std::uint16_t float_to_fp16(float f) noexcept;
[[nodiscard]] float fp16_to_float(std::uint16_t h) noexcept;
/// The value `f` takes after a round trip through `dtype` storage.
[[nodiscard]] float round_to(DType dtype, float f) noexcept;

class Tensor {
 public:
  Tensor() = default;
  Tensor(TrackingAllocator& alloc, std::vector<Count> shape, DType dtype, MemoryTag tag);
  Tensor(Tensor&& o) noexcept { swap(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    Tensor tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() { release(); }

  void release() noexcept;
  [[nodiscard]] bool empty() const noexcept { return data_ == nullptr; }
  [[nodiscard]] const std::vector<Count>& shape() const noexcept { return shape_; }
  [[nodiscard]] Count numel() const noexcept { return numel_; }
  [[nodiscard]] DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] MemoryTag tag() const noexcept { return tag_; }
  [[nodiscard]] Bytes bytes() const noexcept { return numel_ * bytes_of(dtype_); }
  [[nodiscard]] void* data() noexcept { return data_; }
  [[nodiscard]] const void* data() const noexcept { return data_; }
  /// Typed access; checks the dtype.
  [[nodiscard]] float* f32();
  [[nodiscard]] const float* f32() const;

  /// Reads elements [offset, offset + n) as fp32 into `out`.
  void read(float* out, Count n, Count offset = 0) const;
  /// Writes fp32 values into elements [offset, offset + n), rounding to the storage dtype.
  void write(const float* in, Count n, Count offset = 0);
  /// All elements as fp32.
  [[nodiscard]] std::vector<float> to_vector() const;
  void fill_from(const std::vector<float>& v) { write(v.data(), static_cast<Count>(v.size())); }
  void zero();

 private:
  void swap(Tensor& o) noexcept {
    std::swap(alloc_, o.alloc_);
    std::swap(shape_, o.shape_);
    std::swap(numel_, o.numel_);
    std::swap(dtype_, o.dtype_);
    std::swap(tag_, o.tag_);
    std::swap(data_, o.data_);
  }
  TrackingAllocator* alloc_ = nullptr;
  std::vector<Count> shape_;
  Count numel_ = 0;
  DType dtype_ = DType::fp32;
  MemoryTag tag_ = MemoryTag::buffers;
  void* data_ = nullptr;
};

}  // namespace distplan::backend
