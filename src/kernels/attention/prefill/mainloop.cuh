// What the two prefill kernels' main loops share: the CTA's tile of (sequence, query head,
// query rows), where a key/value row comes from (the paged cache for the cached prefix, the
// new-token arrays after it), and how a cached e4m3 row reaches the bf16 tiles.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/attention/prefill/prefill.h"
#include "kernels/attention/kv_element.cuh"
#include "kernels/attention/prefill/tile_order.cuh"
#include "kernels/common/bf16.cuh"

namespace asynct::kernels::prefill {

// ---- The tile ------------------------------------------------------------------------------

// What a CTA knows about its sequence, head and tile.
struct TileInfo {
  int seq, head, kv_head;
  int q_begin, q_len, prefix;
  int m0;      // first query row of the tile (within the sequence)
  int kv_end;  // keys [0, kv_end) are visible to some row of the tile
  int split;   // which of the tile's CTAs this is, when its keys are split over several (else 0)
};


// The tile at `place` in a grid of `zs` query tiles (x splits) a sequence: (query head, sequence,
// query rows); with `splits` CTAs a tile, the z index also says which split this is; with `heads`
// query heads a CTA (of one KV head), the head index picks the first of them and block_m is each
// head's rows. A CTA's place is this_ctas_grid_tile(seq_group) (tile_order.cuh: sequences in
// groups of `seq_group`, each group's heaviest (last) query tiles first), or, for a CTA that takes
// several tiles, grid_tile() of each. False: the tile lies past the sequence's new tokens, there
// is nothing to do.
__device__ __forceinline__ bool make_tile_info(const PrefillParams& p, int block_m, const GridTile& place, int zs,
                                               TileInfo& t, int splits = 1, int heads = 1) {
  t.head = place.head_index * heads;
  t.seq = place.seq;
  t.q_begin = p.cu_seqlens_q[t.seq];
  t.q_len = p.cu_seqlens_q[t.seq + 1] - t.q_begin;
  t.m0 = int(zs / splits - 1 - place.z / splits) * block_m;
  t.split = place.z % splits;
  if (t.m0 >= t.q_len) return false;
  t.prefix = p.kv_lens[t.seq] - t.q_len;
  t.kv_head = t.head / (p.num_q_heads / p.kv.num_kv_heads);
  t.kv_end = t.prefix + t.m0 + min(block_m, t.q_len - t.m0);
  return true;
}

// Where key/value row `pos` (< kv_end) of the tile's sequence starts, at the tile's KV head:
// positions before the prefix in the paged cache (through the block table; Kv is its element
// type: with KvFp8 `cached_e4m3` is set and the pointers are to its bytes), the others in the
// new-token arrays (bf16).
struct KvRow {
  const unsigned char* key;
  const unsigned char* value;
  bool cached_e4m3;
};
template <int D, class Kv>
__device__ __forceinline__ KvRow kv_row(const PrefillParams& p, const TileInfo& t, int pos) {
  const long long row_stride = (long long)p.kv.num_kv_heads * D;  // elements per token
  if (pos < t.prefix) {
    const int shift = __ffs(p.kv.block_size) - 1;
    const long long block =
        p.kv.block_table[(long long)t.seq * p.kv.max_blocks_per_seq + (pos >> shift)];
    const long long offset =
        ((block * p.kv.block_size + (pos & (p.kv.block_size - 1))) * row_stride + t.kv_head * D) * Kv::kBytes;
    return {reinterpret_cast<const unsigned char*>(p.kv.key_cache) + offset,
            reinterpret_cast<const unsigned char*>(p.kv.value_cache) + offset, !Kv::kIsBf16};
  }
  const long long offset = (long long)(t.q_begin - t.prefix + pos) * row_stride + t.kv_head * D;
  return {reinterpret_cast<const unsigned char*>(p.key + offset), reinterpret_cast<const unsigned char*>(p.value + offset),
          false};
}

// ---- Cached rows of an e4m3 cache ------------------------------------------------------------
//
// The tiles in shared memory are bf16 whatever the cache holds: a cached e4m3 chunk (8 values, 8
// bytes) is read into registers, multiplied by its KV head's scale in fp32 and rounded to bf16
// once, and stored where a copied bf16 chunk would land. The portable kernel loads it from global
// memory itself; the Hopper producer copies it into the first half of that 16-byte slot
// asynchronously and expands it in place (expand_e4m3_slot) once its copies have landed.
__device__ __forceinline__ uint2 load_e4m3_chunk(const unsigned char* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ void store_e4m3_chunk_as_bf16(unsigned smem, uint2 raw, float scale) {
  float f[8];
  to_float8(KvFp8::decode8(raw), f);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] *= scale;
  const Bf16x8 v = from_float8(f);
  unsigned w[4];
  memcpy(w, &v, 16);
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};" ::"r"(smem), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

// The e4m3 chunk in the first 8 bytes of a 16-byte shared-memory slot, as bf16 in the whole slot.
// The caller's own copy into it has landed (cp_async_wait_all).
__device__ __forceinline__ void expand_e4m3_slot(unsigned smem, float scale) {
  uint2 raw;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(raw.x), "=r"(raw.y) : "r"(smem) : "memory");
  store_e4m3_chunk_as_bf16(smem, raw, scale);
}

}  // namespace asynct::kernels::prefill
