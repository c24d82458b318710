#include "models/step_sampling.h"

#include <span>

#include "engine/sampler.h"

namespace asynct {

std::vector<std::int32_t> step_input_tokens(const StepBatch& batch, const std::vector<LogitSummary>& previous) {
  std::vector<std::int32_t> tokens = batch.tokens;
  for (std::size_t i = 0; i < batch.tokens_from_rows.size(); ++i) tokens[i] = previous[std::size_t(batch.tokens_from_rows[i])].token;
  return tokens;
}

bool only_argmax_rows(const StepBatch& batch) {
  for (const RowSampling& s : batch.sampling)
    if (s.params.temperature != 0.0f || s.params.has_penalties() || s.params.logprobs >= 0 || s.bias_begin != s.bias_end ||
        s.mask_offset >= 0)
      return false;
  return true;
}

void sample_step_rows(const StepBatch& batch, const std::vector<std::int32_t>& tokens, const float* logits, std::size_t vocab,
                      StepOutput* out, const std::function<void(std::size_t, const std::function<void(std::size_t)>&)>& for_each_row) {
  const std::size_t rows = batch.logit_rows.size();
  out->summaries.resize(rows);
  out->logits.assign(rows, nullptr);
  out->top_logprobs.assign(rows, {});
  for_each_row(rows, [&](std::size_t i) {
    const float* row = logits + i * vocab;
    const RowSampling& s = batch.sampling[i];
    const PenaltyContext penalties{
        std::span<const PenaltyToken>(batch.penalty_tokens).subspan(std::size_t(s.penalty_begin),
                                                                    std::size_t(s.penalty_end - s.penalty_begin)),
        tokens[std::size_t(batch.logit_rows[i])], s.newest_is_output != 0};
    const std::span<const LogitBias> bias =
        std::span<const LogitBias>(batch.logit_bias).subspan(std::size_t(s.bias_begin), std::size_t(s.bias_end - s.bias_begin));
    const std::uint32_t* allowed = s.mask_offset >= 0 ? batch.token_masks.data() + s.mask_offset : nullptr;
    out->summaries[i] = sample_logit_row(row, vocab, s, penalties, &out->top_logprobs[i], bias, allowed);
    if (batch.full_logits[i]) out->logits[i] = row;
  });
}

}  // namespace asynct
