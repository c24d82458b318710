// How a request's tokens are drawn, and what one logit row of a step needs to draw its token:
// the request's parameters, the draw's index, and the tokens its penalties see. The layouts are
// plain data shared by the host sampler (engine/sampler.h) and the device sampler, which is
// why RowSampling and PenaltyToken live here beside SamplingParams (engine/step_batch.h, which
// carries them in a step, includes this file). The engine checks a request's parameters when it
// is added; check_step_batch checks every row's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.h"

namespace asynct {

// The order of operations is the host sampler's (engine/sampler.h):
//  0. the request's logit bias (LogitBias) added to the raw logits;
//  1. penalties on the biased logits (repetition first, then frequency and presence), then a
//     constrained row's disallowed tokens (its bitmask, engine/token_constraint.h) set to
//     -FLT_MAX, giving the "processed logits";
//  2. temperature 0: the token is the argmax of the processed logits (lowest id on ties);
//  3. otherwise weights w_i = exp((x_i - max) / temperature) over the processed logits x;
//  4. the candidates in order (x down, id up on ties): the first top_k (when > 0); then top-p
//     over those (the shortest prefix whose mass reaches top_p of their mass); then min-p (only
//     tokens with w_i >= min_p); the top token is always kept;
//  5. one draw u = uniform_draw(seed, step) in [0, 1): the first kept token, in order, whose
//     cumulative mass exceeds u times the kept mass.
// Logprobs are of the model's own distribution: log_softmax of the raw logits (before the bias
// and the penalties).
struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax of the processed logits, lowest id on ties)
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]: keep tokens whose probability >= min_p * the top one's
  float repetition_penalty = 1.0f;  // > 0 (HF/CTRL): a token seen in prompt or output: logit > 0 ? logit / r : logit * r
  float presence_penalty = 0.0f;    // [-2, 2] (OpenAI): logit -= presence when the token is in the output
  float frequency_penalty = 0.0f;   // [-2, 2] (OpenAI): logit -= frequency * (times in the output)
  std::uint64_t seed = 0;
  int logprobs = -1;                // -1: none; 0..20: the sampled token's logprob and this many top ones
  // Any of the three penalties differs from neutral (1, 0, 0).
  ASYNCT_HOST_DEVICE bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};
constexpr int kMaxTopLogprobs = 20;

// Throws Error naming the field for a value out of range or not finite: temperature < 0,
// top_k < 0, top_p outside (0, 1], min_p outside [0, 1], repetition_penalty <= 0, presence or
// frequency penalty outside [-2, 2], logprobs outside -1..kMaxTopLogprobs.
void validate_sampling(const SamplingParams& params);

// OpenAI's logit_bias: `bias` added to token `id`'s raw logit before everything else (step 0;
// the sum clamped to the finite floats). 8 bytes, plain data.
struct LogitBias {
  std::int32_t id;
  float bias;  // [-kMaxLogitBias, kMaxLogitBias]
};
constexpr float kMaxLogitBias = 100.0f;
constexpr int kMaxLogitBiasTokens = 300;

// Throws Error naming logit_bias for more than kMaxLogitBiasTokens entries, an id outside
// [0, vocab) or listed twice, or a bias outside [-kMaxLogitBias, kMaxLogitBias] or not finite.
void validate_logit_bias(const LogitBias* bias, std::size_t count, int vocab);

// One distinct token of a sequence, as its penalties see it. 12 bytes, plain data.
struct PenaltyToken {
  std::int32_t id;
  std::int32_t output_count;  // times the sequence generated it
  std::int32_t in_prompt;     // non-zero: the prompt holds it
};

// What one logit row of a step draws with (StepBatch::sampling).
struct RowSampling {
  SamplingParams params;
  std::uint64_t step = 0;                  // the draw index: tokens the request generated before this one
  int penalty_begin = 0, penalty_end = 0;  // range in StepBatch::penalty_tokens
  std::int32_t newest_is_output = 0;       // the row's own input token (the sequence's newest) was generated
  int bias_begin = 0, bias_end = 0;        // range in StepBatch::logit_bias (empty: no bias)
  int mask_offset = -1;                    // -1: every token allowed; else its allowed-token bitmask's first word in StepBatch::token_masks
};

}  // namespace asynct
