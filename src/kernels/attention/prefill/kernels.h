// The two prefill kernels as launch_prefill (prefill.cu) sees them: the portable mma.sync kernel
// (portable.cu) and the Hopper wgmma kernel (hopper.cu). `scale` is the resolved score scale
// (> 0); the parameters are validated.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/prefill/prefill.h"

namespace asynct::kernels {

void launch_prefill_portable(const PrefillParams& params, float scale, cudaStream_t stream);

// Whether launch_prefill should run the Hopper kernel for these parameters: head_dim 128 on a
// Hopper device, unless KernelTuning::prefill forces the portable kernel.
bool prefill_hopper_applies(const PrefillParams& params);

void launch_prefill_hopper(const PrefillParams& params, float scale, cudaStream_t stream);

// The Hopper kernel's split of each query tile's keys over CTAs (1: none), and the workspace its
// partial outputs take (0 for 1).
int prefill_hopper_kv_splits(const PrefillParams& params);
std::size_t prefill_hopper_workspace_bytes(const PrefillParams& params, int splits);

}  // namespace asynct::kernels
