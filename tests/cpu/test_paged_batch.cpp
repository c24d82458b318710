// check_paged_batch: a valid decode and prefill batch pass; each way the metadata can be wrong
// is an error that names the sequence and the value.
#include <gtest/gtest.h>

#include <vector>

#include "core/paged_batch.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

// Three sequences in a cache of 6 blocks of 16 tokens, rows of 3 blocks; entries a sequence does
// not use are -1 (never read). Sequence 2 is prefilled with 5 new tokens after 12 cached ones.
struct Batch {
  std::vector<std::int32_t> kv_lens{1, 33, 17};
  std::vector<std::int32_t> table{4, -1, -1, 0, 5, 2, 3, 1, -1};
  std::vector<std::int32_t> cu_seqlens_q{0, 1, 2, 7};
  PagedBatch view(bool prefill) {
    PagedBatch b;
    b.num_seqs = 3;
    b.kv_lens = kv_lens.data();
    b.max_kv_len = 40;
    b.block_table = table.data();
    b.max_blocks_per_seq = 3;
    b.num_blocks = 6;
    b.block_size = 16;
    if (prefill) {
      b.cu_seqlens_q = cu_seqlens_q.data();
      b.total_q = 7;
      b.max_q_len = 5;
    }
    return b;
  }
};

TEST(PagedBatch, AcceptsAValidDecodeAndPrefillBatch) {
  Batch batch;
  EXPECT_NO_THROW(check_paged_batch(batch.view(false), "decode"));
  EXPECT_NO_THROW(check_paged_batch(batch.view(true), "prefill"));
}

TEST(PagedBatch, RejectsBadLengths) {
  Batch batch;
  batch.kv_lens[1] = 0;
  expect_error([&] { check_paged_batch(batch.view(false), "decode"); }, "sequence 1 has kv_len 0");
  batch.kv_lens[1] = 41;
  expect_error([&] { check_paged_batch(batch.view(false), "decode"); }, "sequence 1 has kv_len 41, outside 1..40");
  batch = Batch{};
  PagedBatch b = batch.view(false);
  b.max_kv_len = 49;  // 3 blocks of 16 address 48 tokens
  expect_error([&] { check_paged_batch(b, "decode"); }, "max_kv_len 49 outside 1..48");
  b.num_seqs = 0;
  expect_error([&] { check_paged_batch(b, "decode"); }, "no sequences");
}

TEST(PagedBatch, RejectsBlocksOutsideTheCache) {
  Batch batch;
  batch.table[4] = 6;  // sequence 1, its second block
  expect_error([&] { check_paged_batch(batch.view(false), "decode"); }, "block_table[1][1] = 6 is not a block");
  batch.table[4] = -1;
  expect_error([&] { check_paged_batch(batch.view(false), "decode"); }, "block_table[1][1] = -1");
  batch = Batch{};
  batch.table[2] = 99;  // sequence 0 uses one block: the rest of its row is not read
  EXPECT_NO_THROW(check_paged_batch(batch.view(false), "decode"));
}

TEST(PagedBatch, RejectsBadQueryOffsets) {
  Batch batch;
  batch.cu_seqlens_q = {1, 1, 2, 7};
  expect_error([&] { check_paged_batch(batch.view(true), "prefill"); }, "must start at 0");
  batch.cu_seqlens_q = {0, 1, 0, 7};
  expect_error([&] { check_paged_batch(batch.view(true), "prefill"); }, "decreases at sequence 1");
  batch.cu_seqlens_q = {0, 1, 2, 8};
  expect_error([&] { check_paged_batch(batch.view(true), "prefill"); }, "6 new tokens, above max_q_len 5");
  batch = Batch{};
  batch.cu_seqlens_q = {0, 2, 3, 8};
  PagedBatch b = batch.view(true);
  b.total_q = 8;
  expect_error([&] { check_paged_batch(b, "prefill"); }, "sequence 0 has 2 new tokens but kv_len 1");
  batch = Batch{};
  b = batch.view(true);
  b.total_q = 9;
  expect_error([&] { check_paged_batch(b, "prefill"); }, "ends at 7, not at the 9 query rows");
}

}  // namespace
}  // namespace asynct
