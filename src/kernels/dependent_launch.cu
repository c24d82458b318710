#include "kernels/dependent_launch.cuh"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "kernels/device_info.h"

namespace asynct::kernels {

bool dependent_launch_enabled() {
  static const bool wanted = [] {
    const char* value = std::getenv("ASYNCT_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return wanted && current_device_info().major >= 9;
}

void prefer_shared_carveout(const void* kernel) {
  static const int carveout = [] {
    const char* value = std::getenv("ASYNCT_CARVEOUT");
    return value == nullptr || *value == '\0' ? -1 : std::atoi(value);
  }();
  if (carveout < 0) return;
  static std::mutex mutex;
  static std::set<const void*> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (!done.insert(kernel).second) return;
  ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
}

}  // namespace asynct::kernels
