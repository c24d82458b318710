// Per-head q/k norm + neox RoPE + KV-cache write (launch_qk_norm_rope_cache_write, norms.h): the
// prefill step's q/k norm, and the decode step's when the decode kernel does not take the qkv
// projection itself; or, for models without a q/k norm (Llama), RoPE and the cache write alone.
#include <algorithm>
#include <cstdint>

#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/fp8.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/norms/head_norm_rope.cuh"
#include "kernels/norms/norms.h"
#include "kernels/norms/norms_common.h"

namespace asynct::kernels {
namespace {

using namespace norms;  // kWarp, kMaxThreads, round_up, check_pointers

// A lane's 8 values in RoPE pairs (load_pairs) as e4m3 of x / scale: values 0-3 at the head's
// byte 4j, 4-7 at byte HEAD_DIM / 2 + 4j.
template <int HEAD_DIM>
__device__ __forceinline__ void store_pairs_e4m3(unsigned char* head, int j, const float (&x)[8], float scale) {
  const uint2 bytes = float8_to_e4m3x8(x, scale);
  *reinterpret_cast<unsigned*>(head + 4 * j) = bytes.x;
  *reinterpret_cast<unsigned*>(head + HEAD_DIM / 2 + 4 * j) = bytes.y;
}

struct QkParams {
  bf16* q;
  bf16* k;
  const bf16* v;
  LinearOutput qkv;  // the fused input, dense or (SPLIT kernels) split partial sums; or empty
  bf16* v_out;       // with qkv: where v is copied
  const bf16* q_weight;
  const bf16* k_weight;
  const std::int64_t* positions;
  const std::int64_t* slot_mapping;
  bf16* key_cache;
  bf16* value_cache;
  bool fp8_cache;  // e4m3 bytes at the scales below, and the dense k and v as they hold them (norms.h)
  const float* key_scales;
  const float* value_scales;
  int num_q_heads, num_kv_heads;
  float eps, clip;
  RopeTurns turns;
  int first_token;
};

// Grid (group of tokens, group of heads): a head is held by HEAD_DIM/8 lanes, 8 values each as
// RoPE pairs (load_pairs, head_norm_rope.cuh); q heads come first, then k heads, whose lanes also
// copy v into the cache. NORM: the per-head norm before RoPE (false: RoPE alone, the weights
// unread).
// A block takes up to kQkTokens consecutive tokens and issues all their loads before it uses
// any (a token's heads are only 4 KB per block). Measured on H200 at 8192 tokens
// (bench/RESULTS.md): with lanes holding 8 consecutive values the kernel was
// bound by its shuffles and shared-memory reads (L1 95% busy), 75 us per call with one token or
// four per block; in RoPE pairs, 67 us with one token per block and 41 us with four.
// (The split form, which only decode-sized batches use, keeps one token per block: its sums
// of partials would hold 8 floats per token in registers.)
constexpr int kQkTokens = 4;

template <int HEAD_DIM, bool SPLIT, bool NORM>
__global__ void __launch_bounds__(kMaxThreads) qk_norm_rope_kernel(QkParams p, int tokens_per_block, int end_token) {
  constexpr int kLanes = HEAD_DIM / 8, kHalf = HEAD_DIM / 2;
  constexpr int kTokens = SPLIT ? 1 : kQkTokens;
  static_assert(kLanes >= 2 && kLanes <= kWarp && (kLanes & (kLanes - 1)) == 0);
  // cos/sin per frequency and token, shared by the block's heads: computed once per block and
  // token, not once per element.
  __shared__ __align__(16) float2 rotation[kTokens][kHalf];
  wait_for_prior_grids();
  allow_next_grid();

  const int first = p.first_token + blockIdx.x * tokens_per_block;
  const int count = min(tokens_per_block, end_token - first);
  const int lane = threadIdx.x % kLanes;
  const int head = blockIdx.y * (blockDim.x / kLanes) + threadIdx.x / kLanes;
  const bool is_q = head < p.num_q_heads;
  const int kv_head = head - p.num_q_heads;
  const bool head_exists = head < p.num_q_heads + p.num_kv_heads;
  // Without a cache (the prefill kernel writes it) every k is rewritten in place.
  const bool write_cache = p.key_cache != nullptr;

  // 1. Every token's loads, kept as loaded (bf16; the split form's sums in float) until used.
  //    Inactive lanes still take part in the shuffles; they only skip memory.
  float sums[SPLIT ? 8 : 1] = {};
  Bf16x8 loaded[kTokens] = {}, value[kTokens] = {};
  std::int64_t slot[kTokens] = {};
  bool active[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    const int token = first + t;
    slot[t] = write_cache && t < count ? p.slot_mapping[token] : 0;
    active[t] = t < count && head_exists && (is_q || slot[t] >= 0);
    if (!active[t]) continue;
    // The fused row holds the q heads, then the k heads, then the v heads: `head` indexes it.
    const std::int64_t fused_row = std::int64_t(token) * (p.num_q_heads + 2 * p.num_kv_heads) * HEAD_DIM;
    if constexpr (SPLIT) {
      load_split_pairs<HEAD_DIM>(p.qkv, fused_row + head * HEAD_DIM, lane, sums);
      if (!is_q) {
        float v[8];
        load_split_pairs<HEAD_DIM>(p.qkv, fused_row + (head + p.num_kv_heads) * HEAD_DIM, lane, v);
        value[t] = from_float8(v);  // rounded as a dense product would be
      }
    } else if (is_q) {
      loaded[t] = load_pairs<HEAD_DIM>(p.qkv.dense ? p.qkv.dense + fused_row + head * HEAD_DIM
                                                   : p.q + (std::int64_t(token) * p.num_q_heads + head) * HEAD_DIM,
                                       lane);
    } else if (p.qkv.dense) {
      loaded[t] = load_pairs<HEAD_DIM>(p.qkv.dense + fused_row + head * HEAD_DIM, lane);
      value[t] = load_pairs<HEAD_DIM>(p.qkv.dense + fused_row + (head + p.num_kv_heads) * HEAD_DIM, lane);
    } else {
      const std::int64_t offset = (std::int64_t(token) * p.num_kv_heads + kv_head) * HEAD_DIM;
      loaded[t] = load_pairs<HEAD_DIM>(p.k + offset, lane);
      value[t] = load_pairs<HEAD_DIM>(p.v + offset, lane);
    }
  }

  // 2. While the loads are in flight: the rotations of the block's tokens.
  for (int i = threadIdx.x; i < count * kHalf; i += blockDim.x)
    rotation[i / kHalf][i % kHalf] = rope_rotation(p.turns, p.positions[first + i / kHalf], i % kHalf);
  __syncthreads();

  // 3. Per token: norm, rotate, store.
  const Bf16x8 weight = NORM ? load_pairs<HEAD_DIM>(is_q ? p.q_weight : p.k_weight, lane) : Bf16x8{};
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= count) break;  // block-uniform
    float x[8];
    if constexpr (SPLIT) {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = sums[e];
    } else {
      to_float8(loaded[t], x);
    }
    if constexpr (NORM) head_norm8<HEAD_DIM>(x, weight, p.eps, p.clip);
    float2 lane_rotation[4];  // frequencies 4 lane .. + 3, two 16-byte reads
    *reinterpret_cast<float4*>(&lane_rotation[0]) = *reinterpret_cast<const float4*>(&rotation[t][4 * lane]);
    *reinterpret_cast<float4*>(&lane_rotation[2]) = *reinterpret_cast<const float4*>(&rotation[t][4 * lane + 2]);
    rope_pairs(x, lane_rotation);
    if (!active[t]) continue;
    const int token = first + t;
    if (is_q) {
      store_pairs<HEAD_DIM>(p.q + (std::int64_t(token) * p.num_q_heads + head) * HEAD_DIM, lane, from_float8(x));
      continue;
    }
    const std::int64_t dense = (std::int64_t(token) * p.num_kv_heads + kv_head) * HEAD_DIM;
    if (p.fp8_cache) {  // k from its float32 value, v as loaded (bf16); dense as the cache holds them
      float k_held[8], v_held[8];
      to_float8(value[t], v_held);
      if (write_cache) {
        const std::int64_t offset = (slot[t] * p.num_kv_heads + kv_head) * HEAD_DIM;
        store_pairs_e4m3<HEAD_DIM>(reinterpret_cast<unsigned char*>(p.key_cache) + offset, lane, x, p.key_scales[kv_head]);
        store_pairs_e4m3<HEAD_DIM>(reinterpret_cast<unsigned char*>(p.value_cache) + offset, lane, v_held,
                                   p.value_scales[kv_head]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) k_held[e] = x[e];
      round_through_e4m3(k_held, p.key_scales[kv_head]);
      round_through_e4m3(v_held, p.value_scales[kv_head]);
      store_pairs<HEAD_DIM>(p.k + dense, lane, from_float8(k_held));
      if (SPLIT || p.qkv.dense) store_pairs<HEAD_DIM>(p.v_out + dense, lane, from_float8(v_held));
      continue;
    }
    const Bf16x8 rotated = from_float8(x);
    store_pairs<HEAD_DIM>(p.k + dense, lane, rotated);
    if (SPLIT || p.qkv.dense) store_pairs<HEAD_DIM>(p.v_out + dense, lane, value[t]);
    if (!write_cache) continue;
    const std::int64_t offset = (slot[t] * p.num_kv_heads + kv_head) * HEAD_DIM;
    store_pairs<HEAD_DIM>(p.key_cache + offset, lane, rotated);
    store_pairs<HEAD_DIM>(p.value_cache + offset, lane, value[t]);
  }
}

template <int HEAD_DIM, bool NORM>
void launch_qk(const QkParams& p, bool split, int tokens, cudaStream_t stream) {  // tokens from first_token
  constexpr int kLanes = HEAD_DIM / 8;
  const int heads = p.num_q_heads + p.num_kv_heads;
  // Up to kMaxThreads per block; fewer when the token has few heads (whole warps always).
  const int threads = round_up(std::min(heads * kLanes, kMaxThreads), kWarp);
  const int heads_per_block = threads / kLanes;
  // Several tokens per block once there are enough blocks without it to fill the GPU many times
  // over (the split form: always one, see kQkTokens).
  const int count = tokens - p.first_token;
  const int tokens_per_block = !split && count >= 1024 ? kQkTokens : 1;
  const dim3 grid((count + tokens_per_block - 1) / tokens_per_block, (heads + heads_per_block - 1) / heads_per_block);
  if (split)
    launch_dependent(qk_norm_rope_kernel<HEAD_DIM, true, NORM>, grid, threads, 0, stream, "qk_norm_rope", p,
                     tokens_per_block, tokens);
  else
    launch_dependent(qk_norm_rope_kernel<HEAD_DIM, false, NORM>, grid, threads, 0, stream, "qk_norm_rope", p,
                     tokens_per_block, tokens);
}

template <int HEAD_DIM>
void launch_qk(const QkParams& p, bool norm, bool split, int tokens, cudaStream_t stream) {
  if (norm)
    launch_qk<HEAD_DIM, true>(p, split, tokens, stream);
  else
    launch_qk<HEAD_DIM, false>(p, split, tokens, stream);
}

}  // namespace

void launch_qk_norm_rope_cache_write(const QkNormRopeArgs& args, cudaStream_t stream) {
  constexpr const char* who = "launch_qk_norm_rope_cache_write";
  check(args.tokens > 0, who, ": tokens must be > 0, got ", args.tokens);
  check(args.num_q_heads > 0 && args.num_kv_heads > 0, who,
        ": head counts must be > 0, got num_q_heads ", args.num_q_heads, ", num_kv_heads ",
        args.num_kv_heads);
  check(args.head_dim == 64 || args.head_dim == 128 || args.head_dim == 256, who,
        ": head_dim must be 64, 128 or 256, got ", args.head_dim);
  check(std::isfinite(args.rope_theta) && args.rope_theta > 0, who,
        ": rope_theta must be finite and > 0, got ", args.rope_theta);
  if (args.qk_norm) check_norm_args(who, args.norm);
  const bool split = args.qkv.is_split();
  if (split) {
    check_pointers(who, {{args.q, "q"}, {args.k, "k"}, {args.v_out, "v_out"}});
    check_split_output(who, "qkv partials", args.qkv,
                std::int64_t(args.tokens) * (args.num_q_heads + 2 * args.num_kv_heads) * args.head_dim);
  } else if (args.qkv.dense)
    check_pointers(who, {{args.q, "q"}, {args.k, "k"}, {args.qkv.dense, "qkv"}, {args.v_out, "v_out"}});
  else
    check_pointers(who, {{args.q, "q"}, {args.k, "k"}, {args.v, "v"}});
  if (args.qk_norm) check_pointers(who, {{args.q_weight, "q_weight"}, {args.k_weight, "k_weight"}});
  check(args.positions != nullptr, who, ": positions is null");
  check((args.key_cache == nullptr) == (args.value_cache == nullptr), who,
        ": key_cache and value_cache must both be given or both be null");
  if (args.key_cache) {
    check_pointers(who, {{args.key_cache, "key_cache"}, {args.value_cache, "value_cache"}});
    check(args.slot_mapping != nullptr, who, ": slot_mapping is null");
  }
  if (args.kv_element == KvElement::Fp8E4M3)
    check(args.key_scales && args.value_scales, who, ": an FP8 KV cache needs its key and value scales");

  check(args.first_token >= 0 && args.first_token < args.tokens, who, ": first_token ", args.first_token,
        " outside 0..", args.tokens - 1);
  const QkParams p{args.q, args.k, args.v, args.qkv, args.v_out, args.q_weight, args.k_weight, args.positions,
                   args.slot_mapping, args.key_cache, args.value_cache, args.kv_element == KvElement::Fp8E4M3,
                   args.key_scales, args.value_scales, args.num_q_heads, args.num_kv_heads,
                   args.norm.eps, args.norm.clip, RopeTurns::of(args.head_dim, args.rope_theta), args.first_token};
  switch (args.head_dim) {
    case 64: return launch_qk<64>(p, args.qk_norm, split, args.tokens, stream);
    case 128: return launch_qk<128>(p, args.qk_norm, split, args.tokens, stream);
    default: return launch_qk<256>(p, args.qk_norm, split, args.tokens, stream);
  }
}

}  // namespace asynct::kernels
