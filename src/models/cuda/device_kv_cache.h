// The CUDA runner's paged KV cache as one type: every layer's keys and values in one element
// type (bf16, or e4m3 at per-KV-head scales: models/kv_cache_format.h states the rule), as the
// attention kernels and the cache writers take it (kernels::PagedKv), and whole-block copies
// (prefix caching's copy-on-write, forks) over every layer at once.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "engine/model_runner.h"  // BlockCopy
#include "kernels/attention/attention_args.h"
#include "kernels/common/cuda_array.h"
#include "models/config.h"
#include "models/kv_cache_format.h"

namespace asynct {

class DeviceKvCache {
 public:
  // Throws Error unless the CUDA backend keeps a cache of this type for this model: bf16, or e4m3
  // at a head size the attention kernels read it at (64 and 128).
  static void check_supported(const ModelConfig& config, KvCacheDtype dtype);

  // Allocates num_blocks blocks of block_size tokens a layer and uploads the scales (e4m3), after
  // check_supported.
  DeviceKvCache(const ModelConfig& config, KvCacheDtype dtype, const KvCacheScales& scales, int num_blocks,
                int block_size, cudaStream_t stream);

  // Layer `layer`'s cache through a block table of max_blocks entries a sequence.
  kernels::PagedKv paged(int layer, const std::int32_t* block_table, int max_blocks) const;
  // Copies whole blocks (every layer's keys and values), queued on `stream`. The copies are
  // checked by the caller (CudaModelRunner::copy_blocks).
  void copy_blocks(const std::vector<BlockCopy>& copies, cudaStream_t stream);

  kernels::KvElement element() const { return element_; }
  // Bytes of one block of one layer's keys (or values).
  std::size_t block_bytes() const { return block_bytes_; }

 private:
  struct Layer {
    kernels::DeviceArray<std::uint8_t> key, value;          // [num_blocks, block_size, Hkv, D]
    kernels::DeviceArray<float> key_scales, value_scales;  // [Hkv], e4m3 only
  };
  std::vector<Layer> layers_;
  kernels::KvElement element_;
  int num_blocks_, block_size_, num_kv_heads_, head_dim_;
  std::size_t block_bytes_;
};

}  // namespace asynct
