// Which devices this build and machine offer.
#include "distplan/gpu_backend/run.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {

bool cuda_available() noexcept {
#ifdef DISTPLAN_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

}  // namespace distplan::backend
