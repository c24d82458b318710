#include "engine/step_batch.h"

#include <algorithm>

#include "core/error.h"

namespace asynct {

void check_step_batch(const StepBatch& b, const StepBounds& bounds) {
  const int t = b.num_tokens(), s = b.num_seqs();
  const std::size_t rows = b.logit_rows.size();
  check(t >= 1 && s >= 1, "forward: empty batch");
  check(int(b.positions.size()) == t && int(b.slot_mapping.size()) == t,
        "forward: positions and slot_mapping need one entry per token");
  check(int(b.cu_seqlens_q.size()) == s + 1, "forward: cu_seqlens_q needs one entry per sequence and one more");
  check(int(b.block_tables.size()) == s, "forward: one block table per sequence");
  check(b.full_logits.size() == rows, "forward: full_logits needs one flag per logit row");
  if (!b.tokens_from_rows.empty()) {
    check(int(b.tokens_from_rows.size()) == t, "submit: tokens_from_rows needs one row per token");
    for (std::size_t i = 0; i < b.tokens_from_rows.size(); ++i)
      check(b.tokens_from_rows[i] >= 0 && b.tokens_from_rows[i] < bounds.previous_rows, "submit: token ", i,
            " takes row ", b.tokens_from_rows[i], " of a step that sampled ", std::max(0, bounds.previous_rows),
            " rows");
  }
  check(b.cu_seqlens_q[0] == 0 && b.cu_seqlens_q[std::size_t(s)] == t, "forward: cu_seqlens_q must run from 0 to ", t);
  for (int i = 0; i < s; ++i) {
    const int q_len = b.cu_seqlens_q[std::size_t(i) + 1] - b.cu_seqlens_q[std::size_t(i)];
    const int kv_len = b.kv_lens[std::size_t(i)];
    check(q_len >= 1 && q_len <= kv_len, "forward: sequence ", i, " has q_len ", q_len, " and kv_len ", kv_len);
    const std::vector<int>& blocks = b.block_tables[std::size_t(i)];
    check(std::int64_t(kv_len) <= std::int64_t(blocks.size()) * bounds.block_size, "forward: sequence ", i,
          " has more tokens than its blocks hold");
    for (int block : blocks)
      check(block >= 0 && block < bounds.num_blocks, "forward: block ", block, " is not in the cache");
  }
  const std::int64_t cache_slots = std::int64_t(bounds.num_blocks) * bounds.block_size;
  for (std::size_t i = 0; i < std::size_t(t); ++i) {
    const std::int32_t id = b.tokens[i];
    const std::int64_t p = b.positions[i], slot = b.slot_mapping[i];
    check(id >= 0 && id < bounds.vocab_size, "forward: token id ", id, " outside the vocabulary");
    check(p >= 0 && p < bounds.max_position_embeddings, "forward: position ", p, " outside 0..",
          bounds.max_position_embeddings - 1);
    check(slot >= 0 && slot < cache_slots, "forward: slot ", slot, " outside the cache");
  }
  for (int row : b.logit_rows) check(row >= 0 && row < t, "forward: logit row ", row, " out of range");
  check(b.sampling.size() == rows, "forward: sampling needs one entry per logit row");
  for (std::size_t r = 0; r < rows; ++r) {
    const RowSampling& s = b.sampling[r];
    validate_sampling(s.params);
    check(s.penalty_begin >= 0 && s.penalty_begin <= s.penalty_end && std::size_t(s.penalty_end) <= b.penalty_tokens.size(),
          "forward: logit row ", r, "'s penalty tokens [", s.penalty_begin, ", ", s.penalty_end,
          ") are not within penalty_tokens (", b.penalty_tokens.size(), ")");
    check(s.bias_begin >= 0 && s.bias_begin <= s.bias_end && std::size_t(s.bias_end) <= b.logit_bias.size(),
          "forward: logit row ", r, "'s logit bias [", s.bias_begin, ", ", s.bias_end, ") is not within logit_bias (",
          b.logit_bias.size(), ")");
    check(s.mask_offset == -1 || (s.mask_offset >= 0 && std::size_t(s.mask_offset) + std::size_t((bounds.vocab_size + 31) / 32) <=
                                                            b.token_masks.size()),
          "forward: logit row ", r, "'s token mask at word ", s.mask_offset, " is not within token_masks (",
          b.token_masks.size(), " words)");
    validate_logit_bias(b.logit_bias.data() + s.bias_begin, std::size_t(s.bias_end - s.bias_begin), bounds.vocab_size);
  }
  for (const PenaltyToken& p : b.penalty_tokens) {
    check(p.id >= 0 && p.id < bounds.vocab_size, "forward: penalty token id ", p.id, " outside the vocabulary");
    check(p.output_count >= 0, "forward: penalty token ", p.id, " has a negative output count (", p.output_count, ")");
  }
}

void check_block_size(int block_size, Backend backend) {
  if (backend == Backend::Cpu) {
    check(block_size >= 1 && block_size <= 4096, "block size ", block_size,
          ": the CPU backend runs block sizes in 1..4096");
  } else {
    check(block_size >= 16 && block_size <= 256 && (block_size & (block_size - 1)) == 0, "block size ", block_size,
          ": the CUDA backend runs powers of two in 16..256");
  }
}

}  // namespace asynct
