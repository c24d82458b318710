// Portable prefill attention (sm_80 and up), FlashAttention-2 style on mma.sync tensor cores.
//
// One CTA of 4 warps handles a tile of kBlockM query rows (128 for head_dim <= 128, 64 for 256)
// of one (sequence, query head); each warp owns 16 * kRowBlocks consecutive rows (32 or 16), so
// every K/V fragment it reads from shared memory feeds kRowBlocks mma rows. Two CTAs share an SM,
// so one's barrier waits and gate math overlap the other's tensor-core work. The CTA walks the
// key tiles (kBlockN keys) from key 0 up to the tile's last visible key; K and V tiles are
// double-buffered in shared memory with cp.async (tile t+1 loads while tile t is computed, one
// barrier per tile). S and O live in fp32 registers (mma.sync m16n8k16 bf16 -> fp32); P is
// rounded to bf16 for the PV product. The grid runs the heaviest (last) query tiles of every
// (sequence, head) first, so that the short causal tiles fill the tail.
//
// The gate is a policy (SoftmaxGate<MB>, AsyncGate<MB, kMaxW, kExact>; MB row blocks per warp)
// with two hooks: apply() turns one tile of a row block's raw scores into P in place (softmax:
// online max/sum with lazy rescaling of O; async: the pooled-ReLU gate, no rescale), finish()
// runs once before the output is written (softmax: the 1/l normalisation; async: gamma).
// Everything else is shared.
//
// The async halo: P of key j needs the ReLU'd scores of keys j-1 .. j-W+1. Within a tile they
// come from the neighbouring lanes of the quad that holds the row (mma C-fragment layout: lane
// 4g+q holds columns 8n+2q, 8n+2q+1 of rows g and g+8) by shuffles; across the tile boundary
// each thread carries the ReLU'd scores of its columns of the previous tile's last 8-column
// block (key tiles are visited in ascending order from key 0, so the carry is always the
// previous tile's; before key 0 it is zero, as the definition wants).
//
// Keys at positions < prefix come from the paged cache through the block table; keys at
// positions >= prefix come from the `key`/`value` inputs. The CTAs of the first query head of
// each KV-head group also copy their tile's new K/V rows from shared memory into the paged cache
// (exactly one CTA writes each new row; no CTA reads the cache at new positions, so there is no
// race).
#include "kernels/prefill.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/bf16.cuh"
#include "kernels/cuda_check.h"
#include "kernels/gate.cuh"
#include "kernels/mma_sync.cuh"

namespace asynct::kernels {
namespace {

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

// Shared-memory tiles are [rows][D] bf16 in the swizzled layout of swizzle<D> (mma_sync.cuh).

// ---- Configuration -------------------------------------------------------------------------

template <int D>
struct Config {
  // 16-row mma blocks per warp: 2 halves the shared-memory reads per mma; head_dim 256 keeps 1
  // (its O accumulators alone take 128 registers per row block).
  static constexpr int kRowBlocks = D <= 128 ? 2 : 1;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16 * kRowBlocks;  // query rows per CTA
  static constexpr int kBlockN = D <= 128 ? 64 : 32;        // keys per tile
  static constexpr int kStages = 2;                         // K/V tiles in flight
  static constexpr int kCtasPerSm = 2;
  static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * D * 2;
  static_assert(kSmemBytes * kCtasPerSm <= 227 * 1024, "two CTAs must fit one SM");
};

// What a CTA knows about its sequence, head and tile.
struct TileInfo {
  int seq, head, kv_head;
  int q_begin, q_len, prefix;
  int m0;      // first query row of the tile (within the sequence)
  int kv_end;  // keys [0, kv_end) are visible to some row of the tile
};

// Whether element e (0..3) of 8-column block nb of the warp's S fragment is causally masked.
// key0: the key of column 0 of the tile; pos0: the position of the thread's first row.
__device__ __forceinline__ bool is_masked(int key0, int pos0, int nb, int e, int quad) {
  return key0 + 8 * nb + 2 * quad + (e & 1) > pos0 + 8 * (e >> 1);
}

// ---- Gates ---------------------------------------------------------------------------------

// Both gates keep per-row state for each of the warp's MB 16-row blocks; apply() and finish()
// take the block index mb (a compile-time constant after unrolling).
template <int MB>
struct SoftmaxGate {
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
          if (is_masked(key0, pos0, nb, e, quad)) s[nb][e] = -INFINITY;
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
  // The scores stay unscaled: the scale and 1/W live in the constants (async_gate_unscaled),
  // and gamma multiplies O once in finish().
  float alpha_scale, sigma_over_w, gamma;
  int window;
  float carry[MB][4];  // ReLU'd scores of this thread's columns of the previous tile's last block

  __device__ AsyncGate(const PrefillParams& p, int head, float s) {
    window = kExact ? kMaxW : p.gate.pool_window;
    alpha_scale = p.gate.alpha[head] * s;
    sigma_over_w = p.gate.sigma[head] / float(window);
    gamma = p.gate.gamma[head];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int e = 0; e < 4; ++e) carry[mb][e] = 0.0f;  // R = 0 left of key 0
  }

  template <bool kMask, int NB, int DB>
  __device__ __forceinline__ void apply(int mb, float (&s)[NB][4], float (&)[DB][4], int key0,
                                        int pos0) {
    const int lane = threadIdx.x & 31, quad = lane & 3;
    float prev[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      prev[e] = carry[mb][e];
      carry[mb][e] = fmaxf(s[NB - 1][e], 0.0f);
    }
    // Descending blocks: block nb's P overwrites its S only after block nb+1 (which reads it
    // as its left neighbour) is done.
#pragma unroll
    for (int nb = NB - 1; nb >= 0; --nb) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s0 = s[nb][2 * hh], s1 = s[nb][2 * hh + 1];
        const float r0 = fmaxf(s0, 0.0f), r1 = fmaxf(s1, 0.0f);
        // This thread's ReLU'd scores of the same columns one block (8 keys) to the left.
        const float p0 = nb > 0 ? fmaxf(s[nb > 0 ? nb - 1 : 0][2 * hh], 0.0f) : prev[2 * hh];
        const float p1 =
            nb > 0 ? fmaxf(s[nb > 0 ? nb - 1 : 0][2 * hh + 1], 0.0f) : prev[2 * hh + 1];
        // left[k] = R of column (8nb + 2quad) - k, k = 1 .. kMaxW-1. Column pair m to the left
        // is held by quad lane (quad - m) & 3: in this block when quad >= m, else in the block
        // before, so the source lane picks which of its two blocks to send.
        float left[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) left[k] = 0.0f;
#pragma unroll
        for (int m = 1; m <= 3; ++m) {
          if (2 * m - 1 <= kMaxW - 1) {
            const int src = (lane & ~3) | ((quad - m) & 3);
            const bool same_block = quad + m < 4;  // as the source: my receiver is in my block
            left[2 * m - 1] = __shfl_sync(0xffffffffu, same_block ? r1 : p1, src);
            if (2 * m <= kMaxW - 1)
              left[2 * m] = __shfl_sync(0xffffffffu, same_block ? r0 : p0, src);
          }
        }
        if (kMaxW - 1 >= 7) left[7] = p1;
        // sum0: R over columns c0-W+1 .. c0; sum1: over c0-W+2 .. c0+1.
        float sum0 = r0, sum1 = r1;
        if (kExact ? kMaxW >= 2 : window >= 2) sum1 += r0;
#pragma unroll
        for (int k = 1; k < kMaxW; ++k)
          if (kExact || k < window) sum0 += left[k];
#pragma unroll
        for (int k = 1; k + 1 < kMaxW; ++k)
          if (kExact || k + 1 < window) sum1 += left[k];
        float g0 = async_gate_unscaled(s0, sum0, alpha_scale, sigma_over_w);
        float g1 = async_gate_unscaled(s1, sum1, alpha_scale, sigma_over_w);
        if constexpr (kMask) {
          if (is_masked(key0, pos0, nb, 2 * hh, quad)) g0 = 0.0f;
          if (is_masked(key0, pos0, nb, 2 * hh + 1, quad)) g1 = 0.0f;
        }
        s[nb][2 * hh] = g0;
        s[nb][2 * hh + 1] = g1;
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

// ---- Tile loads ----------------------------------------------------------------------------

// Copies key/value tile `tile` (kBlockN rows) into shared memory with cp.async: positions
// < prefix from the paged cache, positions in [prefix, kv_end) from the new-token arrays, rows
// at or past kv_end zero-filled.
//
// Each thread copies part of one row (kThreadsPerRow threads per row), so the row's address (a
// block-table lookup, or a linear index; the same for K and V) is computed once per tile. Chunk
// c = kThreadsPerRow * j + h of the row goes to thread h: one copy instruction of a warp reads
// whole 32-byte sectors, and the 8 threads of a shared-memory phase hold 8 consecutive rows,
// whose swizzled chunks fall in 8 distinct banks. The kCopies copies per thread are issued one
// pair (K and V) at a time between the Q K^T steps (issue(j)): a burst of them ahead of the
// ldmatrix reads queued those reads behind the copies.
template <int D>
struct KvTileLoader {
  using C = Config<D>;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kThreadsPerRow = C::kThreads / C::kBlockN;
  static constexpr int kCopies = kChunks / kThreadsPerRow;  // per thread, K and V each
  // A V stage lies this far after its K stage.
  static constexpr unsigned kValueOffsetBytes = C::kStages * C::kBlockN * D * 2;
  static_assert(C::kThreads % C::kBlockN == 0 && kChunks % kThreadsPerRow == 0, "tile shape");
  static_assert(kCopies <= D / 16, "the copies are issued within the k-steps of Q K^T");

  // Few live registers (the Q K^T loop around issue() is at the register limit): the sources
  // point at chunk h of the thread's row; dst is the row's shared address in the K stage; the
  // swizzled chunk of copy j is (kThreadsPerRow * j + h) ^ (row & 7) = (kThreadsPerRow * j) ^ hr.
  const bf16 *k_src, *v_src;
  unsigned dst;
  int hr;
  bool valid;

  __device__ __forceinline__ KvTileLoader(bf16* k_stage, int tile, const PrefillParams& p,
                                          const TileInfo& t) {
    const int tid = threadIdx.x;
    const int row = (tid & 7) | ((tid / (8 * kThreadsPerRow)) << 3);
    const int h = (tid / 8) % kThreadsPerRow;
    const int pos = tile * C::kBlockN + row;
    valid = pos < t.kv_end;
    const long long row_stride = (long long)p.kv.num_kv_heads * D;  // elements per token
    k_src = p.key;
    v_src = p.value;
    long long offset = 0;
    if (pos < t.prefix) {
      const int shift = __ffs(p.kv.block_size) - 1;
      const long long block =
          p.kv.block_table[(long long)t.seq * p.kv.max_blocks_per_seq + (pos >> shift)];
      offset = (block * p.kv.block_size + (pos & (p.kv.block_size - 1))) * row_stride;
      k_src = p.kv.key_cache;
      v_src = p.kv.value_cache;
    } else if (valid) {
      offset = (long long)(t.q_begin - t.prefix + pos) * row_stride;
    }
    if (valid) offset += t.kv_head * D + h * 8;
    k_src += offset;
    v_src += offset;
    dst = smem_addr(k_stage + row * D);
    hr = h ^ (row & 7);
  }

  __device__ __forceinline__ void issue(int j) const {
    const unsigned d = dst + (((kThreadsPerRow * j) ^ hr) << 4);
    const int src = valid ? kThreadsPerRow * j * 8 : 0;
    cp_async16_shared(d, k_src + src, valid);
    cp_async16_shared(d + kValueOffsetBytes, v_src + src, valid);
  }
  __device__ __forceinline__ void issue_all() const {
#pragma unroll
    for (int j = 0; j < kCopies; ++j) issue(j);
  }
};

// Copies the tile's rows that are this CTA's new tokens (positions [prefix + m0, kv_end)) from
// the staged K/V tiles into the paged cache. They pass through shared memory anyway, so the
// write costs no global loads; stores do not stall the warp.
template <int D>
__device__ __forceinline__ void store_new_rows(const bf16* k_tile, const bf16* v_tile, int tile,
                                               const PrefillParams& p, const TileInfo& t) {
  using C = Config<D>;
  constexpr int kChunks = D / 8;
  const int key0 = tile * C::kBlockN;
  const int first = max(t.prefix + t.m0, key0) - key0;  // rows of the tile
  const int last = min(t.kv_end, key0 + C::kBlockN) - key0;
  const int hkv = p.kv.num_kv_heads;
  const int shift = __ffs(p.kv.block_size) - 1;
  const std::int32_t* table = p.kv.block_table + (long long)t.seq * p.kv.max_blocks_per_seq;
  for (int idx = first * kChunks + threadIdx.x; idx < last * kChunks; idx += C::kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    const int pos = key0 + row;
    const long long block = table[pos >> shift];
    const long long dst =
        ((block * p.kv.block_size + (pos & (p.kv.block_size - 1))) * hkv + t.kv_head) * D +
        chunk * 8;
    store_bf16x8(p.kv.key_cache + dst, load_bf16x8(k_tile + swizzle<D>(row, chunk)));
    store_bf16x8(p.kv.value_cache + dst, load_bf16x8(v_tile + swizzle<D>(row, chunk)));
  }
}

// ---- The kernel ----------------------------------------------------------------------------

template <int D, class Gate>
__global__ void __launch_bounds__(Config<D>::kThreads, Config<D>::kCtasPerSm)
    prefill_kernel(const PrefillParams p, float scale) {
  using C = Config<D>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  constexpr int MB = C::kRowBlocks;  // 16-row blocks per warp
  constexpr int NB = kBlockN / 8;    // 8-key column blocks of S
  constexpr int DB = D / 8;          // 8-wide column blocks of O
  constexpr int KS = D / 16;         // k-steps of Q K^T
  constexpr int kChunks = D / 8;
  constexpr int kTileElems = kBlockN * D;

  TileInfo t;
  t.head = blockIdx.x;
  t.seq = blockIdx.y;
  t.q_begin = p.cu_seqlens_q[t.seq];
  t.q_len = p.cu_seqlens_q[t.seq + 1] - t.q_begin;
  // Heaviest (last) query tiles first: blockIdx.z is the slowest grid dimension.
  t.m0 = int(gridDim.z - 1 - blockIdx.z) * kBlockM;
  if (t.m0 >= t.q_len) return;
  const int kv_len = p.kv_lens[t.seq];
  t.prefix = kv_len - t.q_len;
  t.kv_head = t.head / (p.num_q_heads / p.kv.num_kv_heads);
  const int rows = min(kBlockM, t.q_len - t.m0);  // valid query rows of this tile
  t.kv_end = t.prefix + t.m0 + rows;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBlockM * D;              // kStages K tiles
  bf16* sV = sK + C::kStages * kTileElems;  // kStages V tiles

  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const int hq = p.num_q_heads;
  const int warp_row0 = warp * 16 * MB;  // the warp's first row within the tile

  // Q tile (rows past q_len zero-filled) and the first K/V tile: one cp.async group.
  {
    constexpr int kRowsPerPass = C::kThreads / kChunks;
    const int chunk = tid % kChunks;
#pragma unroll
    for (int i = 0; i < kBlockM / kRowsPerPass; ++i) {
      const int row = tid / kChunks + i * kRowsPerPass;
      const bool valid = row < rows;
      const bf16* src =
          p.query + (valid ? ((long long)(t.q_begin + t.m0 + row) * hq + t.head) * D + chunk * 8
                           : 0);
      cp_async16(sQ + swizzle<D>(row, chunk), src, valid);
    }
  }
  KvTileLoader<D>(sK, 0, p, t).issue_all();
  cp_async_commit();

  Gate gate(p, t.head, scale);
  float acc_o[MB][DB][4];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int db = 0; db < DB; ++db)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mb][db][e] = 0.0f;

  const int q_row = warp_row0 + (lane & 15);               // ldmatrix row (A operand), block 0
  const int pos0 = t.prefix + t.m0 + warp_row0 + lane / 4;  // position of the thread's row g
  const int warp_last_pos = t.prefix + t.m0 + warp_row0 + 16 * MB - 1;
  // The first query head of each KV-head group writes the new tokens' K/V into the cache.
  const bool writes_cache = t.head % (hq / p.kv.num_kv_heads) == 0;
  const int n_tiles = (t.kv_end + kBlockN - 1) / kBlockN;
  // The first tile with a key past the tile's first row needs the causal mask.
  const int first_masked = (t.prefix + t.m0 + 1) / kBlockN;
  // ldmatrix lane offsets: K (B operand, not transposed) and V (B operand, transposed).
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_chunk = (lane >> 3) & 1;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    __syncthreads();  // K/V(tile) (and Q) landed; every warp is done with tile-1's stage
    // Tile+1 goes into the stage that tile-1 used.
    const bool has_next = tile + 1 < n_tiles;
    const int next = (tile + 1) % C::kStages;
    const KvTileLoader<D> next_tile(sK + next * kTileElems, has_next ? tile + 1 : tile, p, t);
    const bf16* k_tile = sK + (tile % C::kStages) * kTileElems;
    const bf16* v_tile = sV + (tile % C::kStages) * kTileElems;
    // On the diagonal, a warp whose rows all precede the tile's first key has nothing to do
    // (nor on any later tile): its P would be all zero.
    if (tile * kBlockN > warp_last_pos) {
      if (has_next) next_tile.issue_all();
      cp_async_commit();
    } else {

      // S = Q K^T for the warp's MB row blocks; each K fragment feeds all of them.
      float acc_s[MB][NB][4];
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mb][nb][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        if (has_next && ks < KvTileLoader<D>::kCopies) next_tile.issue(ks);
        unsigned a[MB][4];
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
          ldmatrix_x4(a[mb], sQ + swizzle<D>(q_row + 16 * mb, 2 * ks + (lane >> 4)));
#pragma unroll
        for (int nb2 = 0; nb2 < NB / 2; ++nb2) {
          unsigned b[4];
          ldmatrix_x4(b, k_tile + swizzle<D>(nb2 * 16 + k_row, 2 * ks + k_chunk));
          mma_row_blocks(acc_s, a, b, 2 * nb2);
        }
      }
      cp_async_commit();

#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        if (tile >= first_masked)
          gate.template apply<true>(mb, acc_s[mb], acc_o[mb], tile * kBlockN, pos0 + 16 * mb);
        else
          gate.template apply<false>(mb, acc_s[mb], acc_o[mb], tile * kBlockN, pos0 + 16 * mb);
      }

      // O += P V; each V fragment feeds all row blocks.
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        unsigned a[MB][4];
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
          a[mb][0] = pack_bf16(acc_s[mb][2 * kk][0], acc_s[mb][2 * kk][1]);
          a[mb][1] = pack_bf16(acc_s[mb][2 * kk][2], acc_s[mb][2 * kk][3]);
          a[mb][2] = pack_bf16(acc_s[mb][2 * kk + 1][0], acc_s[mb][2 * kk + 1][1]);
          a[mb][3] = pack_bf16(acc_s[mb][2 * kk + 1][2], acc_s[mb][2 * kk + 1][3]);
        }
#pragma unroll
        for (int db2 = 0; db2 < DB / 2; ++db2) {
          unsigned b[4];
          ldmatrix_x4_trans(b, v_tile + swizzle<D>(kk * 16 + v_row, 2 * db2 + v_chunk));
          mma_row_blocks(acc_o, a, b, 2 * db2);
        }
      }
    }
    // After the math, where S's registers are free: the tile's new rows into the cache.
    if (writes_cache && (tile + 1) * kBlockN > t.prefix + t.m0)
      store_new_rows<D>(k_tile, v_tile, tile, p, t);
  }

  // Stage O (bf16) through this warp's own rows of sQ, then 16-byte coalesced stores.
  {
    const int g = lane / 4, quad = lane & 3;
    __syncwarp();  // the warp's ldmatrix reads of sQ are done
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      gate.finish(mb, acc_o[mb]);
#pragma unroll
      for (int db = 0; db < DB; ++db) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = warp_row0 + 16 * mb + g + 8 * hh;
          *reinterpret_cast<__nv_bfloat162*>(sQ + swizzle<D>(row, db) + 2 * quad) =
              __floats2bfloat162_rn(acc_o[mb][db][2 * hh], acc_o[mb][db][2 * hh + 1]);
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * MB * kChunks / 32; ++i) {
      const int idx = i * 32 + lane;
      const int row = warp_row0 + idx / kChunks, chunk = idx % kChunks;
      if (row < rows) {
        const long long dst = ((long long)(t.q_begin + t.m0 + row) * hq + t.head) * D + chunk * 8;
        store_bf16x8(p.out + dst, load_bf16x8(sQ + swizzle<D>(row, chunk)));
      }
    }
  }

}

// ---- Host side -----------------------------------------------------------------------------

template <int D, class Gate>
void launch_with(const PrefillParams& p, float scale, cudaStream_t stream) {
  using C = Config<D>;
  allow_dynamic_smem<prefill_kernel<D, Gate>>(C::kSmemBytes);
  const int m_tiles = (p.max_q_len + C::kBlockM - 1) / C::kBlockM;
  check(m_tiles <= 65535, "launch_prefill: max_q_len ", p.max_q_len, " needs ", m_tiles,
        " query tiles; the grid allows 65535");
  const dim3 grid(p.num_q_heads, p.num_seqs, m_tiles);
  prefill_kernel<D, Gate><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, scale);
  check_launch("launch_prefill");
}

template <int D>
void dispatch_gate(const PrefillParams& p, float scale, cudaStream_t stream) {
  constexpr int MB = Config<D>::kRowBlocks;
  if (p.gate.kind == GateKind::Softmax) return launch_with<D, SoftmaxGate<MB>>(p, scale, stream);
  switch (p.gate.pool_window) {
    case 1: return launch_with<D, AsyncGate<MB, 1, true>>(p, scale, stream);
    case 2: return launch_with<D, AsyncGate<MB, 2, true>>(p, scale, stream);
    case 3: return launch_with<D, AsyncGate<MB, 3, true>>(p, scale, stream);
    default: return launch_with<D, AsyncGate<MB, 8, false>>(p, scale, stream);  // 4..8
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

}  // namespace

void launch_prefill(const PrefillParams& p, cudaStream_t stream) {
  const char* who = "launch_prefill";
  validate_paged_kv(p.kv, who);
  validate_gate(p.gate, who);
  check(p.num_seqs >= 1 && p.num_seqs <= 65535, who, ": num_seqs must be in 1..65535, got ",
        p.num_seqs);
  check(p.num_q_heads >= 1 && p.num_q_heads <= 65535, who,
        ": num_q_heads must be in 1..65535, got ", p.num_q_heads);
  check(p.num_q_heads % p.kv.num_kv_heads == 0, who, ": ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.total_q >= 0 && p.max_q_len >= 0 && p.max_q_len <= p.total_q, who,
        ": need 0 <= max_q_len <= total_q, got max_q_len ", p.max_q_len, ", total_q ", p.total_q);
  check(p.max_kv_len >= p.max_q_len, who, ": max_kv_len ", p.max_kv_len, " < max_q_len ",
        p.max_q_len);
  check((long long)p.max_kv_len <= (long long)p.kv.max_blocks_per_seq * p.kv.block_size, who,
        ": max_kv_len ", p.max_kv_len, " exceeds the block table's ", p.kv.max_blocks_per_seq,
        " blocks of ", p.kv.block_size, " tokens");
  // (> 0 matters: both gates keep raw scores and fold the scale into constants.)
  check(std::isfinite(p.scale) && p.scale >= 0.0f, who,
        ": scale must be finite and positive (0: 1/sqrt(head_dim)), got ", p.scale);
  check(p.cu_seqlens_q && p.kv_lens, who, ": null cu_seqlens_q or kv_lens");
  if (p.total_q == 0 || p.max_q_len == 0) return;
  check(p.query && p.key && p.value && p.out, who, ": null query, key, value or out pointer");
  check(aligned16(p.query) && aligned16(p.key) && aligned16(p.value) && aligned16(p.out) &&
            aligned16(p.kv.key_cache) && aligned16(p.kv.value_cache),
        who, ": query, key, value, out and the caches must be 16-byte aligned");

  const float scale = p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.kv.head_dim)));
  switch (p.kv.head_dim) {
    case 64: return dispatch_gate<64>(p, scale, stream);
    case 128: return dispatch_gate<128>(p, scale, stream);
    default: return dispatch_gate<256>(p, scale, stream);
  }
}

}  // namespace asynct::kernels
