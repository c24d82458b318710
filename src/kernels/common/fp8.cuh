// Device conversions of the FP8 KV cache's e4m3 bytes (OCP e4m3fn, core/fp8.h is the CPU's):
// 8 values to bf16 exactly (every e4m3 value is a bf16 value), and 8 floats to e4m3 at a scale,
// rounded to nearest even and saturated to +-448 as the CPU side rounds them.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "kernels/common/bf16.cuh"

namespace asynct::kernels {

// Two e4m3 values, placed in the high bytes of a word's two halves, as a bf16 pair times 2^-120:
// each byte's sign and exponent-mantissa bits moved to a bf16's places (bf16's exponent bias is
// 120 more than e4m3's; subnormals map to subnormals), on the integer pipe, not the conversion
// instructions' quarter-rate pipe [F32]. e4m3's NaN (0x7f, 0xff) comes out as +-480 * 2^-120.
__device__ __forceinline__ unsigned e4m3_pair_to_bf16x2_bits_over_2p120(unsigned high_bytes) {
  return (high_bytes & 0x80008000u) | ((high_bytes & 0x7f007f00u) >> 4);
}

// Two e4m3 values as above, times 2^120 (exact) on the half-precision pipe: exact, but e4m3's
// NaN reads as +-480 (the decode kernel's tensor-core scores; see KvFp8 for why that is enough).
__device__ __forceinline__ __nv_bfloat162 e4m3_pair_to_bf16x2_nan_as_480(unsigned high_bytes) {
  const unsigned bits = e4m3_pair_to_bf16x2_bits_over_2p120(high_bytes);
  __nv_bfloat162 v;
  memcpy(&v, &bits, 4);
  return __hmul2(v, __float2bfloat162_rn(0x1p120f));
}

// Two e4m3 values as above, exactly, NaN kept.
__device__ __forceinline__ __nv_bfloat162 e4m3_pair_to_bf16x2(unsigned high_bytes) {
  constexpr unsigned kMagnitude = 0x7f007f00u;
  __nv_bfloat162 v = e4m3_pair_to_bf16x2_nan_as_480(high_bytes);
  unsigned out;
  memcpy(&out, &v, 4);
  out |= __vcmpeq2(high_bytes & kMagnitude, kMagnitude) & 0x7fc07fc0u;  // e4m3's NaN as bf16's
  memcpy(&v, &out, 4);
  return v;
}

// 8 e4m3 values (bytes 0..7 of raw, in order) as bf16, in order: exactly, or (kExact false)
// times 2^-120 with NaN read as +-480 * 2^-120, for readers that fold 2^120 into their scales.
template <bool kExact = true>
__device__ __forceinline__ Bf16x8 e4m3x8_to_bf16x8(uint2 raw) {
  Bf16x8 out;
  const unsigned high_bytes[4] = {
      __byte_perm(raw.x, 0u, 0x1404),  // bytes 0, 1 to the halves' high bytes
      __byte_perm(raw.x, 0u, 0x3424),  // bytes 2, 3
      __byte_perm(raw.y, 0u, 0x1404),
      __byte_perm(raw.y, 0u, 0x3424),
  };
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kExact) {
      out.pair[i] = e4m3_pair_to_bf16x2(high_bytes[i]);
    } else {
      const unsigned bits = e4m3_pair_to_bf16x2_bits_over_2p120(high_bytes[i]);
      memcpy(&out.pair[i], &bits, 4);
    }
  }
  return out;
}

// 8 floats divided by `scale`, as e4m3 bytes 0..7 in order (round to nearest even, saturating).
__device__ __forceinline__ uint2 float8_to_e4m3x8(const float in[8], float scale) {
  unsigned word[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    unsigned packed = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 pair = make_float2(in[4 * w + 2 * i] / scale, in[4 * w + 2 * i + 1] / scale);
      const unsigned two = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);  // low byte: pair.x
      packed |= (two & 0xffffu) << (16 * i);
    }
    word[w] = packed;
  }
  return make_uint2(word[0], word[1]);
}

// 8 floats as an e4m3 cache at `scale` holds them: e4m3(x / scale) * scale, in place.
__device__ __forceinline__ void round_through_e4m3(float (&x)[8], float scale) {
  to_float8(e4m3x8_to_bf16x8(float8_to_e4m3x8(x, scale)), x);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] *= scale;
}

}  // namespace asynct::kernels
