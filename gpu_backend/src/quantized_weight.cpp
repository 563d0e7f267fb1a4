// bitsandbytes' storage of a frozen weight on the backend (quantized_weight.h).
#include "quantized_weight.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "distplan/planner/check.h"
#include "distplan/planner/peft.h"

namespace distplan::backend {

namespace {

// bitsandbytes get_4bit_type (functional.py, v0.49): NF4, the quantiles of N(0, 1) (Dettmers et
// al. 2023, sec. 3 and Appendix E), and FP4 (e2m1), normalised by its largest value.
constexpr std::array<float, 16> kNf4 = {-1.0f,        -0.6961928f,  -0.52507305f, -0.39491749f,
                                        -0.28444138f, -0.18477343f, -0.09105004f, 0.0f,
                                        0.0795803f,   0.1609302f,   0.24611230f,  0.33791524f,
                                        0.44070983f,  0.562617f,    0.72295684f,  1.0f};
constexpr std::array<float, 16> kFp4 = {
    0.0f,  0.0625f / 12,  8.0f / 12,  12.0f / 12,  4.0f / 12,  6.0f / 12,  2.0f / 12,  3.0f / 12,
    -0.0f, -0.0625f / 12, -8.0f / 12, -12.0f / 12, -4.0f / 12, -6.0f / 12, -2.0f / 12, -3.0f / 12};

// The code index whose value is nearest to v (ties to the lower index).
template <std::size_t N>
std::uint8_t nearest(const std::array<float, N>& code, float v) {
  std::size_t best = 0;
  float err = std::abs(code[0] - v);
  for (std::size_t i = 1; i < N; ++i) {
    const float e = std::abs(code[i] - v);
    if (e < err) best = i, err = e;
  }
  return static_cast<std::uint8_t>(best);
}

}  // namespace

std::vector<float> QuantizedWeight::nested_code_values() {
  std::vector<float> c(256);
  for (int k = 0; k < 256; ++k) c[static_cast<std::size_t>(k)] = -1.0f + 2.0f * k / 255.0f;
  return c;
}

QuantizedWeight::QuantizedWeight(TrackingAllocator& a, BaseStorage storage, bool double_quant,
                                 const float* w, Count rows, Count cols, const float* nested_code)
    : storage_(storage),
      double_quant_(double_quant),
      rows_(rows),
      cols_(cols),
      nested_code_(nested_code) {
  const Count n = rows * cols;
  if (storage == BaseStorage::int8) {
    // LLM.int8's vectorwise quantization: each row scaled by its absmax into [-127, 127].
    values_ = TrackedBytes(a, n, MemoryTag::weights);
    absmax_ = TrackedBytes(a, rows * 4, MemoryTag::weights);
    auto* cb = static_cast<std::int8_t*>(values_.data());
    auto* scb = static_cast<float*>(absmax_.data());
    for (Count r = 0; r < rows; ++r) {
      float m = 0;
      for (Count c = 0; c < cols; ++c) m = std::max(m, std::abs(w[r * cols + c]));
      scb[r] = m;
      for (Count c = 0; c < cols; ++c) {
        const float q = m > 0 ? std::nearbyint(w[r * cols + c] / m * 127.0f) : 0.0f;
        cb[r * cols + c] = static_cast<std::int8_t>(q);
      }
    }
    return;
  }
  DISTPLAN_CHECK(storage == BaseStorage::nf4 || storage == BaseStorage::fp4, "not a 4-bit storage");
  const std::array<float, 16>& code = storage == BaseStorage::nf4 ? kNf4 : kFp4;
  const Count blocks = (n + kBnb4bitBlock - 1) / kBnb4bitBlock;
  values_ = TrackedBytes(a, (n + 1) / 2, MemoryTag::weights);
  code_ = TrackedBytes(a, kBnb4bitCodeBytes, MemoryTag::weights);
  std::memcpy(code_.data(), code.data(), sizeof(float) * code.size());
  std::vector<float> absmax(static_cast<std::size_t>(blocks), 0.0f);
  auto* packed = static_cast<std::uint8_t*>(values_.data());
  for (Count b = 0; b < blocks; ++b) {
    const Count lo = b * kBnb4bitBlock, hi = std::min(n, lo + kBnb4bitBlock);
    float m = 0;
    for (Count i = lo; i < hi; ++i) m = std::max(m, std::abs(w[i]));
    absmax[static_cast<std::size_t>(b)] = m;
    for (Count i = lo; i < hi; ++i) {
      const std::uint8_t q = nearest(code, m > 0 ? w[i] / m : 0.0f);
      // Two values per byte, the first in the high nibble (bitsandbytes' packing).
      packed[i / 2] |= static_cast<std::uint8_t>(i % 2 == 0 ? q << 4 : q);
    }
  }
  if (!double_quant) {
    absmax_ = TrackedBytes(a, blocks * 4, MemoryTag::weights);
    std::memcpy(absmax_.data(), absmax.data(), sizeof(float) * absmax.size());
    return;
  }
  // Double quantization: the absmax less its mean, in 8 bits per block of 256 absmax values.
  DISTPLAN_CHECK(nested_code != nullptr, "double quantization needs its code");
  const Count nested = (blocks + kBnbNestedBlock - 1) / kBnbNestedBlock;
  absmax_ = TrackedBytes(a, blocks, MemoryTag::weights);
  nested_absmax_ = TrackedBytes(a, nested * 4, MemoryTag::weights);
  offset_ = TrackedBytes(a, 4, MemoryTag::weights);
  double sum = 0;
  for (float v : absmax) sum += v;
  const auto mean = static_cast<float>(sum / static_cast<double>(blocks));
  std::memcpy(offset_.data(), &mean, 4);
  auto* q = static_cast<std::uint8_t*>(absmax_.data());
  auto* scale = static_cast<float*>(nested_absmax_.data());
  for (Count j = 0; j < nested; ++j) {
    const Count lo = j * kBnbNestedBlock, hi = std::min(blocks, lo + kBnbNestedBlock);
    float m = 0;
    for (Count b = lo; b < hi; ++b) m = std::max(m, std::abs(absmax[b] - mean));
    scale[j] = m;
    for (Count b = lo; b < hi; ++b) {
      const float v = m > 0 ? (absmax[static_cast<std::size_t>(b)] - mean) / m : 0.0f;
      q[b] =
          static_cast<std::uint8_t>(std::clamp(std::nearbyint((v + 1.0f) * 127.5f), 0.0f, 255.0f));
    }
  }
}

void QuantizedWeight::dequantize(float* out) const {
  const Count n = rows_ * cols_;
  if (storage_ == BaseStorage::int8) {
    const auto* cb = static_cast<const std::int8_t*>(values_.data());
    const auto* scb = static_cast<const float*>(absmax_.data());
    for (Count r = 0; r < rows_; ++r)
      for (Count c = 0; c < cols_; ++c)
        out[r * cols_ + c] = static_cast<float>(cb[r * cols_ + c]) * scb[r] / 127.0f;
    return;
  }
  const auto* code = static_cast<const float*>(code_.data());
  const auto* packed = static_cast<const std::uint8_t*>(values_.data());
  float mean = 0;
  if (double_quant_) std::memcpy(&mean, offset_.data(), 4);
  for (Count i = 0; i < n; ++i) {
    const Count b = i / kBnb4bitBlock;
    float m = 0;
    if (double_quant_) {
      const auto q = static_cast<const std::uint8_t*>(absmax_.data())[b];
      const float s = static_cast<const float*>(nested_absmax_.data())[b / kBnbNestedBlock];
      m = nested_code_[q] * s + mean;
    } else {
      m = static_cast<const float*>(absmax_.data())[b];
    }
    const std::uint8_t byte = packed[i / 2];
    const std::uint8_t idx = i % 2 == 0 ? byte >> 4 : byte & 0x0F;
    out[i] = code[idx] * m;
  }
}

}  // namespace distplan::backend
