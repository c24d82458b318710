// The vector kernels' target: on x86-64, the intrinsics and AVX2, a function attribute compiling
// one function for AVX2 + FMA + F16C (chosen at run time: kernels.h, vector_kernels()), and
// ASYNCT_X86 to guard them; elsewhere neither is defined and the plain C++ forms run.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#define ASYNCT_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#endif
