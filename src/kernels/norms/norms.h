// Fused norms (docs/DESIGN.md §4): UClipNorm / RMSNorm and their fused forms, one pass over memory each.
// Tensors are bf16 row-major (the residual stream bf16 or fp32); rows are normalised over `hidden`
// in fp32.
#pragma once

#include <cstdint>
#include <limits>

#include <cuda_runtime_api.h>

#include "kernels/common/bf16.h"
#include "kernels/common/kv_element.h"
#include "kernels/gemm/linear_output.h"

namespace asynct::kernels {

// y = w * clamp(x * rsqrt(mean(x^2) + eps), -clip, clip); infinite clip = RMSNorm.
struct NormArgs {
  float eps = 1e-6f;
  float clip = std::numeric_limits<float>::infinity();
};

// Raises an Error naming `who` unless eps is finite and >= 0 and clip > 0.
void check_norm_args(const char* who, const NormArgs& args);

// out = norm(x). x, out: [rows, hidden]; weight: [hidden].
void launch_norm(const bf16* x, const bf16* weight, bf16* out, int rows, int hidden,
                 NormArgs args, cudaStream_t stream);

// The residual stream comes in bf16 (the PyTorch API's) or fp32 (the model runner's: rounding it
// to bf16 at each of a model's 2 x layers additions is the largest share of a bf16 forward's
// error against an fp32 one, tests/model/bf16_error_budget.py). The sums are fp32 either way.

// residual = x (in fp32); out = norm(x): the first norm of a forward, which keeps its input as
// the start of the residual stream.
void launch_norm_keeping_input(const bf16* x, float* residual, const bf16* weight, bf16* out, int rows, int hidden,
                               NormArgs args, cudaStream_t stream);

// residual += x; out = norm(residual). residual is updated in place. x may also come as a
// GEMM's split partial sums (linear_output.h), added in fp32 as they are read.
void launch_fused_add_norm(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream);
void launch_fused_add_norm(const LinearOutput& x, bf16* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream);
void launch_fused_add_norm(const LinearOutput& x, float* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream);

// AsyncT's Peri-LN step: residual += norm(attn_out, out_weight); mlp_in = norm(residual,
// next_weight). residual is updated in place. attn_out may come as split partial sums.
void launch_post_attn_pre_mlp(const bf16* attn_out, bf16* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream);
void launch_post_attn_pre_mlp(const LinearOutput& attn_out, bf16* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream);
void launch_post_attn_pre_mlp(const LinearOutput& attn_out, float* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream);

// Per-head q/k norm, neox RoPE at each token's position, and the KV-cache write:
//   q[t, h]            = rope(norm(q[t, h], q_weight), positions[t])      (in place)
//   k[t, h]            = rope(norm(k[t, h], k_weight), positions[t])      (in place)
//   key_cache[slot]    = k[t, h]
//   value_cache[slot]  = v[t, h]
// With qk_norm false (models without a q/k norm, Llama) there is no norm: q = rope(q), k =
// rope(k), and q_weight, k_weight and norm are unused.
// k is rewritten too so that the prefill kernel can read the new keys from it; a token whose
// slot is negative is skipped entirely (its k stays as it was). With key_cache and value_cache
// null only q and k are rewritten: the prefill kernel writes the cache itself, and a second
// write would be a wasted pass over the new K/V.
// q: [tokens, num_q_heads, head_dim]; k, v: [tokens, num_kv_heads, head_dim];
// slot_mapping[t] = block * block_size + offset (negative: skip the cache write);
// key_cache/value_cache: [num_blocks, block_size, num_kv_heads, head_dim]; bf16, or with
// kv_element Fp8E4M3 e4m3 bytes (the pointers point at them) holding k / key_scales[h] and
// v / value_scales[h] (device float32 [num_kv_heads]), k encoded from its float32 value.
// With kv_element Fp8E4M3 (and its scales) the dense k and v_out come out as the cache holds
// them, e4m3 times the scale rounded to bf16, with or without a cache write: the prefill kernel
// then attends to the values every later step reads back (a step's result does not depend on
// how its prompt was chunked or cached), and writes them to the cache exactly.
// Fused input: with qkv set, q, k and v are read from one buffer [tokens, (num_q_heads +
// 2 num_kv_heads) * head_dim] (each token's q heads, then k, then v: what one GEMM over the
// concatenated projections writes) and the results go to q, k and v_out, dense as above
// (v_out gets a copy of v, for the prefill kernel); v is then unused. The fused input may also
// come as a GEMM's split partial sums (linear_output.h), added in fp32 as they are read, v
// rounded to bf16 as the dense product would be. qkv left empty: q, k and v are separate.
// Only tokens first_token .. tokens - 1 are processed (the decode kernel does a step's leading
// decode tokens itself, decode.h): indices stay those of the whole step.
struct QkNormRopeArgs {
  bf16* q = nullptr;
  bf16* k = nullptr;
  const bf16* v = nullptr;
  LinearOutput qkv;
  bf16* v_out = nullptr;
  const bf16* q_weight = nullptr;
  const bf16* k_weight = nullptr;
  const std::int64_t* positions = nullptr;
  const std::int64_t* slot_mapping = nullptr;
  bf16* key_cache = nullptr;
  bf16* value_cache = nullptr;
  KvElement kv_element = KvElement::Bf16;
  const float* key_scales = nullptr;
  const float* value_scales = nullptr;
  int tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int first_token = 0;
  float rope_theta = 1e6f;
  NormArgs norm;
  bool qk_norm = true;
};
void launch_qk_norm_rope_cache_write(const QkNormRopeArgs& args, cudaStream_t stream);

}  // namespace asynct::kernels
