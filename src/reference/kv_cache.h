// Where the reference reads K and V from: per-sequence contiguous arrays, or the paged cache
// of docs/DESIGN.md §3 ([num_blocks, block_size, num_kv_heads, head_dim] plus a block table).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace asynct {

class KvCache {
 public:
  // key, value: float32 [total_kv, Hkv, D]; sequence s owns rows cu_seqlens_k[s] .. [s+1].
  static KvCache contiguous(Tensor key, Tensor value, std::vector<int> cu_seqlens_k);
  // key_cache, value_cache: float32 [num_blocks, block_size, Hkv, D];
  // block_table: int32 [num_seqs, max_blocks_per_seq]; token t of sequence s lives in
  // physical block block_table[s][t / block_size], slot t % block_size.
  static KvCache paged(Tensor key_cache, Tensor value_cache, Tensor block_table);

  int num_seqs() const { return num_seqs_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  bool is_paged() const { return paged_; }
  int block_size() const { return block_size_; }
  // The most tokens sequence `seq` can hold.
  int capacity(int seq) const;

  const float* key(int seq, int pos, int kv_head) const { return row(key_, seq, pos, kv_head); }
  const float* value(int seq, int pos, int kv_head) const { return row(value_, seq, pos, kv_head); }

 private:
  const float* row(const Tensor& t, int seq, int pos, int kv_head) const;

  bool paged_ = false;
  Tensor key_, value_, block_table_;
  std::vector<int> cu_seqlens_k_;
  int num_seqs_ = 0, num_kv_heads_ = 0, head_dim_ = 0, block_size_ = 0, num_blocks_ = 0;
  int max_blocks_per_seq_ = 0;
};

}  // namespace asynct
