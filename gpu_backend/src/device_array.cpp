#include "distplan/gpu_backend/device_array.h"

#include <algorithm>
#include <cstring>

#include "distplan/planner/check.h"

#ifdef DISTPLAN_HAVE_CUDA
#include "cuda_api.h"
#endif

namespace distplan::backend {
namespace {

template <class T>
T* allocate(Device d, std::size_t n) {
  if (n == 0) return nullptr;
#ifdef DISTPLAN_HAVE_CUDA
  if (d == Device::cuda) return static_cast<T*>(cuda::pool_alloc(n * sizeof(T)));
#endif
  DISTPLAN_CHECK(d == Device::cpu, "a CUDA working array in a build without CUDA");
  return new T[n]();
}

template <class T>
void copy(Device d, T* dst, const T* src, std::size_t n, int kind /* 0 dev-dev, 1 h-d, 2 d-h */) {
  if (n == 0) return;
#ifdef DISTPLAN_HAVE_CUDA
  if (d == Device::cuda) {
    if (kind == 0) return cuda::copy_on_device(dst, src, n * sizeof(T));
    if (kind == 1) return cuda::copy_to_device(dst, src, n * sizeof(T));
    return cuda::copy_to_host(dst, src, n * sizeof(T));
  }
#endif
  (void)d;
  (void)kind;
  std::memcpy(dst, src, n * sizeof(T));
}

}  // namespace

template <class T>
DeviceArray<T>::DeviceArray(Device d, Count n) : dev_(d) {
  DISTPLAN_CHECK(n >= 0, "negative working array size");
  n_ = static_cast<std::size_t>(n);
  p_ = allocate<T>(d, n_);
}

template <class T>
DeviceArray<T> DeviceArray<T>::from_host(Device d, const T* host, Count n) {
  DeviceArray a(d, n);
  copy(d, a.p_, host, a.n_, 1);
  return a;
}

template <class T>
DeviceArray<T>::DeviceArray(const DeviceArray& o) : DeviceArray(o.dev_, static_cast<Count>(o.n_)) {
  copy(dev_, p_, o.p_, n_, 0);
}

template <class T>
DeviceArray<T>& DeviceArray<T>::operator=(const DeviceArray& o) {
  if (this != &o) {
    DeviceArray tmp(o);
    swap(tmp);
  }
  return *this;
}

template <class T>
std::vector<T> DeviceArray<T>::to_host() const {
  std::vector<T> h(n_);
  copy(dev_, h.data(), p_, n_, 2);
  return h;
}

template <class T>
void DeviceArray<T>::release() noexcept {
  if (p_ == nullptr) return;
#ifdef DISTPLAN_HAVE_CUDA
  if (dev_ == Device::cuda) {
    cuda::pool_free(p_, n_ * sizeof(T));
    p_ = nullptr;
    n_ = 0;
    return;
  }
#endif
  delete[] p_;
  p_ = nullptr;
  n_ = 0;
}

template class DeviceArray<float>;
template class DeviceArray<std::int32_t>;

}  // namespace distplan::backend
