// One step's batch as the engine hands it to a runner, and the checks every runner makes
// before it runs one: the batch against the cache and the model (check_step_batch), and the
// cache's block size against what the backend can run (check_block_size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/sampling_params.h"

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
  // [logit_rows.size()] how each row draws its token. The runner samples every row itself
  // (StepOutput::summaries[row].token).
  std::vector<RowSampling> sampling;
  // The distinct tokens of each penalised row's sequence EXCEPT its newest token (the row's
  // input token, which the runner adds itself: in a chained step it is not on the host yet),
  // row r's in [sampling[r].penalty_begin, penalty_end). Empty ranges for rows without penalties.
  std::vector<PenaltyToken> penalty_tokens;
  // Each biased row's logit bias (its request's), row r's in [sampling[r].bias_begin, bias_end).
  std::vector<LogitBias> logit_bias;
  // The allowed-token bitmasks of constrained rows (engine/token_constraint.h), (vocab + 31) / 32
  // words each, row r's from word sampling[r].mask_offset (when >= 0).
  std::vector<std::uint32_t> token_masks;
  // token_masks is sized but its masks are not yet known: the runner starts the step and samples
  // it once ModelRunner::supply_masks hands it this batch with them filled.
  bool masks_later = false;
  // [logit_rows.size()] non-zero where the engine reads that row's full logits (recording them:
  // EngineOptions::record_first_logits); every other row's logits may stay where they were
  // computed.
  std::vector<std::uint8_t> full_logits;
  // Empty, or [T]: token i is the token (summaries[row].token, greedy or drawn) of row
  // tokens_from_rows[i] of the step submitted just before this one, found by the runner where
  // that step ran (`tokens` then holds placeholders). This is how a step is queued before the
  // host has read the tokens it continues from (ModelRunner::pipelines_steps).
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
    sampling.clear();
    penalty_tokens.clear();
    logit_bias.clear();
    token_masks.clear();
    masks_later = false;
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
// 0 .. max_position_embeddings - 1; a slot outside the cache; a logit row outside 0 .. T - 1;
// sampling not one per logit row, a row's parameters out of range (validate_sampling), its
// penalty range outside penalty_tokens, a penalty token outside the vocabulary or with a
// negative count, its bias range outside logit_bias or a bias entry out of range
// (validate_logit_bias), its mask outside token_masks.
// Both runners call it before a step touches anything, so a bad batch changes no state.
void check_step_batch(const StepBatch& batch, const StepBounds& bounds);

enum class Backend { Cpu, Cuda };

// The block sizes a backend runs: the CPU runner any in 1..4096; the CUDA runner a power of two
// in 16..256 (the attention kernels' tiles hold whole blocks). Throws Error otherwise. Each
// runner's constructor calls it before allocating anything.
void check_block_size(int block_size, Backend backend);

}  // namespace asynct
