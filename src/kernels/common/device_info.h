// What the kernels' host code needs to know about the current CUDA device (how many
// multiprocessors to spread work over, which architecture's features to use), asked of the
// driver once per device and cached.
#pragma once

namespace asynct::kernels {

struct DeviceInfo {
  int sm_count = 0;  // multiprocessors
  int major = 0;     // compute capability: 9 for Hopper
  int shared_memory_per_block_optin = 0;  // bytes a block may ask for (227 KB on H200)
};

// The current device's (cudaGetDevice) info.
const DeviceInfo& current_device_info();

}  // namespace asynct::kernels
