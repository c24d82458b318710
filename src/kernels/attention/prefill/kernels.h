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

// Whether the Hopper kernel copies these parameters' tiles of new tokens with tensor copies (the
// driver took its tensor maps of `key` and `value`); else its threads copy them with cp.async.
bool prefill_hopper_tensor_copies(const PrefillParams& params);

// How many CTAs each kernel splits a query tile's keys over (1: none; split_keys.cuh): the
// workspace their parts take is prefill::split_workspace_bytes.
int prefill_hopper_kv_splits(const PrefillParams& params);
int prefill_portable_kv_splits(const PrefillParams& params);

}  // namespace asynct::kernels
