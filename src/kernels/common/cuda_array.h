// Owning, typed CUDA allocations for host code that keeps buffers: DeviceArray (cudaMalloc)
// and PinnedArray (cudaMallocHost: page-locked host memory, for what a runner copies between
// host and device every step; copies from it are true DMA transfers that run asynchronously on
// the stream, while from pageable memory the driver stages them through its own buffers).
// Allocating is slow, so the arrays grow and are then reused.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/common/cuda_check.h"

namespace asynct::kernels {

struct DeviceMemory {
  static constexpr bool kOnDevice = true;
  static void allocate(void** p, std::size_t bytes) { ASYNCT_CUDA_CHECK(cudaMalloc(p, bytes)); }
  static cudaError_t release(void* p) { return cudaFree(p); }
};

struct PinnedMemory {
  static constexpr bool kOnDevice = false;
  static void allocate(void** p, std::size_t bytes) { ASYNCT_CUDA_CHECK(cudaMallocHost(p, bytes)); }
  static cudaError_t release(void* p) { return cudaFreeHost(p); }
};

template <typename T, typename Memory>
class CudaArray {
 public:
  CudaArray() = default;
  explicit CudaArray(std::size_t count) { resize(count); }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;
  CudaArray(CudaArray&& o) noexcept { swap(o); }
  CudaArray& operator=(CudaArray&& o) noexcept {
    swap(o);
    return *this;
  }
  ~CudaArray() {
    if (data_) Memory::release(data_);
  }

  // Reallocates (contents are lost) when `count` is more than what is held. Not while a kernel
  // or a copy may still use the old memory.
  void reserve(std::size_t count) {
    if (count > count_) resize(count);
  }
  void resize(std::size_t count) {
    if (data_) ASYNCT_CUDA_CHECK(Memory::release(data_));
    data_ = nullptr;
    count_ = 0;
    if (count) Memory::allocate(reinterpret_cast<void**>(&data_), count * sizeof(T));
    count_ = count;
  }

  // Device arrays: copies host data in, on the stream (growing the array when needed).
  void upload(const T* host, std::size_t count, cudaStream_t stream)
    requires Memory::kOnDevice
  {
    reserve(count);
    if (count) ASYNCT_CUDA_CHECK(cudaMemcpyAsync(data_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  void upload(const std::vector<T>& host, cudaStream_t stream)
    requires Memory::kOnDevice
  {
    upload(host.data(), host.size(), stream);
  }

  T* get() const { return data_; }
  std::size_t size() const { return count_; }
  // Pinned arrays: the host can index them directly.
  T& operator[](std::size_t i) const
    requires(!Memory::kOnDevice)
  {
    return data_[i];
  }

 private:
  void swap(CudaArray& o) {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

template <typename T>
using DeviceArray = CudaArray<T, DeviceMemory>;
template <typename T>
using PinnedArray = CudaArray<T, PinnedMemory>;

}  // namespace asynct::kernels
