// The decode kernel's split combine (decode.cu): with several splits, the last CTA of a (head
// group, sequence) to arrive adds up every split's partial output.
#pragma once

#include <cfloat>

#include "kernels/attention/decode/traits.cuh"

namespace asynct::kernels::decode {

// Waits for the CTA's consumer warps only (the producer warp may have left).
__device__ __forceinline__ void consumer_barrier(int warps) {
  asm volatile("bar.sync 1, %0;" ::"r"(warps * 32) : "memory");
}

// The last split of a (head group, sequence): adds up every split's part of this warp's query
// heads, in split order, into the bf16 output. Softmax parts are weighted by exp(max_s - max)
// over the total of the parts' sums (an empty split, max -FLT_MAX and sum 0, weighs 0).
template <int kHeadDim, int kGroup, bool kSoftmax>
__device__ void combine_splits(const Stage1Args& a, int splits, long long first_row) {
  constexpr int kPerLane = kHeadDim / 32;
  static_assert(kPerLane % 2 == 0, "whole float2s per lane");
  const int lane = threadIdx.x & 31;
  const long long rows = (long long)a.p.num_seqs * a.p.num_q_heads;
#pragma unroll 1
  for (int h = 0; h < kGroup; ++h) {
    const long long row = first_row + h;
    float row_max = -FLT_MAX, inv_denom = 1.0f;
    if constexpr (kSoftmax) {
      for (int s = lane; s < splits; s += 32) row_max = fmaxf(row_max, __ldcg(a.partial_max + s * rows + row));
#pragma unroll
      for (int off = 16; off; off >>= 1) row_max = fmaxf(row_max, __shfl_xor_sync(kFull, row_max, off));
      float denom = 0.0f;
      for (int s = lane; s < splits; s += 32)
        denom += __expf(__ldcg(a.partial_max + s * rows + row) - row_max) * __ldcg(a.partial_sum + s * rows + row);
#pragma unroll
      for (int off = 16; off; off >>= 1) denom += __shfl_xor_sync(kFull, denom, off);
      inv_denom = denom > 0.0f ? 1.0f / denom : 0.0f;
    }
    float total[kPerLane] = {};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const float w = kSoftmax ? __expf(__ldcg(a.partial_max + s * rows + row) - row_max) : 1.0f;
      const float2* part = reinterpret_cast<const float2*>(a.partial_out + (s * rows + row) * kHeadDim) + lane * (kPerLane / 2);
#pragma unroll
      for (int j = 0; j < kPerLane / 2; ++j) {
        const float2 v = __ldcg(part + j);
        total[2 * j] = fmaf(w, v.x, total[2 * j]);
        total[2 * j + 1] = fmaf(w, v.y, total[2 * j + 1]);
      }
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(a.p.out + row * kHeadDim) + lane * (kPerLane / 2);
#pragma unroll
    for (int j = 0; j < kPerLane / 2; ++j)
      out[j] = __floats2bfloat162_rn(total[2 * j] * inv_denom, total[2 * j + 1] * inv_denom);
  }
}
}  // namespace asynct::kernels::decode
