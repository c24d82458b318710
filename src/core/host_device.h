// ASYNCT_HOST_DEVICE marks a function that host and device code both call (core's small
// helpers that kernels share with the CPU reference); plain inline for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define ASYNCT_HOST_DEVICE __host__ __device__
#else
#define ASYNCT_HOST_DEVICE
#endif
