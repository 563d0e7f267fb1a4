#include "distplan/gpu_backend/tensor.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "distplan/planner/check.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {

std::uint16_t float_to_bf16(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  const std::uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; round to nearest even.
std::uint16_t float_to_fp16(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000;
  const std::uint32_t abs = u & 0x7FFFFFFF;
  if (abs >= 0x7F800000)
    return static_cast<std::uint16_t>(sign | (abs > 0x7F800000 ? 0x7E00 : 0x7C00));
  if (abs >= 0x477FF000) return static_cast<std::uint16_t>(sign | 0x7C00);  // rounds past 65504
  if (abs < 0x38800000) {  // subnormal in fp16 (below 2^-14)
    const float a = std::bit_cast<float>(abs);
    const float scaled = a * 16777216.0f;  // 2^24: fp16 subnormal step is 2^-24
    const auto m = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return static_cast<std::uint16_t>(sign | m);
  }
  std::uint32_t m = abs + 0xC8000000;  // rebias exponent: (127 - 15) << 23
  m += 0x0FFF + ((m >> 13) & 1);
  return static_cast<std::uint16_t>(sign | (m >> 13));
}

float fp16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1F;
  const std::uint32_t man = h & 0x3FF;
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000 | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

float round_to(DType dtype, float f) noexcept {
  switch (dtype) {
    case DType::fp32:
      return f;
    case DType::bf16:
      return bf16_to_float(float_to_bf16(f));
    case DType::fp16:
      return fp16_to_float(float_to_fp16(f));
  }
  return f;
}

Tensor::Tensor(TrackingAllocator& alloc, std::vector<Count> shape, DType dtype, MemoryTag tag)
    : alloc_(&alloc), shape_(std::move(shape)), dtype_(dtype), tag_(tag) {
  numel_ = 1;
  for (Count d : shape_) {
    DISTPLAN_CHECK(d >= 0, "negative dimension");
    numel_ *= d;
  }
  data_ = alloc_->allocate(bytes(), tag_);
}

void Tensor::release() noexcept {
  if (data_ != nullptr) alloc_->deallocate(data_, bytes(), tag_);
  data_ = nullptr;
  numel_ = 0;
  shape_.clear();
}

float* Tensor::f32() {
  DISTPLAN_CHECK(dtype_ == DType::fp32, "tensor is not fp32");
  return static_cast<float*>(data_);
}
const float* Tensor::f32() const {
  DISTPLAN_CHECK(dtype_ == DType::fp32, "tensor is not fp32");
  return static_cast<const float*>(data_);
}

void Tensor::read(float* out, Count n, Count offset) const {
  DISTPLAN_CHECK(offset >= 0 && offset + n <= numel_, "read out of range");
  // An empty read (an expert that received no tokens) may come with a null `out`.
  if (n == 0) return;
  if (alloc_ != nullptr && alloc_->device() == Device::cuda) {
#ifdef DISTPLAN_HAVE_CUDA
    cuda::read_as_float(data_, static_cast<int>(dtype_), offset, n, out);
    return;
#endif
  }
  if (dtype_ == DType::fp32) {
    std::memcpy(out, static_cast<const float*>(data_) + offset, static_cast<std::size_t>(n) * 4);
    return;
  }
  const auto* s = static_cast<const std::uint16_t*>(data_) + offset;
  if (dtype_ == DType::bf16) {
    for (Count i = 0; i < n; ++i) out[i] = bf16_to_float(s[i]);
  } else {
    for (Count i = 0; i < n; ++i) out[i] = fp16_to_float(s[i]);
  }
}

void Tensor::write(const float* in, Count n, Count offset) {
  DISTPLAN_CHECK(offset >= 0 && offset + n <= numel_, "write out of range");
  if (n == 0) return;
  if (alloc_ != nullptr && alloc_->device() == Device::cuda) {
#ifdef DISTPLAN_HAVE_CUDA
    cuda::write_from_float(data_, static_cast<int>(dtype_), offset, n, in);
    return;
#endif
  }
  if (dtype_ == DType::fp32) {
    std::memcpy(static_cast<float*>(data_) + offset, in, static_cast<std::size_t>(n) * 4);
    return;
  }
  auto* d = static_cast<std::uint16_t*>(data_) + offset;
  if (dtype_ == DType::bf16) {
    for (Count i = 0; i < n; ++i) d[i] = float_to_bf16(in[i]);
  } else {
    for (Count i = 0; i < n; ++i) d[i] = float_to_fp16(in[i]);
  }
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> v(static_cast<std::size_t>(numel_));
  read(v.data(), numel_);
  return v;
}

void Tensor::zero() {
  if (alloc_ != nullptr && alloc_->device() == Device::cuda) {
#ifdef DISTPLAN_HAVE_CUDA
    if (data_ != nullptr) cuda::zero_on_device(data_, static_cast<std::size_t>(bytes()));  // +0.0
    return;
#endif
  }
  std::vector<float> z(static_cast<std::size_t>(numel_), 0.0f);
  write(z.data(), numel_);
}

}  // namespace distplan::backend
