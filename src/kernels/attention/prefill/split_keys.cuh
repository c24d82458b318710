// What both prefill kernels share when a query tile's keys are split over several CTAs (a short
// prompt after a long cached prefix, whose few query tiles would leave most of the GPU idle):
// how many splits fill the GPU, which key tiles a split visits, where its part of the output goes
// (the workspace), and the kernel that adds the parts. Each part is the split's rows of O in fp32,
// softmax's normalised by its own sum with that sum's log2 beside it; by the gates' additivity
// (docs/DESIGN.md) the async parts add up as they are and softmax's weighted by their sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/attention/gate_policy.cuh"
#include "kernels/attention/prefill/mainloop.cuh"
#include "kernels/attention/prefill/prefill.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_info.h"
#include "kernels/common/tuning.h"

namespace asynct::kernels::prefill {

// Where the parts go in the workspace: [splits][total_q][num_q_heads] rows of head_dim floats,
// then [splits][total_q][num_q_heads] floats of log2 sums (softmax).
struct SplitParts {
  float* out;
  float* log2_sum;
  // Row r of the tile `t` at query head `head`, in split `split`.
  __device__ __forceinline__ long long row(const PrefillParams& p, const TileInfo& t, int head, int split, int r) const {
    return ((long long)split * p.total_q + t.q_begin + t.m0 + r) * p.num_q_heads + head;
  }
};
__host__ __device__ inline SplitParts split_parts(const PrefillParams& p, int splits) {
  float* out = static_cast<float*>(p.workspace);
  return {out, out + (long long)splits * p.total_q * p.num_q_heads * p.kv.head_dim};
}

inline std::size_t split_workspace_bytes(const PrefillParams& p, int splits) {
  if (splits <= 1) return 0;
  return std::size_t(splits) * std::size_t(p.total_q) * std::size_t(p.num_q_heads) * std::size_t(p.kv.head_dim + 1) *
         sizeof(float);
}

// `splits`, or 1 when the caller's workspace cannot hold their parts (the keys are then not split).
inline int splits_the_workspace_holds(const PrefillParams& p, int splits) {
  return splits > 1 && (!p.workspace || p.workspace_bytes < split_workspace_bytes(p, splits)) ? 1 : splits;
}

// How many CTAs share each query tile's keys. `tiles`: the kernel's CTAs unsplit; `split_tiles`:
// its CTAs a split (fewer when a split CTA takes several heads); `ctas_per_sm`: how many of its
// CTAs an SM holds. Split only when the tiles fill less than half of those places, into as many
// as fill them, each with at least two key tiles of the longest sequence.
// KernelTuning::prefill_kv_splits forces a count.
inline int kv_splits_to_fill(const PrefillParams& p, long long tiles, long long split_tiles, int ctas_per_sm,
                             int block_n) {
  constexpr int kMaxSplits = 16;
  if (const int forced = kernel_tuning().prefill_kv_splits; forced > 0) return std::min(forced, kMaxSplits);
  const long long places = (long long)current_device_info().sm_count * ctas_per_sm;
  if (tiles == 0 || split_tiles == 0 || 2 * tiles > places) return 1;
  const int key_tiles = (p.max_kv_len + block_n - 1) / block_n;
  return int(std::max<long long>(1, std::min<long long>({kMaxSplits, places / split_tiles, key_tiles / 2})));
}

// The key tiles a CTA visits: split `split` of `splits` owns tiles [begin, end) of its query
// tile's `key_tiles` (an even share); it visits [first, end), where first is begin - 1 when the
// gate's halo needs the scores of the keys before its own (the async gate: that tile runs
// through Q K^T and the gate, not P V).
struct SplitRange {
  int first, begin, end;
};
template <class Gate>
__device__ __forceinline__ SplitRange split_range(int key_tiles, int split, int splits) {
  const int begin = split * key_tiles / splits, end = (split + 1) * key_tiles / splits;
  return {Gate::kMaxHalo > 0 && begin > 0 ? begin - 1 : begin, begin, end};
}

// A split with no keys (a short sequence among longer ones): its part of `rows` rows at heads
// [head, head + heads) is zero (softmax: a log2 sum of -inf, which weighs nothing). All the CTA's
// threads call it.
template <class Gate>
__device__ void write_empty_part(const PrefillParams& p, const TileInfo& t, int head, int heads, int rows, int split,
                                 int splits) {
  const SplitParts parts = split_parts(p, splits);
  const int d = p.kv.head_dim;
  for (int h = head; h < head + heads; ++h) {
    for (int i = threadIdx.x; i < rows * d; i += blockDim.x) parts.out[parts.row(p, t, h, split, i / d) * d + i % d] = 0.0f;
    if (Gate::kRowStatistics)
      for (int r = threadIdx.x; r < rows; r += blockDim.x) parts.log2_sum[parts.row(p, t, h, split, r)] = -INFINITY;
  }
}

// A warp's 16-row block of this split's part, from the m16n8 accumulator fragment `o` (traits.cuh)
// of row block mb: rows r0 + g and r0 + g + 8 of head `head` (those below `rows`), finished by the
// gate, softmax's with their log2 sums beside them. Every lane of the warp calls it.
template <class Gate, int DB>
__device__ __forceinline__ void write_part_block(const PrefillParams& p, const TileInfo& t, int head, int splits,
                                                 Gate& gate, int mb, float (&o)[DB][4], int r0, int rows) {
  constexpr int D = 8 * DB;
  const int g = (threadIdx.x & 31) / 4, quad = threadIdx.x & 3;
  const SplitParts parts = split_parts(p, splits);
  float log2_sum[2] = {0.0f, 0.0f};
  if constexpr (Gate::kRowStatistics)
    for (int hh = 0; hh < 2; ++hh) log2_sum[hh] = gate.log2_sum(mb, hh);
  gate.finish(mb, o);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r0 + g + 8 * hh;
    if (r >= rows) continue;
    const long long row = parts.row(p, t, head, t.split, r);
    float* out = parts.out + row * D + 2 * quad;
#pragma unroll
    for (int db = 0; db < DB; ++db) *reinterpret_cast<float2*>(out + 8 * db) = make_float2(o[db][2 * hh], o[db][2 * hh + 1]);
    if (Gate::kRowStatistics && quad == 0) parts.log2_sum[row] = log2_sum[hh];
  }
}

// The parts of each (token, query head) row added into the bf16 output: one warp a row, D / 32
// consecutive columns a lane; softmax's parts weighted by their sums (a part with none weighs 0).
template <int D, bool kSoftmax>
__global__ void __launch_bounds__(256) combine_splits_kernel(const PrefillParams p, int splits) {
  constexpr int kPerLane = D / 32;
  static_assert(D % 64 == 0, "an even number of columns a lane");
  const long long rows = (long long)p.total_q * p.num_q_heads;
  const long long row = (long long)blockIdx.x * 8 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const SplitParts parts = split_parts(p, splits);
  float top = -INFINITY;
  if constexpr (kSoftmax)
    for (int s = 0; s < splits; ++s) top = fmaxf(top, __ldcg(parts.log2_sum + s * rows + row));
  float sum[kPerLane] = {};
  float weights = 0.0f;
  for (int s = 0; s < splits; ++s) {
    float w = 1.0f;
    if constexpr (kSoftmax) w = top == -INFINITY ? 0.0f : exp2f(__ldcg(parts.log2_sum + s * rows + row) - top);
    const float* part = parts.out + (s * rows + row) * D + lane * kPerLane;
#pragma unroll
    for (int i = 0; i < kPerLane; i += 2) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(part + i));
      sum[i] = fmaf(w, v.x, sum[i]);
      sum[i + 1] = fmaf(w, v.y, sum[i + 1]);
    }
    weights += w;
  }
  const float inv = !kSoftmax ? 1.0f : weights > 0.0f ? 1.0f / weights : 0.0f;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.out + row * D + lane * kPerLane);
#pragma unroll
  for (int i = 0; i < kPerLane; i += 2) out[i / 2] = __floats2bfloat162_rn(sum[i] * inv, sum[i + 1] * inv);
}

template <int D, class Gate>
void launch_combine_splits(const PrefillParams& p, int splits, cudaStream_t stream) {
  const long long rows = (long long)p.total_q * p.num_q_heads;
  combine_splits_kernel<D, is_softmax_gate<Gate>><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(p, splits);
  check_launch("launch_prefill (the splits' combine)");
}

}  // namespace asynct::kernels::prefill
