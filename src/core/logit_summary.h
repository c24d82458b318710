// What a runner gives back for one logit row without moving the vocabulary-wide row: the
// row's token (its argmax, or the token drawn with the row's sampling parameters), the lowest id
// whose raw logit is not finite, and the token's logprob when the row asks for logprobs. The
// host computes it with the host sampler (engine/sampler.h); the CUDA runner computes
// the same on the device (kernels/sampling.h). The layout is shared between the two.
#pragma once

#include <cstdint>

namespace asynct {

struct LogitSummary {
  std::int32_t token = 0;          // the row's next token: the argmax (temperature 0) or the draw
                                   // (meaningless when nonfinite >= 0)
  std::int32_t nonfinite = -1;     // lowest id with a NaN or infinite RAW logit; -1: all finite
  float nonfinite_value = 0.0f;    // that logit
  float logprob = 0.0f;            // log-probability of `token` under the raw logits (when the row
                                   // asks for logprobs >= 0)
};

// One of a row's most likely tokens under the raw logits.
struct TopLogprob {
  std::int32_t id;
  float logprob;
};

}  // namespace asynct
