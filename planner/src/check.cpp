#include "distplan/planner/check.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "distplan/planner/checked.h"
#include "distplan/planner/error.h"

namespace distplan::detail {

void check_failed(const char* expr, const char* msg, const char* func, const char* file, int line) {
  std::fprintf(stderr, "distplan: internal check failed: %s (%s) in %s at %s:%d\n", msg, expr, func,
               file, line);
  std::abort();
}

}  // namespace distplan::detail

namespace distplan {

void bytes_overflow(const char* path, const char* what) {
  throw InputError(path, fmt::format("{} exceed the 2^63 - 1 = 9.2e18 bytes a 64-bit count holds; "
                                     "distplan refuses rather than wrap (docs/limits.md)",
                                     what));
}

}  // namespace distplan
