#include "models/cuda/device_kv_cache.h"

#include "core/error.h"
#include "kernels/common/cuda_check.h"

namespace asynct {

void DeviceKvCache::check_supported(const ModelConfig& c, KvCacheDtype dtype) {
  check(dtype == KvCacheDtype::BF16 || dtype == KvCacheDtype::Fp8E4M3, "CudaModelRunner: a ",
        kv_cache_dtype_name(dtype), " KV cache (the CUDA backend's is bf16 or fp8)");
  check(dtype != KvCacheDtype::Fp8E4M3 || c.head_dim == 64 || c.head_dim == 128,
        "--kv-cache-dtype fp8: the CUDA attention kernels read an FP8 cache at head_dim 64 and 128; this model's is ",
        c.head_dim, " (use --kv-cache-dtype bf16)");
}

DeviceKvCache::DeviceKvCache(const ModelConfig& c, KvCacheDtype dtype, const KvCacheScales& scales, int num_blocks,
                             int block_size, cudaStream_t stream)
    : element_(dtype == KvCacheDtype::Fp8E4M3 ? kernels::KvElement::Fp8E4M3 : kernels::KvElement::Bf16),
      num_blocks_(num_blocks), block_size_(block_size), num_kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  check_supported(c, dtype);
  const bool e4m3 = element_ == kernels::KvElement::Fp8E4M3;
  block_bytes_ = std::size_t(block_size) * std::size_t(num_kv_heads_) * std::size_t(head_dim_) * (e4m3 ? 1 : 2);
  const std::size_t heads = std::size_t(num_kv_heads_);
  if (e4m3)
    check(scales.num_kv_heads == num_kv_heads_ && scales.key.size() == heads * std::size_t(c.num_hidden_layers) &&
              scales.value.size() == scales.key.size(),
          "CudaModelRunner: FP8 KV-cache scales for ", scales.num_kv_heads, " KV heads and ", scales.key.size(),
          " values; the model has ", c.num_hidden_layers, " layers of ", num_kv_heads_);
  layers_.resize(std::size_t(c.num_hidden_layers));
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    layer.key.resize(block_bytes_ * std::size_t(num_blocks));
    layer.value.resize(block_bytes_ * std::size_t(num_blocks));
    if (e4m3) {
      layer.key_scales.upload(scales.key.data() + l * heads, heads, stream);
      layer.value_scales.upload(scales.value.data() + l * heads, heads, stream);
    }
  }
  ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream));  // the scales' host memory is the caller's
}

kernels::PagedKv DeviceKvCache::paged(int layer, const std::int32_t* block_table, int max_blocks) const {
  const Layer& l = layers_[std::size_t(layer)];
  kernels::PagedKv kv;
  kv.key_cache = reinterpret_cast<kernels::bf16*>(l.key.get());
  kv.value_cache = reinterpret_cast<kernels::bf16*>(l.value.get());
  kv.element = element_;
  kv.key_scales = l.key_scales.get();
  kv.value_scales = l.value_scales.get();
  kv.block_table = block_table;
  kv.max_blocks_per_seq = max_blocks;
  kv.num_blocks = num_blocks_;
  kv.block_size = block_size_;
  kv.num_kv_heads = num_kv_heads_;
  kv.head_dim = head_dim_;
  return kv;
}

void DeviceKvCache::copy_blocks(const std::vector<BlockCopy>& copies, cudaStream_t stream) {
  for (const BlockCopy& copy : copies)
    for (Layer& layer : layers_)
      for (std::uint8_t* cache : {layer.key.get(), layer.value.get()})
        ASYNCT_CUDA_CHECK(cudaMemcpyAsync(cache + std::size_t(copy.to) * block_bytes_,
                                          cache + std::size_t(copy.from) * block_bytes_, block_bytes_,
                                          cudaMemcpyDeviceToDevice, stream));
}

}  // namespace asynct
