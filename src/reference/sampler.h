// The sampler's draw written for clarity (core/sampling_params.h's definition, from scratch): the
// whole row sorted into the sampling order (logit down, id up on ties), each token's weight
// exp((x - max) / temperature), then top-k, top-p over what top-k keeps, min-p, and the draw, each
// a prefix of that order with its masses summed in order. The host sampler (engine/sampler.h),
// which sorts only what the cuts and the draw reach, is tested against it token for token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/sampling_params.h"

namespace asynct {

// The ids of `logits` in sampling order.
std::vector<int> reference_sampling_order(const std::vector<float>& logits);

// The kept tokens in sampling order with their weights (`order`: reference_sampling_order): the
// first top_k (when > 0); then the shortest prefix whose mass reaches top_p of theirs; then those
// whose weight is at least min_p (x >= max + T ln(min_p)).
std::vector<std::pair<int, double>> reference_kept(const std::vector<float>& logits, const std::vector<int>& order,
                                                   const SamplingParams& params);

// The draw of generation step `step` from the kept tokens: the first whose running mass exceeds
// uniform_draw(seed, step) times their mass (the last when rounding leaves none).
int reference_draw(const std::vector<std::pair<int, double>>& kept, const SamplingParams& params, std::uint64_t step);

// The token of step `step` from finite logits (bias and penalties applied): the argmax (lowest
// id on ties) at temperature 0, else reference_draw of reference_kept.
int reference_sample_token(const std::vector<float>& logits, const SamplingParams& params, std::uint64_t step);

}  // namespace asynct
