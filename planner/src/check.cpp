#include "distplan/planner/check.h"

#include <cstdio>
#include <cstdlib>

namespace distplan::detail {

void check_failed(const char* expr, const char* msg, const char* func, const char* file, int line) {
  std::fprintf(stderr, "distplan: internal check failed: %s (%s) in %s at %s:%d\n", msg, expr, func,
               file, line);
  std::abort();
}

}  // namespace distplan::detail
