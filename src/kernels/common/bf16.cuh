// Device helpers for bf16 data: 16-byte vector loads/stores of 8 values, and conversions.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "kernels/common/bf16.h"

namespace asynct::kernels {

// 8 bf16 values, loaded and stored as one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 pair[4];
};

__device__ __forceinline__ Bf16x8 load_bf16x8(const __nv_bfloat16* p) {
  return *reinterpret_cast<const Bf16x8*>(p);
}
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* p, const Bf16x8& v) {
  *reinterpret_cast<Bf16x8*>(p) = v;
}
__device__ __forceinline__ void to_float8(const Bf16x8& v, float out[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(v.pair[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ Bf16x8 from_float8(const float in[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.pair[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return v;
}

}  // namespace asynct::kernels
