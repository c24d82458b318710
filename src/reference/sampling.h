// Reference sampling: greedy, temperature, top-k, top-p, from a seeded counter-based generator,
// so that a (seed, step) pair always draws the same number on any machine or backend.
#pragma once

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

// Picks a token from logits ([vocab], finite) for generation step `step` of a request.
// Order: temperature, then top-k, then top-p on what is left, then one draw.
int sample_token(const std::vector<float>& logits, const SamplingParams& params,
                 std::uint64_t step);

}  // namespace asynct
