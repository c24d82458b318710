// Reference sampling: greedy, temperature, top-k, top-p, from a seeded counter-based generator,
// so that a (seed, step) pair always draws the same number on any machine or backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace asynct {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: off; else keep the k most likely tokens
  float top_p = 1.0f;        // keep the smallest most-likely set whose mass reaches top_p
  std::uint64_t seed = 0;
};

// Throws Error for a negative or non-finite temperature, negative top_k, top_p outside (0, 1].
void validate_sampling(const SamplingParams& params);

// A uniform number in [0, 1) that depends only on (seed, step): splitmix64 of the pair.
double uniform_draw(std::uint64_t seed, std::uint64_t step);

// What greedy sampling needs from one row of logits, in one pass: the argmax (lowest id on
// ties) and the lowest id whose logit is not finite. The CUDA runner computes the same on the
// device (kernels/sampling.h) so that greedy rows never leave the GPU; the layout is shared.
struct LogitSummary {
  std::int32_t greedy = 0;         // argmax, lowest id on ties (meaningless when nonfinite >= 0)
  std::int32_t nonfinite = -1;     // lowest id with a NaN or infinite logit; -1: all finite
  float nonfinite_value = 0.0f;    // that logit
};
LogitSummary summarize_logits(const float* logits, std::size_t vocab);

// Throws Error "sampling: logit <id> is not finite (<value>)" when the summary has one.
void check_finite(const LogitSummary& summary);

// Picks a token from logits ([vocab], finite) for generation step `step` of a request.
// Order: temperature, then top-k, then top-p on what is left, then one draw, walking the kept
// tokens by decreasing logit (lowest id first on ties); with neither top-k nor top-p, walking
// the whole vocabulary in id order. Only the head of the order that top-k/top-p keeps is sorted.
int sample_token(const float* logits, std::size_t vocab, const SamplingParams& params, std::uint64_t step);
int sample_token(const std::vector<float>& logits, const SamplingParams& params,
                 std::uint64_t step);

}  // namespace asynct
