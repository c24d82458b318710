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

// After a kernel launch: turns a launch error into asynct::Error.
inline void check_launch(const char* kernel) {
  cudaError_t status = cudaGetLastError();
  check(status == cudaSuccess, kernel, ": launch failed: ", cudaGetErrorString(status));
}

}  // namespace asynct
