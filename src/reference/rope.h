// Neox-style rotary position embedding (HuggingFace's rotate_half), and the step the attention
// layer runs before the kernel: RoPE of q and k and the KV-cache write, after a per-head q/k norm
// (Qwen3, AsyncT) or without one (Llama).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "reference/norms.h"

namespace asynct {

// x: float32 [tokens, heads, head_dim], head_dim even; positions: one per token.
// For i < head_dim/2, with f_i = theta^(-2i/head_dim) and a = position * f_i:
//   y[i] = x[i] cos a - x[i + half] sin a;   y[i + half] = x[i + half] cos a + x[i] sin a.
Tensor rope_neox(const Tensor& x, const std::vector<std::int64_t>& positions, double theta);

// Writes k and v ([tokens, Hkv, D]) into the paged cache ([num_blocks, block_size, Hkv, D]) at
// slot_mapping[t] = physical_block * block_size + offset; a negative slot skips the token.
void write_kv_cache(Tensor& key_cache, Tensor& value_cache, const Tensor& k, const Tensor& v,
                    const std::vector<std::int64_t>& slot_mapping);

// q_out = rope(q); k_out = rope(k); and k_out, v are written into the cache (models without a
// q/k norm). q: [tokens, Hq, D]; k, v: [tokens, Hkv, D].
struct QkNormRopeOutput {
  Tensor q;
  Tensor k;
};
QkNormRopeOutput rope_cache_write(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::vector<std::int64_t>& positions, double rope_theta,
                                  Tensor& key_cache, Tensor& value_cache,
                                  const std::vector<std::int64_t>& slot_mapping);

// The same after the per-head norm: q_out = rope(norm_per_head(q, q_weight)); k_out =
// rope(norm_per_head(k, k_weight)). q_weight, k_weight: float32 [head_dim].
QkNormRopeOutput qk_norm_rope_cache_write(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& q_weight, const Tensor& k_weight,
                                          const NormConfig& norm_config,
                                          const std::vector<std::int64_t>& positions,
                                          double rope_theta, Tensor& key_cache,
                                          Tensor& value_cache,
                                          const std::vector<std::int64_t>& slot_mapping);

}  // namespace asynct
