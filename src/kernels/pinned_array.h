// An owning, typed page-locked host allocation (cudaMallocHost), for what a runner copies
// between host and device every step: copies from pinned memory are true DMA transfers that
// run asynchronously on the stream; from pageable memory the driver stages them through its
// own buffers. Allocating pinned memory is slow, so it grows and is then reused.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime_api.h>

#include "kernels/cuda_check.h"

namespace asynct::kernels {

template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& o) noexcept { swap(o); }
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    swap(o);
    return *this;
  }
  ~PinnedArray() {
    if (data_) cudaFreeHost(data_);
  }

  // Reallocates (contents are lost) when `count` is more than what is held. Not while a copy
  // into or out of the old memory may still be running.
  void reserve(std::size_t count) {
    if (count <= count_) return;
    if (data_) ASYNCT_CUDA_CHECK(cudaFreeHost(data_));
    data_ = nullptr;
    count_ = 0;
    ASYNCT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    count_ = count;
  }

  T* get() const { return data_; }
  std::size_t size() const { return count_; }
  T& operator[](std::size_t i) const { return data_[i]; }

 private:
  void swap(PinnedArray& o) {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace asynct::kernels
