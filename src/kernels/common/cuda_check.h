// Checked CUDA runtime calls for host code: a failure becomes asynct::Error naming the call.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "core/error.h"

#define ASYNCT_CUDA_CHECK(call)                                                               \
  do {                                                                                        \
    cudaError_t status_ = (call);                                                             \
    if (status_ != cudaSuccess)                                                               \
      throw ::asynct::Error(std::string(#call) + " failed: " + cudaGetErrorString(status_));  \
  } while (0)

namespace asynct {

// Raises a kernel's dynamic shared-memory limit to `bytes` (beyond the default 48 KB), once per
// kernel rather than on every launch: the call costs host time on the decode hot path. The
// attribute belongs to the current device; asynct runs one device per process.
template <auto kKernel>
void allow_dynamic_smem(int bytes) {
  static const bool done = [bytes] {
    ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)done;
}

// After a kernel launch: turns a launch error into asynct::Error.
inline void check_launch(const char* kernel) {
  cudaError_t status = cudaGetLastError();
  check(status == cudaSuccess, kernel, ": launch failed: ", cudaGetErrorString(status));
}

}  // namespace asynct
