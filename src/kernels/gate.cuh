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

// Softmax's optional logit softcap, S = c * tanh(S / c); c = 0 leaves S alone.
__device__ __forceinline__ float softcap_score(float score, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(score / softcap) : score;
}

}  // namespace asynct::kernels
