#include "reference/rope.h"

#include <cmath>
#include <cstring>

namespace asynct {

Tensor rope_neox(const Tensor& x, const std::vector<std::int64_t>& positions, double theta) {
  expect_dtype(x, DType::F32, "rope: x");
  expect_shape(x, {std::int64_t(positions.size()), any, any}, "rope: x (one position per token)");
  const std::int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2);
  check(dim % 2 == 0, "rope: head_dim must be even, got ", dim);
  check(theta > 0 && std::isfinite(theta), "rope: theta must be positive");
  const std::int64_t half = dim / 2;
  Tensor y = Tensor::empty(DType::F32, x.shape());
  for (std::int64_t t = 0; t < tokens; ++t) {
    check(positions[std::size_t(t)] >= 0, "rope: negative position ", positions[std::size_t(t)]);
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* in = x.data_as<float>() + (t * heads + h) * dim;
      float* out = y.data_as<float>() + (t * heads + h) * dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const double freq = std::pow(theta, -2.0 * double(i) / double(dim));
        const double angle = double(positions[std::size_t(t)]) * freq;
        const double c = std::cos(angle), s = std::sin(angle);
        out[i] = float(in[i] * c - in[i + half] * s);
        out[i + half] = float(in[i + half] * c + in[i] * s);
      }
    }
  }
  return y;
}

void write_kv_cache(Tensor& key_cache, Tensor& value_cache, const Tensor& k, const Tensor& v,
                    const std::vector<std::int64_t>& slot_mapping) {
  expect_dtype(key_cache, DType::F32, "write_kv_cache: key_cache");
  expect_dtype(value_cache, DType::F32, "write_kv_cache: value_cache");
  expect_shape(key_cache, {any, any, any, any}, "write_kv_cache: key_cache");
  expect_shape(value_cache, key_cache.shape(), "write_kv_cache: value_cache");
  const std::int64_t heads = key_cache.size(2), dim = key_cache.size(3);
  const std::int64_t slots = key_cache.size(0) * key_cache.size(1);
  expect_shape(k, {std::int64_t(slot_mapping.size()), heads, dim}, "write_kv_cache: k");
  expect_shape(v, k.shape(), "write_kv_cache: v");
  expect_dtype(k, DType::F32, "write_kv_cache: k");
  expect_dtype(v, DType::F32, "write_kv_cache: v");
  const std::size_t row_bytes = std::size_t(heads * dim) * sizeof(float);
  for (std::size_t t = 0; t < slot_mapping.size(); ++t) {
    const std::int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    check(slot < slots, "write_kv_cache: slot ", slot, " of token ", t, " is past the cache (",
          slots, " slots)");
    std::memcpy(key_cache.data_as<float>() + slot * heads * dim,
                k.data_as<float>() + std::int64_t(t) * heads * dim, row_bytes);
    std::memcpy(value_cache.data_as<float>() + slot * heads * dim,
                v.data_as<float>() + std::int64_t(t) * heads * dim, row_bytes);
  }
}

QkNormRopeOutput rope_cache_write(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::vector<std::int64_t>& positions, double rope_theta,
                                  Tensor& key_cache, Tensor& value_cache,
                                  const std::vector<std::int64_t>& slot_mapping) {
  expect_shape(q, {std::int64_t(positions.size()), any, any}, "qk_rope: q");
  expect_shape(k, {q.size(0), any, q.size(2)}, "qk_rope: k");
  check(slot_mapping.size() == positions.size(), "qk_rope: ", slot_mapping.size(),
        " slots for ", positions.size(), " tokens");
  QkNormRopeOutput r;
  r.q = rope_neox(q, positions, rope_theta);
  r.k = rope_neox(k, positions, rope_theta);
  write_kv_cache(key_cache, value_cache, r.k, v, slot_mapping);
  return r;
}

QkNormRopeOutput qk_norm_rope_cache_write(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& q_weight, const Tensor& k_weight,
                                          const NormConfig& norm_config,
                                          const std::vector<std::int64_t>& positions,
                                          double rope_theta, Tensor& key_cache,
                                          Tensor& value_cache,
                                          const std::vector<std::int64_t>& slot_mapping) {
  return rope_cache_write(norm(q, q_weight, norm_config), norm(k, k_weight, norm_config), v, positions,
                          rope_theta, key_cache, value_cache, slot_mapping);
}

}  // namespace asynct
