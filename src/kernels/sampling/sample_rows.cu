// Over 500 lines: one kernel and the cluster primitives only it uses (block and cluster
// reductions and scans, block 0's decisions shared over distributed shared memory), the small
// top-k path, its two histogram levels and the place-finding walk over them; the pieces call
// each other throughout.
// One thread-block cluster per row: its 8 blocks (7 when 8-block clusters would leave rows
// waiting: the H200 holds 30 such clusters, 32 of 7) each load their share of the row into
// shared memory (76 KB at Qwen3's 151,936 tokens in eighths, 87 KB in sevenths), so the row is
// read from global memory once, and every later pass runs over shared memory, the blocks
// agreeing through distributed shared memory at a few cluster barriers. For a row, in the
// host sampler's order (engine/sampler.h):
//   1. one pass: the raw row's maximum, argmax, first non-finite logit and (for logprobs) its
//      sum of exponentials; the logit bias, penalties and allowed-token mask, applied to the
//      shared-memory copy (the row in global memory stays raw); the processed row's maximum and
//      argmax. One cluster reduction.
//      With top-n logprobs the raw statistics are reduced first and the top-n found before the
//      penalties change the copy (the n best as the small top-k path below takes its k best).
//   2. temperature 0: the processed argmax. With 1 <= top-k <= 64 (the serving case) the draw
//      needs only the k best tokens: step 1 also bounds the row's k-th logit from below by the
//      threads' maxima (k threads' maxima at or above a value are k tokens at or above it); each
//      block adds its tokens at or above the bound to block 0 (about 6k for k = 50 on N(0, s^2)
//      rows), which ranks them, keeps the k best in order and walks them as step 3 does. More
//      than the gather holds (a flat row) falls through to the histogram.
//      Otherwise a histogram of the tokens by how far below the maximum their tempered logit
//      lies, d = (max - x) / T, 1/32 nat a bin, with each bin's count and mass. A token's weight exp(-d) is kept in its bin's fixed point:
//      q = round(exp(b/32 - d) * 2^16) in bin b, worth q * 2^-16 * exp(-b/32) (relative error
//      <= 1.6e-5): 32-bit shared-memory atomics, and sums that do not depend on their order.
//      With top-k, counts alone (the head's weights are its own; step 4 builds them again).
//   3. The head: the bins up to the one holding the first place that bounds the kept set
//      (top-k's k-th token, else top-p's or min-p's cut, else the draw). When it fits the
//      gather (kMaxCandidates tokens, as with top-k 50 on any row), block 0 gathers, sorts and
//      walks it exactly as the host walks the order, every cut and the draw in one go.
//   4. Otherwise positions in the order (logit desc, id asc) are found one by one from the
//      histogram's prefix sums: top-k's k-th token, top-p's cut over what top-k kept, min-p's,
//      the kept mass, the draw. Only the bins a cut or the draw falls in are gathered.
//   5. A bin of more than kMaxCandidates tokens (a nearly flat row): every cut and the draw by
//      bisection on the tokens' order keys instead (exact, 64 passes over shared memory each).
// Needs sm_90 (clusters); the runners sample on the host elsewhere.
#include "kernels/sampling/sample_rows.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include <cooperative_groups.h>

#include "core/uniform_draw.h"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_info.h"

namespace asynct::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kMaxClusterBlocks = 8;  // a row's blocks: 8, or 7 when 8-block clusters leave rows waiting (launch_sample_rows)
constexpr int kThreads = 512;         // two blocks per multiprocessor
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32 && (kWarps & (kWarps - 1)) == 0, "block_allreduce's tree");
constexpr int kBins = 1536;  // 1/32 nat each; the last also takes everything beyond 48 nats
constexpr int kMaxCandidates = 2 * kThreads;
constexpr int kSubBins = 256;  // a bin too full to gather is split this finely (1/8192 nat)
constexpr int kMaxSmallTopK = 64;  // the small top-k path's largest k: one warp walks the head
// Each warp's largest thread maxima that bound the k-th logit (step 1): 8 a warp, so the bound
// needs no warp to hold more than 8 of the block's k best maxima (16 warps, k <= 64).
constexpr int kBoundsPerWarp = 8;

using u64 = unsigned long long;

struct Shared {
  union {
    unsigned bin_count[kBins];  // a block's counts; then, in block 0, their prefix sums
    unsigned candidate_rank[kMaxCandidates];  // the small top-k path: how many candidates lie above each
  };
  union {
    unsigned bin_fixed[kBins];  // a block's bin masses in fixed point while the histogram is built
    double bin_mass[kBins];     // then, in block 0, the prefix sums of the bins' masses
    u64 own[kMaxCandidates];    // the small top-k path: a block's candidates before they go to block 0
    struct {                    // ... then block 0's candidates that may be among the k best, and the k best in order
      u64 kept[kMaxCandidates];
      u64 best[kMaxSmallTopK];
    } select;
  };
  // Block 0's gathered order keys, sorted in place (first = most likely).
  union {
    u64 candidates[kMaxCandidates];
    struct {  // one bin's tokens by sub-bin: a block's counts and weights; block 0's prefix sums
      unsigned count[kSubBins];
      unsigned fixed[kSubBins];
      unsigned cum_count[kSubBins];
      u64 cum_fixed[kSubBins];
    } sub;
  };
  u64 exchange[2][4];  // cluster_allreduce's and cluster_exclusive_scan's slots, used in turn
  u64 reduced[4];      // their result, for the block
  u64 warp_partial[kWarps][4];
  u64 decision[2];     // share_from_block0's slots, used in turn
  alignas(16) float bounds[kWarps * kBoundsPerWarp];  // the warps' largest thread maxima (the small top-k bound)
  u64 scratch;         // block 0's locate
  int gathered;        // in block 0: candidates gathered so far (every block adds to it)
  int gathered_top;    // ... by the small top-k path for top-n logprobs (a counter of its own: never reset)
  int own_count, own_base;  // the small top-k path: a block's candidates, and where they go in block 0's
  int newest_found;    // the row's input token was among its penalty entries
  int penalised_nonfinite;  // the lowest id whose raw logit the penalties changed and was not finite
};
// Two blocks a multiprocessor (228 KB) with a seventh of a 151,936-token row each (86,832 bytes),
// 1 KB reserved per block.
static_assert(sizeof(Shared) <= (233472 - 2 * 1024) / 2 - 86832, "two 7-way Qwen3 blocks fit a multiprocessor");
static_assert(kMaxCandidates <= kBins && kMaxSmallTopK <= 2 * 32 && kWarps * kBoundsPerWarp >= kMaxSmallTopK && kBoundsPerWarp % 4 == 0,
              "the small top-k path's arrays");
static_assert(sizeof(u64) * (kMaxCandidates + kMaxSmallTopK) <= sizeof(double) * kBins, "fits the union");
static_assert(3 * sizeof(unsigned) * kSubBins + sizeof(u64) * kSubBins <= sizeof(u64) * kMaxCandidates, "fits the union");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

constexpr float kBinsPerNat = 32.0f;
constexpr float kFixedOne = 65536.0f;  // a weight of exp(-b/32) in bin b's fixed point
// A token's weight as the bisection fallback sums it: 40 fraction bits, rounded.
constexpr double kFallbackOne = 1099511627776.0;

// Order keys: a larger key comes first (logit desc, then id asc), one key per token. -0.0 and
// +0.0 are one value, as for the host's comparisons.
__device__ __forceinline__ unsigned ordered_bits(float v) {
  if (v == 0.0f) v = 0.0f;
  const unsigned u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float value_of_bits(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ u64 order_key(float v, int id) {
  return (u64(ordered_bits(v)) << 32) | u64(0xffffffffu - unsigned(id));
}
__device__ __forceinline__ int id_of(u64 key) { return int(0xffffffffu - unsigned(key & 0xffffffffu)); }
__device__ __forceinline__ float value_of(u64 key) { return value_of_bits(unsigned(key >> 32)); }

// How far below the maximum a logit lies, in nats of tempered weight, and its bin.
// (A product with 1/T, which the passes hoist: a division costs them more than the rest.)
__device__ __forceinline__ float depth(float x, float peak, float temperature) { return (peak - x) * (1.0f / temperature); }
__device__ __forceinline__ int bin_of_depth(float d) {
  return d < float(kBins) / kBinsPerNat ? min(int(d * kBinsPerNat), kBins - 1) : kBins - 1;
}
// A token's weight in its bin's fixed point, and what one unit of bin b weighs.
__device__ __forceinline__ unsigned fixed_in_bin(float d, int bin) {
  return unsigned(expf(float(bin) / kBinsPerNat - d) * kFixedOne + 0.5f);
}
__device__ __forceinline__ double bin_unit(int bin) { return exp(-double(bin) / kBinsPerNat) / double(kFixedOne); }

// A value of any size shuffled across the warp, 32 bits at a time; `word` shuffles one.
template <typename T, typename Word>
__device__ __forceinline__ T shuffle_words(const T& v, Word word) {
  static_assert(sizeof(T) % 4 == 0, "shuffled in 32-bit words");
  T out;
  const unsigned* src = reinterpret_cast<const unsigned*>(&v);
  unsigned* dst = reinterpret_cast<unsigned*>(&out);
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 4); ++i) dst[i] = word(src[i]);
  return out;
}
template <typename T>
__device__ __forceinline__ T shuffle_from(const T& v, int lane) {
  return shuffle_words(v, [lane](unsigned w) { return __shfl_sync(0xffffffffu, w, lane); });
}
template <typename T>
__device__ __forceinline__ T shuffle_xor(const T& v, int mask) {
  return shuffle_words(v, [mask](unsigned w) { return __shfl_xor_sync(0xffffffffu, w, mask); });
}

// f(x, i) for each logit x = row.x[i] of the slice (float4 loads; i rises within a thread).
template <typename Slice, typename F>
__device__ __forceinline__ void for_each_logit(const Slice& row, F&& f) {
  const int quads = row.n / 4;
  for (int j = int(threadIdx.x); j < quads; j += kThreads) {
    const float4 q = reinterpret_cast<const float4*>(row.x)[j];
    f(q.x, 4 * j), f(q.y, 4 * j + 1), f(q.z, 4 * j + 2), f(q.w, 4 * j + 3);
  }
  for (int i = 4 * quads + int(threadIdx.x); i < row.n; i += kThreads) f(row.x[i], i);
}

// What step 1 learns about a row: the raw best (value, lowest id), the lowest non-finite id,
// the raw sum of exp(x - raw max), and the processed best.
struct RowStats {
  float raw_max;
  int raw_id;
  int nonfinite;
  float raw_sum;
  float max;
  int id;
  float bound;      // the small top-k path: a value at most the processed row's k-th logit; -inf when not taken
  float top_bound;  // ... at most the raw row's n-th, for the top-n logprobs
};
__device__ __forceinline__ RowStats empty_stats() {
  return RowStats{-FLT_MAX, INT_MAX, INT_MAX, 0.0f, -FLT_MAX, INT_MAX, -INFINITY, -INFINITY};
}
__device__ __forceinline__ bool better(float v, int id, float than_v, int than_id) {
  return v > than_v || (v == than_v && id < than_id);
}
struct StatsOp {
  __device__ RowStats operator()(const RowStats& a, const RowStats& b) const {
    RowStats r = a;
    const float raw_max = fmaxf(a.raw_max, b.raw_max);
    r.raw_sum = a.raw_sum * expf(a.raw_max - raw_max) + b.raw_sum * expf(b.raw_max - raw_max);
    if (better(b.raw_max, b.raw_id, a.raw_max, a.raw_id)) r.raw_max = b.raw_max, r.raw_id = b.raw_id;
    r.nonfinite = min(a.nonfinite, b.nonfinite);
    if (better(b.max, b.id, a.max, a.id)) r.max = b.max, r.id = b.id;
    r.bound = fmaxf(a.bound, b.bound);
    r.top_bound = fmaxf(a.top_bound, b.top_bound);
    return r;
  }
};
struct CountMass {
  u64 count, mass;
};
struct SumOp {
  __device__ CountMass operator()(const CountMass& a, const CountMass& b) const { return {a.count + b.count, a.mass + b.mass}; }
  __device__ u64 operator()(u64 a, u64 b) const { return a + b; }
};
struct CountWeight {
  u64 count;
  double mass;
};

// One row as this block sees it: its slice x[0, n) of the row (ids base ..), the shared state.
struct Row {
  cg::cluster_group cluster;
  unsigned rank;
  int blocks;  // the cluster's
  Shared& sh;
  float* x;
  int n;
  int base;
  int phase;           // which exchange slot the next cluster-wide exchange uses
  int decision_phase;  // which decision slot the next share_from_block0 uses
  long long* clocks;   // SampleRowsArgs::phase_clocks' slots for this row, or null
};

// Block 0's clock at the end of a phase (SampleRowsPhase), when the launch asks.
__device__ __forceinline__ void mark(const Row& row, SampleRowsPhase phase) {
  if (row.clocks && row.rank == 0 && threadIdx.x == 0) row.clocks[int(phase)] = clock64();
}

// Every thread of the block gets op over all threads' values, combined in a fixed order (op
// commutative).
template <typename T, typename Op>
__device__ T block_allreduce(T v, Op op, Shared& sh) {
  static_assert(sizeof(T) <= sizeof(sh.warp_partial[0]), "fits a slot");
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) v = op(v, shuffle_xor(v, mask));
  __syncthreads();  // an earlier call's readers are done
  if (threadIdx.x % 32 == 0) *reinterpret_cast<T*>(&sh.warp_partial[threadIdx.x / 32][0]) = v;
  __syncthreads();
  // Each half-warp combines the warps' values as a tree: op is commutative, so every lane ends
  // with the same value.
  T r = *reinterpret_cast<const T*>(&sh.warp_partial[threadIdx.x % kWarps][0]);
#pragma unroll
  for (int mask = kWarps / 2; mask > 0; mask /= 2) r = op(r, shuffle_xor(r, mask));
  return r;
}

// The sum of the values of the threads before this one, in thread order.
template <typename T>
__device__ T exclusive_block_scan(T v, Shared& sh) {
  static_assert(sizeof(T) <= sizeof(sh.warp_partial[0]), "fits a slot");
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  T inclusive = v;
  for (int offset = 1; offset < 32; offset *= 2) {
    const T up = shuffle_from(inclusive, lane >= offset ? lane - offset : lane);
    if (lane >= offset) inclusive.count += up.count, inclusive.mass += up.mass;
  }
  __syncthreads();  // an earlier user of warp_partial is done
  if (lane == 31) *reinterpret_cast<T*>(&sh.warp_partial[warp][0]) = inclusive;
  __syncthreads();
  T before = inclusive;
  before.count -= v.count, before.mass -= v.mass;
  for (int w = 0; w < warp; ++w) {
    const T other = *reinterpret_cast<const T*>(&sh.warp_partial[w][0]);
    before.count += other.count, before.mass += other.mass;
  }
  return before;
}

// Over the cluster: every thread of every block gets op over all blocks' values. Block b's
// value goes to its slot; lane b of warp 0 reads it; they are combined in block order. The
// slots alternate, so a slot is written again only after a barrier its readers have passed.
template <typename T, typename Op>
__device__ T cluster_allreduce(T v, Op op, Row& row) {
  static_assert(sizeof(T) <= sizeof(row.sh.exchange[0]), "fits a slot");
  v = block_allreduce(v, op, row.sh);
  T* slot = reinterpret_cast<T*>(&row.sh.exchange[row.phase][0]);
  row.phase ^= 1;
  if (threadIdx.x == 0) *slot = v;
  row.cluster.sync();
  if (threadIdx.x < 32) {
    const T mine = *row.cluster.map_shared_rank(slot, threadIdx.x % unsigned(row.blocks));
    T r = shuffle_from(mine, 0);
    for (int b = 1; b < row.blocks; ++b) r = op(r, shuffle_from(mine, b));
    if (threadIdx.x == 0) *reinterpret_cast<T*>(&row.sh.reduced[0]) = r;
  }
  __syncthreads();
  const T out = *reinterpret_cast<const T*>(&row.sh.reduced[0]);
  __syncthreads();  // read before the next exchange writes it
  return out;
}

// Over the cluster, by block rank: the sum of the values of the blocks before this one.
__device__ CountWeight cluster_exclusive_scan(CountWeight own, Row& row) {
  CountWeight* slot = reinterpret_cast<CountWeight*>(&row.sh.exchange[row.phase][0]);
  row.phase ^= 1;
  if (threadIdx.x == 0) *slot = own;
  row.cluster.sync();
  if (threadIdx.x < 32) {
    const CountWeight mine = *row.cluster.map_shared_rank(slot, threadIdx.x % unsigned(row.blocks));
    CountWeight before{0, 0.0};
    for (int b = 0; b < row.blocks; ++b) {
      const CountWeight other = shuffle_from(mine, b);
      if (unsigned(b) < row.rank) before.count += other.count, before.mass += other.mass;
    }
    if (threadIdx.x == 0) *reinterpret_cast<CountWeight*>(&row.sh.reduced[0]) = before;
  }
  __syncthreads();
  const CountWeight out = *reinterpret_cast<const CountWeight*>(&row.sh.reduced[0]);
  __syncthreads();
  return out;
}

// Block 0 decides; every block returns its answer. Block 0 stores it into every block's slot
// (two slots in turn) before one cluster barrier.
__device__ u64 share_from_block0(Row& row, u64 value) {
  const int slot = row.decision_phase;
  row.decision_phase ^= 1;
  if (row.rank == 0 && threadIdx.x < 32) {
    value = __shfl_sync(0xffffffffu, value, 0);
    if (int(threadIdx.x) < row.blocks) *row.cluster.map_shared_rank(&row.sh.decision[slot], threadIdx.x) = value;
  }
  row.cluster.sync();
  return row.sh.decision[slot];
}

// Step 2's histogram by bin_of, with each bin's mass when `mass`, merged over the cluster into
// block 0 as prefix sums (bin_count[b]: tokens in bins 0..b; bin_mass[b]: their weight). The last
// bin's tokens (a peaked row's most) are summed in registers and added once a warp. Block r
// merges bins [r * range, (r + 1) * range) of every block, one bin a thread, and stores their
// prefix sums into block 0. Every block returns after a cluster barrier.
__device__ void build_histogram(Row& row, float peak, float temperature, bool mass) {
  Shared& sh = row.sh;
  for (int b = int(threadIdx.x); b < kBins; b += kThreads) sh.bin_count[b] = 0, sh.bin_fixed[b] = 0;
  __syncthreads();
  unsigned deep = 0, deep_fixed = 0;
  for_each_logit(row, [&](float x, int) {
    const float d = depth(x, peak, temperature);
    const int bin = bin_of_depth(d);
    const unsigned fixed = mass ? fixed_in_bin(d, bin) : 0u;
    if (bin == kBins - 1) {
      deep += 1, deep_fixed += fixed;
      return;
    }
    atomicAdd(&sh.bin_count[bin], 1u);
    if (mass) atomicAdd(&sh.bin_fixed[bin], fixed);
  });
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) {
    deep += __shfl_xor_sync(0xffffffffu, deep, mask);
    deep_fixed += __shfl_xor_sync(0xffffffffu, deep_fixed, mask);
  }
  if (threadIdx.x % 32 == 0 && deep != 0) atomicAdd(&sh.bin_count[kBins - 1], deep), atomicAdd(&sh.bin_fixed[kBins - 1], deep_fixed);
  mark(row, SampleRowsPhase::kHistogramPass);
  row.cluster.sync();
  mark(row, SampleRowsPhase::kHistogramMet);
  const int range = (kBins + row.blocks - 1) / row.blocks;
  const int bin = int(row.rank) * range + int(threadIdx.x);
  CountWeight own{0, 0.0};
  if (int(threadIdx.x) < range && bin < kBins) {
    unsigned counts[kMaxClusterBlocks], fixed[kMaxClusterBlocks];  // every load issued before any is used
#pragma unroll
    for (int r = 0; r < kMaxClusterBlocks; ++r) {
      counts[r] = r < row.blocks ? row.cluster.map_shared_rank(sh.bin_count, r)[bin] : 0u;
      fixed[r] = mass && r < row.blocks ? row.cluster.map_shared_rank(sh.bin_fixed, r)[bin] : 0u;
    }
    u64 mass_fixed = 0;
#pragma unroll
    for (int r = 0; r < kMaxClusterBlocks; ++r) own.count += counts[r], mass_fixed += fixed[r];
    own.mass = double(mass_fixed) * bin_unit(bin);
  }
  const CountWeight in_range = exclusive_block_scan(own, sh);
  // The range's total as its last bin's prefix sum (the same additions, so the prefix sums rise).
  __syncthreads();  // the scan's readers of warp_partial are done
  if (int(threadIdx.x) == range - 1)
    *reinterpret_cast<CountWeight*>(&sh.warp_partial[0][0]) = CountWeight{in_range.count + own.count, in_range.mass + own.mass};
  __syncthreads();
  const CountWeight range_total = *reinterpret_cast<const CountWeight*>(&sh.warp_partial[0][0]);
  // Every block's reads of the bins are done after it: block 0's become its prefix sums.
  const CountWeight before = cluster_exclusive_scan(range_total, row);
  mark(row, SampleRowsPhase::kHistogramScan);
  if (int(threadIdx.x) < range && bin < kBins) {
    row.cluster.map_shared_rank(sh.bin_count, 0)[bin] = unsigned(before.count + in_range.count + own.count);
    row.cluster.map_shared_rank(sh.bin_mass, 0)[bin] = before.mass + in_range.mass + own.mass;
  }
  row.cluster.sync();
}

// Block 0, on the prefix sums: the first bin whose cumulative count reaches `count`.
__device__ int bin_reaching_count(const Shared& sh, u64 count) {
  int lo = 0, hi = kBins - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (u64(sh.bin_count[mid]) >= count) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}
// ... the first bin whose cumulative mass reaches `mass` (>=), or passes it (> when strict).
__device__ int bin_reaching_mass(const Shared& sh, double mass, bool strict) {
  int lo = 0, hi = kBins - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (strict ? sh.bin_mass[mid] > mass : sh.bin_mass[mid] >= mass) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}
__device__ CountWeight before_bin(const Shared& sh, int bin) {
  return bin == 0 ? CountWeight{0, 0.0} : CountWeight{sh.bin_count[bin - 1], sh.bin_mass[bin - 1]};
}

__device__ __forceinline__ int sub_of(float d, int bin) {
  return min(max(int((d * kBinsPerNat - float(bin)) * float(kSubBins)), 0), kSubBins - 1);
}

// Gathers the order keys of the tokens whose bin lies in [lo, hi] (and, with sub >= 0, whose
// sub-bin of bin lo is sub) into block 0's candidates, their number known beforehand (at most
// kMaxCandidates). Every block adds to block 0's counter, which is zero before.
__device__ void gather(Row& row, float peak, float temperature, int lo, int hi, int sub) {
  u64* out = row.cluster.map_shared_rank(row.sh.candidates, 0);
  int* counter = row.cluster.map_shared_rank(&row.sh.gathered, 0);
  for_each_logit(row, [&](float v, int i) {
    const float d = depth(v, peak, temperature);
    const int bin = bin_of_depth(d);
    if (bin >= lo && bin <= hi && (sub < 0 || sub_of(d, bin) == sub)) out[atomicAdd(counter, 1)] = order_key(v, row.base + i);
  });
  row.cluster.sync();  // block 0 holds them all
}

// Sorts the c gathered keys in place, largest first, by a team of kSize threads (block 0's
// whole block, or its first warp) whose barrier is sync: each key's rank is the number of keys
// above it (keys are unique), found by the thread holding it (two a thread).
template <int kSize, typename Sync>
__device__ void rank_sort(Shared& sh, int c, int member, Sync sync) {
  u64 key[2];
  int rank[2] = {0, 0};
  for (int j = 0; j < 2; ++j) key[j] = member + j * kSize < c ? sh.candidates[member + j * kSize] : 0;
  for (int m = 0; m < c; ++m) {
    const u64 other = sh.candidates[m];
    rank[0] += other > key[0] ? 1 : 0;
    rank[1] += other > key[1] ? 1 : 0;
  }
  sync();
  for (int j = 0; j < 2; ++j)
    if (member + j * kSize < c) sh.candidates[rank[j]] = key[j];
  if (member == 0) sh.gathered = 0;  // for the next gather (after a barrier)
  sync();
}
__device__ void sort_candidates(Shared& sh, int c) {
  static_assert(kMaxCandidates == 2 * kThreads, "two keys a thread");
  rank_sort<kThreads>(sh, c, int(threadIdx.x), [] { __syncthreads(); });
}

// Bin `bin`'s tokens by sub-bin, merged into block 0 as prefix sums in the bin's fixed point
// (like build_histogram, one level down); overwrites the candidates.
__device__ void build_sub_histogram(Row& row, float peak, float temperature, int bin) {
  Shared& sh = row.sh;
  const int range = (kSubBins + row.blocks - 1) / row.blocks;
  for (int b = int(threadIdx.x); b < kSubBins; b += kThreads) sh.sub.count[b] = 0, sh.sub.fixed[b] = 0;
  __syncthreads();
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const float d = depth(row.x[i], peak, temperature);
    if (bin_of_depth(d) != bin) continue;
    const int sub = sub_of(d, bin);
    atomicAdd(&sh.sub.count[sub], 1u);
    atomicAdd(&sh.sub.fixed[sub], fixed_in_bin(d, bin));
  }
  row.cluster.sync();
  const int sub = int(row.rank) * range + int(threadIdx.x);
  CountMass own{0, 0};
  if (int(threadIdx.x) < range && sub < kSubBins)
    for (int r = 0; r < row.blocks; ++r) {
      own.count += row.cluster.map_shared_rank(sh.sub.count, r)[sub];
      own.mass += row.cluster.map_shared_rank(sh.sub.fixed, r)[sub];
    }
  const CountMass in_range = exclusive_block_scan(own, sh);
  __syncthreads();
  if (int(threadIdx.x) == range - 1)
    *reinterpret_cast<CountMass*>(&sh.warp_partial[0][0]) = CountMass{in_range.count + own.count, in_range.mass + own.mass};
  __syncthreads();
  const CountMass range_total = *reinterpret_cast<const CountMass*>(&sh.warp_partial[0][0]);
  const CountWeight before = cluster_exclusive_scan(CountWeight{range_total.count, double(range_total.mass)}, row);
  if (int(threadIdx.x) < range && sub < kSubBins) {
    row.cluster.map_shared_rank(sh.sub.cum_count, 0)[sub] = unsigned(before.count + in_range.count + own.count);
    row.cluster.map_shared_rank(sh.sub.cum_fixed, 0)[sub] = u64(before.mass) + in_range.mass + own.mass;
  }
  row.cluster.sync();
}

// A place in the order (logit desc, id asc): the token at `index` (from 0), its id, and the
// weight of the tokens up to and including it.
struct Place {
  u64 index;
  int id;
  double through;
};

// What block 0 has gathered and sorted: bin `bin`'s tokens (sub < 0) or those of one sub-bin,
// `count` of them after `before_count` tokens of weight `before` in the order; thread t holds
// the prefix weights of the set's tokens 2t and 2t + 1, in the bin's fixed point.
struct Loaded {
  int bin = -1, sub = -2, count = 0;
  u64 before_count = 0;
  double before = 0.0;
  u64 prefix[2] = {0, 0};
};

// Every block: where the order reaches `value` tokens (by_count: the value-th token) or a
// cumulative weight `value` (>= it, or > it when strict): block 0 finds the bin from the
// histogram, and within it the sub-bin when the bin holds more than the gather does; gathers
// and sorts that set (unless loaded already) and walks it. Returns false when even the sub-bin
// is too full (the caller falls back to bisection); the Place is block 0's.
__device__ bool locate(Row& row, float peak, float temperature, bool by_count, double value, bool strict, Loaded& loaded,
                       Place* place) {
  Shared& sh = row.sh;
  const bool zero = row.rank == 0;
  // Block 0 picks the bin and says how full it is.
  int bin = 0;
  u64 in_bin = 0;
  if (zero) {
    bin = by_count ? bin_reaching_count(sh, u64(value)) : bin_reaching_mass(sh, value, strict);
    in_bin = sh.bin_count[bin] - (bin ? sh.bin_count[bin - 1] : 0u);
  }
  const u64 choice = share_from_block0(row, u64(bin) | (in_bin << 32));
  bin = int(choice & 0xffffffffu);
  in_bin = choice >> 32;
  const CountWeight bin_before = zero ? before_bin(sh, bin) : CountWeight{0, 0.0};
  int sub = -1;
  u64 count = in_bin, before_count = bin_before.count;
  double before = bin_before.mass;
  if (in_bin > kMaxCandidates && bin == kBins - 1 && by_count) {
    // The last bin holds every token beyond 48 nats: a place there by count (top-k's k-th, the
    // kept set's last) needs only the weight through it, all but e^-64 of the total; its id is
    // never asked for (the draw cannot land there). A peaked row has most of its tokens there: the
    // random 1.7B model's logits spread ~45 (sqrt(2048) for unit-scale LM-head rows), 200 nats
    // deep at temperature 0.8.
    if (zero) *place = Place{u64(value) - 1, -1, sh.bin_mass[kBins - 1]};
    return true;
  }
  if (in_bin > kMaxCandidates) {  // the sub-bin holding the place
    build_sub_histogram(row, peak, temperature, bin);  // over the candidates: whatever was loaded is gone
    loaded.bin = -1;
    u64 sub_choice = 0;
    if (zero) {
      const double unit = bin_unit(bin);
      int lo = 0, hi = kSubBins - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const bool reached = by_count ? before_count + sh.sub.cum_count[mid] >= u64(value)
                                      : (strict ? before + double(sh.sub.cum_fixed[mid]) * unit > value
                                                : before + double(sh.sub.cum_fixed[mid]) * unit >= value);
        if (reached) hi = mid;
        else lo = mid + 1;
      }
      const u64 sub_before_count = lo ? sh.sub.cum_count[lo - 1] : 0, sub_before_fixed = lo ? sh.sub.cum_fixed[lo - 1] : 0;
      count = sh.sub.cum_count[lo] - sub_before_count;
      before_count += sub_before_count;
      before += double(sub_before_fixed) * unit;
      sub_choice = u64(lo) | (count << 32);
    }
    sub_choice = share_from_block0(row, sub_choice);
    sub = int(sub_choice & 0xffffffffu);
    count = sub_choice >> 32;
    if (count > kMaxCandidates) return false;
  }
  if (loaded.bin != bin || loaded.sub != sub) {
    gather(row, peak, temperature, bin, bin, sub);
    loaded.bin = bin, loaded.sub = sub, loaded.count = int(count);
    if (zero) {
      sort_candidates(sh, int(count));
      const int i = 2 * int(threadIdx.x);
      const auto fixed = [&](int k) {
        return k < int(count) ? u64(fixed_in_bin(depth(value_of(sh.candidates[k]), peak, temperature), bin)) : 0;
      };
      const u64 w0 = fixed(i), w1 = fixed(i + 1);
      const u64 start = exclusive_block_scan(CountMass{0, w0 + w1}, sh).mass;
      loaded.prefix[0] = start + w0;
      loaded.prefix[1] = start + w0 + w1;
      loaded.before_count = before_count;
      loaded.before = before;
    }
  }
  if (!zero) return true;
  // Block 0: the set's token at the place, and the weight through it.
  const double unit = bin_unit(bin);
  int j = 0;
  if (by_count) {
    j = int(u64(value) - 1 - loaded.before_count);
  } else {
    u64 below = 0;
    for (int k = 0; k < 2; ++k) {
      const int i = 2 * int(threadIdx.x) + k;
      const double w = loaded.before + double(loaded.prefix[k]) * unit;
      below += i < loaded.count && (strict ? w <= value : w < value) ? 1 : 0;
    }
    j = min(int(block_allreduce(below, SumOp{}, sh)), loaded.count - 1);  // not reached (rounding): the set's last
  }
  __syncthreads();
  if (j / 2 == int(threadIdx.x)) sh.scratch = loaded.prefix[j % 2];
  __syncthreads();
  *place = Place{loaded.before_count + u64(j), id_of(sh.candidates[j]), loaded.before + double(sh.scratch) * unit};
  __syncthreads();
  return true;
}

// Tokens with weight >= min_weight (a prefix of the order), over the row.
__device__ u64 count_heavy(Row& row, float peak, float temperature, float min_weight) {
  u64 n = 0;
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) n += expf(-depth(row.x[i], peak, temperature)) >= min_weight ? 1 : 0;
  return cluster_allreduce(n, SumOp{}, row);
}

// Tokens of the slice with order key >= `at` (and weight >= min_weight when > 0): how many, and
// their weight in 40-bit fixed point. For the bisections.
__device__ CountMass count_from(Row& row, u64 at, float peak, float temperature, float min_weight) {
  CountMass c{0, 0};
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const float v = row.x[i];
    if (order_key(v, row.base + i) < at) continue;
    const float w = expf(-depth(v, peak, temperature));
    if (min_weight > 0.0f && w < min_weight) continue;
    c.count += 1;
    c.mass += u64(double(w) * kFallbackOne + 0.5);
  }
  return cluster_allreduce(c, SumOp{}, row);
}

// The largest key K with pred(count_from(K)) (pred holds at K = 0 and fails as K grows).
template <typename Pred>
__device__ u64 largest_key_where(Row& row, float peak, float temperature, float min_weight, Pred pred) {
  u64 key = 0;
  for (int bit = 63; bit >= 0; --bit) {
    const u64 next = key | (u64(1) << bit);
    if (pred(count_from(row, next, peak, temperature, min_weight))) key = next;
  }
  return key;
}

// The draw by bisection (step 4).
__device__ int draw_by_bisection(Row& row, const SamplingParams& p, double u, float peak, int vocab) {
  const float t = p.temperature, no_min = 0.0f;
  const u64 k_key = p.top_k > 0 && p.top_k < vocab
                        ? largest_key_where(row, peak, t, no_min, [&](CountMass m) { return m.count >= u64(p.top_k); })
                        : 0;
  u64 cut_key = k_key;
  if (p.top_p < 1.0f) {
    const double needed = double(p.top_p) * double(count_from(row, k_key, peak, t, no_min).mass);
    cut_key = max(cut_key, largest_key_where(row, peak, t, no_min, [&](CountMass m) { return double(m.mass) >= needed; }));
  }
  const double target = u * double(count_from(row, cut_key, peak, t, p.min_p).mass);
  const u64 drawn = largest_key_where(row, peak, t, p.min_p, [&](CountMass m) { return double(m.mass) > target; });
  return id_of(max(drawn, cut_key));
}

// The head: the tokens of bins 0..head_bin(), which hold every place the draw needs: top-k's
// k-th token when top-k cuts (top-p's and min-p's cuts and the draw come after it in the order);
// else top-p's cut and min-p's (a bin more for expf's rounding), whichever comes first; with no
// cut, the draw itself. A k-th token past 48 nats (a peaked row's) ends the head at the last bin
// but one: draw_on_head treats the tokens beyond as weightless (each < e^-48 of the top token).
// Block 0, on the prefix sums (with top-k, of the counts alone).
__device__ int head_bin(const Shared& sh, const SamplingParams& p, double u, double total, int vocab) {
  if (p.top_k > 0 && p.top_k < vocab) {
    const int bin = bin_reaching_count(sh, u64(p.top_k));
    return bin == kBins - 1 && sh.bin_count[kBins - 2] <= unsigned(kMaxCandidates) ? kBins - 2 : bin;
  }
  int last = kBins - 1;
  if (p.top_p < 1.0f) last = bin_reaching_mass(sh, double(p.top_p) * total, false);
  if (p.min_p > 0.0f) last = min(last, min(bin_of_depth(-logf(p.min_p)) + 1, kBins - 1));
  if (p.top_p >= 1.0f && p.min_p <= 0.0f) last = bin_reaching_mass(sh, u * total, true);
  return last;
}

// Who walks the head in block 0: the whole block (any head), or its first warp (a head of at most
// 64 tokens, with no block barriers). Member m holds the sorted head's tokens 2m and 2m + 1.
struct BlockTeam {
  Shared& sh;
  static constexpr int kMaxHead = 2 * kThreads;
  __device__ int member() const { return int(threadIdx.x); }
  __device__ void sort(int c) const { sort_candidates(sh, c); }
  __device__ u64 sum(u64 v) const { return block_allreduce(v, SumOp{}, sh); }
  __device__ double exclusive_sum(double v) const { return exclusive_block_scan(CountWeight{0, v}, sh).mass; }
  __device__ double from(double v, int m) const {  // member m's v
    __syncthreads();
    if (m == member()) sh.scratch = u64(__double_as_longlong(v));
    __syncthreads();
    return __longlong_as_double((long long)(sh.scratch));
  }
};
static_assert(BlockTeam::kMaxHead == kMaxCandidates, "the block walks any head the gather holds");
struct WarpTeam {
  Shared& sh;
  static constexpr int kMaxHead = 64;
  __device__ int member() const { return int(threadIdx.x % 32); }
  __device__ void sort(int c) const { rank_sort<32>(sh, c, member(), [] { __syncwarp(); }); }
  __device__ u64 sum(u64 v) const {
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) v += shuffle_xor(v, mask);
    return v;
  }
  __device__ double exclusive_sum(double v) const {
    const int lane = member();
    double inclusive = v;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const double up = shuffle_from(inclusive, lane >= offset ? lane - offset : lane);
      if (lane >= offset) inclusive += up;
    }
    return inclusive - v;
  }
  __device__ double from(double v, int m) const { return shuffle_from(v, m); }
};

// The team, with the head's c tokens (at most Team::kMaxHead) gathered into block 0: sorts them
// (unless `sorted`) and takes every cut and the draw on them, in the host sampler's order. Each token weighs
// its bin's fixed-point share, as the histogram sums it. `total` is the row's weight (without
// top-k). With top-k the kept weights are the head's own: top-k's tokens past the head (past 48
// nats) count as weightless. Returns -1 when a place the draw needs lies past the head (the
// histogram's and the head's sums round apart); every member returns the same.
template <typename Team>
__device__ int draw_on_head(const Team& team, const SamplingParams& p, double u, float peak, double total, int c, int vocab,
                            bool sorted = false) {
  const u64* head = team.sh.candidates;
  if (!sorted) team.sort(c);
  const float t = p.temperature;
  const int m = team.member();
  double w[2];
  for (int k = 0; k < 2; ++k) {
    const int i = 2 * m + k;
    w[k] = 0.0;
    if (i < c) {
      const float d = depth(value_of(head[i]), peak, t);
      const int bin = bin_of_depth(d);
      w[k] = double(fixed_in_bin(d, bin)) * bin_unit(bin);
    }
  }
  const double start = team.exclusive_sum(w[0] + w[1]);
  const double through[2] = {start + w[0], start + w[0] + w[1]};
  // The index of the first token whose weight through it reaches x (>= x; > x when strict); c if none.
  const auto first_reaching = [&](double x, bool strict) {
    u64 below = 0;
    for (int k = 0; k < 2; ++k) below += 2 * m + k < c && (strict ? through[k] <= x : through[k] < x) ? 1 : 0;
    return int(team.sum(below));
  };
  const auto through_token = [&](int j) { return team.from(through[j % 2], j / 2); };
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  bool cut = top_k;  // else the kept set is the whole row
  int keep = top_k ? min(p.top_k, c) : c;
  if (p.top_p < 1.0f) {
    const double base = top_k ? through_token(keep - 1) : total;
    const int j = first_reaching(double(p.top_p) * base, false);
    if (j < keep) keep = j + 1, cut = true;
    else if (!top_k && p.min_p <= 0.0f) return -1;
  }
  if (p.min_p > 0.0f) {  // the heavy tokens are a prefix of the order, the top one among them
    u64 heavy = 0;
    for (int k = 0; k < 2; ++k) heavy += 2 * m + k < c && expf(-depth(value_of(head[2 * m + k]), peak, t)) >= p.min_p ? 1 : 0;
    const int at_least = max(1, int(team.sum(heavy)));
    keep = cut ? min(keep, at_least) : at_least;
    cut = true;
  }
  const double kept = cut ? through_token(keep - 1) : total;
  const int j = first_reaching(u * kept, true);
  if (!cut && j >= c) return -1;
  return id_of(head[cut ? min(j, keep - 1) : j]);
}

// The small top-k path (step 2), in step 1: this thread's share of the bound on the row's k-th
// logit, from the block's thread maxima (`thread_max`, -FLT_MAX for a thread without tokens).
// Each warp sorts its maxima (a bitonic network over the lanes) and puts its 8 largest in shared
// memory; a value among those 128 with k of them at or above it is held by k threads, so k of the
// block's tokens lie at or above it. The largest such value, over the cluster (StatsOp's max),
// bounds the row's k-th logit from below. Every thread of the block calls it; -inf from the
// threads that hold no such value.
__device__ float small_top_k_bound(Row& row, float thread_max, int k) {
  Shared& sh = row.sh;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  __syncthreads();  // an earlier call's readers of bounds are done
  float v = thread_max;
#pragma unroll
  for (int size = 2; size <= 32; size *= 2)
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, v, stride);
      v = ((lane & stride) == 0) == ((lane & size) == 0) ? fmaxf(v, other) : fminf(v, other);  // descending by lane
    }
  if (lane < kBoundsPerWarp) sh.bounds[warp * kBoundsPerWarp + lane] = v;
  __syncthreads();
  float share = -INFINITY;
  if (threadIdx.x < unsigned(kWarps * kBoundsPerWarp)) {
    const float value = sh.bounds[threadIdx.x];
    int at_or_above = 0;
    const float4* all = reinterpret_cast<const float4*>(sh.bounds);
#pragma unroll 8
    for (int i = 0; i < kWarps * kBoundsPerWarp / 4; ++i) {
      const float4 q = all[i];
      at_or_above += (q.x >= value) + (q.y >= value) + (q.z >= value) + (q.w >= value);
    }
    if (at_or_above >= k) share = value;
  }
  return share;  // (the cluster reduction's block barriers come before bounds is written again)
}

// The warp's takers append their keys (key(), made by the takers only) to out, one counter
// update a warp; past kMaxCandidates they are only counted. Every lane of the warp calls it.
template <typename Key>
__device__ __forceinline__ void warp_append(bool take, Key&& key, u64* out, int* counter) {
  const unsigned takers = __ballot_sync(0xffffffffu, take);
  if (takers == 0) return;
  const unsigned lane = threadIdx.x % 32;
  int base = 0;
  if (lane == 0) base = atomicAdd(counter, __popc(takers));
  base = __shfl_sync(0xffffffffu, base, 0);
  const int at = base + __popc(takers & ((1u << lane) - 1u));
  if (take && at < kMaxCandidates) out[at] = key();
}

// Every block: the order keys of its tokens at or above `bound`, gathered in its own shared
// memory, then appended to block 0's candidates (one cluster-wide counter update a block); block
// 0's counter (its copy of `counter`, zero before) may pass kMaxCandidates. Returns the count,
// the same in every block, after a cluster barrier.
__device__ int gather_at_or_above(Row& row, float bound, int& own_counter) {
  Shared& sh = row.sh;
  if (threadIdx.x == 0) sh.own_count = 0;
  __syncthreads();
  const int quads = row.n / 4;
  for (int j0 = 0; j0 < quads; j0 += kThreads) {  // the same trip count in every warp
    const int j = j0 + int(threadIdx.x);
    float4 q = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    if (j < quads) q = reinterpret_cast<const float4*>(row.x)[j];
    const int id = row.base + 4 * j;
    warp_append(q.x >= bound, [&] { return order_key(q.x, id); }, sh.own, &sh.own_count);
    warp_append(q.y >= bound, [&] { return order_key(q.y, id + 1); }, sh.own, &sh.own_count);
    warp_append(q.z >= bound, [&] { return order_key(q.z, id + 2); }, sh.own, &sh.own_count);
    warp_append(q.w >= bound, [&] { return order_key(q.w, id + 3); }, sh.own, &sh.own_count);
  }
  const int i = 4 * quads + int(threadIdx.x);  // the last n % 4 tokens
  const float x = i < row.n ? row.x[i] : -INFINITY;
  warp_append(x >= bound, [&] { return order_key(x, row.base + i); }, sh.own, &sh.own_count);
  __syncthreads();
  int* counter = row.cluster.map_shared_rank(&own_counter, 0);
  const int own = sh.own_count;
  if (threadIdx.x == 0) sh.own_base = own ? atomicAdd(counter, own) : 0;
  __syncthreads();
  u64* out = row.cluster.map_shared_rank(sh.candidates, 0);
  for (int k = int(threadIdx.x); k < min(own, kMaxCandidates); k += kThreads)
    if (sh.own_base + k < kMaxCandidates) out[sh.own_base + k] = sh.own[k];
  row.cluster.sync();
  return *counter;
}

// Block 0: the k best of its c gathered candidates (k <= c <= kMaxCandidates), in order, as the
// first k candidates. The candidates are counted into 256 bins of value between the row's
// maximum and the bound; those up to the bin that reaches k hold the k best (a higher bin holds
// only lower values), ~k of them. Each of those is ranked by the number above it (keys are
// unique), over segments of them so that ~2 (key, segment) pairs fall to each thread.
__device__ void select_best(Shared& sh, int c, int k, float peak, float bound) {
  constexpr int kSelectBins = 256;
  static_assert(kSelectBins == 8 * 32 && kSelectBins <= kMaxCandidates, "one warp scans the bins, 8 a lane");
  unsigned* bins = sh.candidate_rank;
  for (int b = int(threadIdx.x); b < kSelectBins; b += kThreads) bins[b] = 0;
  float scale = peak > bound ? float(kSelectBins) / (peak - bound) : 0.0f;
  if (!isfinite(scale)) scale = 0.0f;  // a bound of -FLT_MAX: one bin (a small vocabulary)
  const auto bin_of = [&](u64 key) { return min(int((peak - value_of(key)) * scale), kSelectBins - 1); };
  __syncthreads();
  for (int i = int(threadIdx.x); i < c; i += kThreads) atomicAdd(&bins[bin_of(sh.candidates[i])], 1u);
  __syncthreads();
  if (threadIdx.x < 32) {  // the first bin whose prefix count reaches k
    const int lane = int(threadIdx.x);
    unsigned own = 0;
    for (int b = 8 * lane; b < 8 * lane + 8; ++b) own += bins[b];
    unsigned inclusive = own;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const unsigned up = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += up;
    }
    const unsigned reached = __ballot_sync(0xffffffffu, inclusive >= unsigned(k));  // the last lane always reaches
    const int first = __ffs(int(reached)) - 1;
    if (lane == first) {
      unsigned cumulative = inclusive - own;
      int b = 8 * lane;
      while ((cumulative += bins[b]) < unsigned(k)) ++b;
      sh.scratch = u64(b);
    }
    if (lane == 0) sh.own_count = 0;
  }
  __syncthreads();
  const int last_bin = int(sh.scratch);
  for (int i0 = 0; i0 < c; i0 += kThreads) {  // the same trip count in every warp
    const int i = i0 + int(threadIdx.x);
    const u64 key = i < c ? sh.candidates[i] : 0;
    warp_append(i < c && bin_of(key) <= last_bin, [&] { return key; }, sh.select.kept, &sh.own_count);
  }
  __syncthreads();
  const int n = sh.own_count;
  unsigned* rank = sh.candidate_rank;  // (the bins are done with)
  for (int i = int(threadIdx.x); i < n; i += kThreads) rank[i] = 0;
  __syncthreads();
  const int segments = max(1, 2 * kThreads / n), length = (n + segments - 1) / segments;
  for (int item = int(threadIdx.x); item < n * segments; item += kThreads) {
    const int i = item % n, from = (item / n) * length, to = min(n, from + length);
    const u64 key = sh.select.kept[i];
    unsigned above = 0;
    for (int m = from; m < to; ++m) above += sh.select.kept[m] > key ? 1u : 0u;
    if (above) atomicAdd(&rank[i], above);
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += kThreads)
    if (rank[i] < unsigned(k)) sh.select.best[rank[i]] = sh.select.kept[i];
  __syncthreads();
  if (int(threadIdx.x) < k) sh.candidates[threadIdx.x] = sh.select.best[threadIdx.x];
  __syncthreads();
}

// The small top-k path's draw (1 <= top_k <= kMaxSmallTopK, top_k < vocab): every block gathers
// its tokens at or above the bound from step 1; block 0 keeps the k best in order and its first
// warp walks them as draw_on_head does the histogram's head, with the same weights, so the two
// paths draw the same token. A k-th token past 48 nats ends the head before the last bin, as
// head_bin does. Returns the token in every block, or -1 when the candidates do not fit the
// gather (every block then goes on to the histogram).
__device__ int draw_small_top_k(Row& row, const SamplingParams& p, double u, float peak, float bound, int vocab) {
  Shared& sh = row.sh;
  const bool zero = row.rank == 0;
  const int c = gather_at_or_above(row, bound, sh.gathered);
  mark(row, SampleRowsPhase::kCandidates);
  if (c < p.top_k || c > kMaxCandidates) {
    row.cluster.sync();  // every block has read the count
    if (zero && threadIdx.x == 0) sh.gathered = 0;
    __syncthreads();
    return -1;
  }
  int token = 0;
  if (zero) {
    select_best(sh, c, p.top_k, peak, bound);
    mark(row, SampleRowsPhase::kSelected);
    if (threadIdx.x < 32) {
      int head = 0;
      for (int k = 0; k < 2; ++k) {
        const int i = 2 * int(threadIdx.x) + k;
        head += i < p.top_k && bin_of_depth(depth(value_of(sh.candidates[i]), peak, p.temperature)) < kBins - 1 ? 1 : 0;
      }
#pragma unroll
      for (int mask = 16; mask > 0; mask /= 2) head += __shfl_xor_sync(0xffffffffu, head, mask);
      token = draw_on_head(WarpTeam{sh}, p, u, peak, 0.0, head, vocab, true);
    }
  }
  mark(row, SampleRowsPhase::kHeadDrawn);
  token = int(unsigned(share_from_block0(row, u64(unsigned(token)))));
  if (token < 0 && zero && threadIdx.x == 0) sh.gathered = 0;  // (every block has read the count)
  __syncthreads();
  return token;
}

// The processed row's draw (temperature > 0), in the host sampler's order: the token id,
// in block 0 (the others may return anything). The kept set is the first `keep` tokens of the
// order; each cut and the draw is a place found by locate().
// With the small top-k path's bound from step 1 (> -inf), that path first.
__device__ int draw(Row& row, const SamplingParams& p, std::uint64_t step, float peak, float bound, int vocab) {
  Shared& sh = row.sh;
  const float t = p.temperature;
  const double u = uniform_draw(p.seed, step);
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  if (bound > -INFINITY) {
    const int token = draw_small_top_k(row, p, u, peak, bound, vocab);
    if (token >= 0) return token;
  }
  build_histogram(row, peak, t, !top_k);
  mark(row, SampleRowsPhase::kHistogram);
  const bool zero = row.rank == 0;
  double total = zero && !top_k ? sh.bin_mass[kBins - 1] : 0.0;
  u64 head = 0;  // the head's last bin, and its tokens
  if (zero) {
    const int last = head_bin(sh, p, u, total, vocab);
    head = u64(last) | (u64(sh.bin_count[last]) << 32);
  }
  head = share_from_block0(row, head);
  mark(row, SampleRowsPhase::kHeadChosen);
  if ((head >> 32) <= u64(kMaxCandidates)) {
    gather(row, peak, t, 0, int(head & 0xffffffffu), -1);
    mark(row, SampleRowsPhase::kHeadGathered);
    // Block 0's first warp walks a short head alone; share_from_block0 takes its first lane's token.
    const int c = int(head >> 32);
    int token = 0;
    if (zero && c <= WarpTeam::kMaxHead) {
      if (threadIdx.x < 32) token = draw_on_head(WarpTeam{sh}, p, u, peak, total, c, vocab);
    } else if (zero) {
      token = draw_on_head(BlockTeam{sh}, p, u, peak, total, c, vocab);
    }
    mark(row, SampleRowsPhase::kHeadDrawn);
    token = int(unsigned(share_from_block0(row, u64(unsigned(token)))));
    if (token >= 0) return token;
  }
  // A larger head, or a place past it: the places one by one, on the masses too.
  if (top_k) {
    build_histogram(row, peak, t, true);
    total = zero ? sh.bin_mass[kBins - 1] : 0.0;
  }
  Loaded loaded;
  Place place{};
  bool fits = true;

  // top-k: the first top_k tokens; their weight is top-p's base.
  u64 keep = u64(vocab);
  double base = total;
  if (top_k) {
    keep = u64(p.top_k);
    if (p.top_p < 1.0f) {
      fits = locate(row, peak, t, true, double(keep), false, loaded, &place);
      base = place.through;
    }
  }
  // top-p over what top-k kept: the shortest head whose weight reaches top_p of it.
  if (fits && p.top_p < 1.0f) {
    fits = locate(row, peak, t, false, double(p.top_p) * base, false, loaded, &place);
    keep = min(keep, place.index + 1);
  }
  // min-p: no token below min_p of the top one's weight (the top one always stays).
  if (fits && p.min_p > 0.0f) keep = min(keep, max(u64(1), count_heavy(row, peak, t, p.min_p)));
  keep = share_from_block0(row, keep);  // block 0's, for every block's control flow
  // The kept weight, then the first token whose cumulative weight passes u times it; past the
  // kept set (rounding), its last token, as the host.
  double kept = total;
  if (fits && keep < u64(vocab)) {
    fits = locate(row, peak, t, true, double(keep), false, loaded, &place);
    kept = place.through;
  }
  if (fits) fits = locate(row, peak, t, false, u * kept, true, loaded, &place);
  if (fits && share_from_block0(row, zero && place.index >= keep ? 1 : 0))
    fits = locate(row, peak, t, true, double(keep), false, loaded, &place);
  if (fits && share_from_block0(row, zero && place.id < 0 ? 1 : 0)) fits = false;  // (that place had no id)
  if (fits) return place.id;
  return draw_by_bisection(row, p, u, peak, vocab);
}

// The n largest raw logits (n <= kMaxTopLogprobs), written by block 0 as logprobs. With a bound
// from step 1 (> -inf) on the raw row's n-th logit, as the small top-k path takes its k best;
// otherwise, or when those candidates overflow the gather, the bins up to the one holding the
// n-th are gathered and sorted. Ends with a cluster barrier, after which block 0's candidates
// are free for the draw.
__device__ void top_logprobs(Row& row, int n, float peak, float bound, float log_sum, TopLogprob* out) {
  Shared& sh = row.sh;
  if (bound > -INFINITY) {
    const int c = gather_at_or_above(row, bound, sh.gathered_top);
    if (c >= n && c <= kMaxCandidates) {
      if (row.rank == 0) {
        select_best(sh, c, n, peak, bound);
        for (int j = int(threadIdx.x); j < n; j += kThreads)
          out[j] = TopLogprob{id_of(sh.candidates[j]), value_of(sh.candidates[j]) - log_sum};
      }
      row.cluster.sync();
      return;
    }
  }
  build_histogram(row, peak, 1.0f, false);
  const u64 hi = share_from_block0(row, row.rank == 0 ? u64(bin_reaching_count(sh, u64(n))) | (u64(sh.bin_count[bin_reaching_count(sh, u64(n))]) << 32) : 0);
  int c = int(hi >> 32);
  if (c <= kMaxCandidates) {
    gather(row, peak, 1.0f, 0, int(hi & 0xffffffffu), -1);
  } else {
    // Ties over a whole bin: the n-th key by bisection, then exactly the n keys from it.
    const u64 nth = largest_key_where(row, peak, 1.0f, 0.0f, [&](CountMass m) { return m.count >= u64(n); });
    u64* dst = row.cluster.map_shared_rank(sh.candidates, 0);
    int* counter = row.cluster.map_shared_rank(&sh.gathered, 0);
    for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
      const u64 key = order_key(row.x[i], row.base + i);
      if (key >= nth) dst[atomicAdd(counter, 1)] = key;
    }
    row.cluster.sync();
    c = n;
  }
  if (row.rank == 0) {
    sort_candidates(sh, c);
    for (int j = int(threadIdx.x); j < n; j += kThreads)
      out[j] = TopLogprob{id_of(sh.candidates[j]), value_of(sh.candidates[j]) - log_sum};
    if (threadIdx.x == 0) sh.gathered = 0;
  }
  row.cluster.sync();
}

__device__ void penalise_row(Row& row, const SamplingParams& p, const PenaltyToken* entries, int count, int newest,
                             bool newest_is_output, const PenaltyToken& first);

// Applies the logit bias, then the penalties, then the allowed-token mask (`allowed`, or none)
// to the slice: the bias entries in it, the row's penalty entries and its input token `newest`,
// the tokens the mask leaves out. Notes the lowest id among them whose raw logit was not finite
// (the clamp or the mask hides it).
__device__ void process_row(Row& row, const SamplingParams& p, const LogitBias* bias, int bias_count,
                            const PenaltyToken* entries, int count, int newest, bool newest_is_output,
                            const PenaltyToken& first, const std::uint32_t* allowed) {
  Shared& sh = row.sh;
  if (threadIdx.x == 0) sh.newest_found = 0, sh.penalised_nonfinite = INT_MAX;
  __syncthreads();
  for (int e = int(threadIdx.x); e < bias_count; e += kThreads) {  // ids are distinct: no two threads meet
    const LogitBias b = bias[e];
    if (b.id < row.base || b.id >= row.base + row.n) continue;
    float& v = row.x[b.id - row.base];
    if (!isfinite(v)) atomicMin(&sh.penalised_nonfinite, b.id);
    v = fminf(fmaxf(v + b.bias, -FLT_MAX), FLT_MAX);  // clamped to the finite floats, as the host does
  }
  __syncthreads();
  if (p.has_penalties()) penalise_row(row, p, entries, count, newest, newest_is_output, first);
  if (allowed == nullptr) return;
  // The allowed-token mask last, as on the host: every token it leaves out at -FLT_MAX.
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const int id = row.base + i;
    if (allowed[id / 32] >> (id % 32) & 1u) continue;
    if (!isfinite(row.x[i])) atomicMin(&sh.penalised_nonfinite, id);
    row.x[i] = -FLT_MAX;
  }
  __syncthreads();
}

// The repetition, frequency and presence penalties, applied to the row's copy (process_row).
__device__ void penalise_row(Row& row, const SamplingParams& p, const PenaltyToken* entries, int count, int newest,
                             bool newest_is_output, const PenaltyToken& first) {
  Shared& sh = row.sh;
  const auto penalise = [&](int id, int output_count, bool in_prompt) {
    float v = row.x[id - row.base];
    if (!isfinite(v)) atomicMin(&sh.penalised_nonfinite, id);
    if (in_prompt || output_count > 0) v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    v -= float(output_count) * p.frequency_penalty + (output_count > 0 ? p.presence_penalty : 0.0f);
    row.x[id - row.base] = fminf(fmaxf(v, -FLT_MAX), FLT_MAX);  // clamped to the finite floats, as the host does
  };
  for (int e = int(threadIdx.x); e < count; e += kThreads) {
    const PenaltyToken t = e == int(threadIdx.x) ? first : entries[e];
    if (t.id < row.base || t.id >= row.base + row.n) continue;
    const bool is_newest = t.id == newest;
    if (is_newest) sh.newest_found = 1;
    penalise(t.id, t.output_count + (is_newest && newest_is_output ? 1 : 0), t.in_prompt != 0 || (is_newest && !newest_is_output));
  }
  __syncthreads();
  if (threadIdx.x == 0 && !sh.newest_found && newest >= row.base && newest < row.base + row.n)
    penalise(newest, newest_is_output ? 1 : 0, !newest_is_output);
  __syncthreads();
}

// The slice's best finite logit (lowest id on ties: ids rise within a thread) into (max, id),
// and its lowest non-finite id into nonfinite.
__device__ void best_of(const Row& row, float& max, int& id, int& nonfinite) {
  for_each_logit(row, [&](float v, int i) {
    if (!isfinite(v)) nonfinite = min(nonfinite, row.base + i);
    else if (v > max || id == INT_MAX) max = v, id = row.base + i;
  });
}
// The slice's raw best, non-finite id and sum of exp(x - its raw max).
__device__ RowStats raw_stats(const Row& row) {
  RowStats s = empty_stats();
  best_of(row, s.raw_max, s.raw_id, s.nonfinite);
  if (s.raw_id != INT_MAX) for_each_logit(row, [&](float v, int) { s.raw_sum += isfinite(v) ? expf(v - s.raw_max) : 0.0f; });
  return s;
}
// ... and the slice's processed best (after the penalties).
__device__ void processed_best(const Row& row, RowStats& s) {
  int nonfinite = INT_MAX;  // the raw row's are known
  best_of(row, s.max, s.id, nonfinite);
}
// The slice's best and lowest non-finite logit in one pass.
__device__ RowStats best_and_nonfinite(const Row& row) {
  RowStats s = empty_stats();
  best_of(row, s.max, s.id, s.nonfinite);
  return s;
}

// What a row's sampling reads from global memory besides the logits, loaded while the slice
// copies in: its parameters, its input token and this thread's first penalty entry.
struct RowInputs {
  RowSampling rs;
  int newest = 0;
  PenaltyToken first{};
};
__device__ RowInputs load_row_inputs(const SampleRowsArgs& a, int r) {
  RowInputs in;
  in.rs = a.sampling[r];
  if (in.rs.params.has_penalties()) {
    in.newest = a.tokens[a.logit_rows[r]];
    const int e = in.rs.penalty_begin + int(threadIdx.x);
    if (e < in.rs.penalty_end) in.first = a.penalty_tokens[e];
  }
  return in;
}

__device__ void sample_row(Row& row, const SampleRowsArgs& a, int r, const float* logits, const RowInputs& in) {
  const RowSampling& rs = in.rs;
  const SamplingParams& p = rs.params;
  const std::uint32_t* allowed = rs.mask_offset >= 0 ? a.token_masks + rs.mask_offset : nullptr;
  // `penalties`: the copy is processed (a logit bias, penalties, an allowed-token mask) before the draw.
  const bool penalties = p.has_penalties() || rs.bias_end > rs.bias_begin || allowed != nullptr, top_n = p.logprobs > 0;
  const auto process = [&] {
    process_row(row, p, a.logit_bias + rs.bias_begin, rs.bias_end - rs.bias_begin, a.penalty_tokens + rs.penalty_begin,
                rs.penalty_end - rs.penalty_begin, in.newest, rs.newest_is_output != 0, in.first, allowed);
  };
  const bool small_top_k = a.small_top_k && p.temperature > 0.0f && p.top_k >= 1 && p.top_k <= kMaxSmallTopK && p.top_k < a.vocab;
  // A thread's processed maximum, before the reduction, gives its share of the small top-k bound.
  const auto with_bound = [&](RowStats local) {
    if (small_top_k) local.bound = small_top_k_bound(row, local.max, p.top_k);
    return local;
  };
  RowStats s;
  if (p.logprobs < 0) {
    // One pass over the processed row, the penalties first: the raw row's non-finite logits are
    // those the pass finds and those the penalties changed.
    if (penalties)
      process();
    RowStats local = best_and_nonfinite(row);
    if (penalties) local.nonfinite = min(local.nonfinite, row.sh.penalised_nonfinite);
    mark(row, SampleRowsPhase::kStatsPass);
    s = cluster_allreduce(with_bound(local), StatsOp{}, row);
  } else {
    s = raw_stats(row);
  }
  if (top_n) {  // the top-n raw logits before the penalties change the copy
    const int n = min(p.logprobs, a.vocab);
    s.max = s.raw_max, s.id = s.raw_id;
    // This thread's raw maximum bounds the top n, and without penalties the draw's k best too.
    if (a.small_top_k && n <= kMaxSmallTopK) s.top_bound = small_top_k_bound(row, s.raw_max, n);
    if (!penalties) s = with_bound(s);
    s = cluster_allreduce(s, StatsOp{}, row);
    if (s.nonfinite == INT_MAX)
      top_logprobs(row, n, s.raw_max, s.top_bound, s.raw_max + logf(s.raw_sum), a.top_logprobs + std::size_t(r) * kMaxTopLogprobs);
  }
  if (p.logprobs >= 0 && (s.nonfinite == INT_MAX || !top_n)) {
    if (penalties)
      process();
    if (penalties || !top_n) {
      RowStats local = top_n ? empty_stats() : s;
      if (penalties) processed_best(row, local);
      else local.max = local.raw_max, local.id = local.raw_id;
      const RowStats all = cluster_allreduce(with_bound(local), StatsOp{}, row);
      if (top_n) s.max = all.max, s.id = all.id, s.bound = all.bound;
      else s = all;
    }
  }
  LogitSummary summary{};
  if (s.nonfinite != INT_MAX) {
    summary.nonfinite = s.nonfinite;
    summary.nonfinite_value = logits[s.nonfinite];
    if (row.rank == 0 && threadIdx.x == 0) a.summaries[r] = summary;
    return;
  }
  mark(row, SampleRowsPhase::kStats);
  int token = p.temperature == 0.0f ? s.id : draw(row, p, rs.step, s.max, s.bound, a.vocab);
  // (a draw whose sums round past the allowed tokens' would land on a disallowed one of weight 0)
  if (allowed != nullptr && !(allowed[token / 32] >> (token % 32) & 1u)) token = s.id;
  mark(row, SampleRowsPhase::kDrawn);
  if (row.rank == 0 && threadIdx.x == 0) {
    summary.token = token;
    summary.logprob = p.logprobs >= 0 ? logits[token] - (s.raw_max + logf(s.raw_sum)) : 0.0f;
    a.summaries[r] = summary;
  }
}

#endif  // __CUDA_ARCH__ >= 900

__global__ void __launch_bounds__(kThreads, 2) sample_rows_kernel(SampleRowsArgs a, int slice_len) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ Shared sh;
  extern __shared__ float4 dynamic_smem[];
  wait_for_prior_grids();
  allow_next_grid();
  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = int(cluster.num_blocks());
  const int r = int(blockIdx.x) / blocks;
  const unsigned rank = cluster.block_rank();
  Row row{cluster, rank, blocks, sh, reinterpret_cast<float*>(dynamic_smem), 0, int(rank) * slice_len, 0, 0,
          a.phase_clocks ? a.phase_clocks + std::size_t(r) * kSampleRowsPhases : nullptr};
  mark(row, SampleRowsPhase::kStart);
  row.n = max(0, min(slice_len, a.vocab - row.base));
  if (threadIdx.x == 0) sh.gathered = 0, sh.gathered_top = 0;
  const float* logits = a.logits + std::size_t(r) * std::size_t(a.vocab);
  RowInputs in;
  if (a.vocab % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.logits) % 16 == 0) {
    // Slices start 16-byte aligned: the copy engine brings the slice in, 16 KB a copy.
    __shared__ SharedBarrier loaded;
    if (threadIdx.x == 0) {
      loaded.init(1);
      SharedBarrier::fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const std::uint64_t policy = l2_evict_first_policy();  // read once
      const unsigned bytes = unsigned(row.n) * 4u;
      for (unsigned at = 0; at < bytes; at += 16384u)
        bulk_copy_to_shared(reinterpret_cast<char*>(row.x) + at, reinterpret_cast<const char*>(logits + row.base) + at,
                            min(16384u, bytes - at), loaded, policy);
      loaded.arrive_expecting(bytes);
    }
    in = load_row_inputs(a, r);
    loaded.wait(0);
  } else {
    in = load_row_inputs(a, r);
    for (int i = int(threadIdx.x); i < row.n; i += kThreads) row.x[i] = __ldcs(logits + row.base + i);
  }
  __syncthreads();
  mark(row, SampleRowsPhase::kLoaded);
  sample_row(row, a, r, logits, in);
  cluster.sync();  // no block leaves while another may still read its shared memory
  mark(row, SampleRowsPhase::kEnd);
#endif
}

// A block's slice of the row, rounded up to 16 bytes.
std::size_t slice_floats(int vocab, int blocks) { return std::size_t((vocab + blocks - 1) / blocks + 3) / 4 * 4; }

// Allows the kernel `smem` bytes of dynamic shared memory (once per size that grows), with the
// whole carveout as shared memory (two blocks of a Qwen3 row's eighth need 218 of its 228 KB).
void configure_kernel(std::size_t smem) {
  static std::mutex mutex;
  static std::size_t configured = 0;
  const std::lock_guard<std::mutex> lock(mutex);
  if (smem <= configured) return;
  ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  configured = smem;
}

bool fits_shared_memory(int vocab, int blocks) {
  // A bin's fixed-point sum in one block stays below 2^32: at most 65,535 tokens a slice.
  return slice_floats(vocab, blocks) <= 65535 &&
         slice_floats(vocab, blocks) * sizeof(float) + sizeof(Shared) <= std::size_t(current_device_info().shared_memory_per_block_optin);
}

// How many clusters of `blocks` blocks fit the device at once (cudaOccupancyMaxActiveClusters:
// a cluster's blocks share one GPC), once per device, vocabulary and cluster size.
int resident_clusters(int vocab, int blocks) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> known;
  int device = 0;
  ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, vocab, blocks);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  const std::size_t smem = slice_floats(vocab, blocks) * sizeof(float);
  configure_kernel(smem);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(blocks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  ASYNCT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, sample_rows_kernel, &config));
  return known[key] = clusters;
}

}  // namespace

bool device_sampling_supported(int vocab) {
  return current_device_info().major >= 9 && vocab >= 1 && fits_shared_memory(vocab, kMaxClusterBlocks);
}

SampleRowsLayout sample_rows_layout(int rows, int vocab) {
  check(rows >= 1, "sample_rows: bad row count ", rows);
  check(device_sampling_supported(vocab), "sample_rows: this device cannot sample a ", vocab,
        "-token vocabulary (needs sm_90 and the row in one cluster's shared memory)");
  // The fewest turns of rows, 8 blocks a row on ties. The H200's GPCs hold 30 eight-block
  // clusters at two blocks a multiprocessor, so 32 rows in 8-block clusters take two turns (32 seven-block clusters fit).
  const SampleRowsLayout eight{kMaxClusterBlocks, resident_clusters(vocab, kMaxClusterBlocks)};
  if (rows <= eight.resident_clusters || !fits_shared_memory(vocab, kMaxClusterBlocks - 1)) return eight;
  const SampleRowsLayout seven{kMaxClusterBlocks - 1, resident_clusters(vocab, kMaxClusterBlocks - 1)};
  const auto turns = [&](const SampleRowsLayout& l) { return l.resident_clusters > 0 ? (rows + l.resident_clusters - 1) / l.resident_clusters : INT_MAX; };
  return turns(seven) < turns(eight) ? seven : eight;
}

void launch_sample_rows(const SampleRowsArgs& a, cudaStream_t stream) {
  check(a.rows >= 0 && a.vocab >= 1, "sample_rows: bad sizes (rows ", a.rows, ", vocab ", a.vocab, ")");
  if (a.rows == 0) return;
  check(a.logits && a.sampling && a.tokens && a.logit_rows && a.summaries, "sample_rows: null pointer");
  check(a.cluster_blocks == 0 || a.cluster_blocks == kMaxClusterBlocks || a.cluster_blocks == kMaxClusterBlocks - 1,
        "sample_rows: cluster_blocks is 0, 7 or 8, not ", a.cluster_blocks);
  const int blocks = a.cluster_blocks ? a.cluster_blocks : sample_rows_layout(a.rows, a.vocab).cluster_blocks;
  check(device_sampling_supported(a.vocab) && fits_shared_memory(a.vocab, blocks), "sample_rows: this device cannot sample a ",
        a.vocab, "-token vocabulary in ", blocks, "-block clusters (needs sm_90 and the row in one cluster's shared memory)");
  const std::size_t smem = slice_floats(a.vocab, blocks) * sizeof(float);
  configure_kernel(smem);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(a.rows) * unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = unsigned(blocks);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attrs;
  config.numAttrs = dependent_launch_enabled() ? 2 : 1;
  ASYNCT_CUDA_CHECK(cudaLaunchKernelEx(&config, sample_rows_kernel, a, int(slice_floats(a.vocab, blocks))));
  check_launch("sample_rows");
}

}  // namespace asynct::kernels
