// GPU test plumbing: checked CUDA calls, a device buffer that is poisoned (every byte 0xFF,
// a NaN in bf16, fp16 and fp32) before a kernel writes it, and uploads/downloads that convert
// between the host float32 reference tensors and the device's bf16/fp32 arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/tensor.h"
#include "kernels/common/cuda_check.h"

namespace asynct::testing {

// After a launch: the launch error, then the kernel's own (synchronising).
inline void check_launch(const char* what) {
  ::asynct::check_launch(what);
  cudaError_t run = cudaDeviceSynchronize();
  check(run == cudaSuccess, what, ": kernel failed: ", cudaGetErrorString(run));
}

// A typed device array shaped like a host tensor. Owns its memory.
class DeviceBuffer {
 public:
  DeviceBuffer(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_ = std::size_t(shape_numel(shape_)) * dtype_size(dtype_);
    if (bytes_) ASYNCT_CUDA_CHECK(cudaMalloc(&data_, bytes_));
  }
  // A device copy of a host tensor, converted to `dtype` (e.g. float32 reference -> bf16).
  static DeviceBuffer upload(const Tensor& host, DType dtype) {
    DeviceBuffer b(dtype, host.shape());
    Tensor converted = host.dtype() == dtype ? host : host.to(dtype);
    if (b.bytes_) ASYNCT_CUDA_CHECK(cudaMemcpy(b.data_, converted.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    dtype_ = o.dtype_;
    shape_ = o.shape_;
    return *this;
  }
  ~DeviceBuffer() { if (data_) cudaFree(data_); }

  // Fills every byte with 0xFF: NaN for every float type, -1 for integers.
  void poison() { if (bytes_) ASYNCT_CUDA_CHECK(cudaMemset(data_, 0xFF, bytes_)); }

  Tensor download() const {
    Tensor host = Tensor::empty(dtype_, shape_);
    if (bytes_) ASYNCT_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }
  // The contents as a float32 host tensor (for comparison with a reference).
  Tensor download_float() const { return download().to(DType::F32); }

  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  void* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_numel(shape_); }
  // A borrowed cuda Tensor over this memory (what the kernel entry points take).
  Tensor view() const { return Tensor::borrow(data_, dtype_, shape_, Device::CUDA); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  DType dtype_ = DType::F32;
  Shape shape_;
};

// Fails the test (not skip) when no GPU is visible: a GPU test that cannot run is a failure.
inline void require_gpu() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  ASSERT_TRUE(status == cudaSuccess && count > 0)
      << "no CUDA device (" << cudaGetErrorString(status) << "); GPU tests need one";
}

}  // namespace asynct::testing
