// A step's logit rows sampled on the host, as both CPU runners do it: each row with the host
// sampler (engine/sampler.h: logit bias, penalties, the token mask, then the row's own draw),
// the logits asked for handed out where they lie.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model_runner.h"
#include "engine/step_batch.h"

namespace asynct {

// The step's input tokens: batch.tokens, with those a chained batch takes from the step before
// (StepBatch::tokens_from_rows) read from that step's summaries.
std::vector<std::int32_t> step_input_tokens(const StepBatch& batch, const std::vector<LogitSummary>& previous);

// Whether every row only takes the argmax of its raw logits (no sampling, penalties, bias, mask
// or logprobs): then the rows are cheap, and run one after another.
bool only_argmax_rows(const StepBatch& batch);

// Samples row i of `logits` ([rows, vocab], rows = batch.logit_rows.size()) into out->summaries
// and out->top_logprobs, and points out->logits[i] at it where batch.full_logits asks. `tokens`
// are the step's input tokens (a chained step's taken from the step before). `for_each_row`
// runs a function over 0 .. rows - 1, in parallel where it likes: each row's draw depends only
// on its own (seed, step), so the order does not matter.
void sample_step_rows(const StepBatch& batch, const std::vector<std::int32_t>& tokens, const float* logits, std::size_t vocab,
                      StepOutput* out, const std::function<void(std::size_t, const std::function<void(std::size_t)>&)>& for_each_row);

}  // namespace asynct
