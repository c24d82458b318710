#include "kernels/dependent_launch.cuh"

#include <cstdlib>
#include <cstring>

namespace asynct::kernels {

bool dependent_launch_enabled() {
  static const bool wanted = [] {
    const char* value = std::getenv("ASYNCT_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  static int cached[64] = {};  // per device: 0 unknown, 1 no, 2 yes
  int device = 0;
  ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
  int& known = cached[device % 64];
  if (known == 0) {
    int major = 0;
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    known = major >= 9 ? 2 : 1;
  }
  return wanted && known == 2;
}

}  // namespace asynct::kernels
