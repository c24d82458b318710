// The decode kernel's projection of the new token (decode.cu, DecodeProjection in decode.h): q/k
// RMSNorm and RoPE of the sequence's newest token from the qkv projection, and its K/V write
// into the paged cache.
#pragma once

#include <cstdint>

#include "kernels/attention/decode/traits.cuh"
#include "kernels/common/bf16.cuh"
#include "kernels/norms/head_norm_rope.cuh"

namespace asynct::kernels::decode {

// With the projection (decode.h): this lane's 8 values of each of the warp's query heads, normed
// and rotated, from the sequence's projection row; and, when the CTA holds the sequence's newest
// key (`writes_newest`), that key and its value for the warp's KV head, written into the cache
// for later steps and for the V gathers (which the consumer orders after these writes when it
// reaches the newest key's tile), and returned (this lane's 8 values as stored) for the consumer
// to use in place of the stage's copy of that row, which the producer may have copied before the
// write. The warp computes kGroup heads of which the first kHeads exist (see decode_stage1): a padding head loads the last real head's row (any readable row would do)
// and its q is zero.
template <int kHeadDim, int kGroup, int kHeads, typename Kv>
__device__ void project_new_token(const Stage1Args& a, int seq, int kv_head, bool writes_newest,
                                  float (&q)[kGroup][8], typename Kv::Raw& newest_k, typename Kv::Raw& newest_v) {
  using L = Layout<kHeadDim, kGroup, Kv>;
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
  for (int h = 0; h < kGroup; ++h) at[h] = row + std::int64_t(kv_head * kHeads + (h < kHeads ? h : kHeads - 1)) * kHeadDim;
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
    for (int e = 0; e < 8; ++e) q[h][e] = h < kHeads ? x[h][e] : 0.0f;
  }
  if (!writes_newest) return;
  head_norm8<kHeadDim>(x[kKey], pr.k_weight + 8 * slice, pr.norm.eps, pr.norm.clip);
  head_rope8<kHeadDim>(x[kKey], slice, rotation);
  // The value rounded to bf16 first, as the dense product's output would be.
  float value[8];
  to_float8(from_float8(x[kValue]), value);
  const float key_scale = Kv::kIsBf16 ? 1.0f : a.p.kv.key_scales[kv_head];
  const float value_scale = Kv::kIsBf16 ? 1.0f : a.p.kv.value_scales[kv_head];
  newest_k = Kv::encode8(x[kKey], key_scale);
  newest_v = Kv::encode8(value, value_scale);
  const std::int64_t slot = pr.slot_mapping[seq];
  if (lane < L::kLanesPerKey && slot >= 0) {
    const std::int64_t offset = ((slot * hkv + kv_head) * kHeadDim + 8 * slice) * Kv::kBytes;
    *reinterpret_cast<typename Kv::Raw*>(reinterpret_cast<unsigned char*>(a.p.kv.key_cache) + offset) = newest_k;
    *reinterpret_cast<typename Kv::Raw*>(reinterpret_cast<unsigned char*>(a.p.kv.value_cache) + offset) = newest_v;
  }
}
}  // namespace asynct::kernels::decode
