// Each row is split into `parts` contiguous ranges, one block each: its threads stride over
// the range with 16-byte loads (four in flight per thread), each keeping the best (value, id)
// it saw and its lowest non-finite id, then the block reduces those. With several parts, each
// block leaves its result in a slot and counts itself on the row's counter; the last to arrive
// combines the parts. A decode step has one row per sequence (32 in decode_heavy_b32), each
// 151936 floats for Qwen3's vocabulary: one pass over 19 MB, against the copy of all of it to
// the host that it replaces. One block per row (32 blocks) took 13.2 us of the step on H200,
// eight parts per row (256 blocks) 9.3 us (bench/RESULTS.md).
#include "kernels/sampling/sampling.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_info.h"
#include "kernels/common/last_arrival.cuh"

namespace asynct::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// A partial result: the largest finite logit and its id (lowest id among equal values; -0.0
// and +0.0 are equal, as for the host's `>`), and the lowest non-finite id.
// Plain (no initialisers) so that it can live in shared memory.
struct Best {
  float value;
  int id;
  int nonfinite;
};

// Ids a thread visits only increase, so within a thread a strict `>` keeps the lowest id.
__device__ __forceinline__ void visit(Best& b, float v, int id) {
  if (!isfinite(v)) {
    b.nonfinite = min(b.nonfinite, id);
  } else if (v > b.value) {
    b.value = v;
    b.id = id;
  }
}

__device__ __forceinline__ void visit4(Best& b, float4 v, int id) {
  visit(b, v.x, id);
  visit(b, v.y, id + 1);
  visit(b, v.z, id + 2);
  visit(b, v.w, id + 3);
}

// Across threads the ids interleave, so ties compare ids.
__device__ __forceinline__ void combine(Best& b, float value, int id, int nonfinite) {
  if (value > b.value || (value == b.value && id < b.id)) {
    b.value = value;
    b.id = id;
  }
  b.nonfinite = min(b.nonfinite, nonfinite);
}

__device__ __forceinline__ void warp_reduce(Best& b) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    combine(b, __shfl_xor_sync(kFullMask, b.value, offset), __shfl_xor_sync(kFullMask, b.id, offset),
            __shfl_xor_sync(kFullMask, b.nonfinite, offset));
}

// The parts of a row: at most kMaxParts, for at most kMaxPartRows rows (more rows already fill
// the GPU with one block each). Slots and counters per device; the counters are zero when the
// module loads and the last part of a row leaves its counter zero (launches in stream order).
constexpr int kMaxParts = 8, kMaxPartRows = 1024;
__device__ Best g_part_best[kMaxPartRows * kMaxParts];
__device__ unsigned g_part_counters[kMaxPartRows];

template <bool kVec4>
__global__ void __launch_bounds__(kThreads) summarize_logits_kernel(const float* logits, int vocab, int part_len,
                                                                    LogitSummary* out) {
  wait_for_prior_grids();
  allow_next_grid();
  const int parts = int(gridDim.y), part = int(blockIdx.y);
  const float* row = logits + (long long)blockIdx.x * vocab;
  const int begin = part * part_len, end = min(vocab, begin + part_len);  // part_len % 4 == 0
  Best b{-INFINITY, INT_MAX, INT_MAX};
  if constexpr (kVec4) {  // vocab % 4 == 0: every row and part starts 16-byte aligned
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int n4 = end / 4;
    int i = begin / 4 + threadIdx.x;
    for (; i + 3 * kThreads < n4; i += 4 * kThreads) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcs(row4 + i + u * kThreads);  // read once: stream it
#pragma unroll
      for (int u = 0; u < 4; ++u) visit4(b, v[u], 4 * (i + u * kThreads));
    }
    for (; i < n4; i += kThreads) visit4(b, __ldcs(row4 + i), 4 * i);
  } else {
    for (int i = begin + threadIdx.x; i < end; i += kThreads) visit(b, __ldcs(row + i), i);
  }

  static_assert(kThreads / kWarp == kWarp, "the second reduction gives each lane one warp's partial");
  __shared__ Best partial[kThreads / kWarp];
  warp_reduce(b);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  if (warp != 0) return;
  b = partial[lane];
  warp_reduce(b);
  if (lane != 0) return;
  if (parts > 1) {  // leave this part's result; the last part of the row combines them
    g_part_best[blockIdx.x * kMaxParts + part] = b;
    if (!last_to_arrive(&g_part_counters[blockIdx.x], unsigned(parts), [] {})) return;  // only this thread
    b = Best{-INFINITY, INT_MAX, INT_MAX};
    for (int p = 0; p < parts; ++p) {
      const Best& other = g_part_best[blockIdx.x * kMaxParts + p];  // through L2: other blocks wrote it
      combine(b, __ldcg(&other.value), __ldcg(&other.id), __ldcg(&other.nonfinite));
    }
  }
  LogitSummary s;
  s.token = b.id == INT_MAX ? 0 : b.id;
  s.nonfinite = b.nonfinite == INT_MAX ? -1 : b.nonfinite;
  s.nonfinite_value = b.nonfinite == INT_MAX ? 0.0f : row[b.nonfinite];
  out[blockIdx.x] = s;
}

__global__ void greedy_tokens_kernel(const LogitSummary* summaries, int summary_rows, const std::int32_t* rows,
                                     int count, int vocab, std::int32_t* tokens) {
  wait_for_prior_grids();
  allow_next_grid();
  const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (i >= count) return;
  const int row = rows[i];
  const int id = row >= 0 && row < summary_rows ? summaries[row].token : 0;
  tokens[i] = id >= 0 && id < vocab ? id : 0;
}

}  // namespace

void launch_greedy_tokens(const LogitSummary* summaries, int summary_rows, const std::int32_t* rows, int count,
                          int vocab, std::int32_t* tokens, cudaStream_t stream) {
  check(count >= 0 && summary_rows >= 0 && vocab >= 1, "greedy_tokens: bad sizes (count ", count, ", summary rows ",
        summary_rows, ", vocab ", vocab, ")");
  if (count == 0) return;
  check(summaries && rows && tokens, "greedy_tokens: null pointer");
  constexpr int kBlock = 256;
  launch_dependent(greedy_tokens_kernel, dim3((count + kBlock - 1) / kBlock), kBlock, 0, stream, "greedy_tokens",
                   summaries, summary_rows, rows, count, vocab, tokens);
}

void launch_summarize_logits(const float* logits, int rows, int vocab, LogitSummary* out, cudaStream_t stream) {
  check(vocab >= 1, "summarize_logits: vocab must be >= 1, got ", vocab);
  check(rows >= 0, "summarize_logits: rows must be >= 0, got ", rows);
  check(logits && out, "summarize_logits: null pointer");
  if (rows == 0) return;
  const bool vec4 = vocab % 4 == 0 && reinterpret_cast<std::uintptr_t>(logits) % 16 == 0;
  // Parts enough for ~4 blocks per multiprocessor of work at one per row, each at least 16K
  // values (a block's four loads in flight per thread); one part beyond kMaxPartRows rows.
  const int wanted = (4 * current_device_info().sm_count + rows - 1) / rows;
  const int parts = rows > kMaxPartRows ? 1 : std::clamp(std::min(wanted, vocab / 16384), 1, kMaxParts);
  const int part_len = ((vocab + parts - 1) / parts + 3) / 4 * 4;
  const dim3 grid(rows, parts);
  if (vec4)
    launch_dependent(summarize_logits_kernel<true>, grid, kThreads, 0, stream, "summarize_logits", logits, vocab,
                     part_len, out);
  else
    launch_dependent(summarize_logits_kernel<false>, grid, kThreads, 0, stream, "summarize_logits", logits, vocab,
                     part_len, out);
}

}  // namespace asynct::kernels
