#include "kernels/common/dependent_launch.cuh"

#include <cstdlib>
#include <cstring>

#include "kernels/common/device_info.h"

namespace asynct::kernels {

bool dependent_launch_enabled() {
  static const bool wanted = [] {
    const char* value = std::getenv("ASYNCT_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return wanted && current_device_info().major >= 9;
}

}  // namespace asynct::kernels
