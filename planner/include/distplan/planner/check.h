// Always-on internal invariant checks. Bad *input* is reported with InputError at the edges;
// DISTPLAN_CHECK guards what must hold once input is valid, and aborts with a clear message.
#pragma once

namespace distplan::detail {
[[noreturn]] void check_failed(const char* expr, const char* msg, const char* func,
                               const char* file, int line);
}  // namespace distplan::detail

#define DISTPLAN_CHECK(expr, msg)                                                              \
  do {                                                                                         \
    if (!(expr)) ::distplan::detail::check_failed(#expr, (msg), __func__, __FILE__, __LINE__); \
  } while (0)
