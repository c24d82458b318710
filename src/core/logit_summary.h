// What greedy sampling needs from one row of logits: the argmax (lowest id on ties) and the
// lowest id whose logit is not finite. The host computes it in engine/sampler.h
// (summarize_logits); the CUDA runner computes the same on the device (kernels/sampling.h) so
// that greedy rows never leave the GPU. The layout is shared between the two.
#pragma once

#include <cstdint>

namespace asynct {

struct LogitSummary {
  std::int32_t greedy = 0;         // argmax, lowest id on ties (meaningless when nonfinite >= 0)
  std::int32_t nonfinite = -1;     // lowest id with a NaN or infinite logit; -1: all finite
  float nonfinite_value = 0.0f;    // that logit
};

}  // namespace asynct
