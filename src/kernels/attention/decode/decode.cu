// Paged decode attention: one query token per sequence against its cached K/V.
//
// Decode reads every cached key (and, for softmax, every value) once and does little arithmetic
// on it, so the kernel is a stream: what matters is keeping enough bytes in flight to cover HBM
// latency, and never stopping the stream at a block-wide barrier. Hence:
//   * one CTA per (group of up to 8 KV heads, sequence, split): a producer warp and one
//     consumer warp per KV head. The producer streams tiles of keys (and, for softmax, values)
//     for all the CTA's heads into a ring of shared-memory stages with bulk copies (TMA); with
//     every head of the cache in one CTA, a tile of a cache block is one contiguous copy. The
//     bytes in flight then depend on the stage ring, not on how many warps are resident or
//     how long their math takes (bench/kv_read_probe.cu: warps loading 256-byte head rows
//     themselves, 3 CTAs of 4 warps per SM, read 3.3 TB/s; bulk copies 4.3 TB/s);
//   * the query heads that share a KV head are computed by its warp together, so each K/V row
//     is read once for all of them (GQA);
//   * a consumer warp reads its head's rows of a tile from the stage: a key's head_dim is spread
//     over kLanesPerKey lanes (8 bf16 = 16 bytes each), kKeysPerLoad keys per warp read, kUnroll
//     reads per tile. The dot products finish with a reduce-scatter inside the lane group, so
//     each score is finished (and gated or exponentiated) in one lane, not in all of them.
//     The async gate's 16-key tiles are scored on tensor cores instead (ldmatrix from the stage,
//     mma.m16n8k16 against q in bf16): 0.9 us less per CTA at 32 x 512 on H200 (RESULTS);
//   * the gate is a policy (SoftmaxGate / AsyncGate) and is all that differs between the two:
//     softmax keeps an online max and sum per head and has V staged with K; the async gate
//     pools the ReLU'd scores over the window (a W-1 halo of scores carried from tile to tile
//     in warp-private shared memory), compacts the keys whose P is non-zero for some head of the
//     group (sparse-P) and bulk-copies only their V rows into the warp's shared memory, used
//     two tiles later;
//   * with the qkv projection as input (DecodeProjection, decode.h), the consumer warps norm and
//     rotate their q heads themselves before their first tile, and the CTA holding a sequence's
//     newest key writes that key and value into the cache and uses them from registers, so the
//     decode step needs no separate qk-norm kernel;
//   * with several splits, each CTA leaves its partial outputs in the workspace and counts
//     itself on its (head group, sequence) counter; the last of the splits to arrive combines
//     them, in split order: a plain sum for the async gate (additivity; each warp recomputes the
//     scores of its W-1 halo keys), the log-sum-exp merge for softmax. No second kernel: at
//     decode sizes its launch and its wait on this one cost more than the combine (2.5 us per
//     layer, 32 sequences, bench/RESULTS.md).
#include "kernels/attention/decode/decode.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/bf16.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_info.h"
#include "kernels/attention/gate.cuh"
#include "kernels/norms/head_norm_rope.cuh"
#include "kernels/common/last_arrival.cuh"
#include "kernels/common/mma_sync.cuh"

namespace asynct::kernels {
namespace {

// One consumer warp per KV head, up to this many per CTA, plus the producer warp.
constexpr int kMaxHeadsPerCta = 8;
constexpr int kMaxThreads = (kMaxHeadsPerCta + 1) * 32;
// Shared memory for the stage ring, per KV head of the CTA: 8 heads x 24 KB = 192 KB (of 227).
constexpr int kStageBudgetPerHead = 24 * 1024;
constexpr int kMaxHalo = 7;  // pool window <= 8
constexpr int kMaxSplits = 256;
constexpr unsigned kFull = 0xffffffffu;

template <int kHeadDim, int kGroup>
struct Layout {
  static constexpr int kLanesPerKey = kHeadDim / 8;          // 8, 16 or 32 lanes share a key
  static constexpr int kKeysPerLoad = 32 / kLanesPerKey;     // whole keys per warp read
  // 16-byte reads per lane and per tile (a tile is one stage for one head); fewer for big
  // groups (registers: q and o hold 8 floats per query head). kTile * kHeadDim is then the same
  // for every head_dim, and so is a stage's size.
  static constexpr int kUnroll = kGroup <= 2 ? 8 : (kGroup == 4 ? 4 : 2);
  static constexpr int kTile = kKeysPerLoad * kUnroll;       // keys per warp iteration
  static constexpr bool kMmaTile = kTile == 16;               // one m16 tile of keys (see StageRing)
  static_assert(kTile <= 32, "the async list gives each key of a tile one lane");
};

__device__ __forceinline__ Bf16x8 load_stream(const bf16* p) {
  // K and V are read once: keep them out of L1.
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  Bf16x8 out;
  memcpy(&out, &v, 16);
  return out;
}

// Where one sequence's keys live: the block table and the cache geometry of one KV head.
struct SeqCache {
  const std::int32_t* table;
  int block_shift, block_mask, row_stride;  // row_stride = num_kv_heads * head_dim
  int kv_head_offset;                       // kv_head * head_dim

  // Element offset of key/value `pos` (this KV head) in the cache.
  __device__ __forceinline__ long long offset(int pos) const {
    const long long block = table[pos >> block_shift];
    return ((block << block_shift) + (pos & block_mask)) * row_stride + kv_head_offset;
  }
};

// A consumer warp's view of one filled stage: its KV head's rows of the tile's keys (and of the
// values staged with them), and the newest key when this warp wrote it (see project_new_token).
// The stage's copy of that key may predate the write (the producer does not wait for it), so
// every reader takes the row as written.
template <int kHeadDim, int kGroup>
struct StagedTile {
  using L = Layout<kHeadDim, kGroup>;
  unsigned char* head_rows;  // the head's row of the tile's first key
  int row_stride;            // bytes from one token's rows to the next
  int first_key, end;        // the tile's first key; the end of the split's keys
  bool wrote_newest;         // whether this warp wrote the sequence's newest key,
  int newest_key;            // at this position
  Bf16x8 newest_k, newest_v;
  SharedBarrier* empty;      // the stage's barrier: each consumer warp arrives once it has read

  __device__ bool holds_newest() const { return wrote_newest && first_key + L::kTile > newest_key; }

  // This lane's 8 elements of key (and value) u * kKeysPerLoad + key lane, u < kUnroll, into
  // registers; keys past the end read as zero.
  __device__ __forceinline__ void read(Bf16x8 (&k)[L::kUnroll], Bf16x8 (&v)[L::kUnroll]) const { read_rows<true>(k, &v); }
  __device__ __forceinline__ void read(Bf16x8 (&k)[L::kUnroll]) const { read_rows<false>(k, nullptr); }

  // The newest key's row as written, in place of the stage's copy, for readers of the stage
  // itself (ldmatrix). The async proxy refills the stage after this write.
  __device__ void put_newest_key() const {
    if (!holds_newest()) return;
    const int lane = threadIdx.x & 31;
    if (lane < L::kLanesPerKey)
      store_bf16x8(reinterpret_cast<bf16*>(head_rows + (newest_key - first_key) * row_stride) + lane * 8, newest_k);
    fence_generic_to_async_shared();
    __syncwarp();
  }

  // The warp is done with the stage (what it needs is in registers): the producer may refill it.
  __device__ void release() const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) empty->arrive();
  }

 private:
  template <bool kValues>
  __device__ __forceinline__ void read_rows(Bf16x8 (&k)[L::kUnroll], Bf16x8 (*v)[L::kUnroll]) const {
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
    const unsigned char* rows = head_rows + slice * 16;
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int row = u * L::kKeysPerLoad + key_lane;
      const bool valid = first_key + row < end;
      k[u] = valid ? *reinterpret_cast<const Bf16x8*>(rows + row * row_stride) : Bf16x8{};
      if constexpr (kValues)
        (*v)[u] = valid ? *reinterpret_cast<const Bf16x8*>(rows + (L::kTile + row) * row_stride) : Bf16x8{};
      if (wrote_newest && first_key + row == newest_key) {
        k[u] = newest_k;
        if constexpr (kValues) (*v)[u] = newest_v;
      }
    }
  }
};

// A tile's scores: each lane's partial dot products (index u * kGroup + h), then a
// reduce-scatter over the kLanesPerKey lanes of each key. At each step a lane sends half of
// what it holds to its partner and adds the partner's other half, so n values take n/2 + n/4
// + ... shuffles (15 for 16) instead of n * log2(kLanesPerKey) (64) for a full reduction in
// every lane. Afterwards lane `slice` holds the complete sums of the values
// [slice * n / kLanesPerKey, +max(1, n / kLanesPerKey)) in v[0..].
template <int kOff, int kCount, int kN>
__device__ __forceinline__ void reduce_scatter(float (&v)[kN], int slice) {
  if constexpr (kOff >= 1) {
    if constexpr (kCount > 1) {
      constexpr int kHalf = kCount / 2;
      const bool upper = (slice & kOff) != 0;  // keeps the upper half
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(kFull, send, kOff);
      }
      reduce_scatter<kOff / 2, kHalf>(v, slice);
    } else {  // fewer values than lanes: the rest is a plain all-reduce
      v[0] += __shfl_xor_sync(kFull, v[0], kOff);
      reduce_scatter<kOff / 2, 1>(v, slice);
    }
  }
}

// Where a tile's scores are after the reduce-scatter: value idx = u * kGroup + h (key u of the
// lane's key group, query head h) is in slot idx % kHeld of the lane(s) slice = idx / kHeld *
// kCopies (kCopies lanes hold each value when there are fewer values than lanes).
template <int kLanesPerKey, int kN>
struct Scatter {
  static constexpr int kHeld = kN >= kLanesPerKey ? kN / kLanesPerKey : 1;
  static constexpr int kCopies = kN >= kLanesPerKey ? 1 : kLanesPerKey / kN;
  __device__ static int index(int slice, int slot) { return slice / kCopies * kHeld + slot; }
  __device__ static constexpr int holder(int idx) { return idx / kHeld * kCopies; }
  __device__ static constexpr int slot(int idx) { return idx % kHeld; }
};

// The tile's scores q . k, reduce-scattered: s[j] is value Scatter::index(slice, j).
template <int kLanesPerKey, int kGroup, int kUnroll>
__device__ __forceinline__ void scattered_scores(const float (&q)[kGroup][8], const Bf16x8 (&k)[kUnroll],
                                                 float (&s)[kUnroll * kGroup]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float kf[8];
    to_float8(k[u], kf);
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(q[h][e], kf[e], dot);
      s[u * kGroup + h] = dot;
    }
  }
  reduce_scatter<kLanesPerKey / 2, kUnroll * kGroup>(s, int(threadIdx.x & 31) % kLanesPerKey);
}

// ---- The gates as policies: what happens between a tile's scores and its P V. -------------

struct SoftmaxGate {
  static constexpr bool kLoadValuesWithKeys = true;  // every V row is needed, staged with K
  // Its K+V stages would fit 3 deep in the budget; measured on H200, 3 were 2-3% slower than 2
  // on every bench_decode shape (a guess at why: the larger ring leaves less room to L1).
  static constexpr int kMaxStages = 2;
  template <typename L>
  static constexpr bool scores_on_tensor_cores() { return false; }
  float softcap;

  template <int kHeadDim, int kGroup>
  struct Scratch {};  // none
  template <typename Smem>
  __device__ static void init_scratch(Smem&) {}

  template <int kHeadDim, int kGroup>
  struct State {
    float max[kGroup], sum[kGroup];
  };
  // The state before the first key, for the query heads first_head .. first_head+kGroup-1.
  template <int kHeadDim, int kGroup>
  __device__ void start(State<kHeadDim, kGroup>& st, int /*first_head*/) const {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) st.max[h] = -FLT_MAX, st.sum[h] = 0.0f;
  }
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ void start_warp(State<kHeadDim, kGroup>&, Smem&, const SeqCache&, const bf16*, const float (&)[kGroup][8],
                             int, int) const {}

  template <int kHeadDim, int kGroup, typename Smem>
  __device__ void finish(State<kHeadDim, kGroup>&, Smem&, float (&)[kGroup][8]) const {}

  // The tile's scores (reduce-scattered: each is softcapped and exponentiated once, not in
  // every lane of its key), online softmax over them, then o += P V with the values staged with
  // the keys, each P shuffled from the lane that holds it.
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ __forceinline__ void tile(State<kHeadDim, kGroup>& st, Smem&, const float (&q)[kGroup][8],
                                       StagedTile<kHeadDim, kGroup> staged, float (&o)[kGroup][8], const SeqCache&,
                                       const bf16*, unsigned long long (&counts)[2]) const {
    using L = Layout<kHeadDim, kGroup>;
    constexpr int kUnroll = L::kUnroll;
    using S = Scatter<L::kLanesPerKey, kUnroll * kGroup>;
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
    const int first_key = staged.first_key, end = staged.end;
    Bf16x8 k[kUnroll], v[kUnroll];
    staged.read(k, v);
    staged.release();
    float s[kUnroll * kGroup];
    scattered_scores<L::kLanesPerKey, kGroup, kUnroll>(q, k, s);
    float tile_max[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) tile_max[h] = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < S::kHeld; ++j) {
      const int idx = S::index(slice, j), u = idx / kGroup;
      s[j] = first_key + u * L::kKeysPerLoad + key_lane < end ? softcap_score(s[j], softcap) : -FLT_MAX;
#pragma unroll
      for (int h = 0; h < kGroup; ++h)
        if (idx % kGroup == h) tile_max[h] = fmaxf(tile_max[h], s[j]);
    }
    float p[S::kHeld];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFull, tile_max[h], off));
      const float new_max = fmaxf(st.max[h], tile_max[h]);
      const float rescale = __expf(st.max[h] - new_max);
      st.max[h] = new_max;
      st.sum[h] *= rescale;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] *= rescale;
#pragma unroll
      for (int j = 0; j < S::kHeld; ++j)
        if (S::index(slice, j) % kGroup == h) p[j] = __expf(s[j] - new_max);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float vf[8];
      to_float8(v[u], vf);
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const int idx = u * kGroup + h;
        const float pu = __shfl_sync(kFull, p[S::slot(idx)], key_lane * L::kLanesPerKey + S::holder(idx));
        st.sum[h] += pu;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[h][e] = fmaf(pu, vf[e], o[h][e]);
      }
    }
    if (lane == 0) {
      const int valid = min(L::kTile, end - first_key);
      counts[0] += (unsigned long long)valid * kGroup;
      counts[1] += (unsigned long long)valid;
    }
  }
};

struct AsyncGate {
  static constexpr bool kLoadValuesWithKeys = false;  // V rows wait for P: only non-zero ones
  static constexpr int kMaxStages = 8;
  // A tile's listed V rows are copied into the warp's shared memory as soon as the list is
  // built, and used kValueLead tiles later, so their latency hides behind that much work.
  static constexpr int kValueLead = 2;
  static constexpr int kValueSlots = kValueLead + 1;
  // A 16-key tile (one m16 tile of keys) is scored on tensor cores: ldmatrix from the stage,
  // mma.m16n8k16 against q in bf16 (the stage rows are padded for it, see StageRing).
  template <typename L>
  static constexpr bool scores_on_tensor_cores() { return L::kMmaTile; }
  int window;
  const float *alpha, *sigma, *gamma;  // per query head, device

  template <int kHeadDim, int kGroup>
  struct Scratch {
    using L = Layout<kHeadDim, kGroup>;
    alignas(128) bf16 values[kValueSlots][L::kTile][kHeadDim];  // the listed V rows, in list order
    float weights[kValueSlots][L::kTile][kGroup];               // their P, per query head
    int listed[kValueSlots];
    SharedBarrier values_ready[kValueSlots];
    float scores[kGroup][kMaxHalo + L::kTile];  // the carried halo, then this tile
    float tile_p[L::kTile][kGroup];             // P of this tile, before compaction
    // q in bf16, on its way to the tensor-core scores' B operand (one row when not used).
    alignas(16) bf16 q_bf16[scores_on_tensor_cores<L>() ? kGroup : 1][kHeadDim];
  };
  template <typename Smem>
  __device__ static void init_scratch(Smem& sm) {
    for (int i = 0; i < kValueSlots; ++i) sm.values_ready[i].init(1);
  }

  template <int kHeadDim, int kGroup>
  struct State {
    float alpha, sigma, gamma;  // of the query head this lane gates (see tile)
    float inv_window;
    int tiles = 0;              // tiles listed so far
    // The tensor-core scores' B operand, q^T (head_dim x query heads, padded to 8 with zeros):
    // this lane holds column lane / 4, rows 2 (lane % 4) + {0, 1} and + {8, 9} of each k16 step.
    unsigned q_operand[scores_on_tensor_cores<Layout<kHeadDim, kGroup>>() ? kHeadDim / 16 : 1][2] = {};
  };
  template <int kHeadDim, int kGroup>
  __device__ void start(State<kHeadDim, kGroup>& st, int first_head) const {
    const int head = first_head + int(threadIdx.x & 31) % kGroup;
    st.alpha = alpha[head];
    st.sigma = sigma[head];
    st.gamma = gamma[head];
    st.inv_window = 1.0f / float(window);
  }

  // Reduce-scattered scores (see scattered_scores) into the warp's score rows: key u of this
  // lane's key group goes to column `column + u * kKeysPerLoad + key group`; one lane stores each.
  template <typename L, int kUnroll, typename Smem, int kN>
  __device__ static void store_scores(Smem& sm, const float (&s)[kN], int column) {
    using S = Scatter<L::kLanesPerKey, kN>;
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
    constexpr int kGroup = kN / kUnroll;
    if (slice % S::kCopies != 0) return;
#pragma unroll
    for (int j = 0; j < S::kHeld; ++j) {
      const int idx = S::index(slice, j), u = idx / kGroup, h = idx % kGroup;
      sm.scores[h][column + u * L::kKeysPerLoad + key_lane] = s[j];
    }
  }

  // The halo: the scores of the W-1 keys before the warp's first key (zero left of key 0,
  // where the definition puts R = 0), recomputed rather than carried across splits.
  // And, for tensor-core scores, q as their B operand.
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ void start_warp(State<kHeadDim, kGroup>& st, Smem& sm, const SeqCache& cache, const bf16* key_cache,
                             const float (&q)[kGroup][8], int begin, int) const {
    using L = Layout<kHeadDim, kGroup>;
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey;
    if constexpr (scores_on_tensor_cores<L>()) {
      if (lane / L::kLanesPerKey == 0)
#pragma unroll
        for (int h = 0; h < kGroup; ++h) store_bf16x8(&sm.q_bf16[h][slice * 8], from_float8(q[h]));
      __syncwarp();
      const int n = lane / 4, kq = 2 * (lane % 4);
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks)
        if (n < kGroup) {
          st.q_operand[ks][0] = *reinterpret_cast<const unsigned*>(&sm.q_bf16[n][ks * 16 + kq]);
          st.q_operand[ks][1] = *reinterpret_cast<const unsigned*>(&sm.q_bf16[n][ks * 16 + kq + 8]);
        }
    }
    for (int i = lane; i < kGroup * kMaxHalo; i += 32) sm.scores[i / kMaxHalo][i % kMaxHalo] = 0.0f;
    __syncwarp();
    const int halo = min(window - 1, begin);
    for (int base = 0; base < halo; base += L::kKeysPerLoad) {  // warp-uniform bounds
      const int i = base + lane / L::kLanesPerKey;
      const int pos = begin - halo + i;
      Bf16x8 k[1] = {};
      if (i < halo) k[0] = load_stream(key_cache + cache.offset(pos) + slice * 8);
      float s[kGroup];
      scattered_scores<L::kLanesPerKey, kGroup, 1>(q, k, s);
      if (i < halo) store_scores<L, 1>(sm, s, kMaxHalo - halo + base);
    }
    __syncwarp();
  }

  // o += P V for listed tile `index`, once its V rows have landed.
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ void accumulate(Smem& sm, int index, float (&o)[kGroup][8]) const {
    using L = Layout<kHeadDim, kGroup>;
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
    const int slot = index % kValueSlots;
    sm.values_ready[slot].wait((index / kValueSlots) & 1);
    const int listed = sm.listed[slot];
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int i = u * L::kKeysPerLoad + key_lane;
      if (u * L::kKeysPerLoad >= listed) break;  // warp-uniform
      if (i < listed) {
        float vf[8];
        to_float8(load_bf16x8(&sm.values[slot][i][slice * 8]), vf);
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
          const float w = sm.weights[slot][i][h];
#pragma unroll
          for (int e = 0; e < 8; ++e) o[h][e] = fmaf(w, vf[e], o[h][e]);
        }
      }
    }
  }

  // The tiles still waiting for their V rows.
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ void finish(State<kHeadDim, kGroup>& st, Smem& sm, float (&o)[kGroup][8]) const {
    for (int index = max(0, st.tiles - kValueLead); index < st.tiles; ++index)
      accumulate<kHeadDim, kGroup>(sm, index, o);
  }

  // This tile's scores (on tensor cores for 16-key tiles, else reduce-scattered over the lanes
  // of each key) after the carried halo, then its P from the pooled scores, the list of keys with
  // a non-zero P for some head (sparse-P) and the copies of only their V rows; then the P V of
  // the tile listed kValueLead tiles ago.
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ __forceinline__ void tile(State<kHeadDim, kGroup>& st, Smem& sm, const float (&q)[kGroup][8],
                                       StagedTile<kHeadDim, kGroup> staged, float (&o)[kGroup][8],
                                       const SeqCache& cache, const bf16* value_cache,
                                       unsigned long long (&counts)[2]) const {
    using L = Layout<kHeadDim, kGroup>;
    if constexpr (scores_on_tensor_cores<L>()) {
      // S^T = K q^T: keys as the mma's 16 rows (ldmatrix lanes: key lane & 15, 8-value half
      // lane >> 4 of each 16-value step), query heads as its 8 columns. Keys past the end
      // score garbage that the gate never reads (their P is 0; no later key pools them).
      staged.put_newest_key();
      const int lane = threadIdx.x & 31;
      const unsigned char* a_row = staged.head_rows + (lane & 15) * staged.row_stride + (lane >> 4) * 16;
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        unsigned a[4];
        ldmatrix_x4(a, a_row + ks * 32);
        mma_bf16(c, a, st.q_operand[ks][0], st.q_operand[ks][1]);
      }
      staged.release();
      store_mma_scores<kGroup>(sm, c);
    } else {
      Bf16x8 k[L::kUnroll];
      staged.read(k);
      staged.release();
      float d[L::kUnroll * kGroup];
      scattered_scores<L::kLanesPerKey, kGroup, L::kUnroll>(q, k, d);
      store_scores<L, L::kUnroll>(sm, d, kMaxHalo);
      __syncwarp();
    }
    // The V gathers (bulk copies) may read the newest key's V row, which this warp wrote.
    if (staged.holds_newest()) {
      fence_generic_to_async_global();
      __syncwarp();
    }
    after_scores<kHeadDim, kGroup>(st, sm, o, cache, value_cache, staged.first_key, staged.end, counts);
  }

  // The tensor-core scores of a 16-key tile into the warp's score rows: the m16n8
  // accumulator holds key lane / 4 (c0, c1) and lane / 4 + 8 (c2, c3) for query heads
  // 2 (lane % 4) and + 1.
  template <int kGroup, typename Smem>
  __device__ static void store_mma_scores(Smem& sm, const float (&c)[4]) {
    const int lane = threadIdx.x & 31, key = lane / 4;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = 2 * (lane % 4) + j;
      if (h < kGroup) {
        sm.scores[h][kMaxHalo + key] = c[j];
        sm.scores[h][kMaxHalo + key + 8] = c[2 + j];
      }
    }
    __syncwarp();
  }

  // Steps 2-4 of a tile, once its scores are in the warp's score rows.
  template <int kHeadDim, int kGroup, typename Smem>
  __device__ void after_scores(State<kHeadDim, kGroup>& st, Smem& sm, float (&o)[kGroup][8], const SeqCache& cache,
                               const bf16* value_cache, int first_key, int end, unsigned long long (&counts)[2]) const {
    using L = Layout<kHeadDim, kGroup>;
    const int lane = threadIdx.x & 31;
    const int slot = st.tiles % kValueSlots;
    // 2. P of each (key, head) pair of the tile, computed once: lane i takes pairs i, i+32, ...,
    //    all of the same head (lane % kGroup, as 32 is a multiple of kGroup).
    constexpr int kPairs = L::kTile * kGroup;
#pragma unroll
    for (int i = lane; i < kPairs; i += 32) {
      const int t = i / kGroup, h = i % kGroup;
      float pooled = 0.0f;
      for (int w = 0; w < window; ++w) pooled += fmaxf(sm.scores[h][kMaxHalo + t - w], 0.0f);
      pooled *= st.inv_window;
      const float p = first_key + t < end
                          ? async_gate(sm.scores[h][kMaxHalo + t], pooled, st.alpha, st.sigma, st.gamma)
                          : 0.0f;
      sm.tile_p[t][h] = p;
      counts[0] += p != 0.0f;
    }
    __syncwarp();
    // 3. The compacted list (sparse-P): lane t lists key t when some head's P is non-zero, and
    //    copies its V row into the slot.
    bool any = false;
    if (lane < L::kTile)
#pragma unroll
      for (int h = 0; h < kGroup; ++h) any |= sm.tile_p[lane][h] != 0.0f;
    const unsigned listed_keys = __ballot_sync(kFull, any);
    const int listed = __popc(listed_keys);
    constexpr unsigned kRowBytes = kHeadDim * 2;
    if (any) {
      const int i = __popc(listed_keys & ((1u << lane) - 1u));
#pragma unroll
      for (int h = 0; h < kGroup; ++h) sm.weights[slot][i][h] = sm.tile_p[lane][h];
      bulk_copy_to_shared(&sm.values[slot][i][0], value_cache + cache.offset(first_key + lane), kRowBytes,
                          sm.values_ready[slot], l2_evict_first_policy());
    }
    __syncwarp();  // the copies are issued (or, emulated, done) before the arrival
    if (lane == 0) {
      sm.listed[slot] = listed;
      sm.values_ready[slot].arrive_expecting(listed * kRowBytes);
      counts[1] += listed;
    }
    // Carry the last kMaxHalo scores to the front for the next tile.
    constexpr int kCarried = kGroup * kMaxHalo, kPerLane = (kCarried + 31) / 32;
    float carry[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < kCarried) carry[j] = sm.scores[i / kMaxHalo][L::kTile + i % kMaxHalo];
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < kCarried) sm.scores[i / kMaxHalo][i % kMaxHalo] = carry[j];
    }
    __syncwarp();  // the weights and the list count are visible to every lane
    // 4. The P V of the tile listed kValueLead tiles ago.
    ++st.tiles;
    if (st.tiles > kValueLead) accumulate<kHeadDim, kGroup>(sm, st.tiles - 1 - kValueLead, o);
  }
};

// The stage ring: a stage holds one tile of keys (and, when the gate needs every value, the
// same tile of values) for all the CTA's heads, [kTile tokens][heads][head_dim] each, as it
// lies in the cache. Dynamic shared memory: the stages, then each consumer warp's gate scratch,
// within kStageBudgetPerHead per head.
template <int kHeadDim, int kGroup, typename Gate>
struct StageRing {
  using L = Layout<kHeadDim, kGroup>;
  using Scratch = typename Gate::template Scratch<kHeadDim, kGroup>;
  static constexpr int kParts = Gate::kLoadValuesWithKeys ? 2 : 1;  // keys, and values
  static constexpr int kBytesPerHead = kParts * L::kTile * kHeadDim * 2;
  // (An empty scratch takes no room.)
  static constexpr int kScratchBytes = std::is_empty_v<Scratch> ? 0 : (sizeof(Scratch) + 127) / 128 * 128;
  static constexpr int kStages =
      std::clamp((kStageBudgetPerHead - kScratchBytes) / kBytesPerHead, 2, Gate::kMaxStages);
  // The async gate's 16-key tiles are scored on tensor cores, read from the stage with
  // ldmatrix: a token's row is padded by 16 bytes so that 8 consecutive keys of a head fall in 8
  // distinct bank groups (unpadded, rows 2 KB apart would conflict 8 ways).
  static constexpr int kRowPad = Gate::template scores_on_tensor_cores<L>() ? 16 : 0;
  static constexpr std::size_t bytes(int heads) {
    return std::size_t(heads) * (kStages * kBytesPerHead + kScratchBytes) + std::size_t(kStages) * kParts * L::kTile * kRowPad;
  }
};

// ---- Stage 1: one CTA per (group of KV heads, sequence, split) ------------------------------

struct Stage1Args {
  DecodeParams p;
  int block_shift;
  int heads_per_cta;  // KV heads of a CTA, one consumer warp each (see kv_heads_per_cta)
  float scale;
  float* partial_out;  // [splits, seqs, Hq, D] (null when one split)
  float* partial_max;  // [splits, seqs, Hq] softmax only
  float* partial_sum;
  RopeTurns turns;  // with p.projection
};

// The split counters, one per (head group, sequence): zero when the module loads, and left zero
// by every launch (the last split resets its counter). Per device; decode launches on one
// device run in stream order (like every user of one workspace).
constexpr int kMaxSplitCounters = 1 << 18;
__device__ unsigned g_split_counters[kMaxSplitCounters];

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

// The producer warp: streams the split's tiles into the stage ring. A stage is refilled once
// every consumer warp has arrived on its "empty" barrier (it has read its rows out). Keys before
// `written_from` do not depend on the kernel before this one (a dependent launch: only the
// newest key is written by it, or, with the projection, by this kernel, whose consumers then do
// not use the copy), so the tiles that end before it are requested before the wait for that
// kernel: their loads overlap its tail and this kernel's start.
template <int kTile, int kStages, int kParts>
__device__ void produce_tiles(const Stage1Args& a, const SeqCache& cache, unsigned char* stages, int stage_bytes,
                              int row_bytes, int row_stride, SharedBarrier* full, SharedBarrier* empty, int begin, int end,
                              int written_from) {
  const PagedKv& kv = a.p.kv;
  const int lane = threadIdx.x & 31;
  // With all of the cache's heads in the CTA, a token's rows for them are contiguous and a tile
  // is one copy per cache block it touches (tiles start on multiples of kTile, so a tile no
  // longer than a block lies in one block); otherwise one copy per token.
  // (Padded stage rows take one copy per token.)
  const int rows_per_copy = a.heads_per_cta == kv.num_kv_heads && row_stride == row_bytes ? min(kTile, kv.block_size) : 1;
  const std::uint64_t read_once = l2_evict_first_policy();  // K and V: this step reads them once
  bool waited = false;
  for (int t = 0; begin + t * kTile < end; ++t) {
    const int s = t % kStages;
    const int first = begin + t * kTile, n = min(kTile, end - first);
    if (!waited && (t >= kStages || first + n > written_from)) {
      wait_for_prior_grids();
      allow_next_grid();
      waited = true;
    }
    if (t >= kStages) empty[s].wait((t / kStages - 1) & 1);
    for (int i = lane * rows_per_copy; i < n; i += 32 * rows_per_copy) {
      const long long offset = cache.offset(first + i);
      const unsigned bytes = unsigned(min(rows_per_copy, n - i) * row_bytes);
      unsigned char* dst = stages + s * stage_bytes + i * row_stride;
      bulk_copy_to_shared(dst, kv.key_cache + offset, bytes, full[s], read_once);
      if constexpr (kParts == 2)
        bulk_copy_to_shared(dst + kTile * row_stride, kv.value_cache + offset, bytes, full[s], read_once);
    }
    __syncwarp();  // the copies are issued (or, emulated, done) before the arrival
    if (lane == 0) full[s].arrive_expecting(unsigned(kParts * n * row_bytes));
  }
  if (!waited) {
    wait_for_prior_grids();
    allow_next_grid();
  }
}

// With the projection (decode.h): this lane's 8 values of each of the warp's query heads, normed
// and rotated, from the sequence's projection row; and, when the CTA holds the sequence's newest
// key (`writes_newest`), that key and its value for the warp's KV head, written into the cache
// for later steps and for the V gathers (which the consumer orders after these writes when it
// reaches the newest key's tile), and returned (this lane's 8 values, bf16 as stored) for the
// consumer to use in place of the stage's copy of that row, which the producer may have copied
// before the write.
template <int kHeadDim, int kGroup>
__device__ void project_new_token(const Stage1Args& a, int seq, int kv_head, bool writes_newest,
                                  float (&q)[kGroup][8], Bf16x8& newest_k, Bf16x8& newest_v) {
  using L = Layout<kHeadDim, kGroup>;
  const DecodeProjection& pr = a.p.projection;
  const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey;
  const int hq = a.p.num_q_heads, hkv = a.p.kv.num_kv_heads;
  const std::int64_t row = std::int64_t(seq) * (hq + 2 * hkv) * kHeadDim + 8 * slice;  // this lane's values
  // The warp's query heads, its key head and its value head, loaded together (in batches of
  // at most 4 heads: more spill the registers of the largest groups). Every lane group of the
  // warp computes every head (they all need all of q).
  constexpr int kSets = kGroup + 2, kKey = kGroup, kValue = kGroup + 1;
  constexpr int kBatch = kSets <= 4 ? kSets : 2;
  std::int64_t at[kSets];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) at[h] = row + std::int64_t(kv_head * kGroup + h) * kHeadDim;
  at[kKey] = row + std::int64_t(hq + kv_head) * kHeadDim;
  at[kValue] = row + std::int64_t(hq + hkv + kv_head) * kHeadDim;
  float x[kSets][8];
#pragma unroll
  for (int first = 0; first < kSets; first += kBatch) {
    std::int64_t batch_at[kBatch];
    float batch[kBatch][8];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) batch_at[i] = at[first + i];
    load_outputs8<kBatch>(pr.qkv, batch_at, batch);
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) x[first + i][e] = batch[i][e];
  }
  float2 rotation[8];
  const std::int64_t position = pr.positions[seq];
#pragma unroll
  for (int i = 0; i < 8; ++i) rotation[i] = rope_rotation(a.turns, position, (8 * slice + i) % (kHeadDim / 2));
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    head_norm8<kHeadDim>(x[h], pr.q_weight + 8 * slice, pr.norm.eps, pr.norm.clip);
    head_rope8<kHeadDim>(x[h], slice, rotation);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] = x[h][e];
  }
  if (!writes_newest) return;
  head_norm8<kHeadDim>(x[kKey], pr.k_weight + 8 * slice, pr.norm.eps, pr.norm.clip);
  head_rope8<kHeadDim>(x[kKey], slice, rotation);
  newest_k = from_float8(x[kKey]);
  newest_v = from_float8(x[kValue]);  // rounded as the dense product would be
  const std::int64_t slot = pr.slot_mapping[seq];
  if (lane < L::kLanesPerKey && slot >= 0) {
    const std::int64_t offset = (slot * hkv + kv_head) * kHeadDim + 8 * slice;
    store_bf16x8(a.p.kv.key_cache + offset, newest_k);
    store_bf16x8(a.p.kv.value_cache + offset, newest_v);
  }
}

template <int kHeadDim, int kGroup, typename Gate>
__global__ void __launch_bounds__(kMaxThreads) decode_stage1(Stage1Args a, Gate gate) {
  using L = Layout<kHeadDim, kGroup>;
  constexpr bool kSoftmax = Gate::kLoadValuesWithKeys;
  using Ring = StageRing<kHeadDim, kGroup, Gate>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ SharedBarrier full[Ring::kStages], empty[Ring::kStages];
  // A dependent launch: the kernel before writes q and the newest key of each sequence, or the
  // projection (see produce_tiles); the metadata and the older keys were written before it.
  const DecodeParams& p = a.p;
  const int heads = a.heads_per_cta;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
  const int seq = blockIdx.y, split = blockIdx.z;
  const int row_bytes = heads * kHeadDim * 2;  // one token's K (or V) for the CTA's heads
  const int row_stride = row_bytes + Ring::kRowPad;
  const int stage_bytes = Ring::kParts * L::kTile * row_stride;
  unsigned char* scratch_base = smem + Ring::kStages * stage_bytes;
  auto scratch = [&](int w) -> typename Ring::Scratch& {
    return *reinterpret_cast<typename Ring::Scratch*>(scratch_base + w * Ring::kScratchBytes);
  };

  // This split's keys, clamped to what the block table can address. The splits share each
  // sequence's own length (not the batch's longest, nor the capacity a CUDA graph was captured
  // for), so every split of every sequence has work; they start on multiples of the tile.
  const int kv_len = max(0, min(p.kv_lens[seq], p.kv.max_blocks_per_seq * p.kv.block_size));
  const int splits = int(gridDim.z);
  const int keys_per_split = ((kv_len + splits - 1) / splits + L::kTile - 1) / L::kTile * L::kTile;
  const int begin = split * keys_per_split;
  const int end = min(kv_len, begin + keys_per_split);

  // With the projection, the CTA that holds the newest key writes it (project_new_token). Its
  // producer may copy that cache row before the write lands (the copy races the write and is
  // not used): the consumers take the row from their registers instead.
  const bool writes_newest = p.projection.enabled() && begin < end && end == kv_len;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Ring::kStages; ++s) full[s].init(1), empty[s].init(unsigned(heads));
    for (int w = 0; w < heads; ++w) Gate::init_scratch(scratch(w));
    SharedBarrier::fence_init();
  }
  __syncthreads();  // the only CTA-wide barrier: the producer leaves early

  // The cache seen from this warp's KV head (the producer's: the CTA's first).
  const int kv_head = blockIdx.x * heads + (warp < heads ? warp : 0);
  const SeqCache cache{p.kv.block_table + (long long)seq * p.kv.max_blocks_per_seq, a.block_shift,
                       p.kv.block_size - 1, p.kv.num_kv_heads * kHeadDim, kv_head * kHeadDim};
  if (warp == heads) {
    produce_tiles<L::kTile, Ring::kStages, Ring::kParts>(a, cache, smem, stage_bytes, row_bytes, row_stride, full, empty,
                                                         begin, end, kv_len - 1);
    return;
  }
  wait_for_prior_grids();  // q (or the projection), and the newest key the halo or V gathers may read
  allow_next_grid();

  // A consumer warp: this lane's 8 elements of each query head, pre-scaled.
  const int first_head = kv_head * kGroup;
  float q[kGroup][8];
  Bf16x8 newest_k{}, newest_v{};  // with writes_newest: the newest key's row, as written
  if (p.projection.enabled()) {
    project_new_token<kHeadDim, kGroup>(a, seq, kv_head, writes_newest, q, newest_k, newest_v);
  } else {
#pragma unroll
    for (int h = 0; h < kGroup; ++h)
      to_float8(load_bf16x8(p.query + ((long long)seq * p.num_q_heads + first_head + h) * kHeadDim + slice * 8), q[h]);
  }
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] *= a.scale;
  typename Gate::template State<kHeadDim, kGroup> state;
  gate.template start<kHeadDim, kGroup>(state, first_head);
  float o[kGroup][8] = {};
  unsigned long long counts[2] = {0, 0};  // non-zero P entries, V rows loaded

  if (begin < end) {
    gate.template start_warp<kHeadDim, kGroup>(state, scratch(warp), cache, p.kv.key_cache, q, begin, end);
    // The tile's stage, first key and barrier are set in the loop.
    StagedTile<kHeadDim, kGroup> staged{nullptr, row_stride, begin, end, writes_newest, kv_len - 1,
                                        newest_k, newest_v, nullptr};
    for (int t = 0; begin + t * L::kTile < end; ++t) {
      const int s = t % Ring::kStages, first_key = begin + t * L::kTile;
      full[s].wait((t / Ring::kStages) & 1);
      staged.head_rows = smem + s * stage_bytes + warp * kHeadDim * 2;
      staged.first_key = first_key;
      staged.empty = &empty[s];
      gate.template tile<kHeadDim, kGroup>(state, scratch(warp), q, staged, o, cache, p.kv.value_cache, counts);
    }
    gate.template finish<kHeadDim, kGroup>(state, scratch(warp), o);
  }
  if (p.counters) {  // counts live in the lanes that own a key (non-zero P) and in lane 0
    if (counts[0]) atomicAdd(p.counters, counts[0]);
    if (counts[1]) atomicAdd(p.counters + 1, counts[1]);
  }

  // The warp's output: the lane groups that served different keys add up; then the lanes of
  // the first group hold 8 elements each of every query head.
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
#pragma unroll
    for (int off = L::kLanesPerKey; off < 32; off <<= 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] += __shfl_xor_sync(kFull, o[h][e], off);
      if constexpr (kSoftmax) state.sum[h] += __shfl_xor_sync(kFull, state.sum[h], off);
    }
  }
  const long long first_row = (long long)seq * p.num_q_heads + first_head;
#pragma unroll
  for (int h = 0; h < kGroup && key_lane == 0; ++h) {
    const long long row = first_row + h;
    if (a.partial_out == nullptr) {  // one split: finish here
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        out[e] = o[h][e];
        if constexpr (kSoftmax) out[e] = state.sum[h] > 0.0f ? out[e] / state.sum[h] : 0.0f;
      }
      store_bf16x8(p.out + row * kHeadDim + slice * 8, from_float8(out));
    } else {
      const long long prow = (long long)split * p.num_seqs * p.num_q_heads + row;
      float* dst = a.partial_out + prow * kHeadDim + slice * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = o[h][e];
      if constexpr (kSoftmax)
        if (slice == 0) {  // an empty split leaves max -FLT_MAX, sum 0: weight 0 in the combine
          a.partial_max[prow] = state.max[h];
          a.partial_sum[prow] = state.sum[h];
        }
    }
  }
  if (a.partial_out == nullptr) return;

  // Several splits: the last CTA of the (head group, sequence) to arrive combines them.
  unsigned* counter = g_split_counters + (long long)seq * gridDim.x + blockIdx.x;
  if (!last_to_arrive(counter, unsigned(splits), [heads] { consumer_barrier(heads); })) return;
  combine_splits<kHeadDim, kGroup, kSoftmax>(a, splits, first_row);
}

template <int kHeadDim, int kGroup, typename Gate>
void launch_with(const Stage1Args& a, const Gate& gate, int splits, cudaStream_t stream) {
  using Ring = StageRing<kHeadDim, kGroup, Gate>;
  static const bool big_shared_memory_allowed = [] {  // above 48 KB needs an opt-in, once
    ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(decode_stage1<kHeadDim, kGroup, Gate>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(Ring::bytes(kMaxHeadsPerCta))));
    return true;
  }();
  (void)big_shared_memory_allowed;
  dim3 grid(a.p.kv.num_kv_heads / a.heads_per_cta, a.p.num_seqs, splits);
  launch_dependent(decode_stage1<kHeadDim, kGroup, Gate>, grid, (a.heads_per_cta + 1) * 32,
                   Ring::bytes(a.heads_per_cta), stream, "decode_stage1", a, gate);
}

template <int kHeadDim, typename Gate>
void dispatch_group(int group, const Stage1Args& a, const Gate& gate, int splits,
                    cudaStream_t stream) {
  switch (group) {
    case 1: return launch_with<kHeadDim, 1>(a, gate, splits, stream);
    case 2: return launch_with<kHeadDim, 2>(a, gate, splits, stream);
    case 4: return launch_with<kHeadDim, 4>(a, gate, splits, stream);
    case 8: return launch_with<kHeadDim, 8>(a, gate, splits, stream);
  }
  check(false, "decode: ", group, " query heads per KV head; supported: 1, 2, 4, 8");
}

template <typename Gate>
void dispatch(int head_dim, int group, const Stage1Args& a, const Gate& gate, int splits,
              cudaStream_t stream) {
  switch (head_dim) {
    case 64: return dispatch_group<64>(group, a, gate, splits, stream);
    case 128: return dispatch_group<128>(group, a, gate, splits, stream);
    case 256: return dispatch_group<256>(group, a, gate, splits, stream);
  }
  check(false, "decode: head_dim ", head_dim, " not supported (64, 128, 256)");
}

int ceil_div(long long a, long long b) { return int((a + b - 1) / b); }

// How many KV heads one CTA serves: the most (8, 4, 2 or 1) that divides the head count.
int kv_heads_per_cta(int num_kv_heads) {
  for (int n = kMaxHeadsPerCta; n > 1; n /= 2)
    if (num_kv_heads % n == 0) return n;
  return 1;
}

}  // namespace

int decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count) {
  // One wave: as many CTAs as fit on the GPU at once, each streaming an equal share of the
  // keys. A multiprocessor holds the stage rings of kMaxHeadsPerCta heads (one CTA of 8 heads,
  // two of 4, ...). More CTAs than that only add a ragged second wave; fewer leave bandwidth
  // idle. Each split keeps at least 64 keys so that the halo, the pipeline's fill and the combine
  // stay cheap.
  const int heads_per_cta = kv_heads_per_cta(num_kv_heads);
  const long long ctas = (long long)num_seqs * (num_kv_heads / heads_per_cta);
  const long long resident = (long long)(kMaxHeadsPerCta / heads_per_cta) * sm_count;
  const long long wanted = std::max(1LL, resident / ctas);
  const int most = std::max(1, ceil_div(max_kv_len, 64));
  return int(std::min<long long>({wanted, most, kMaxSplits}));
}

std::size_t decode_workspace_bytes(const DecodeParams& p, int num_splits) {
  if (num_splits <= 1) return 0;
  const std::size_t rows = std::size_t(num_splits) * p.num_seqs * p.num_q_heads;
  return rows * p.kv.head_dim * sizeof(float) + 2 * rows * sizeof(float);
}

void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  validate_paged_kv(p.kv, "decode");
  validate_gate(p.gate, "decode");
  check((p.query || p.projection.enabled()) && p.out && p.kv_lens, "decode: null query (and no projection), out or kv_lens");
  check(p.num_seqs >= 1, "decode: no sequences");
  check(p.num_q_heads % p.kv.num_kv_heads == 0, "decode: ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.max_kv_len >= 1 && p.max_kv_len <= p.kv.max_blocks_per_seq * p.kv.block_size,
        "decode: max_kv_len ", p.max_kv_len, " outside 1..", p.kv.max_blocks_per_seq * p.kv.block_size);
  check(p.gate.kind == GateKind::Softmax || p.gate.pool_window - 1 <= kMaxHalo, "decode: pool window ",
        p.gate.pool_window, " above the supported ", kMaxHalo + 1);
  // Bulk copies and 16-byte loads need 16-byte aligned rows (head_dim is a multiple of 64).
  check(reinterpret_cast<std::uintptr_t>(p.kv.key_cache) % 16 == 0 &&
            reinterpret_cast<std::uintptr_t>(p.kv.value_cache) % 16 == 0 &&
            reinterpret_cast<std::uintptr_t>(p.query) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0,
        "decode: the query, output and K/V cache pointers must be 16-byte aligned");
  const int group = p.num_q_heads / p.kv.num_kv_heads;

  int splits = p.num_splits;
  if (splits <= 0) splits = decode_num_splits(p.num_seqs, p.kv.num_kv_heads, p.max_kv_len, current_device_info().sm_count);
  splits = std::min({splits, p.max_kv_len, kMaxSplits});

  Stage1Args a{p, 0, kv_heads_per_cta(p.kv.num_kv_heads), 0.0f, nullptr, nullptr, nullptr, {}};
  while ((1 << a.block_shift) < p.kv.block_size) ++a.block_shift;
  a.scale = p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.kv.head_dim)));
  if (splits > 1) {
    check(p.workspace != nullptr, "decode: ", splits, " splits need a workspace of ",
          decode_workspace_bytes(p, splits), " bytes");
    const std::size_t rows = std::size_t(splits) * p.num_seqs * p.num_q_heads;
    a.partial_out = static_cast<float*>(p.workspace);
    a.partial_max = a.partial_out + rows * p.kv.head_dim;
    a.partial_sum = a.partial_max + rows;
    const long long counters = (long long)p.num_seqs * (p.kv.num_kv_heads / a.heads_per_cta);
    check(counters <= kMaxSplitCounters, "decode: ", p.num_seqs, " sequences x ", p.kv.num_kv_heads / a.heads_per_cta,
          " head groups need more split counters than the ", kMaxSplitCounters, " there are");
  }

  if (p.projection.enabled()) {
    const DecodeProjection& pr = p.projection;
    check(pr.q_weight && pr.k_weight && pr.positions && pr.slot_mapping,
          "decode: the projection needs q_weight, k_weight, positions and slot_mapping");
    check(std::isfinite(pr.rope_theta) && pr.rope_theta > 0, "decode: rope_theta must be finite and > 0, got ",
          pr.rope_theta);
    check_norm_args("decode (projection)", pr.norm);
    const std::int64_t elements = std::int64_t(p.num_seqs) * (p.num_q_heads + 2 * p.kv.num_kv_heads) * p.kv.head_dim;
    if (pr.qkv.is_split())
      check_split_output("decode", "qkv partials", pr.qkv, elements);
    else
      check(reinterpret_cast<std::uintptr_t>(pr.qkv.dense) % 16 == 0, "decode: the projection is not 16-byte aligned");
    a.turns = RopeTurns::of(p.kv.head_dim, pr.rope_theta);
  }

  const bool softmax = p.gate.kind == GateKind::Softmax;
  if (softmax)
    dispatch(p.kv.head_dim, group, a, SoftmaxGate{p.gate.softcap}, splits, stream);
  else
    dispatch(p.kv.head_dim, group, a, AsyncGate{p.gate.pool_window, p.gate.alpha, p.gate.sigma, p.gate.gamma},
             splits, stream);
}

}  // namespace asynct::kernels
