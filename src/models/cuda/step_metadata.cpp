#include "models/cuda/step_metadata.h"

#include <algorithm>
#include <vector>

#include "kernels/common/cuda_check.h"

namespace asynct {

StepShape shape_of(const StepBatch& b) {
  StepShape shape;
  shape.tokens = b.num_tokens();
  shape.seqs = b.num_seqs();
  for (int i = 0; i < shape.seqs; ++i) {
    const int q_len = b.cu_seqlens_q[std::size_t(i) + 1] - b.cu_seqlens_q[std::size_t(i)];
    const int kv_len = b.kv_lens[std::size_t(i)];
    shape.max_blocks = std::max(shape.max_blocks, int(b.block_tables[std::size_t(i)].size()));
    if (q_len == 1 && shape.decodes == i) {
      ++shape.decodes;
      shape.decode_kv_len = std::max(shape.decode_kv_len, kv_len);
    } else {
      shape.prefill_q_len = std::max(shape.prefill_q_len, q_len);
      shape.prefill_kv_len = std::max(shape.prefill_kv_len, kv_len);
    }
  }
  return shape;
}

void StepMetadata::upload(cudaStream_t stream, std::size_t from, std::size_t to) {
  to = std::min(to, bytes_);
  if (from < to)
    ASYNCT_CUDA_CHECK(cudaMemcpyAsync(device_[turn_].get() + from, host_[turn_].get() + from, to - from,
                                      cudaMemcpyHostToDevice, stream));
}

std::size_t token_masks_bytes(const StepBatch& b) { return b.token_masks.size() * sizeof(std::uint32_t); }

void upload_token_masks(const StepBatch& b, StepMetadata& md, cudaStream_t stream) {
  const std::size_t bytes = token_masks_bytes(b), offset = md.bytes() - bytes;
  std::copy(b.token_masks.begin(), b.token_masks.end(), md.host<std::uint32_t>(offset));
  md.upload(stream, offset);
}

StepPointers write_step_metadata(const StepBatch& b, const StepShape& shape, StepMetadata& md, bool in_flight) {
  const std::size_t t = std::size_t(shape.tokens), s = std::size_t(shape.seqs), width = std::size_t(shape.max_blocks);
  const std::size_t decodes = std::size_t(shape.decodes), rows = b.logit_rows.size();
  md.clear(in_flight);
  const std::size_t o_tokens = md.add<std::int32_t>(t), o_positions = md.add<std::int64_t>(t),
                    o_slots = md.add<std::int64_t>(t), o_cu = md.add<std::int32_t>(s - decodes + 1),
                    o_kv_lens = md.add<std::int32_t>(s), o_table = md.add<std::int32_t>(s * width),
                    o_rows = md.add<std::int32_t>(rows), o_from = md.add<std::int32_t>(b.tokens_from_rows.size()),
                    o_sampling = md.add<RowSampling>(rows), o_bias = md.add<LogitBias>(b.logit_bias.size()),
                    o_penalties = md.add<PenaltyToken>(b.penalty_tokens.size()),
                    o_masks = md.add<std::uint32_t>(b.token_masks.size());
  md.reserve();

  std::copy(b.tokens.begin(), b.tokens.end(), md.host<std::int32_t>(o_tokens));
  std::copy(b.positions.begin(), b.positions.end(), md.host<std::int64_t>(o_positions));
  std::copy(b.slot_mapping.begin(), b.slot_mapping.end(), md.host<std::int64_t>(o_slots));
  std::int32_t* cu = md.host<std::int32_t>(o_cu);  // the prefill part's, starting at 0
  for (std::size_t i = decodes; i <= s; ++i) cu[i - decodes] = b.cu_seqlens_q[i] - std::int32_t(decodes);
  std::copy(b.kv_lens.begin(), b.kv_lens.end(), md.host<std::int32_t>(o_kv_lens));
  std::int32_t* table = md.host<std::int32_t>(o_table);
  for (std::size_t i = 0; i < s; ++i) {
    const std::vector<int>& blocks = b.block_tables[i];
    std::copy(blocks.begin(), blocks.end(), table + i * width);
    std::fill(table + i * width + blocks.size(), table + (i + 1) * width, 0);
  }
  std::copy(b.logit_rows.begin(), b.logit_rows.end(), md.host<std::int32_t>(o_rows));
  std::copy(b.tokens_from_rows.begin(), b.tokens_from_rows.end(), md.host<std::int32_t>(o_from));
  std::copy(b.sampling.begin(), b.sampling.end(), md.host<RowSampling>(o_sampling));
  std::copy(b.logit_bias.begin(), b.logit_bias.end(), md.host<LogitBias>(o_bias));
  std::copy(b.penalty_tokens.begin(), b.penalty_tokens.end(), md.host<PenaltyToken>(o_penalties));
  if (!b.masks_later)  // (else written and sent once filled: upload_token_masks)
    std::copy(b.token_masks.begin(), b.token_masks.end(), md.host<std::uint32_t>(o_masks));
  StepPointers p{md.device<std::int32_t>(o_tokens), md.device<std::int64_t>(o_positions), md.device<std::int64_t>(o_slots),
                 md.device<std::int32_t>(o_cu),     md.device<std::int32_t>(o_kv_lens),     md.device<std::int32_t>(o_table),
                 md.device<std::int32_t>(o_rows),   b.tokens_from_rows.empty() ? nullptr : md.device<std::int32_t>(o_from)};
  p.sampling = md.device<RowSampling>(o_sampling);
  p.logit_bias = md.device<LogitBias>(o_bias);
  p.penalty_tokens = md.device<PenaltyToken>(o_penalties);
  p.token_masks = md.device<std::uint32_t>(o_masks);
  return p;
}

}  // namespace asynct
