// One step's batch as the engine hands it to a runner, and the checks every runner makes
// before it runs one: the batch against the cache and the model (check_step_batch), and the
// cache's block size against what the backend can run (check_block_size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace asynct {

// One step's batch, all sequences' new tokens flattened in sequence order.
struct StepBatch {
  std::vector<std::int32_t> tokens;      // [T] token ids
  std::vector<std::int64_t> positions;   // [T] absolute positions
  std::vector<int> cu_seqlens_q;         // [S + 1]
  std::vector<int> kv_lens;              // [S] tokens in the cache after this step
  std::vector<std::vector<int>> block_tables;  // [S] physical blocks of each sequence
  std::vector<std::int64_t> slot_mapping;      // [T] cache slot of each new token
  std::vector<int> logit_rows;           // flattened rows whose next-token logits are wanted
  // [logit_rows.size()] non-zero where the engine reads that row's full logits (sampling with
  // a temperature, or recording them); every other row only needs its greedy token, which a
  // backend can find without moving the vocabulary-wide row anywhere.
  std::vector<std::uint8_t> full_logits;
  // Empty, or [T]: token i is the greedy token of row tokens_from_rows[i] of the step submitted
  // just before this one, found by the runner where that step ran (`tokens` then holds
  // placeholders). This is how a step is queued before the host has read the tokens it
  // continues from (ModelRunner::pipelines_steps).
  std::vector<int> tokens_from_rows;

  int num_seqs() const { return int(kv_lens.size()); }
  int num_tokens() const { return int(tokens.size()); }
  // Empties it for `seqs` sequences (one block table each), keeping every vector's capacity.
  void reset(std::size_t seqs) {
    tokens.clear();
    positions.clear();
    slot_mapping.clear();
    kv_lens.clear();
    logit_rows.clear();
    full_logits.clear();
    tokens_from_rows.clear();
    cu_seqlens_q.assign(1, 0);
    block_tables.resize(seqs);
  }
};

// What a batch must fit: the runner's paged cache and its model.
struct StepBounds {
  int num_blocks = 0;
  int block_size = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;  // positions run 0 .. this - 1
  // Rows the step submitted just before sampled (what tokens_from_rows may name); 0 when none.
  int previous_rows = 0;
};

// Throws Error naming the first problem: an empty batch; vectors of the wrong lengths;
// tokens_from_rows naming rows the step before did not sample; cu_seqlens_q not running from 0
// to T; a sequence with no new token, more new tokens than its kv_len, or a kv_len its blocks
// cannot hold; a block not in the cache; a token id outside the vocabulary; a position outside
// 0 .. max_position_embeddings - 1; a slot outside the cache; a logit row outside 0 .. T - 1.
// Both runners call it before a step touches anything, so a bad batch changes no state.
void check_step_batch(const StepBatch& batch, const StepBounds& bounds);

enum class Backend { Cpu, Cuda };

// The block sizes a backend runs: the CPU runner any in 1..4096; the CUDA runner a power of two
// in 16..256 (the attention kernels' tiles hold whole blocks). Throws Error otherwise. Each
// runner's constructor calls it before allocating anything.
void check_block_size(int block_size, Backend backend);

}  // namespace asynct
