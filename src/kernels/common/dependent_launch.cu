#include "kernels/common/dependent_launch.cuh"

#include "kernels/common/device_info.h"
#include "kernels/common/tuning.h"

namespace asynct::kernels {

bool dependent_launch_enabled() {
  return kernel_tuning().dependent_launch && current_device_info().major >= 9;
}

}  // namespace asynct::kernels
