// How a request's tokens are drawn: greedy, temperature, top-k, top-p, from a seed. The engine
// checks a request's parameters when it is added; engine/sampler.h draws with them.
#pragma once

#include <cstdint>

namespace asynct {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: off; else keep the k most likely tokens
  float top_p = 1.0f;        // keep the smallest most-likely set whose mass reaches top_p
  std::uint64_t seed = 0;
};

// Throws Error for a negative or non-finite temperature, negative top_k, top_p outside (0, 1].
void validate_sampling(const SamplingParams& params);

}  // namespace asynct
