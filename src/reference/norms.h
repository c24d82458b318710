// Reference norms (docs/DESIGN.md §4): RMSNorm, UClipNorm, and the fused forms the GPU kernels implement.
// Each normalises over the last dimension, in float64, and returns float32.
#pragma once

#include <limits>

#include "core/tensor.h"

namespace asynct {

// y = w * clamp(x * rsqrt(mean(x^2) + eps), -clip, clip). An infinite clip is plain RMSNorm,
// so one function serves Qwen3's RMSNorm and AsyncT's UClipNorm.
struct NormConfig {
  float eps = 1e-6f;
  float clip = std::numeric_limits<float>::infinity();

  static NormConfig rms(float eps) { return {eps, std::numeric_limits<float>::infinity()}; }
  static NormConfig uclip(float eps, float clip) { return {eps, clip}; }
};

// x: float32 [..., H]; weight: float32 [H]. Rows are normalised independently.
Tensor norm(const Tensor& x, const Tensor& weight, const NormConfig& config);

// residual += x; out = norm(residual). Returns (out, new residual).
struct NormAndResidual {
  Tensor out;
  Tensor residual;
};
NormAndResidual fused_add_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                               const NormConfig& config);

// AsyncT's Peri-LN step: residual += norm(attn_out, w_out); mlp_in = norm(residual, w_next).
NormAndResidual post_attn_pre_mlp(const Tensor& attn_out, const Tensor& residual,
                                  const Tensor& out_norm_weight, const Tensor& next_norm_weight,
                                  const NormConfig& config);

}  // namespace asynct
