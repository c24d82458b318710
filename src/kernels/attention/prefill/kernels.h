// The Hopper prefill kernel (prefill_hopper.cu), as launch_prefill (prefill.cu) sees it.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/prefill/prefill.h"

namespace asynct::kernels {

// Whether launch_prefill should run the Hopper kernel for these (validated) parameters: head_dim
// 128 on a Hopper device, unless prefill_kernel_override() says otherwise.
bool prefill_hopper_applies(const PrefillParams& params);

// Runs it; `scale` is the resolved score scale (> 0).
void launch_prefill_hopper(const PrefillParams& params, float scale, cudaStream_t stream);

}  // namespace asynct::kernels
