// The engine's sampler: greedy, temperature, top-k, top-p, from a seeded counter-based
// generator, so that a (seed, step) pair always draws the same number on any machine or
// backend. The device greedy sampler (kernels/sampling.h) is tested against summarize_logits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/logit_summary.h"
#include "core/sampling_params.h"

namespace asynct {

// A uniform number in [0, 1) that depends only on (seed, step): splitmix64 of the pair.
double uniform_draw(std::uint64_t seed, std::uint64_t step);

// One row's LogitSummary (core/logit_summary.h), in one pass.
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
