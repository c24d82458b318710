// The attention gates on the device: the same formulas as src/reference/gate.h, in fp32.
// Kernels are templates over the gate; these are the only places the two gates differ.
#pragma once

#include <cuda_runtime.h>

namespace asynct::kernels {

// AsyncT: P = gamma * clamp(alpha * (S - sigma * A), 0, 1), A = mean of ReLU over the window.
__device__ __forceinline__ float async_gate(float score, float pooled, float alpha, float sigma,
                                            float gamma) {
  return gamma * __saturatef(alpha * (score - sigma * pooled));
}

// The same gate for kernels that keep raw (unscaled) scores, with the score scale and the
// window's 1/W folded into the constants: for scale > 0, ReLU(scale * s) = scale * ReLU(s), so
// P = gamma * clamp(alpha_scale * (s - sigma_over_w * relu_sum), 0, 1) with alpha_scale =
// alpha * scale, sigma_over_w = sigma / W and relu_sum the window's sum of ReLU(s). gamma is left
// to the caller, which can scale its output once instead of every P.
__device__ __forceinline__ float async_gate_unscaled(float raw_score, float relu_sum,
                                                     float alpha_scale, float sigma_over_w) {
  return __saturatef(alpha_scale * fmaf(-sigma_over_w, relu_sum, raw_score));
}

// Softmax's optional logit softcap, S = c * tanh(S / c); c = 0 leaves S alone.
__device__ __forceinline__ float softcap_score(float score, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(score / softcap) : score;
}

}  // namespace asynct::kernels
