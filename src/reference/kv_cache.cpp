#include "reference/kv_cache.h"

namespace asynct {

KvCache KvCache::contiguous(Tensor key, Tensor value, std::vector<int> cu_seqlens_k) {
  expect_dtype(key, DType::F32, "KvCache: key");
  expect_shape(key, {any, any, any}, "KvCache: key");
  expect_shape(value, key.shape(), "KvCache: value");
  expect_dtype(value, DType::F32, "KvCache: value");
  check(cu_seqlens_k.size() >= 2 && cu_seqlens_k.front() == 0,
        "KvCache: cu_seqlens_k must start at 0 and name at least one sequence");
  for (std::size_t s = 1; s < cu_seqlens_k.size(); ++s)
    check(cu_seqlens_k[s] >= cu_seqlens_k[s - 1], "KvCache: cu_seqlens_k decreases at ", s);
  check(cu_seqlens_k.back() == key.size(0), "KvCache: cu_seqlens_k ends at ",
        cu_seqlens_k.back(), " but key has ", key.size(0), " rows");
  KvCache c;
  c.paged_ = false;
  c.num_seqs_ = int(cu_seqlens_k.size()) - 1;
  c.num_kv_heads_ = int(key.size(1));
  c.head_dim_ = int(key.size(2));
  c.key_ = std::move(key);
  c.value_ = std::move(value);
  c.cu_seqlens_k_ = std::move(cu_seqlens_k);
  return c;
}

KvCache KvCache::paged(Tensor key_cache, Tensor value_cache, Tensor block_table) {
  expect_dtype(key_cache, DType::F32, "KvCache: key_cache");
  expect_shape(key_cache, {any, any, any, any}, "KvCache: key_cache");
  expect_shape(value_cache, key_cache.shape(), "KvCache: value_cache");
  expect_dtype(value_cache, DType::F32, "KvCache: value_cache");
  expect_dtype(block_table, DType::I32, "KvCache: block_table");
  expect_shape(block_table, {any, any}, "KvCache: block_table");
  check(key_cache.size(1) >= 1, "KvCache: block_size must be positive");
  KvCache c;
  c.paged_ = true;
  c.num_blocks_ = int(key_cache.size(0));
  c.block_size_ = int(key_cache.size(1));
  c.num_kv_heads_ = int(key_cache.size(2));
  c.head_dim_ = int(key_cache.size(3));
  c.num_seqs_ = int(block_table.size(0));
  c.max_blocks_per_seq_ = int(block_table.size(1));
  c.key_ = std::move(key_cache);
  c.value_ = std::move(value_cache);
  c.block_table_ = std::move(block_table);
  return c;
}

int KvCache::capacity(int seq) const {
  check(seq >= 0 && seq < num_seqs_, "KvCache: sequence ", seq, " out of range (", num_seqs_,
        " sequences)");
  if (paged_) return max_blocks_per_seq_ * block_size_;
  return cu_seqlens_k_[std::size_t(seq) + 1] - cu_seqlens_k_[std::size_t(seq)];
}

const float* KvCache::row(const Tensor& t, int seq, int pos, int kv_head) const {
  check(pos >= 0 && pos < capacity(seq), "KvCache: position ", pos, " out of range for sequence ",
        seq, " (capacity ", capacity(seq), ")");
  check(kv_head >= 0 && kv_head < num_kv_heads_, "KvCache: kv head ", kv_head, " out of range");
  std::int64_t token_row;
  if (paged_) {
    int logical_block = pos / block_size_;
    int physical = block_table_.data_as<std::int32_t>()[std::int64_t(seq) * max_blocks_per_seq_ +
                                                         logical_block];
    check(physical >= 0 && physical < num_blocks_, "KvCache: block_table[", seq, "][",
          logical_block, "] = ", physical, " is not a block of the cache (", num_blocks_,
          " blocks)");
    token_row = std::int64_t(physical) * block_size_ + pos % block_size_;
  } else {
    token_row = cu_seqlens_k_[std::size_t(seq)] + pos;
  }
  return t.data_as<float>() + (token_row * num_kv_heads_ + kv_head) * head_dim_;
}

}  // namespace asynct
