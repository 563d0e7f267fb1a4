// A working array of one device: host memory on Device::cpu, device memory on Device::cuda. The
// trainer's activations, their gradients and the ops' scratch live in these from the first
// forward to the optimizer step; dev:: ops (device_ops.h) read and write them where they are,
// and only explicit to_host()/from_host() calls cross to the host. Copies stay on the device.
// Elements start at zero. On CUDA the memory comes from the block cache of cuda::pool_alloc
// (cuda.h), outside the tracking allocator, as the CPU path's working arrays are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "distplan/gpu_backend/memory.h"
#include "distplan/planner/units.h"

namespace distplan::backend {

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  /// n zeros on device d.
  DeviceArray(Device d, Count n);
  [[nodiscard]] static DeviceArray from_host(Device d, const T* host, Count n);
  [[nodiscard]] static DeviceArray from_host(Device d, const std::vector<T>& host) {
    return from_host(d, host.data(), static_cast<Count>(host.size()));
  }
  DeviceArray(const DeviceArray& o);
  DeviceArray& operator=(const DeviceArray& o);
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    DeviceArray tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~DeviceArray() { release(); }

  /// All elements copied to the host.
  [[nodiscard]] std::vector<T> to_host() const;
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  [[nodiscard]] Device device() const noexcept { return dev_; }
  /// Memory of device(): not dereferenceable on the host under Device::cuda.
  [[nodiscard]] T* data() noexcept { return p_; }
  [[nodiscard]] const T* data() const noexcept { return p_; }

 private:
  void release() noexcept;
  void swap(DeviceArray& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }
  Device dev_ = Device::cpu;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

using DeviceFloats = DeviceArray<float>;
using DeviceIds = DeviceArray<std::int32_t>;

extern template class DeviceArray<float>;
extern template class DeviceArray<std::int32_t>;

}  // namespace distplan::backend
