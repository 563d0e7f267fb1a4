// Unit-carrying aliases used across distplan. JSON carries bytes and seconds; people see GiB and
// ms.
#pragma once

#include <cstdint>

namespace distplan {

/// A byte count. Signed 64-bit: holds 9.2e18, far above any per-GPU or per-step figure that
/// validation admits (see docs/limits.md).
using Bytes = std::int64_t;
/// A count of parameters or elements.
using Count = std::int64_t;
/// Wall-clock time in seconds.
using Seconds = double;
/// Floating-point operations (a count, not a rate).
using Flops = double;
using FlopsPerSecond = double;
using BytesPerSecond = double;

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double to_gib(Bytes b) {
  return static_cast<double>(b) / kGiB;
}

}  // namespace distplan
