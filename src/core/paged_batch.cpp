#include "core/paged_batch.h"

#include "core/error.h"

namespace asynct {

void check_paged_batch(const PagedBatch& b, const char* who) {
  check(b.num_seqs >= 1, who, ": no sequences");
  check(b.kv_lens && b.block_table, who, ": null kv_lens or block_table");
  check(b.max_blocks_per_seq >= 1 && b.num_blocks >= 1, who, ": empty block table or cache");
  check(b.block_size >= 1, who, ": block_size must be positive, got ", b.block_size);
  const std::int64_t row_capacity = std::int64_t(b.max_blocks_per_seq) * b.block_size;
  check(b.max_kv_len >= 1 && b.max_kv_len <= row_capacity, who, ": max_kv_len ", b.max_kv_len, " outside 1..",
        row_capacity, " (what a block-table row addresses)");
  for (int s = 0; s < b.num_seqs; ++s) {
    const std::int32_t kv_len = b.kv_lens[s];
    check(kv_len >= 1 && kv_len <= b.max_kv_len, who, ": sequence ", s, " has kv_len ", kv_len, ", outside 1..",
          b.max_kv_len, " (max_kv_len)");
    const std::int32_t* row = b.block_table + std::int64_t(s) * b.max_blocks_per_seq;
    const int used = int((std::int64_t(kv_len) + b.block_size - 1) / b.block_size);
    for (int i = 0; i < used; ++i)
      check(row[i] >= 0 && row[i] < b.num_blocks, who, ": block_table[", s, "][", i, "] = ", row[i],
            " is not a block of the cache (", b.num_blocks, " blocks)");
  }
  if (b.cu_seqlens_q == nullptr) return;
  check(b.cu_seqlens_q[0] == 0, who, ": cu_seqlens_q must start at 0, got ", b.cu_seqlens_q[0]);
  for (int s = 0; s < b.num_seqs; ++s) {
    const std::int64_t q_len = std::int64_t(b.cu_seqlens_q[s + 1]) - b.cu_seqlens_q[s];
    check(q_len >= 0, who, ": cu_seqlens_q decreases at sequence ", s);
    check(q_len <= b.max_q_len, who, ": sequence ", s, " has ", q_len, " new tokens, above max_q_len ", b.max_q_len);
    check(q_len <= b.kv_lens[s], who, ": sequence ", s, " has ", q_len, " new tokens but kv_len ", b.kv_lens[s],
          " (the new tokens are part of it)");
  }
  check(b.cu_seqlens_q[b.num_seqs] == b.total_q, who, ": cu_seqlens_q ends at ", b.cu_seqlens_q[b.num_seqs],
        ", not at the ", b.total_q, " query rows");
}

}  // namespace asynct
