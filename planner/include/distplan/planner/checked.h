// Byte sums that must not wrap (issue 29, item 1; docs/limits.md, "Why there are magnitude
// bounds"). Validation keeps every figure below 1e18 bytes; where categories, calls and stages
// add up, these refuse a sum past 2^63 - 1 at the field that drives it instead of wrapping to a
// negative count ("fits: true" with a peak of 0). Cheap enough for the estimate's hot path: one
// flag test per operation.
#pragma once

#include "distplan/planner/units.h"

namespace distplan {

/// Throws InputError at `path`: `what` would exceed the 2^63 - 1 bytes an int64 holds.
[[noreturn]] void bytes_overflow(const char* path, const char* what);

[[nodiscard]] inline Bytes add_bytes(Bytes a, Bytes b, const char* path, const char* what) {
  Bytes r = 0;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    bytes_overflow(path, what);
  return r;
}

[[nodiscard]] inline Bytes mul_bytes(Bytes a, Count n, const char* path, const char* what) {
  Bytes r = 0;
  if (__builtin_mul_overflow(a, n, &r)) [[unlikely]]
    bytes_overflow(path, what);
  return r;
}

}  // namespace distplan
