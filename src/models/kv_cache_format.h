// The KV cache as a type: its element type, the FP8 scales, and the bytes a token takes. Both
// runners read it; the scales come with the weights (a checkpoint's k_scale / v_scale tensors)
// or from the bound rule below.
//
// FP8 (e4m3) stores a key value k of layer l and KV head h as e4m3(k / key_scale(l, h)) and reads
// it back times the scale; values past 448 scales saturate. Without checkpoint scales the scale is
// a bound that no value can exceed, divided by 448, computed from the weights alone (no pass over
// data, since every K and V is a norm's output through a fixed map):
//  - a norm's output is bounded by its weight times B: UClipNorm's clip c (AsyncT), or sqrt(n)
//    for RMSNorm over n values (|x_i| / rms(x) <= sqrt(n));
//  - keys after a per-head q/k norm (Qwen3, AsyncT): |k_i| <= B w_i before RoPE, and RoPE rotates
//    the pairs (i, i + D/2), so |k_i| <= B sqrt(w_i^2 + w_{i+D/2}^2) after it;
//  - values, and keys without a q/k norm (Llama): row r of the projection W of the input norm's
//    output x is bounded by B sum_j |W[r, j]| |w_j|; for keys, the RoPE pairs' norms of those.
// e4m3 keeps 3 mantissa bits from 448 down to 2^-6 (then subnormal to 2^-9): a bound k times a
// value's typical size keeps values down to ~1/(7k) of that size at full precision.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/config.h"

namespace asynct {

struct ModelWeights;

enum class KvCacheDtype { Float32, BF16, Fp8E4M3 };

// "float32", "bf16", "fp8".
const char* kv_cache_dtype_name(KvCacheDtype dtype);

// The backends, by the name these functions take: "cpu" (the production CPU backend: a bf16 or
// e4m3 cache), "cpu-reference" (the CPU reference: every value held as float32, rounded as the
// type rounds it), "cuda".
//
// --kv-cache-dtype: "auto" (the backend's compute precision: float32 on the CPU reference, bf16
// on the others), "bf16" or "fp8". Throws Error naming the option for another value. (The CUDA
// backend reads fp8 at head_dim 64 and 128: CudaModelRunner checks.)
KvCacheDtype resolve_kv_cache_dtype(const std::string& name, const std::string& backend);

// Bytes one value takes in a backend's cache: float32 on the CPU reference, the type itself on
// the others.
std::int64_t kv_cache_element_bytes(KvCacheDtype dtype, const std::string& backend);

// Bytes of KV cache one token takes: the keys and values of every layer.
std::int64_t kv_cache_bytes_per_token(const ModelConfig& config, KvCacheDtype dtype, const std::string& backend);

// FP8 scales, [layer][KV head] flattened; 1 for the other types.
struct KvCacheScales {
  int num_kv_heads = 0;
  std::vector<float> key, value;
  float key_scale(int layer, int head) const { return key[std::size_t(layer) * std::size_t(num_kv_heads) + std::size_t(head)]; }
  float value_scale(int layer, int head) const {
    return value[std::size_t(layer) * std::size_t(num_kv_heads) + std::size_t(head)];
  }
};

// The scales of an FP8 cache for these weights: the checkpoint's k_scale / v_scale where it has
// them (ModelWeights), else the bound rule above. All ones for bf16 and float32.
KvCacheScales kv_cache_scales(const ModelWeights& weights, KvCacheDtype dtype);

// A value as the cache stores it and reads it back: rounded to bf16, or to e4m3 at `scale`.
float round_to_kv_cache(float value, KvCacheDtype dtype, float scale);

}  // namespace asynct
