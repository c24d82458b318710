// Per-row norm arithmetic on the device and one attention head's q/k norm and neox RoPE, as the
// norm kernels (norms.cu, qk_norm_rope.cu) and the decode kernel that reads the qkv projection
// itself (attention/decode/projection.cuh) both do it.
//
// A head of HEAD_DIM values is held by HEAD_DIM / 8 consecutive lanes, 8 values each, so its sum
// of squares is a reduction over those lanes. Two layouts: in the decode kernel lane j of the
// head holds values 8j .. 8j + 7 (the layout of its keys), so a value's RoPE partner
// (i +- HEAD_DIM / 2) sits HEAD_DIM / 16 lanes away, a lane XOR (head_rope8); the q/k norm kernel
// holds RoPE pairs instead (load_pairs, rope_pairs) and rotates without exchanging values.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/bf16.cuh"
#include "kernels/gemm/linear_output.h"

namespace asynct::kernels {

constexpr int kMaxRopeHeadDim = 256;

// inv_freq_i / (2 pi) = theta^(-2i/head_dim) / (2 pi) per frequency, computed on the host in
// double (so the kernels skip a double exp2 per frequency); 1 KiB of kernel parameters.
struct RopeTurns {
  double per_position[kMaxRopeHeadDim / 2];

  // Successive powers of theta^(-2/head_dim): one pow per launch (a pow per frequency measured
  // ~2 us of host time per launch); the product's error stays ~1e-14 relative.
  static RopeTurns of(int head_dim, float theta) {
    RopeTurns t{};
    const double ratio = std::pow(double(theta), -2.0 / head_dim);
    double turns = 1.0 / 6.283185307179586477;
    for (int i = 0; i < head_dim / 2; ++i, turns *= ratio) t.per_position[i] = turns;
    return t;
  }
};

#ifdef __CUDACC__

// (cos, sin) of frequency i at `position`. Angles reach ~1e5 rad at long positions, where fp32's
// position * inv_freq alone is off by up to ~5e-3 rad; so the angle is formed in double, as
// turns, and reduced to [-1/2, 1/2] turn (error ~1e-11) before the fp32 sin/cos (~1e-7).
__device__ __forceinline__ float2 rope_rotation(const RopeTurns& t, std::int64_t position, int i) {
  const double turns = double(position) * t.per_position[i];
  float s, c;
  sincospif(2.0f * float(turns - rint(turns)), &s, &c);
  return make_float2(c, s);
}

// Sum over aligned groups of WIDTH lanes (a power of two <= 32); every lane gets its group's
// sum. All 32 lanes of the warp must call it.
template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ void load8(const bf16* p, float (&x)[8]) { to_float8(load_bf16x8(p), x); }
__device__ __forceinline__ void store8(bf16* p, const float (&x)[8]) { store_bf16x8(p, from_float8(x)); }
// The same for an fp32 row (the residual stream, norms.h): two 16-byte accesses.
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}

__device__ __forceinline__ float sum_squares8(const float (&x)[8]) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(x[i], x[i], s);
  return s;
}

__device__ __forceinline__ float inv_rms(float sum_squares, float inv_count, float eps) {
  return rsqrtf(fmaf(sum_squares, inv_count, eps));
}

// x = w * clamp(x * inv_rms, -clip, clip) for 8 values and their 8 weights. An infinite clip
// leaves the clamp a no-op, which makes this RMSNorm.
__device__ __forceinline__ void apply_norm8(float (&x)[8], const Bf16x8& w, float inv_rms, float clip) {
  float wf[8];
  to_float8(w, wf);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = wf[i] * fminf(fmaxf(x[i] * inv_rms, -clip), clip);
}
__device__ __forceinline__ void apply_norm8(float (&x)[8], const bf16* w, float inv_rms, float clip) {
  apply_norm8(x, load_bf16x8(w), inv_rms, clip);
}

// 4 * kVectors values of a split product at element offset `at`: the splits' fp32 values added
// in split order. All the splits' loads are issued before the first add (the loop is unrolled to
// the most splits there can be): a chain of one L2 trip per split would cost more than the GEMM
// epilogue it replaces. Past `valid` nothing is read and x is zero.
template <int kVectors>
__device__ __forceinline__ void load_split(const LinearOutput& in, std::int64_t at, bool valid,
                                           float (&x)[4 * kVectors]) {
  float4 loaded[kMaxLinearSplits][kVectors];
#pragma unroll
  for (int s = 0; s < kMaxLinearSplits; ++s) {
    if (s < in.splits && valid) {
      const float4* from = reinterpret_cast<const float4*>(in.partials + s * in.split_stride + at);
#pragma unroll
      for (int v = 0; v < kVectors; ++v) loaded[s][v] = __ldcg(from + v);
    }
  }
#pragma unroll
  for (int i = 0; i < 4 * kVectors; ++i) x[i] = 0.0f;
#pragma unroll
  for (int s = 0; s < kMaxLinearSplits; ++s) {
    if (s < in.splits && valid) {
#pragma unroll
      for (int v = 0; v < kVectors; ++v) {
        const float4 a = loaded[s][v];
        x[4 * v] += a.x, x[4 * v + 1] += a.y, x[4 * v + 2] += a.z, x[4 * v + 3] += a.w;
      }
    }
  }
}
__device__ __forceinline__ void load_split8(const LinearOutput& in, std::int64_t at, bool valid, float (&x)[8]) {
  load_split<2>(in, at, valid, x);
}

// 8 values at each of kSets offsets of a product's output, dense bf16 or split partial sums
// (added in split order, as load_split8 does). Every set's loads are issued together, two
// splits at a time, so the wait is one L2 round trip per two splits rather than one per set.
template <int kSets>
__device__ __forceinline__ void load_outputs8(const LinearOutput& in, const std::int64_t (&at)[kSets],
                                              float (&x)[kSets][8]) {
  if (!in.is_split()) {
    Bf16x8 loaded[kSets];
#pragma unroll
    for (int i = 0; i < kSets; ++i) loaded[i] = load_bf16x8(in.dense + at[i]);
#pragma unroll
    for (int i = 0; i < kSets; ++i) to_float8(loaded[i], x[i]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kSets; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) x[i][e] = 0.0f;
  for (int s = 0; s < in.splits; s += 2) {
    const bool second = s + 1 < in.splits;
    float4 loaded[2][kSets][2];
#pragma unroll
    for (int i = 0; i < kSets; ++i) {
      const float4* from = reinterpret_cast<const float4*>(in.partials + s * in.split_stride + at[i]);
      loaded[0][i][0] = __ldcg(from);
      loaded[0][i][1] = __ldcg(from + 1);
      if (second) {
        loaded[1][i][0] = __ldcg(from + in.split_stride / 4);
        loaded[1][i][1] = __ldcg(from + in.split_stride / 4 + 1);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (j == 1 && !second) break;
#pragma unroll
      for (int i = 0; i < kSets; ++i) {
        const float4 a = loaded[j][i][0], b = loaded[j][i][1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) x[i][e] += v[e];
      }
    }
  }
}

// The head's norm: x = norm(x) with this lane's 8 weights (`weight` points at them).
template <int HEAD_DIM>
__device__ __forceinline__ void head_norm8(float (&x)[8], const bf16* weight, float eps, float clip) {
  const float inv = inv_rms(group_sum<HEAD_DIM / 8>(sum_squares8(x)), 1.0f / HEAD_DIM, eps);
  apply_norm8(x, weight, inv, clip);
}

// The head's neox RoPE (rotate_half): first half x cos - partner sin, second half x cos + partner
// sin. rotation[i] is (cos, sin) of this lane's value i's frequency, (8 lane + i) % (HEAD_DIM / 2).
template <int HEAD_DIM>
__device__ __forceinline__ void head_rope8(float (&x)[8], int lane_in_head, const float2 (&rotation)[8]) {
  constexpr int kPartner = HEAD_DIM / 16;
  float partner[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) partner[i] = __shfl_xor_sync(0xffffffffu, x[i], kPartner);
  const float sign = lane_in_head < kPartner ? -1.0f : 1.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = fmaf(sign * partner[i], rotation[i].y, x[i] * rotation[i].x);
}

// ---- A head in RoPE pairs (the q/k norm kernel's layout) ----------------------------------
// Lane j of a head (HEAD_DIM / 8 lanes) holds values 4j .. 4j + 3 of the head's first half and
// their RoPE partners HEAD_DIM / 2 + 4j .. + 3, as x[0..3] and x[4..7]: neox RoPE then rotates
// each pair inside the lane, with no exchange between lanes (head_rope8's layout needs 8
// shuffles per head and lane).

// The lane's 8 values of the head whose first value is at `head`, in pair order.
template <int HEAD_DIM>
__device__ __forceinline__ Bf16x8 load_pairs(const bf16* head, int j) {
  Bf16x8 v;
  *reinterpret_cast<uint2*>(&v.pair[0]) = *reinterpret_cast<const uint2*>(head + 4 * j);
  *reinterpret_cast<uint2*>(&v.pair[2]) = *reinterpret_cast<const uint2*>(head + HEAD_DIM / 2 + 4 * j);
  return v;
}
template <int HEAD_DIM>
__device__ __forceinline__ void store_pairs(bf16* head, int j, const Bf16x8& v) {
  *reinterpret_cast<uint2*>(head + 4 * j) = *reinterpret_cast<const uint2*>(&v.pair[0]);
  *reinterpret_cast<uint2*>(head + HEAD_DIM / 2 + 4 * j) = *reinterpret_cast<const uint2*>(&v.pair[2]);
}
// The same from a split product, the head's first value at element offset `head`.
template <int HEAD_DIM>
__device__ __forceinline__ void load_split_pairs(const LinearOutput& in, std::int64_t head, int j, float (&x)[8]) {
  float first[4], second[4];
  load_split<1>(in, head + 4 * j, true, first);
  load_split<1>(in, head + HEAD_DIM / 2 + 4 * j, true, second);
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = first[e], x[4 + e] = second[e];
}

// The head's norm in either layout (the weights in the same order as x).
template <int HEAD_DIM>
__device__ __forceinline__ void head_norm8(float (&x)[8], const Bf16x8& weight, float eps, float clip) {
  const float inv = inv_rms(group_sum<HEAD_DIM / 8>(sum_squares8(x)), 1.0f / HEAD_DIM, eps);
  apply_norm8(x, weight, inv, clip);
}

// neox RoPE on pairs: rotation[e] is (cos, sin) of frequency 4j + e.
__device__ __forceinline__ void rope_pairs(float (&x)[8], const float2 (&rotation)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float a = x[e], b = x[4 + e];
    x[e] = fmaf(a, rotation[e].x, -b * rotation[e].y);
    x[4 + e] = fmaf(b, rotation[e].x, a * rotation[e].y);
  }
}

#endif  // __CUDACC__

}  // namespace asynct::kernels
