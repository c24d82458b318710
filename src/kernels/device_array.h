// An owning, typed device allocation (cudaMalloc), for host code that keeps buffers.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda_check.h"

namespace asynct::kernels {

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) { resize(count); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    swap(o);
    return *this;
  }
  ~DeviceArray() {
    if (data_) cudaFree(data_);
  }

  // Reallocates (contents are lost) when `count` is more than what is held.
  void reserve(std::size_t count) {
    if (count > count_) resize(count);
  }
  void resize(std::size_t count) {
    if (data_) ASYNCT_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    count_ = count;
    if (count) ASYNCT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  void upload(const T* host, std::size_t count, cudaStream_t stream) {
    reserve(count);
    if (count) ASYNCT_CUDA_CHECK(cudaMemcpyAsync(data_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  void upload(const std::vector<T>& host, cudaStream_t stream) { upload(host.data(), host.size(), stream); }

  T* get() const { return data_; }
  std::size_t size() const { return count_; }

 private:
  void swap(DeviceArray& o) {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace asynct::kernels
