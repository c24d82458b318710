#include "models/cpu_fast/kv_cache.h"

#include <algorithm>

#include "core/error.h"
#include "models/cpu_fast/kernels.h"

namespace asynct::cpu_fast {

KvCache::KvCache(const ModelConfig& c, int num_blocks, int block_size, KvCacheDtype dtype, const KvCacheScales& scales)
    : dtype_(dtype), num_blocks_(num_blocks), block_size_(block_size), num_kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      values_per_block_(std::size_t(block_size) * std::size_t(c.num_key_value_heads) * std::size_t(c.head_dim)) {
  check(dtype == KvCacheDtype::BF16 || dtype == KvCacheDtype::Fp8E4M3, "CpuFastModelRunner: a ",
        kv_cache_dtype_name(dtype), " KV cache; the production CPU backend holds bf16 or fp8");
  const std::size_t values = std::size_t(num_blocks) * values_per_block_;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer layer;
    if (dtype == KvCacheDtype::Fp8E4M3) {
      layer.key_fp8 = std::make_unique_for_overwrite<std::uint8_t[]>(values);
      layer.value_fp8 = std::make_unique_for_overwrite<std::uint8_t[]>(values);
      for (int head = 0; head < num_kv_heads_; ++head) {
        layer.key_scales.push_back(scales.key_scale(l, head));
        layer.value_scales.push_back(scales.value_scale(l, head));
      }
    } else {
      layer.key = std::make_unique_for_overwrite<std::uint16_t[]>(values);
      layer.value = std::make_unique_for_overwrite<std::uint16_t[]>(values);
    }
    layers_.push_back(std::move(layer));
  }
}

std::size_t KvCache::bytes_per_block() const {
  const std::size_t element = dtype_ == KvCacheDtype::Fp8E4M3 ? 1 : 2;
  return 2 * layers_.size() * values_per_block_ * element;
}

void KvCache::write(int layer, std::int64_t slot, const float* key, const float* value) {
  Layer& l = layers_[std::size_t(layer)];
  const std::int64_t row = std::int64_t(num_kv_heads_) * head_dim_, at = slot * row;
  if (dtype_ == KvCacheDtype::BF16) {
    float_to_bf16_row(key, l.key.get() + at, int(row));
    float_to_bf16_row(value, l.value.get() + at, int(row));
    return;
  }
  for (int head = 0; head < num_kv_heads_; ++head) {
    const std::int64_t o = std::int64_t(head) * head_dim_;
    float_to_fp8_row(key + o, l.key_scales[std::size_t(head)], l.key_fp8.get() + at + o, head_dim_);
    float_to_fp8_row(value + o, l.value_scales[std::size_t(head)], l.value_fp8.get() + at + o, head_dim_);
  }
}

PagedKv KvCache::paged(int layer) const {
  const Layer& l = layers_[std::size_t(layer)];
  return {l.key.get(), l.value.get(), l.key_fp8.get(), l.value_fp8.get(), l.key_scales.data(), l.value_scales.data(),
          block_size_, num_kv_heads_, head_dim_};
}

void KvCache::copy_blocks(const std::vector<BlockCopy>& copies) {
  for (const BlockCopy& copy : copies)
    check(copy.from >= 0 && copy.from < num_blocks_ && copy.to >= 0 && copy.to < num_blocks_ && copy.from != copy.to,
          "copy_blocks: block ", copy.from, " to ", copy.to, " (the cache has ", num_blocks_, ")");
  const auto copy_in = [&](auto* cache, const BlockCopy& copy) {
    if (cache)
      std::copy_n(cache + std::size_t(copy.from) * values_per_block_, values_per_block_,
                  cache + std::size_t(copy.to) * values_per_block_);
  };
  for (const BlockCopy& copy : copies)
    for (Layer& l : layers_) {
      copy_in(l.key.get(), copy);
      copy_in(l.value.get(), copy);
      copy_in(l.key_fp8.get(), copy);
      copy_in(l.value_fp8.get(), copy);
    }
}

}  // namespace asynct::cpu_fast
