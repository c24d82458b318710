#include "models/kv_cache_format.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "models/architecture.h"
#include "models/weights.h"

namespace asynct {

const char* kv_cache_dtype_name(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::Float32: return "float32";
    case KvCacheDtype::BF16: return "bf16";
    case KvCacheDtype::Fp8E4M3: return "fp8";
  }
  return "?";
}

KvCacheDtype resolve_kv_cache_dtype(const std::string& name, const std::string& backend) {
  check(name == "auto" || name == "bf16" || name == "fp8", "--kv-cache-dtype must be auto, bf16 or fp8, got '", name, "'");
  if (name == "bf16") return KvCacheDtype::BF16;
  if (name == "fp8") return KvCacheDtype::Fp8E4M3;
  return backend == "cpu-reference" ? KvCacheDtype::Float32 : KvCacheDtype::BF16;
}

std::int64_t kv_cache_element_bytes(KvCacheDtype dtype, const std::string& backend) {
  if (backend == "cpu-reference") return 4;
  return dtype == KvCacheDtype::Fp8E4M3 ? 1 : dtype == KvCacheDtype::BF16 ? 2 : 4;
}

std::int64_t kv_cache_bytes_per_token(const ModelConfig& c, KvCacheDtype dtype, const std::string& backend) {
  return 2 * std::int64_t(c.num_hidden_layers) * c.num_key_value_heads * c.head_dim * kv_cache_element_bytes(dtype, backend);
}

namespace {

// |x_i| <= bound * |w_i| for a norm's output x with weight w (see the header).
double norm_bound(const ArchitectureRecipe& recipe, std::int64_t n) {
  return recipe.norm == NormKind::UClip ? double(recipe.norm_clip) : std::sqrt(double(n));
}

// The largest RoPE-pair norm sqrt(b_i^2 + b_{i+D/2}^2) of per-element bounds b over one head.
double rope_pair_bound(const std::vector<double>& b, std::size_t head_begin, std::size_t head_dim) {
  double out = 0;
  for (std::size_t i = 0; i < head_dim / 2; ++i)
    out = std::max(out, std::hypot(b[head_begin + i], b[head_begin + i + head_dim / 2]));
  return out;
}

// Bounds on each output row of projection w (float32 [rows, H]) of a norm's output.
std::vector<double> projection_bounds(const Tensor& w, const std::vector<float>& norm_weight, double bound) {
  const std::int64_t rows = w.size(0), cols = w.size(1);
  std::vector<double> out(std::size_t(rows), 0.0);
  const float* values = w.data_as<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (std::int64_t j = 0; j < cols; ++j) sum += std::fabs(double(values[r * cols + j])) * std::fabs(double(norm_weight[std::size_t(j)]));
    out[std::size_t(r)] = bound * sum;
  }
  return out;
}

}  // namespace

KvCacheScales kv_cache_scales(const ModelWeights& weights, KvCacheDtype dtype) {
  const ModelConfig& c = weights.config;
  KvCacheScales s;
  s.num_kv_heads = c.num_key_value_heads;
  const std::size_t count = std::size_t(c.num_hidden_layers) * std::size_t(c.num_key_value_heads);
  s.key.assign(count, 1.0f);
  s.value.assign(count, 1.0f);
  if (dtype != KvCacheDtype::Fp8E4M3) return s;
  const ArchitectureRecipe recipe = recipe_of(c);
  const std::size_t d = std::size_t(c.head_dim);
  const auto as_float = [](const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); };
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = weights.layers[std::size_t(l)];
    if (w.k_scale.defined() && w.v_scale.defined()) {  // the checkpoint's
      const std::vector<float> k = w.k_scale.to_float_vector(), v = w.v_scale.to_float_vector();
      std::copy(k.begin(), k.end(), s.key.begin() + std::ptrdiff_t(std::size_t(l) * k.size()));
      std::copy(v.begin(), v.end(), s.value.begin() + std::ptrdiff_t(std::size_t(l) * v.size()));
      continue;
    }
    // FP8 projections are bounded by their dequantized values.
    const double in_bound = norm_bound(recipe, c.hidden_size);
    const std::vector<float> in_weight = as_float(w.input_layernorm).to_float_vector();
    const std::vector<double> v_rows =
        projection_bounds(dequantize_projection(w.v_proj, w.v_proj_scale, c.fp8_block_rows, c.fp8_block_cols), in_weight, in_bound);
    std::vector<double> k_rows;
    if (recipe.qk_norm) {
      const std::vector<float> k_norm = as_float(w.k_norm).to_float_vector();
      const double bound = norm_bound(recipe, c.head_dim);
      for (int h = 0; h < c.num_key_value_heads; ++h)
        for (std::size_t i = 0; i < d; ++i) k_rows.push_back(bound * std::fabs(double(k_norm[i])));
    } else {
      k_rows = projection_bounds(dequantize_projection(w.k_proj, w.k_proj_scale, c.fp8_block_rows, c.fp8_block_cols), in_weight,
                                 in_bound);
    }
    for (int h = 0; h < c.num_key_value_heads; ++h) {
      const std::size_t begin = std::size_t(h) * d;
      double v_max = 0;
      for (std::size_t i = 0; i < d; ++i) v_max = std::max(v_max, v_rows[begin + i]);
      const double k_max = rope_pair_bound(k_rows, begin, d);
      // A bound of 0 (all-zero weights) stores zeros at any scale.
      s.key[std::size_t(l) * std::size_t(c.num_key_value_heads) + std::size_t(h)] = k_max > 0 ? float(k_max / kFp8E4M3Max) : 1.0f;
      s.value[std::size_t(l) * std::size_t(c.num_key_value_heads) + std::size_t(h)] = v_max > 0 ? float(v_max / kFp8E4M3Max) : 1.0f;
    }
  }
  return s;
}

float round_to_kv_cache(float value, KvCacheDtype dtype, float scale) {
  switch (dtype) {
    case KvCacheDtype::Float32: return value;
    case KvCacheDtype::BF16: return round_to_bf16(value);
    case KvCacheDtype::Fp8E4M3: return round_to_fp8_e4m3(value / scale) * scale;
  }
  return value;
}

}  // namespace asynct
