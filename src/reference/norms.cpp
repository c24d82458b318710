#include "reference/norms.h"

#include <algorithm>
#include <cmath>

#include "reference/layers.h"

namespace asynct {

Tensor norm(const Tensor& x, const Tensor& weight, const NormConfig& config) {
  expect_dtype(x, DType::F32, "norm: x");
  expect_dtype(weight, DType::F32, "norm: weight");
  check(x.dim() >= 1, "norm: x must have at least one dimension");
  const std::int64_t hidden = x.size(-1);
  expect_shape(weight, {hidden}, "norm: weight");
  check(config.eps >= 0 && std::isfinite(config.eps), "norm: eps must be finite and >= 0");
  check(config.clip > 0, "norm: clip must be > 0");
  check(hidden > 0, "norm: hidden size is 0");

  Tensor y = Tensor::empty(DType::F32, x.shape());
  const float* in = x.data_as<float>();
  const float* w = weight.data_as<float>();
  float* out = y.data_as<float>();
  const double clip = config.clip;
  for (std::int64_t r = 0; r < x.numel() / hidden; ++r) {
    const float* row = in + r * hidden;
    double sum_sq = 0.0;
    for (std::int64_t i = 0; i < hidden; ++i) sum_sq += double(row[i]) * double(row[i]);
    const double inv_rms = 1.0 / std::sqrt(sum_sq / double(hidden) + double(config.eps));
    for (std::int64_t i = 0; i < hidden; ++i)
      out[r * hidden + i] = float(double(w[i]) * std::clamp(double(row[i]) * inv_rms, -clip, clip));
  }
  return y;
}


NormAndResidual fused_add_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                               const NormConfig& config) {
  NormAndResidual r;
  r.residual = add(residual, x);
  r.out = norm(r.residual, weight, config);
  return r;
}

NormAndResidual post_attn_pre_mlp(const Tensor& attn_out, const Tensor& residual,
                                  const Tensor& out_norm_weight, const Tensor& next_norm_weight,
                                  const NormConfig& config) {
  NormAndResidual r;
  r.residual = add(residual, norm(attn_out, out_norm_weight, config));
  r.out = norm(r.residual, next_norm_weight, config);
  return r;
}

}  // namespace asynct
