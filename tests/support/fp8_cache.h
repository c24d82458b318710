// An FP8 (e4m3) paged cache for the attention kernels' tests: per-KV-head scales that put a
// tensor's largest finite |value| at 224 (half of e4m3's 448: rows written later may be larger),
// the bytes e4m3(value / scale), and the values those bytes hold (what the reference reads).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/fp8.h"
#include "core/tensor.h"
#include "support/attention_case.h"

namespace asynct::testing {

// A value as the e4m3 cache holds it at `scale`.
inline float e4m3_at(float value, float scale) { return fp8_e4m3_to_float(float_to_fp8_e4m3(value / scale)) * scale; }

// The KV head of element i of a [..., heads, head_dim] tensor.
inline std::size_t head_of(std::int64_t i, int heads, int head_dim) { return std::size_t(i / head_dim % heads); }

// Scales of a float32 [..., heads, head_dim] tensor: its largest finite |value| a head at 224
// (1 for a head of zeros).
inline std::vector<float> fp8_scales_at_224(const Tensor& values, int heads, int head_dim) {
  std::vector<float> scales(std::size_t(heads), 0.0f);
  const float* v = values.data_as<float>();
  for (std::int64_t i = 0; i < values.numel(); ++i)
    if (std::isfinite(v[i])) scales[head_of(i, heads, head_dim)] = std::max(scales[head_of(i, heads, head_dim)], std::fabs(v[i]));
  for (float& s : scales) s = s > 0.0f ? s / 224.0f : 1.0f;
  return scales;
}

// The e4m3 bytes of a float32 [..., heads, head_dim] tensor at its heads' scales (NaN stays NaN).
inline Tensor e4m3_bytes(const Tensor& values, const std::vector<float>& scales, int head_dim) {
  const int heads = int(scales.size());
  Tensor bytes = Tensor::empty(DType::U8, values.shape());
  for (std::int64_t i = 0; i < values.numel(); ++i)
    bytes.data_as<std::uint8_t>()[i] = float_to_fp8_e4m3(values.data_as<float>()[i] / scales[head_of(i, heads, head_dim)]);
  return bytes;
}

// An e4m3 cache downloaded: each byte's value times its KV head's scale.
inline Tensor decode_fp8(const Tensor& bytes, const std::vector<float>& scales, int head_dim) {
  Tensor out = Tensor::empty(DType::F32, bytes.shape());
  const int heads = int(scales.size());
  for (std::int64_t i = 0; i < bytes.numel(); ++i)
    out.data_as<float>()[i] = fp8_e4m3_to_float(bytes.data_as<std::uint8_t>()[i]) * scales[head_of(i, heads, head_dim)];
  return out;
}

struct Fp8Cache {
  std::vector<float> key_scales, value_scales;
  Tensor key_bytes, value_bytes;  // U8, the cache's shape
};

// The FP8 form of a paged cache, its scales from its own values; the paged cache's floats become
// what the bytes hold (the reference's cache).
inline Fp8Cache to_fp8(AttentionCase::Paged& paged, int num_kv_heads, int head_dim) {
  Fp8Cache f;
  paged.key_cache = paged.key_cache.to(DType::F32);
  paged.value_cache = paged.value_cache.to(DType::F32);
  f.key_scales = fp8_scales_at_224(paged.key_cache, num_kv_heads, head_dim);
  f.value_scales = fp8_scales_at_224(paged.value_cache, num_kv_heads, head_dim);
  f.key_bytes = e4m3_bytes(paged.key_cache, f.key_scales, head_dim);
  f.value_bytes = e4m3_bytes(paged.value_cache, f.value_scales, head_dim);
  paged.key_cache = decode_fp8(f.key_bytes, f.key_scales, head_dim);
  paged.value_cache = decode_fp8(f.value_bytes, f.value_scales, head_dim);
  paged.cache = KvCache::paged(paged.key_cache, paged.value_cache, paged.block_table);
  return f;
}

// Two e4m3 caches' bytes equal, or neighbours (one step apart, the same sign: a value at a
// rounding tie that float division on another processor put on the other side).
inline ::testing::AssertionResult same_e4m3_within_a_step(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* a = got.data_as<std::uint8_t>();
  const auto* b = want.data_as<std::uint8_t>();
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const bool neighbours = (a[i] & 0x80) == (b[i] & 0x80) && std::abs(int(a[i] & 0x7f) - int(b[i] & 0x7f)) <= 1 &&
                            (a[i] & 0x7f) != 0x7f && (b[i] & 0x7f) != 0x7f;
    if (a[i] != b[i] && !neighbours && bad++ == 0) first = i;
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << got.numel() << " cache bytes differ, the first at " << first
                                         << " (got 0x" << std::hex << int(a[first]) << ", want 0x" << int(b[first]) << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace asynct::testing
