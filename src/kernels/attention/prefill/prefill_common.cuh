// What the two prefill kernels share (prefill.cu: portable, mma.sync; prefill_hopper.cu: sm_90a,
// wgmma): the CTA's tile bookkeeping, the gates as policies, where a key/value row comes from,
// and the write of the new tokens' K/V into the paged cache.
//
// The gates work on the m16n8 accumulator fragment that mma.sync and wgmma both produce: lane
// 4g+q of a warp holds columns 8n+2q, 8n+2q+1 of rows g and g+8 of the warp's 16-row block.
//
// The async halo: P of key j needs the ReLU'd scores of keys j-1 .. j-W+1. Within a tile they
// come from the neighbouring lanes of the quad that holds the row by shuffles; across the tile
// boundary each thread carries the ReLU'd scores of its columns of the previous tile's last
// 8-column block (key tiles are visited in ascending order from key 0, so the carry is always
// the previous tile's; before key 0 it is zero, as the definition wants).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/attention/gate.cuh"
#include "kernels/attention/prefill/prefill.h"

namespace asynct::kernels::prefill {

// ---- Small helpers ------------------------------------------------------------------------

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- The tile ------------------------------------------------------------------------------

// What a CTA knows about its sequence, head and tile.
struct TileInfo {
  int seq, head, kv_head;
  int q_begin, q_len, prefix;
  int m0;      // first query row of the tile (within the sequence)
  int kv_end;  // keys [0, kv_end) are visible to some row of the tile
};

// ---- The order of a tile's keys ------------------------------------------------------------
//
// S's m16n8 fragments (mma.sync and wgmma alike) give the thread of quad lane `quad` the columns
// 8 nb + 2 quad + {0, 1} of each 8-column block nb = 0 .. NB-1. Both kernels store a tile's
// keys in shared memory in an order that makes those columns consecutive keys: column
// j = 8 nb + 2 quad + e holds key 2 NB quad + 2 nb + e, so quad lane q holds the run of keys
// [2 NB q, 2 NB q + 2 NB). The async gate's window sums then stay within the thread, except for
// the first W-1 keys of each run (one exchange per run instead of one per block). K and V rows
// share the order, so P V is unchanged; softmax does not care.
template <int NB>
__device__ __forceinline__ int key_of_column(int j) {
  return 2 * NB * ((j % 8) / 2) + 2 * (j / 8) + (j & 1);
}
template <int NB>
__device__ __forceinline__ int column_of_key(int k) {
  constexpr int kRun = 2 * NB;
  return 8 * ((k % kRun) / 2) + 2 * (k / kRun) + (k & 1);
}

// Whether element e (0..3) of 8-column block nb of the warp's S fragment is causally masked.
// key0: the tile's first key; pos0: the position of the thread's first row.
template <int NB>
__device__ __forceinline__ bool is_masked(int key0, int pos0, int nb, int e, int quad) {
  return key0 + 2 * NB * quad + 2 * nb + (e & 1) > pos0 + 8 * (e >> 1);
}

// The CTA's tile: (query head, sequence) from blockIdx.x/y, and the query rows from blockIdx.z,
// the heaviest (last) tiles first (z is the slowest grid dimension). False: the tile lies past
// the sequence's new tokens, the CTA has nothing to do.
__device__ __forceinline__ bool make_tile_info(const PrefillParams& p, int block_m, TileInfo& t) {
  t.head = blockIdx.x;
  t.seq = blockIdx.y;
  t.q_begin = p.cu_seqlens_q[t.seq];
  t.q_len = p.cu_seqlens_q[t.seq + 1] - t.q_begin;
  t.m0 = int(gridDim.z - 1 - blockIdx.z) * block_m;
  if (t.m0 >= t.q_len) return false;
  t.prefix = p.kv_lens[t.seq] - t.q_len;
  t.kv_head = t.head / (p.num_q_heads / p.kv.num_kv_heads);
  t.kv_end = t.prefix + t.m0 + min(block_m, t.q_len - t.m0);
  return true;
}

// Where key/value row `pos` (< kv_end) of the tile's sequence starts, at the tile's KV head:
// positions before the prefix in the paged cache (through the block table), the others in the
// new-token arrays.
struct KvRow {
  const bf16* key;
  const bf16* value;
};
template <int D>
__device__ __forceinline__ KvRow kv_row(const PrefillParams& p, const TileInfo& t, int pos) {
  const long long row_stride = (long long)p.kv.num_kv_heads * D;  // elements per token
  if (pos < t.prefix) {
    const int shift = __ffs(p.kv.block_size) - 1;
    const long long block =
        p.kv.block_table[(long long)t.seq * p.kv.max_blocks_per_seq + (pos >> shift)];
    const long long offset =
        (block * p.kv.block_size + (pos & (p.kv.block_size - 1))) * row_stride + t.kv_head * D;
    return {p.kv.key_cache + offset, p.kv.value_cache + offset};
  }
  const long long offset = (long long)(t.q_begin - t.prefix + pos) * row_stride + t.kv_head * D;
  return {p.key + offset, p.value + offset};
}

// ---- Gates ---------------------------------------------------------------------------------

// Both gates keep per-row state for each of the warp's MB 16-row blocks; apply() and finish()
// take the block index mb (a compile-time constant after unrolling).
template <int MB>
struct SoftmaxGate {
  static constexpr bool kRescalesOutput = true;  // apply() may scale O: no product may be writing it
  static constexpr float kRescaleLog2 = 8.0f;  // see apply()
  float scale_log2;       // scale * log2(e)
  float scale_cap;        // scale / softcap
  float softcap;          // 0: none
  float row_max[MB][2];   // running max of the (log2-scaled) scores, rows g and g+8
  float row_sum[MB][2];   // running sum of this thread's P (reduced over the quad in finish())

  __device__ SoftmaxGate(const PrefillParams& p, int /*head*/, float s) {
    scale_log2 = s * 1.4426950408889634f;
    softcap = p.gate.softcap;
    scale_cap = softcap > 0.0f ? s / softcap : 0.0f;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      row_max[mb][0] = row_max[mb][1] = -INFINITY;
      row_sum[mb][0] = row_sum[mb][1] = 0.0f;
    }
  }

  template <bool kMask, int NB, int DB>
  __device__ __forceinline__ void apply(int mb, float (&s)[NB][4], float (&o)[DB][4], int key0,
                                        int pos0) {
    const int quad = threadIdx.x & 3;
    // The scores stay unscaled where possible: exp2(s * to_log2 - max) is one FFMA per score,
    // and the max of the unscaled scores times to_log2 (> 0) is the max of the scaled ones.
    float to_log2 = scale_log2;
    if (softcap > 0.0f) {
      const float cap_log2 = softcap * 1.4426950408889634f;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] = cap_log2 * tanhf(s[nb][e] * scale_cap);
      to_log2 = 1.0f;
    }
    if constexpr (kMask) {
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (is_masked<NB>(key0, pos0, nb, e, quad)) s[nb][e] = -INFINITY;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * hh], s[nb][2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(row_max[mb][hh], mx * to_log2);  // (-inf * to_log2 stays -inf)
      // Lazy rescaling: the row keeps its old max (the base of its P, l and O alike, so O / l
      // is unchanged) until the new one exceeds it by more than kRescaleLog2; P stays <= 2^8
      // then, exact enough in fp32 and within bf16's range. After the first tiles the max
      // rarely jumps that far, so the warp usually skips the rescale of O; rescaling on every
      // rise of the max measured slower behind the same vote (it was nearly always taken).
      const bool rescale = mx > row_max[mb][hh] + kRescaleLog2;  // also: first keys of the row
      const float correction = rescale ? fast_exp2(row_max[mb][hh] - mx) : 1.0f;
      if (rescale) row_max[mb][hh] = mx;
      const float base = row_max[mb][hh] == -INFINITY ? 0.0f : row_max[mb][hh];
      float sum = 0.0f;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        s[nb][2 * hh] = fast_exp2(fmaf(s[nb][2 * hh], to_log2, -base));
        s[nb][2 * hh + 1] = fast_exp2(fmaf(s[nb][2 * hh + 1], to_log2, -base));
        sum += s[nb][2 * hh] + s[nb][2 * hh + 1];
      }
      row_sum[mb][hh] = row_sum[mb][hh] * correction + sum;
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int db = 0; db < DB; ++db) {
          o[db][2 * hh] *= correction;
          o[db][2 * hh + 1] *= correction;
        }
      }
    }
  }

  template <int DB>
  __device__ __forceinline__ void finish(int mb, float (&o)[DB][4]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_sum[mb][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int db = 0; db < DB; ++db) {
        o[db][2 * hh] *= inv;
        o[db][2 * hh + 1] *= inv;
      }
    }
  }
};

// The async gate for pool windows W <= kMaxW; kExact: W == kMaxW (the window is compile-time).
template <int MB, int kMaxW, bool kExact>
struct AsyncGate {
  static_assert(kMaxW >= 1 && kMaxW <= 8, "pool window 1..8");
  static constexpr bool kRescalesOutput = false;  // apply() leaves O alone
  static constexpr int kHalo = kMaxW - 1 > 0 ? kMaxW - 1 : 1;  // keys left of a run (1 if none)
  // The scores stay unscaled: the scale and 1/W live in the constants (async_gate_unscaled),
  // and gamma multiplies O once in finish().
  float alpha_scale, sigma_over_w, gamma;
  int window;
  // For quad lane 0: R of the previous tile's last kMaxW-1 keys (k = 1: its last), the keys
  // left of its run; rows g and g+8.
  float carry[MB][2][kHalo];

  __device__ AsyncGate(const PrefillParams& p, int head, float s) {
    window = kExact ? kMaxW : p.gate.pool_window;
    alpha_scale = p.gate.alpha[head] * s;
    sigma_over_w = p.gate.sigma[head] / float(window);
    gamma = p.gate.gamma[head];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int k = 0; k < kHalo; ++k) carry[mb][hh][k] = 0.0f;  // R = 0 left of key 0
  }

  template <bool kMask, int NB, int DB>
  __device__ __forceinline__ void apply(int mb, float (&s)[NB][4], float (&)[DB][4], int key0,
                                        int pos0) {
    constexpr int kRun = 2 * NB;  // this thread's consecutive keys (see key_of_column)
    const int lane = threadIdx.x & 31, quad = lane & 3;
    const int from = (lane & ~3) | ((quad - 1) & 3);  // the lane holding the run to the left
    const auto relu = [&](int i, int hh) { return fmaxf(s[i / 2][2 * hh + (i & 1)], 0.0f); };  // key i of the run
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // left[k] = R of the key k places left of the key pair in hand: first the left lane's
      // last keys, or, for quad lane 0, the previous tile's (quad lane 3's, received one tile
      // ago); then this run's, rolled along pair by pair (the scores are overwritten by P).
      float left[kHalo + 1];
#pragma unroll
      for (int k = 1; k < kMaxW; ++k) {
        const float got = __shfl_sync(0xffffffffu, relu(kRun - k, hh), from);
        left[k] = quad == 0 ? carry[mb][hh][k - 1] : got;
        carry[mb][hh][k - 1] = got;
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const float s0 = s[nb][2 * hh], s1 = s[nb][2 * hh + 1];
        const float r0 = fmaxf(s0, 0.0f), r1 = fmaxf(s1, 0.0f);
        // sum0: R over keys i-W+1 .. i; sum1: over i-W+2 .. i+1 (i = 2 nb). With the window
        // known they share R over i-W+2 .. i.
        float sum0, sum1;
        if constexpr (kExact) {
          float shared = r0;
#pragma unroll
          for (int k = 1; k + 1 < kMaxW; ++k) shared += left[k];
          sum0 = kMaxW > 1 ? shared + left[kMaxW - 1] : shared;
          sum1 = kMaxW > 1 ? shared + r1 : r1;
        } else {
          sum0 = r0;
          sum1 = r1;
          if (window >= 2) sum1 += r0;
#pragma unroll
          for (int k = 1; k < kMaxW; ++k)
            if (k < window) sum0 += left[k];
#pragma unroll
          for (int k = 1; k + 1 < kMaxW; ++k)
            if (k + 1 < window) sum1 += left[k];
        }
        float g0 = async_gate_unscaled(s0, sum0, alpha_scale, sigma_over_w);
        float g1 = async_gate_unscaled(s1, sum1, alpha_scale, sigma_over_w);
        if constexpr (kMask) {
          if (is_masked<NB>(key0, pos0, nb, 2 * hh, quad)) g0 = 0.0f;
          if (is_masked<NB>(key0, pos0, nb, 2 * hh + 1, quad)) g1 = 0.0f;
        }
        s[nb][2 * hh] = g0;
        s[nb][2 * hh + 1] = g1;
        // Roll: the next pair's left keys are this pair and the ones before it.
#pragma unroll
        for (int k = kMaxW - 1; k >= 3; --k) left[k] = left[k - 2];
        if (kMaxW >= 3) left[2] = r0;
        if (kMaxW >= 2) left[1] = r1;
      }
    }
  }

  template <int DB>
  __device__ __forceinline__ void finish(int, float (&o)[DB][4]) {  // no normalisation
#pragma unroll
    for (int db = 0; db < DB; ++db)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[db][e] *= gamma;
  }
};

// Calls visit.template operator()<Gate>() with the gate policy for `gate` (MB row blocks per
// warp): softmax, or async with the pool window compile-time for W <= 3.
template <int MB, class Visit>
void with_gate(const GateArgs& gate, Visit&& visit) {
  if (gate.kind == GateKind::Softmax) return visit.template operator()<SoftmaxGate<MB>>();
  switch (gate.pool_window) {
    case 1: return visit.template operator()<AsyncGate<MB, 1, true>>();
    case 2: return visit.template operator()<AsyncGate<MB, 2, true>>();
    case 3: return visit.template operator()<AsyncGate<MB, 3, true>>();
    default: return visit.template operator()<AsyncGate<MB, 8, false>>();  // 4..8
  }
}

// ---- The launch ----------------------------------------------------------------------------

// Either kernel's grid: one CTA per (query head, sequence, block_m query rows).
template <auto kKernel>
void launch_tiles(const PrefillParams& p, int block_m, int threads, int smem_bytes, float scale, cudaStream_t stream,
                  const char* who) {
  allow_dynamic_smem<kKernel>(smem_bytes);
  const int m_tiles = (p.max_q_len + block_m - 1) / block_m;
  check(m_tiles <= 65535, who, ": max_q_len ", p.max_q_len, " needs ", m_tiles, " query tiles; the grid allows 65535");
  kKernel<<<dim3(p.num_q_heads, p.num_seqs, m_tiles), threads, smem_bytes, stream>>>(p, scale);
  check_launch(who);
}

// ---- The cache write -----------------------------------------------------------------------

// Copies the tile's rows that are this CTA's new tokens (positions [prefix + m0, kv_end)) from
// the staged K/V tiles into the paged cache. They pass through shared memory anyway, so the
// write costs no global loads; stores do not stall the warp. The kernel's tile shape: kBlockN
// keys, kThreads threads; layout(row, chunk) is the element offset of 16-byte chunk `chunk` of
// shared-memory row `row` (which holds key key_of_column(row), see the key order above).
template <int D, int kBlockN, int kThreads, class Layout>
__device__ __forceinline__ void store_new_rows(const bf16* k_tile, const bf16* v_tile, int tile,
                                               const PrefillParams& p, const TileInfo& t,
                                               Layout layout) {
  constexpr int kChunks = D / 8;
  const int key0 = tile * kBlockN;
  const int first = max(t.prefix + t.m0, key0) - key0;  // rows of the tile
  const int last = min(t.kv_end, key0 + kBlockN) - key0;
  const int hkv = p.kv.num_kv_heads;
  const int shift = __ffs(p.kv.block_size) - 1;
  const std::int32_t* table = p.kv.block_table + (long long)t.seq * p.kv.max_blocks_per_seq;
  for (int idx = first * kChunks + threadIdx.x; idx < last * kChunks; idx += kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    const int pos = key0 + row;
    const long long block = table[pos >> shift];
    const long long dst =
        ((block * p.kv.block_size + (pos & (p.kv.block_size - 1))) * hkv + t.kv_head) * D +
        chunk * 8;
    const int at = layout(column_of_key<kBlockN / 8>(row), chunk);  // (the key order)
    store_bf16x8(p.kv.key_cache + dst, load_bf16x8(k_tile + at));
    store_bf16x8(p.kv.value_cache + dst, load_bf16x8(v_tile + at));
  }
}

}  // namespace asynct::kernels::prefill
