// The host sampler: one row of logits to one token, in the order core/sampling_params.h lists
// (logit bias, penalties, temperature, top-k, top-p, min-p, one draw), and the logprobs of the raw
// row. Both CPU runners and the CUDA runner's host path sample with it, and the device sampler is
// tested against it; its draw is tested against the plain one in reference/sampler.h, which
// sorts the whole row where this one sorts only what the cuts and the draw reach. Draws come
// from a counter-based generator, so a (seed, step) pair always draws the same number on any
// machine or backend, and the same token from the same row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/logit_summary.h"
#include "core/sampling_params.h"
#include "core/uniform_draw.h"

namespace asynct {


// The greedy summary of a row in one pass: token = the argmax (lowest id on ties), the first
// non-finite logit. logprob is left 0.
LogitSummary summarize_logits(const float* logits, std::size_t vocab);

// Throws Error "sampling: logit <id> is not finite (<value>)" when the summary has one.
void check_finite(const LogitSummary& summary);

// What one row's penalties see: the distinct tokens of its sequence except the newest (each
// id once), and the newest, the row's input token, which counts once more: as generated when
// newest_is_output, else as in the prompt.
struct PenaltyContext {
  std::span<const PenaltyToken> tokens;
  std::int32_t newest = -1;  // -1: none
  bool newest_is_output = false;
};

// Applies the row's penalties to `logits` in place, token by token, in float: the repetition
// penalty r to a token in the prompt or the output (x > 0 ? x / r : x * r), then
// x -= frequency * output_count, then x -= presence when output_count > 0; the result is
// clamped to the finite floats. Throws Error for a token id outside [0, vocab).
void apply_penalties(float* logits, std::size_t vocab, const SamplingParams& params, const PenaltyContext& context);

// Adds each bias to its token's logit in place, the sum clamped to the finite floats. Throws
// Error for a token id outside [0, vocab).
void apply_logit_bias(float* logits, std::size_t vocab, std::span<const LogitBias> bias);

// Sets every token whose bit in `allowed` ((vocab + 31) / 32 words, bit t % 32 of word t / 32)
// is clear to -FLT_MAX.
void apply_token_mask(float* logits, std::size_t vocab, const std::uint32_t* allowed);

// The token of generation step `step` drawn from `logits` ([vocab], finite, penalties already
// applied: only steps 2-5 of the order), with the lowest id first on ties everywhere. Only the
// part of the order that top-k, top-p, min-p and the draw reach is sorted.
int sample_token(const float* logits, std::size_t vocab, const SamplingParams& params, std::uint64_t step);
int sample_token(const std::vector<float>& logits, const SamplingParams& params, std::uint64_t step);

// log_softmax of a raw row at its token, computed in double: summary.logprob; and when n > 0,
// the n largest raw logits (lowest id first on ties) with theirs, into *top.
void fill_logprobs(const float* logits, std::size_t vocab, int n, LogitSummary& summary,
                   std::vector<TopLogprob>* top);

// One row the way a runner samples it: the summary of the raw row (a non-finite logit ends it
// there: the engine reports it), then the token from the processed row (the bias, the penalties
// and the allowed-token mask, on a copy of it, when the row has any), then the logprobs of the
// raw row when asked (top ones into *top, which is emptied otherwise). `bias` is the row's range
// of StepBatch::logit_bias, `allowed` its bitmask (null: every token). The token is always an
// allowed one.
LogitSummary sample_logit_row(const float* logits, std::size_t vocab, const RowSampling& row,
                              const PenaltyContext& penalties, std::vector<TopLogprob>* top,
                              std::span<const LogitBias> bias = {}, const std::uint32_t* allowed = nullptr);

}  // namespace asynct
