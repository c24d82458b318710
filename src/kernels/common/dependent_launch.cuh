// Programmatic dependent launch (Hopper): a decode step is a chain of short kernels, each
// waiting for the one before it. Launched normally, a kernel starts only when its predecessor
// has finished, so every boundary pays the launch and the ramp-up of the new grid. Launched
// with launch_dependent(), a kernel's CTAs may start as soon as every CTA of its predecessor has
// called allow_next_grid(), and do what does not depend on the predecessor (load weights,
// start the weight stream of a GEMM) before wait_for_prior_grids().
//
// The contract for a kernel launched this way: no global read of anything an earlier kernel
// writes, and no global write at all, before wait_for_prior_grids() (which returns once the
// predecessor has completed and its writes are visible). Every kernel here calls
// allow_next_grid() only after its own wait, so at most one grid waits ahead of a running one.
// On a kernel launched normally both calls return at once; before sm_90 they compile to
// nothing and launch_dependent() launches normally. KernelTuning::dependent_launch = false
// (common/tuning.h) turns the early launch off (for measuring it).
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"

namespace asynct::kernels {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device may start early: sm_90 or later, and not turned off
// (KernelTuning::dependent_launch, read at each launch).
bool dependent_launch_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before its predecessor ends
// (see the contract above).
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                      const char* name, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &early;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  ASYNCT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  check_launch(name);
}

}  // namespace asynct::kernels
