// A row across a thread-block cluster and the collectives only the sampling kernel uses: order
// keys, depths and bins, warp shuffles, the per-thread statistics and their reductions, block and
// cluster reductions and scans, block 0's decisions shared over distributed shared memory.
// Included once, by sample_rows.cu, inside its anonymous namespace and its sm_90 section (it uses
// that file's constants and Shared): one job of the sampling kernel, not a header of its own.
#pragma once

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
