// A frozen weight as bitsandbytes stores it (QLoRA's base; docs/peft.md, "A quantized base"):
// NF4 / FP4 blockwise 4-bit, two values per byte, an fp32 absmax per block of 64 values and the
// 16-value fp32 code (bitsandbytes functional.py quantize_4bit, get_4bit_type, v0.49), or with
// double quantization an 8-bit absmax with an fp32 scale per 256 blocks and their fp32 mean; or
// LLM.int8 rows with an fp32 scale each (int8_vectorwise_quant). Every allocation is tracked under
// `weights`, so the measured bytes are the planner's stored_weight_bytes (peft.h) per tensor.
// Private to the backend; CPU memory (run() keeps a quantized base on the CPU device).
//
// The 4-bit codes are bitsandbytes' own values; the double quantization's 8-bit code is a linear
// signed map of 256 levels (bitsandbytes uses its dynamic-tree map): the same bytes, the absmax
// values within 1/255 of their block's scale.
#pragma once

#include <utility>
#include <vector>

#include "distplan/gpu_backend/memory.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan::backend {

/// Bytes from the tracking allocator under one tag, released on destruction.
class TrackedBytes {
 public:
  TrackedBytes() = default;
  TrackedBytes(TrackingAllocator& a, Bytes n, MemoryTag tag)
      : alloc_(&a), n_(n), tag_(tag), p_(n > 0 ? a.allocate(n, tag) : nullptr) {}
  TrackedBytes(TrackedBytes&& o) noexcept { swap(o); }
  TrackedBytes& operator=(TrackedBytes&& o) noexcept {
    TrackedBytes t(std::move(o));
    swap(t);
    return *this;
  }
  TrackedBytes(const TrackedBytes&) = delete;
  TrackedBytes& operator=(const TrackedBytes&) = delete;
  ~TrackedBytes() {
    if (p_ != nullptr) alloc_->deallocate(p_, n_, tag_);
  }
  [[nodiscard]] void* data() noexcept { return p_; }
  [[nodiscard]] const void* data() const noexcept { return p_; }

 private:
  void swap(TrackedBytes& o) noexcept {
    std::swap(alloc_, o.alloc_);
    std::swap(n_, o.n_);
    std::swap(tag_, o.tag_);
    std::swap(p_, o.p_);
  }
  TrackingAllocator* alloc_ = nullptr;
  Bytes n_ = 0;
  MemoryTag tag_ = MemoryTag::weights;
  void* p_ = nullptr;
};

class QuantizedWeight {
 public:
  /// Quantizes w (rows x cols, row-major: bitsandbytes' flattening of an (out, in) weight).
  /// `nested_code`: the shared 256-entry fp32 code of the double quantization (nullptr without).
  QuantizedWeight(TrackingAllocator& a, BaseStorage storage, bool double_quant, const float* w,
                  Count rows, Count cols, const float* nested_code);
  /// The weight's values as they are stored, in fp32 (rows x cols).
  void dequantize(float* out) const;
  [[nodiscard]] Count rows() const noexcept { return rows_; }
  [[nodiscard]] Count cols() const noexcept { return cols_; }

  /// The 256 levels of the double quantization's 8-bit code, in [-1, 1].
  [[nodiscard]] static std::vector<float> nested_code_values();

 private:
  BaseStorage storage_;
  bool double_quant_ = false;
  Count rows_ = 0, cols_ = 0;
  const float* nested_code_ = nullptr;
  TrackedBytes values_;  // packed 4-bit pairs, or int8 rows
  TrackedBytes absmax_;  // fp32 per block (4-bit), uint8 per block (double quantization), or the
                         // fp32 row scales (int8)
  TrackedBytes nested_absmax_, offset_;  // double quantization: fp32 per 256 blocks, the mean
  TrackedBytes code_;                    // 4-bit: the 16 fp32 code values
};

}  // namespace distplan::backend
