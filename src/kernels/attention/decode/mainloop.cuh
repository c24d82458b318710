// The decode kernel's stream of keys and values (decode.cu): where a sequence's rows live in the
// paged cache, the ring of shared-memory stages the producer warp fills with bulk copies, a
// consumer warp's view of one filled stage, and the scores of a tile reduce-scattered over the
// lanes of each key.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/decode/traits.cuh"
#include "kernels/common/bf16.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/dependent_launch.cuh"

namespace asynct::kernels::decode {

// Where one sequence's keys live: the block table and the cache geometry of one KV head.
struct SeqCache {
  const std::int32_t* table;
  int block_shift, block_mask, row_stride;  // row_stride = num_kv_heads * head_dim
  int kv_head_offset;                       // kv_head * head_dim

  // Element offset of key/value `pos` (this KV head) in the cache (times the element's bytes:
  // its byte offset).
  __device__ __forceinline__ long long offset(int pos) const {
    const long long block = table[pos >> block_shift];
    return ((block << block_shift) + (pos & block_mask)) * row_stride + kv_head_offset;
  }
};

// A consumer warp's view of one filled stage: its KV head's rows of the tile's keys (and of the
// values staged with them), and the newest key when this warp wrote it (see project_new_token).
// The stage's copy of that key may predate the write (the producer does not wait for it), so
// every reader takes the row as written.
template <int kHeadDim, int kGroup, typename Kv>
struct StagedTile {
  using L = Layout<kHeadDim, kGroup, Kv>;
  unsigned char* head_rows;  // the head's row of the tile's first key
  int row_stride;            // bytes from one token's rows to the next
  int first_key, end;        // the tile's first key; the end of the split's keys
  bool wrote_newest;         // whether this warp wrote the sequence's newest key,
  int newest_key;            // at this position
  typename Kv::Raw newest_k, newest_v;  // this lane's 8 values of them as stored
  SharedBarrier* empty;      // the stage's barrier: each consumer warp arrives once it has read

  __device__ bool holds_newest() const { return wrote_newest && first_key + L::kTile > newest_key; }

  // This lane's 8 elements of key (and value) u * kKeysPerLoad + key lane, u < kUnroll, into
  // registers; keys past the end read as zero.
  __device__ __forceinline__ void read(Bf16x8 (&k)[L::kUnroll], Bf16x8 (&v)[L::kUnroll]) const { read_rows<true>(k, &v); }
  __device__ __forceinline__ void read(Bf16x8 (&k)[L::kUnroll]) const { read_rows<false>(k, nullptr); }

  // The newest key's row as written, in place of the stage's copy, for readers of the stage
  // itself (the tensor-core scores). The async proxy refills the stage after this write.
  __device__ void put_newest_key() const {
    if (!holds_newest()) return;
    const int lane = threadIdx.x & 31;
    if (lane < L::kLanesPerKey)
      *reinterpret_cast<typename Kv::Raw*>(head_rows + (newest_key - first_key) * row_stride + lane * 8 * Kv::kBytes) =
          newest_k;
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
    const unsigned char* rows = head_rows + slice * 8 * Kv::kBytes;
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int row = u * L::kKeysPerLoad + key_lane;
      const bool valid = first_key + row < end;
      k[u] = valid ? Kv::load8(rows + row * row_stride) : Bf16x8{};
      if constexpr (kValues) (*v)[u] = valid ? Kv::load8(rows + (L::kTile + row) * row_stride) : Bf16x8{};
      if (wrote_newest && first_key + row == newest_key) {
        k[u] = Kv::read8(newest_k);
        if constexpr (kValues) (*v)[u] = Kv::read8(newest_v);
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

// The tile's scores q . k, reduce-scattered: s[j] is value Scatter::index(slice, j). The keys
// as Kv reads them (their stored values / Kv::kReadUnit): each finished score is multiplied back.
template <int kLanesPerKey, int kGroup, int kUnroll, typename Kv>
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
  if constexpr (Kv::kReadUnit != 1.0f)
#pragma unroll
    for (int j = 0; j < Scatter<kLanesPerKey, kUnroll * kGroup>::kHeld; ++j) s[j] *= Kv::kReadUnit;
}

// The stage ring: a stage holds one tile of keys (and, when the gate needs every value, the
// same tile of values) for all the CTA's heads, [kTile tokens][heads][head_dim] each, as it
// lies in the cache. Dynamic shared memory: the stages, then each consumer warp's gate scratch,
// within kStageBudgetPerHead per head.
template <int kHeadDim, int kGroup, typename Kv, typename Gate>
struct StageRing {
  using L = Layout<kHeadDim, kGroup, Kv>;
  using Scratch = typename Gate::template Scratch<kHeadDim, kGroup>;
  static constexpr int kParts = Gate::kLoadValuesWithKeys ? 2 : 1;  // keys, and values
  static constexpr int kBytesPerHead = kParts * L::kTile * L::kRowBytes;
  // (An empty scratch takes no room.)
  static constexpr int kScratchBytes = std::is_empty_v<Scratch> ? 0 : (sizeof(Scratch) + 127) / 128 * 128;
  // An e4m3 stage holds half a bf16 one's bytes: up to twice as many stages keep the same bytes
  // in flight.
  static constexpr int kStages =
      std::clamp((kStageBudgetPerHead - kScratchBytes) / kBytesPerHead, 2, Gate::kMaxStages * 2 / Kv::kBytes);
  // The async gate's 16-key tiles are scored on tensor cores, read from the stage with
  // ldmatrix (bf16) or 16-byte loads (e4m3): a token's row is padded by 16 bytes so that the 8
  // consecutive keys of a head one load phase touches fall in distinct bank groups (unpadded,
  // rows 1-2 KB apart would conflict up to 8 ways).
  static constexpr int kRowPad = Gate::template scores_on_tensor_cores<L>() ? 16 : 0;
  static constexpr std::size_t bytes(int heads) {
    return std::size_t(heads) * (kStages * kBytesPerHead + kScratchBytes) + std::size_t(kStages) * kParts * L::kTile * kRowPad;
  }
};

// The producer warp: streams the split's tiles into the stage ring. A stage is refilled once
// every consumer warp has arrived on its "empty" barrier (it has read its rows out). Keys before
// `written_from` do not depend on the kernel before this one (a dependent launch: only the
// newest key is written by it, or, with the projection, by this kernel, whose consumers then do
// not use the copy), so the tiles that end before it are requested before the wait for that
// kernel: their loads overlap its tail and this kernel's start.
template <int kTile, int kStages, int kParts, int kBytes>
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
      const long long offset = cache.offset(first + i) * kBytes;
      const unsigned bytes = unsigned(min(rows_per_copy, n - i) * row_bytes);
      unsigned char* dst = stages + s * stage_bytes + i * row_stride;
      bulk_copy_to_shared(dst, reinterpret_cast<const unsigned char*>(kv.key_cache) + offset, bytes, full[s], read_once);
      if constexpr (kParts == 2)
        bulk_copy_to_shared(dst + kTile * row_stride, reinterpret_cast<const unsigned char*>(kv.value_cache) + offset, bytes,
                            full[s], read_once);
    }
    __syncwarp();  // the copies are issued (or, emulated, done) before the arrival
    if (lane == 0) full[s].arrive_expecting(unsigned(kParts * n * row_bytes));
  }
  if (!waited) {
    wait_for_prior_grids();
    allow_next_grid();
  }
}
}  // namespace asynct::kernels::decode
