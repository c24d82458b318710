// The decode kernel's gate policies (decode.cu): what happens between a tile's scores and its
// P V. Both implement the contract of attention/gate_policy.cuh; the members below it (Scratch,
// State, start, start_warp, tile, finish, and the stage-ring hints kLoadValuesWithKeys,
// kMaxStages, scores_on_tensor_cores) are decode's own.
#pragma once

#include <cfloat>

#include "kernels/attention/decode/mainloop.cuh"
#include "kernels/attention/gate_policy.cuh"
#include "kernels/common/mma_sync.cuh"

namespace asynct::kernels::decode {

struct SoftmaxGate : SoftmaxGatePolicy, SoftmaxGateDeviceParams {
  static constexpr bool kLoadValuesWithKeys = true;  // every V row is needed, staged with K
  // Its K+V stages would fit 3 deep in the budget; measured on H200, 3 were 2-3% slower than 2
  // on every bench_decode shape (a guess at why: the larger ring leaves less room to L1).
  static constexpr int kMaxStages = 2;
  template <typename L>
  static constexpr bool scores_on_tensor_cores() { return false; }

  template <int kHeadDim, int kGroup>
  struct Scratch {};  // none
  template <typename Smem>
  __device__ static void init_scratch(Smem&) {}

  template <int kHeadDim, int kGroup>
  struct State {
    float max[kGroup], sum[kGroup];
  };
  // The state before the first key, for the query heads first_head .. first_head+kGroup-1
  // (the first kHeads of them exist; see decode_stage1).
  template <int kHeadDim, int kGroup, int kHeads>
  __device__ void start(State<kHeadDim, kGroup>& st, int /*first_head*/) const {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) st.max[h] = -FLT_MAX, st.sum[h] = 0.0f;
  }
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ void start_warp(State<kHeadDim, kGroup>&, Smem&, const SeqCache&, const unsigned char*,
                             const float (&)[kGroup][8], int, int) const {}

  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ void finish(State<kHeadDim, kGroup>&, Smem&, float (&)[kGroup][8]) const {}

  // The tile's scores (reduce-scattered: each is softcapped and exponentiated once, not in
  // every lane of its key), online softmax over them, then o += P V with the values staged with
  // the keys, each P shuffled from the lane that holds it.
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ __forceinline__ void tile(State<kHeadDim, kGroup>& st, Smem&, const float (&q)[kGroup][8],
                                       StagedTile<kHeadDim, kGroup, Kv> staged, float (&o)[kGroup][8], const SeqCache&,
                                       const unsigned char*, unsigned long long (&counts)[2]) const {
    using L = Layout<kHeadDim, kGroup, Kv>;
    constexpr int kUnroll = L::kUnroll;
    using S = Scatter<L::kLanesPerKey, kUnroll * kGroup>;
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
    const int first_key = staged.first_key, end = staged.end;
    Bf16x8 k[kUnroll], v[kUnroll];
    staged.read(k, v);
    staged.release();
    float s[kUnroll * kGroup];
    scattered_scores<L::kLanesPerKey, kGroup, kUnroll, Kv>(q, k, s);
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

// The first of the dims that the k16 step ks of the tensor-core scores gives to lane t's columns
// 2t, 2t + 1 (and, at +8 for bf16 or +2 for e4m3, to its columns 2t + 8, 2t + 9): bf16 steps take
// 16 consecutive dims; e4m3 steps take 4 of each lane's kHeadDim / 4 contiguous bytes
// (AsyncGate::mma_scores_e4m3). Any order that A and B share gives the same dot products.
template <int kHeadDim, typename Kv>
__device__ __forceinline__ int mma_k_order(int ks, int t) {
  return Kv::kIsBf16 ? ks * 16 + 2 * t : t * (kHeadDim / 4) + 4 * ks;
}

// (kMaxHalo, the pool window's bound less one, is the contract's halo.)
struct AsyncGate : AsyncGatePolicy<kMaxHalo + 1>, AsyncGateDeviceParams {
  static constexpr bool kLoadValuesWithKeys = false;  // V rows wait for P: only non-zero ones
  static constexpr int kMaxStages = 8;
  // A tile's listed V rows are copied into the warp's shared memory as soon as the list is
  // built, and used kValueLead tiles later, so their latency hides behind that much work.
  static constexpr int kValueLead = 2;
  static constexpr int kValueSlots = kValueLead + 1;
  // A 16-key tile (one m16 tile of keys) is scored on tensor cores: mma.m16n8k16 against q in
  // bf16, its A fragments by ldmatrix from a bf16 stage or converted from an e4m3 one (the stage
  // rows are padded for it, see StageRing).
  template <typename L>
  static constexpr bool scores_on_tensor_cores() { return L::kMmaTile; }
  // (window, alpha, sigma, gamma: AsyncGateDeviceParams; alpha, sigma, gamma per query head, device.)

  template <int kHeadDim, int kGroup>
  struct Scratch {
    using L = Layout<kHeadDim, kGroup>;
    // The listed V rows, in list order (an e4m3 row takes the first half of its room).
    alignas(128) unsigned char values[kValueSlots][L::kTile][kHeadDim * 2];
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
  // The lane's query head first_head + lane % kGroup; a padding head (kHeads and up, see
  // decode_stage1) gates with zero parameters, so its P is 0 and it lists no V row.
  template <int kHeadDim, int kGroup, int kHeads>
  __device__ void start(State<kHeadDim, kGroup>& st, int first_head) const {
    const int head_in_group = int(threadIdx.x & 31) % kGroup;
    if constexpr (kHeads < kGroup) {
      if (head_in_group >= kHeads) {
        st.alpha = st.sigma = st.gamma = 0.0f;
        st.inv_window = 1.0f / float(window);
        return;
      }
    }
    const int head = first_head + head_in_group;
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
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ void start_warp(State<kHeadDim, kGroup>& st, Smem& sm, const SeqCache& cache, const unsigned char* key_cache,
                             const float (&q)[kGroup][8], int begin, int) const {
    using L = Layout<kHeadDim, kGroup, Kv>;
    const int lane = threadIdx.x & 31, slice = lane % L::kLanesPerKey;
    if constexpr (scores_on_tensor_cores<L>()) {
      if (lane / L::kLanesPerKey == 0)
#pragma unroll
        for (int h = 0; h < kGroup; ++h) store_bf16x8(&sm.q_bf16[h][slice * 8], from_float8(q[h]));
      __syncwarp();
      const int n = lane / 4;
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks)
        if (n < kGroup) {
          const int d = mma_k_order<kHeadDim, Kv>(ks, lane % 4);
          st.q_operand[ks][0] = *reinterpret_cast<const unsigned*>(&sm.q_bf16[n][d]);
          st.q_operand[ks][1] = *reinterpret_cast<const unsigned*>(&sm.q_bf16[n][d + (Kv::kIsBf16 ? 8 : 2)]);
        }
    }
    for (int i = lane; i < kGroup * kMaxHalo; i += 32) sm.scores[i / kMaxHalo][i % kMaxHalo] = 0.0f;
    __syncwarp();
    const int halo = min(window - 1, begin);
    for (int base = 0; base < halo; base += L::kKeysPerLoad) {  // warp-uniform bounds
      const int i = base + lane / L::kLanesPerKey;
      const int pos = begin - halo + i;
      Bf16x8 k[1] = {};
      if (i < halo) k[0] = Kv::stream8(key_cache + (cache.offset(pos) + slice * 8) * Kv::kBytes);
      float s[kGroup];
      scattered_scores<L::kLanesPerKey, kGroup, 1, Kv>(q, k, s);
      if (i < halo) store_scores<L, 1>(sm, s, kMaxHalo - halo + base);
    }
    __syncwarp();
  }

  // o += P V for listed tile `index`, once its V rows have landed.
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ void accumulate(Smem& sm, int index, float (&o)[kGroup][8]) const {
    using L = Layout<kHeadDim, kGroup, Kv>;
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
        to_float8(Kv::load8(&sm.values[slot][i][slice * 8 * Kv::kBytes]), vf);
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
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ void finish(State<kHeadDim, kGroup>& st, Smem& sm, float (&o)[kGroup][8]) const {
    for (int index = max(0, st.tiles - kValueLead); index < st.tiles; ++index)
      accumulate<kHeadDim, kGroup, Kv>(sm, index, o);
  }

  // This tile's scores (on tensor cores for 16-key tiles, else reduce-scattered over the lanes
  // of each key) after the carried halo, then its P from the pooled scores, the list of keys with
  // a non-zero P for some head (sparse-P) and the copies of only their V rows; then the P V of
  // the tile listed kValueLead tiles ago.
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ __forceinline__ void tile(State<kHeadDim, kGroup>& st, Smem& sm, const float (&q)[kGroup][8],
                                       StagedTile<kHeadDim, kGroup, Kv> staged, float (&o)[kGroup][8],
                                       const SeqCache& cache, const unsigned char* value_cache,
                                       unsigned long long (&counts)[2]) const {
    using L = Layout<kHeadDim, kGroup, Kv>;
    if constexpr (scores_on_tensor_cores<L>()) {
      // S^T = K q^T: keys as the mma's 16 rows (ldmatrix lanes: key lane & 15, 8-value half
      // lane >> 4 of each 16-value step), query heads as its 8 columns. Keys past the end
      // score garbage that the gate never reads (their P is 0; no later key pools them).
      staged.put_newest_key();
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (Kv::kIsBf16) {
        // The A fragments by ldmatrix (lanes: key lane & 15, 8-value half lane >> 4 of each
        // 16-value step).
        const int lane = threadIdx.x & 31;
        const unsigned char* a_row = staged.head_rows + (lane & 15) * staged.row_stride + (lane >> 4) * 16;
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks) {
          unsigned a[4];
          ldmatrix_x4(a, a_row + ks * 32);
          mma_bf16(c, a, st.q_operand[ks][0], st.q_operand[ks][1]);
        }
      } else {
        mma_scores_e4m3<kHeadDim>(staged, st.q_operand, c);
      }
      staged.release();
      store_mma_scores<kGroup>(sm, c);
    } else {
      Bf16x8 k[L::kUnroll];
      staged.read(k);
      staged.release();
      float d[L::kUnroll * kGroup];
      scattered_scores<L::kLanesPerKey, kGroup, L::kUnroll, Kv>(q, k, d);
      store_scores<L, L::kUnroll>(sm, d, kMaxHalo);
      __syncwarp();
    }
    // The V gathers (bulk copies) may read the newest key's V row, which this warp wrote.
    if (staged.holds_newest()) {
      fence_generic_to_async_global();
      __syncwarp();
    }
    after_scores<kHeadDim, kGroup, Kv>(st, sm, o, cache, value_cache, staged.first_key, staged.end, counts);
  }

  // S^T = K q^T for an e4m3 stage: lane (g = lane / 4, t = lane % 4) reads kHeadDim / 4 contiguous
  // bytes of keys g and g + 8 (16-byte loads; the padded rows put the 8 keys a load phase touches
  // in distinct banks) and converts each pair to bf16 in registers: word ks of a key's bytes gives
  // k16 step ks its dims (mma_k_order: the A fragment's columns 2t, 2t + 1 the word's bytes 0, 1,
  // columns 2t + 8, 2t + 9 its bytes 2, 3; q's operand is laid out in the same order).
  template <int kHeadDim, typename Staged>
  __device__ static void mma_scores_e4m3(const Staged& staged, const unsigned (&q_operand)[kHeadDim / 16][2],
                                         float (&c)[4]) {
    constexpr int kBytesPerLane = kHeadDim / 4, kSteps = kHeadDim / 16;
    const int lane = threadIdx.x & 31;
    const unsigned char* row = staged.head_rows + (lane / 4) * staged.row_stride + (lane % 4) * kBytesPerLane;
    unsigned lo[kSteps], hi[kSteps];  // keys g and g + 8
#pragma unroll
    for (int i = 0; i < kBytesPerLane / 16; ++i) {
      const uint4 x = *reinterpret_cast<const uint4*>(row + 16 * i);
      const uint4 y = *reinterpret_cast<const uint4*>(row + 8 * staged.row_stride + 16 * i);
      lo[4 * i] = x.x, lo[4 * i + 1] = x.y, lo[4 * i + 2] = x.z, lo[4 * i + 3] = x.w;
      hi[4 * i] = y.x, hi[4 * i + 1] = y.y, hi[4 * i + 2] = y.z, hi[4 * i + 3] = y.w;
    }
    auto pair = [](unsigned word, unsigned selector) {  // two bytes of a word as a bf16 pair
      const __nv_bfloat162 v = e4m3_pair_to_bf16x2_nan_as_480(__byte_perm(word, 0u, selector));
      unsigned bits;
      memcpy(&bits, &v, 4);
      return bits;
    };
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const unsigned a[4] = {pair(lo[ks], 0x1404), pair(hi[ks], 0x1404), pair(lo[ks], 0x3424), pair(hi[ks], 0x3424)};
      mma_bf16(c, a, q_operand[ks][0], q_operand[ks][1]);
    }
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
  template <int kHeadDim, int kGroup, typename Kv, typename Smem>
  __device__ void after_scores(State<kHeadDim, kGroup>& st, Smem& sm, float (&o)[kGroup][8], const SeqCache& cache,
                               const unsigned char* value_cache, int first_key, int end,
                               unsigned long long (&counts)[2]) const {
    using L = Layout<kHeadDim, kGroup, Kv>;
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
    constexpr unsigned kRowBytes = L::kRowBytes;
    if (any) {
      const int i = __popc(listed_keys & ((1u << lane) - 1u));
#pragma unroll
      for (int h = 0; h < kGroup; ++h) sm.weights[slot][i][h] = sm.tile_p[lane][h];
      bulk_copy_to_shared(&sm.values[slot][i][0], value_cache + cache.offset(first_key + lane) * Kv::kBytes, kRowBytes,
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
    if (st.tiles > kValueLead) accumulate<kHeadDim, kGroup, Kv>(sm, st.tiles - 1 - kValueLead, o);
  }
};
static_assert(GatePolicy<SoftmaxGate> && GatePolicy<AsyncGate>, "decode's gates keep the contract of gate_policy.cuh");

}  // namespace asynct::kernels::decode
