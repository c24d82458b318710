#include "kernels/common/device_info.h"

#include <mutex>

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/common/cuda_check.h"

namespace asynct::kernels {

const DeviceInfo& current_device_info() {
  constexpr int kMaxDevices = 64;
  static DeviceInfo cached[kMaxDevices];
  static std::once_flag asked[kMaxDevices];
  int device = 0;
  ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
  check(device >= 0 && device < kMaxDevices, "CUDA device ", device, " beyond the ", kMaxDevices, " supported");
  std::call_once(asked[device], [device] {
    DeviceInfo& info = cached[device];
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device));
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
    ASYNCT_CUDA_CHECK(
        cudaDeviceGetAttribute(&info.shared_memory_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  });
  return cached[device];
}

}  // namespace asynct::kernels
