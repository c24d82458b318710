// The paged metadata of a batch (docs/DESIGN.md §3), checked on the host before kernels that read it on
// the device and trust it. The engine's runners check their StepBatch before a step
// (check_step_batch, engine/step_batch.h); callers of the kernels that bring their own (the
// C API, python/asynct) check it here first, so that a bad block table or length is an error that
// names the sequence and the value instead of an out-of-bounds read on the GPU.
#pragma once

#include <cstdint>

namespace asynct {

// Host copies of a batch's metadata and the cache geometry it must fit.
struct PagedBatch {
  int num_seqs = 0;
  const std::int32_t* kv_lens = nullptr;      // [num_seqs]
  int max_kv_len = 0;                         // the bound the caller promised the kernel
  const std::int32_t* block_table = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int num_blocks = 0;  // blocks in the cache
  int block_size = 0;
  // Prefill only (null for decode): [num_seqs + 1] offsets of each sequence's new tokens.
  const std::int32_t* cu_seqlens_q = nullptr;
  int total_q = 0, max_q_len = 0;
};

// Every kv_len in 1..max_kv_len and no longer than its block-table row addresses; every block a
// sequence uses (the first ceil(kv_len / block_size) of its row) a block of the cache; with
// cu_seqlens_q, offsets from 0 to total_q that never decrease and query lengths no longer than
// max_q_len or their sequence's kv_len. Throws asynct::Error naming `who` and what is wrong.
void check_paged_batch(const PagedBatch& batch, const char* who);

}  // namespace asynct
