// What a prefill tile leaves besides its output: the new tokens' K/V rows, written into the
// paged cache from the staged tiles by either kernel.
#pragma once

#include <cstdint>

#include "kernels/attention/kv_element.cuh"
#include "kernels/attention/prefill/mainloop.cuh"
#include "kernels/attention/prefill/traits.cuh"

namespace asynct::kernels::prefill {

// ---- The cache write -----------------------------------------------------------------------

// Copies the tile's rows that are this CTA's new tokens (positions [prefix + m0, kv_end)) from
// the staged K/V tiles into the paged cache. They pass through shared memory anyway, so the
// write costs no global loads; stores do not stall the warp. The kernel's tile shape: kBlockN
// keys, kThreads threads; layout(row, chunk) is the element offset of 16-byte chunk `chunk` of
// shared-memory row `row` (which holds key key_of_column(row), see the key order above). Kv: the
// cache's element type (attention/kv_element.cuh; e4m3 at the KV head's scales).
template <int D, int kBlockN, int kThreads, class Kv, class Layout>
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
  const float key_scale = Kv::kIsBf16 ? 1.0f : p.kv.key_scales[t.kv_head];
  const float value_scale = Kv::kIsBf16 ? 1.0f : p.kv.value_scales[t.kv_head];
  auto* key_cache = reinterpret_cast<unsigned char*>(p.kv.key_cache);
  auto* value_cache = reinterpret_cast<unsigned char*>(p.kv.value_cache);
  for (int idx = first * kChunks + threadIdx.x; idx < last * kChunks; idx += kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    const int pos = key0 + row;
    const long long block = table[pos >> shift];
    const long long dst =
        ((block * p.kv.block_size + (pos & (p.kv.block_size - 1))) * hkv + t.kv_head) * D +
        chunk * 8;
    const int at = layout(column_of_key<kBlockN / 8>(row), chunk);  // (the key order)
    if constexpr (Kv::kIsBf16) {
      store_bf16x8(p.kv.key_cache + dst, load_bf16x8(k_tile + at));
      store_bf16x8(p.kv.value_cache + dst, load_bf16x8(v_tile + at));
    } else {
      float k[8], v[8];
      to_float8(load_bf16x8(k_tile + at), k);
      to_float8(load_bf16x8(v_tile + at), v);
      *reinterpret_cast<typename Kv::Raw*>(key_cache + dst) = Kv::encode8(k, key_scale);
      *reinterpret_cast<typename Kv::Raw*>(value_cache + dst) = Kv::encode8(v, value_scale);
    }
  }
}
}  // namespace asynct::kernels::prefill
