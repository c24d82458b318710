// The production CPU runner's paged KV cache as one type: every layer's keys and values
// [num_blocks, block_size, num_kv_heads, head_dim], bf16 or e4m3 (value / scale, the scales per
// layer and KV head: models/kv_cache_format.h), owned by the runner rather than spread over its
// layers. It rounds a written row as its type stores it, gives the attention its view of a layer,
// and copies blocks of every layer in one call.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model_runner.h"  // BlockCopy
#include "models/config.h"
#include "models/cpu_fast/attention.h"
#include "models/kv_cache_format.h"

namespace asynct::cpu_fast {

class KvCache {
 public:
  // Throws Error for a type other than bf16 and fp8. The memory is not zeroed: a slot is read
  // only after it is written, and untouched pages cost nothing (a server's cache is sized for its
  // whole context; a short request touches a few blocks).
  KvCache(const ModelConfig& config, int num_blocks, int block_size, KvCacheDtype dtype, const KvCacheScales& scales);

  KvCacheDtype dtype() const { return dtype_; }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Bytes one block takes: the keys and values of every layer.
  std::size_t bytes_per_block() const;

  // Token slot `slot`'s keys and values at `layer` (num_kv_heads * head_dim floats each), as the
  // type stores them: bf16, or e4m3 at each KV head's scales.
  void write(int layer, std::int64_t slot, const float* key, const float* value);
  // The layer's cache as the attention reads it.
  PagedKv paged(int layer) const;
  // Every layer's blocks `from` into `to`; throws Error for a block outside the cache or a copy
  // onto itself (before copying any).
  void copy_blocks(const std::vector<BlockCopy>& copies);

 private:
  struct Layer {
    std::unique_ptr<std::uint16_t[]> key, value;      // bf16
    std::unique_ptr<std::uint8_t[]> key_fp8, value_fp8;  // e4m3
    std::vector<float> key_scales, value_scales;      // e4m3: [num_kv_heads]
  };
  KvCacheDtype dtype_;
  int num_blocks_, block_size_, num_kv_heads_, head_dim_;
  std::size_t values_per_block_;  // one layer's keys (or values) of a block
  std::vector<Layer> layers_;
};

}  // namespace asynct::cpu_fast
