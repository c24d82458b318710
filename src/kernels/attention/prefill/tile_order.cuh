// The order in which the prefill kernels' CTAs take their tiles. The GPU starts a grid's CTAs in
// the order of their linear index (blockIdx.x fastest, then y, then z), so the index decides
// which tiles run side by side and so which keys the L2 cache must hold at once.
//
// A grid is (query heads, sequences, query tiles x splits). Taken in the plain order, every
// sequence's heaviest (last) query tile comes first, then every sequence's next: the CTAs running
// at one time read the keys of every sequence, and at 16 sequences of 1,024 tokens (64 MB of K/V)
// the L2 (60 MB on the H200) re-reads them from memory for each query tile (ncu on the Hopper
// kernel: 473 MB from memory where 268 MB are needed, L2 hits 52%). So the sequences go in groups:
// the tiles of one group, heaviest first, then the next group's. Groups of one sequence measured
// best (Hopper kernel at 16 x 1024 async 370 TFLOP/s against 359 for groups of three, which fit a
// quarter of the L2, and 349 for the plain order; 250 MB from memory, L2 hits 77%; varlen +10%:
// bench/RESULTS.md).
#pragma once

#include <algorithm>

#include "kernels/attention/prefill/prefill.h"
#include "kernels/common/tuning.h"

namespace asynct::kernels::prefill {

// Where the CTA of linear index `linear` (blockIdx.x fastest) takes its tile in a grid of
// (heads, seqs, zs): head index (x), sequence (y) and query tile / split index (z), for groups of
// `seq_group` sequences (>= 1; the last group may hold fewer).
struct GridTile {
  int head_index, seq, z;
};
__host__ __device__ inline GridTile grid_tile(long long linear, long long heads, long long seqs, long long zs,
                                              int seq_group) {
  const long long group_ctas = heads * seq_group * zs;  // a whole group's
  const long long group = linear / group_ctas, in_group = linear - group * group_ctas;
  const long long group_seqs = std::min<long long>(seq_group, seqs - group * seq_group);
  const long long z = in_group / (heads * group_seqs), in_z = in_group - z * heads * group_seqs;
  return {int(in_z % heads), int(group * seq_group + in_z / heads), int(z)};
}
__device__ __forceinline__ GridTile this_ctas_grid_tile(int seq_group) {
  const long long linear = blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
  return grid_tile(linear, gridDim.x, gridDim.y, gridDim.z, seq_group);
}

// Sequences a group: KernelTuning::prefill_seq_group when set (at most all), else one.
inline int prefill_seq_group(const PrefillParams& p) {
  const int forced = kernel_tuning().prefill_seq_group;
  return forced > 0 ? std::min(forced, std::max(p.num_seqs, 1)) : 1;
}

}  // namespace asynct::kernels::prefill
