// The kernels' storage type for activations, weights and the KV cache: bf16 (host and device).
#pragma once

#include <cuda_bf16.h>

namespace asynct::kernels {

using bf16 = __nv_bfloat16;

}  // namespace asynct::kernels
