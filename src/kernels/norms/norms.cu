// Fused UClipNorm / RMSNorm kernels (SPEC §3). They are memory-bound, so each makes one pass
// over memory: a thread reads its share of a row with 16-byte loads, keeps it in registers as
// fp32 while the row's sum of squares is reduced, and writes its outputs once.
//
// Rows of hidden <= 1024 get one warp each (several rows per block), so that small hidden
// sizes still fill the GPU; wider rows get a block each, sized so that every thread holds
// VECS vectors of 8 values. At hidden 2048 plain norm uses 128 threads of two vectors each:
// two loads in flight per thread before the reduction stalls it (3.8 TB/s on H200 at 32k rows,
// against 3.5 with one vector per thread). Rows wider than the register-resident limit go
// through a multi-pass fallback that re-reads the row.
#include "kernels/norms/norms.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/norms/head_norm_rope.cuh"

namespace asynct::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / kWarp;

// ---- Pieces shared by every entry point -------------------------------------------------

// Sum over the block (a whole number of warps); every thread gets the total. `partial` is
// kMaxWarps floats used by this call only, so consecutive reductions need no extra barrier.
__device__ __forceinline__ float block_sum(float v, float* partial) {
  v = group_sum<kWarp>(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / kWarp) ? partial[lane] : 0.0f;
  return group_sum<kWarp>(v);
}

__device__ __forceinline__ void add8(float (&x)[8], const float (&y)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] += y[i];
}

// ---- Row norms: norm, fused add + norm, post-attention + pre-MLP ----------------------------

enum class RowOp { Norm, FusedAdd, PostAttnPreMlp };

struct RowParams {
  const bf16* x = nullptr;             // Norm/FusedAdd: x; PostAttnPreMlp: attn_out
  LinearOutput x_split;                // or x as split partial sums (linear_output.h)
  bf16* residual = nullptr;            // FusedAdd, PostAttnPreMlp (updated in place)
  const bf16* first_weight = nullptr;  // PostAttnPreMlp: the norm applied to attn_out
  const bf16* weight = nullptr;        // the norm that produces `out`
  bf16* out = nullptr;
  int rows = 0;
  int vectors = 0;  // hidden / 8
  float inv_hidden = 0.0f;
  float eps = 0.0f;
  float clip = 0.0f;
};

// The share of a row that a thread holds: vectors lane, lane + stride, ... of row `row`, so
// that neighbouring lanes make neighbouring 16-byte accesses.
template <bool WARP_PER_ROW>
struct RowThread {
  int row, lane, stride;
  __device__ RowThread() {
    if constexpr (WARP_PER_ROW) {
      row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
      lane = threadIdx.x % kWarp;
      stride = kWarp;
    } else {
      row = blockIdx.x;
      lane = threadIdx.x;
      stride = blockDim.x;
    }
  }
  __device__ float sum(float v, float* partial) const {
    if constexpr (WARP_PER_ROW) return group_sum<kWarp>(v);
    else return block_sum(v, partial);
  }
};

// Vectors past the row's end are zero, so they add nothing to the sum of squares.
template <int VECS, class Thread>
__device__ __forceinline__ void load_row(const bf16* row, int vectors, const Thread& t,
                                         float (&x)[VECS][8]) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t.lane + k * t.stride;
    if (j < vectors) {
      load8(row + 8 * j, x[k]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[k][i] = 0.0f;
    }
  }
}

// load_row from split partial sums: the row at element offset `base`.
template <int VECS, class Thread>
__device__ __forceinline__ void load_partial_row(const LinearOutput& in, std::int64_t base, int vectors,
                                                 const Thread& t, float (&x)[VECS][8]) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t.lane + k * t.stride;
    load_split8(in, base + 8 * j, j < vectors, x[k]);
  }
}

template <int VECS, class Thread>
__device__ __forceinline__ void store_row(bf16* row, int vectors, const Thread& t,
                                          const float (&x)[VECS][8]) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t.lane + k * t.stride;
    if (j < vectors) store8(row + 8 * j, x[k]);
  }
}

// The row's 1/rms: this thread's sum of squares reduced over the row's threads.
template <int VECS, class Thread>
__device__ __forceinline__ float row_inv_rms(const float (&x)[VECS][8], const Thread& t,
                                             float* partial, const RowParams& p) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) s += sum_squares8(x[k]);
  return inv_rms(t.sum(s, partial), p.inv_hidden, p.eps);
}

// The thread's share of a norm's weights, loaded with the row: at decode row counts a kernel is
// a chain of latencies, and a weight load after the reduction would add one per norm.
template <int VECS, class Thread>
__device__ __forceinline__ void load_weights(const bf16* weight, int vectors, const Thread& t,
                                             Bf16x8 (&w)[VECS]) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t.lane + k * t.stride;
    if (j < vectors) w[k] = load_bf16x8(weight + 8 * j);
  }
}

template <int VECS, class Thread>
__device__ __forceinline__ void norm_row(float (&x)[VECS][8], const Bf16x8 (&w)[VECS],
                                         int vectors, const Thread& t, float inv, float clip) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t.lane + k * t.stride;
    if (j < vectors) apply_norm8(x[k], w[k], inv, clip);
  }
}

template <RowOp OP, int VECS, bool WARP_PER_ROW, bool SPLIT_X>
__global__ void __launch_bounds__(kMaxThreads) row_norm_kernel(RowParams p) {
  __shared__ float partial[2][kMaxWarps];
  const RowThread<WARP_PER_ROW> t;
  // Only whole warps of a warp-per-row grid's last block get here; they use no barrier.
  if (t.row >= p.rows) return;
  const std::int64_t base = std::int64_t(t.row) * p.vectors * 8;

  // A dependent launch waits before any load: loading the weights ahead of the wait kept them
  // live across it (PostAttnPreMlp went from 69 to 86 registers) for no measured gain.
  wait_for_prior_grids();
  allow_next_grid();
  float x[VECS][8];
  Bf16x8 w[VECS];
  if constexpr (SPLIT_X)
    load_partial_row(p.x_split, base, p.vectors, t, x);
  else
    load_row(p.x + base, p.vectors, t, x);
  load_weights(p.weight, p.vectors, t, w);
  if constexpr (OP != RowOp::Norm) {
    float r[VECS][8];
    load_row(p.residual + base, p.vectors, t, r);  // issued before the reduction waits
    if constexpr (OP == RowOp::PostAttnPreMlp) {
      Bf16x8 first_w[VECS];
      load_weights(p.first_weight, p.vectors, t, first_w);
      norm_row(x, first_w, p.vectors, t, row_inv_rms(x, t, partial[0], p), p.clip);
    }
#pragma unroll
    for (int k = 0; k < VECS; ++k) add8(x[k], r[k]);
    // The stored residual is rounded to bf16; the norm below uses the exact fp32 sum.
    store_row(p.residual + base, p.vectors, t, x);
  }
  norm_row(x, w, p.vectors, t, row_inv_rms(x, t, partial[1], p), p.clip);
  store_row(p.out + base, p.vectors, t, x);
}

// Rows too wide to hold in registers: one block per row, re-reading the row from memory (L2
// mostly). Unlike the register path, the fused forms normalise the residual as stored, i.e.
// after its rounding to bf16.
template <RowOp OP>
__global__ void __launch_bounds__(kMaxThreads) row_norm_multipass_kernel(RowParams p) {
  __shared__ float partial[2][kMaxWarps];
  wait_for_prior_grids();
  allow_next_grid();
  const std::int64_t base = std::int64_t(blockIdx.x) * p.vectors * 8;
  const bf16* source = OP == RowOp::Norm ? p.x : p.residual;

  float first_inv = 0.0f;
  if constexpr (OP == RowOp::PostAttnPreMlp) {
    float s = 0.0f;
    for (int j = threadIdx.x; j < p.vectors; j += blockDim.x) {
      float x[8];
      load8(p.x + base + 8 * j, x);
      s += sum_squares8(x);
    }
    first_inv = inv_rms(block_sum(s, partial[0]), p.inv_hidden, p.eps);
  }
  float s = 0.0f;
  for (int j = threadIdx.x; j < p.vectors; j += blockDim.x) {
    float x[8];
    load8(p.x + base + 8 * j, x);
    if constexpr (OP != RowOp::Norm) {
      if constexpr (OP == RowOp::PostAttnPreMlp)
        apply_norm8(x, p.first_weight + 8 * j, first_inv, p.clip);
      float r[8];
      load8(p.residual + base + 8 * j, r);
      add8(x, r);
      // Each thread re-reads below exactly the vectors it writes here: no barrier needed.
      store8(p.residual + base + 8 * j, x);
    }
    s += sum_squares8(x);
  }
  const float inv = inv_rms(block_sum(s, partial[1]), p.inv_hidden, p.eps);
  for (int j = threadIdx.x; j < p.vectors; j += blockDim.x) {
    float x[8];
    load8(source + base + 8 * j, x);
    apply_norm8(x, p.weight + 8 * j, inv, p.clip);
    store8(p.out + base + 8 * j, x);
  }
}

constexpr int round_up(int n, int m) { return (n + m - 1) / m * m; }

template <RowOp OP, int VECS, bool SPLIT_X>
void launch_warp_per_row(const RowParams& p, cudaStream_t stream, const char* who) {
  constexpr int kRowsPerBlock = 4;
  const int blocks = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  launch_dependent(row_norm_kernel<OP, VECS, true, SPLIT_X>, blocks, kRowsPerBlock * kWarp, 0, stream, who, p);
}

template <RowOp OP, int VECS, bool SPLIT_X>
void launch_block_per_row(const RowParams& p, cudaStream_t stream, const char* who) {
  const int threads = round_up((p.vectors + VECS - 1) / VECS, kWarp);
  launch_dependent(row_norm_kernel<OP, VECS, false, SPLIT_X>, p.rows, threads, 0, stream, who, p);
}

// The widest row each configuration holds in registers: 8 vectors of 8 per thread at most,
// which keeps the fused forms (two such arrays live) clear of spills.
constexpr int kMaxRegisterVectors = kMaxThreads * 8;

template <RowOp OP>
void launch_row(const RowParams& p, cudaStream_t stream, const char* who) {
  const int v = p.vectors;
  if (v <= kWarp) launch_warp_per_row<OP, 1, false>(p, stream, who);
  else if (v <= 2 * kWarp) launch_warp_per_row<OP, 2, false>(p, stream, who);
  else if (v <= 4 * kWarp) launch_warp_per_row<OP, 4, false>(p, stream, who);
  // FusedAdd already has two loads (x, residual) in flight per vector: one vector per thread
  // measured ~4% faster for it at hidden 2048; the others measured faster with two.
  else if (OP == RowOp::FusedAdd && v <= kMaxThreads) launch_block_per_row<OP, 1, false>(p, stream, who);
  else if (v <= 2 * kMaxThreads) launch_block_per_row<OP, 2, false>(p, stream, who);
  else if (v <= 4 * kMaxThreads) launch_block_per_row<OP, 4, false>(p, stream, who);
  else if (v <= kMaxRegisterVectors) launch_block_per_row<OP, 8, false>(p, stream, who);
  else launch_dependent(row_norm_multipass_kernel<OP>, p.rows, kMaxThreads, 0, stream, who, p);
}

// x from split partial sums (decode-sized products): each thread loads every split of its
// vectors, so one vector per thread up to kMaxThreads vectors keeps the loads in flight wide.
template <RowOp OP>
void launch_row_from_splits(const RowParams& p, cudaStream_t stream, const char* who) {
  const int v = p.vectors;
  if (v <= kWarp) launch_warp_per_row<OP, 1, true>(p, stream, who);
  else if (v <= 2 * kWarp) launch_warp_per_row<OP, 2, true>(p, stream, who);
  else if (v <= kMaxThreads) launch_block_per_row<OP, 1, true>(p, stream, who);
  else if (v <= 2 * kMaxThreads) launch_block_per_row<OP, 2, true>(p, stream, who);
  else if (v <= 4 * kMaxThreads) launch_block_per_row<OP, 4, true>(p, stream, who);
  else check(false, who, ": rows of ", 8 * v, " values from split partial sums are not supported (at most ",
             32 * kMaxThreads, ")");
}

using NamedPointer = std::pair<const void*, const char*>;

void check_pointers(const char* who, std::initializer_list<NamedPointer> pointers) {
  for (const auto& [pointer, name] : pointers) {
    check(pointer != nullptr, who, ": ", name, " is null");
    // The kernels move 8 bf16 per 16-byte access.
    check(reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0, who, ": ", name,
          " is not 16-byte aligned");
  }
}

RowParams row_params(const char* who, int rows, int hidden, const NormArgs& args,
                     std::initializer_list<NamedPointer> pointers) {
  check(rows > 0, who, ": rows must be > 0, got ", rows);
  check(hidden > 0 && hidden % 8 == 0, who, ": hidden must be a positive multiple of 8, got ",
        hidden);
  check_norm_args(who, args);
  check_pointers(who, pointers);
  RowParams p;
  p.rows = rows;
  p.vectors = hidden / 8;
  p.inv_hidden = 1.0f / float(hidden);
  p.eps = args.eps;
  p.clip = args.clip;
  return p;
}

// ---- Per-head q/k norm + neox RoPE + KV-cache write ----------------------------------------

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
  int num_q_heads, num_kv_heads;
  float eps, clip;
  RopeTurns turns;
  int first_token;
};

// Grid (group of tokens, group of heads): a head is held by HEAD_DIM/8 lanes, 8 values each as
// RoPE pairs (load_pairs, head_norm_rope.cuh); q heads come first, then k heads, whose lanes also
// copy v into the cache.
// A block takes up to kQkTokens consecutive tokens and issues all their loads before it uses
// any (a token's heads are only 4 KB per block). Measured on H200 at 8192 tokens
// (bench/RESULTS.md, fifteenth run): with lanes holding 8 consecutive values the kernel was
// bound by its shuffles and shared-memory reads (L1 95% busy), 75 us per call with one token or
// four per block; in RoPE pairs, 67 us with one token per block and 41 us with four.
// (The split form, which only decode-sized batches use, keeps one token per block: its sums
// of partials would hold 8 floats per token in registers.)
constexpr int kQkTokens = 4;

template <int HEAD_DIM, bool SPLIT>
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
  const Bf16x8 weight = load_pairs<HEAD_DIM>(is_q ? p.q_weight : p.k_weight, lane);
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
    head_norm8<HEAD_DIM>(x, weight, p.eps, p.clip);
    float2 lane_rotation[4];  // frequencies 4 lane .. + 3, two 16-byte reads
    *reinterpret_cast<float4*>(&lane_rotation[0]) = *reinterpret_cast<const float4*>(&rotation[t][4 * lane]);
    *reinterpret_cast<float4*>(&lane_rotation[2]) = *reinterpret_cast<const float4*>(&rotation[t][4 * lane + 2]);
    rope_pairs(x, lane_rotation);
    if (!active[t]) continue;
    const int token = first + t;
    const Bf16x8 rotated = from_float8(x);
    if (is_q) {
      store_pairs<HEAD_DIM>(p.q + (std::int64_t(token) * p.num_q_heads + head) * HEAD_DIM, lane, rotated);
      continue;
    }
    const std::int64_t dense = (std::int64_t(token) * p.num_kv_heads + kv_head) * HEAD_DIM;
    store_pairs<HEAD_DIM>(p.k + dense, lane, rotated);
    if (SPLIT || p.qkv.dense) store_pairs<HEAD_DIM>(p.v_out + dense, lane, value[t]);
    if (!write_cache) continue;
    const std::int64_t offset = (slot[t] * p.num_kv_heads + kv_head) * HEAD_DIM;
    store_pairs<HEAD_DIM>(p.key_cache + offset, lane, rotated);
    store_pairs<HEAD_DIM>(p.value_cache + offset, lane, value[t]);
  }
}

template <int HEAD_DIM>
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
    launch_dependent(qk_norm_rope_kernel<HEAD_DIM, true>, grid, threads, 0, stream, "qk_norm_rope", p, tokens_per_block,
                     tokens);
  else
    launch_dependent(qk_norm_rope_kernel<HEAD_DIM, false>, grid, threads, 0, stream, "qk_norm_rope", p, tokens_per_block,
                     tokens);
}

}  // namespace

void check_norm_args(const char* who, const NormArgs& args) {
  check(std::isfinite(args.eps) && args.eps >= 0, who, ": eps must be finite and >= 0, got ",
        args.eps);
  check(args.clip > 0, who, ": clip must be > 0 (infinity for RMSNorm), got ", args.clip);
}

void launch_norm(const bf16* x, const bf16* weight, bf16* out, int rows, int hidden,
                 NormArgs args, cudaStream_t stream) {
  constexpr const char* who = "launch_norm";
  RowParams p = row_params(who, rows, hidden, args, {{x, "x"}, {weight, "weight"}, {out, "out"}});
  p.x = x;
  p.weight = weight;
  p.out = out;
  launch_row<RowOp::Norm>(p, stream, who);
}

namespace {

// The x operand of a fused norm: dense bf16, or split partial sums (checked like a pointer, and
// for a split count and stride that the kernels can read).
void set_x(RowParams& p, const LinearOutput& x, const char* who) {
  if (!x.is_split()) {
    check_pointers(who, {{x.dense, "x"}});
    p.x = x.dense;
    return;
  }
  check_split_output(who, "x partials", x, std::int64_t(p.rows) * p.vectors * 8);
  p.x_split = x;
}

template <RowOp OP>
void launch_with_x(const RowParams& p, cudaStream_t stream, const char* who) {
  if (p.x_split.is_split()) launch_row_from_splits<OP>(p, stream, who);
  else launch_row<OP>(p, stream, who);
}

}  // namespace

void launch_fused_add_norm(const LinearOutput& x, bf16* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream) {
  constexpr const char* who = "launch_fused_add_norm";
  RowParams p = row_params(who, rows, hidden, args, {{residual, "residual"}, {weight, "weight"}, {out, "out"}});
  set_x(p, x, who);
  p.residual = residual;
  p.weight = weight;
  p.out = out;
  launch_with_x<RowOp::FusedAdd>(p, stream, who);
}

void launch_fused_add_norm(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream) {
  launch_fused_add_norm(LinearOutput::of(x), residual, weight, out, rows, hidden, args, stream);
}

void launch_post_attn_pre_mlp(const LinearOutput& attn_out, bf16* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream) {
  constexpr const char* who = "launch_post_attn_pre_mlp";
  RowParams p = row_params(who, rows, hidden, args,
                           {{residual, "residual"}, {out_weight, "out_weight"},
                            {next_weight, "next_weight"}, {mlp_in, "mlp_in"}});
  set_x(p, attn_out, who);
  p.residual = residual;
  p.first_weight = out_weight;
  p.weight = next_weight;
  p.out = mlp_in;
  launch_with_x<RowOp::PostAttnPreMlp>(p, stream, who);
}

void launch_post_attn_pre_mlp(const bf16* attn_out, bf16* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream) {
  launch_post_attn_pre_mlp(LinearOutput::of(attn_out), residual, out_weight, next_weight, mlp_in, rows, hidden,
                           args, stream);
}

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
  check_norm_args(who, args.norm);
  const bool split = args.qkv.is_split();
  if (split) {
    check_pointers(who, {{args.q, "q"}, {args.k, "k"}, {args.v_out, "v_out"}, {args.q_weight, "q_weight"},
                         {args.k_weight, "k_weight"}});
    check_split_output(who, "qkv partials", args.qkv,
                std::int64_t(args.tokens) * (args.num_q_heads + 2 * args.num_kv_heads) * args.head_dim);
  } else if (args.qkv.dense)
    check_pointers(who, {{args.q, "q"}, {args.k, "k"}, {args.qkv.dense, "qkv"}, {args.v_out, "v_out"},
                         {args.q_weight, "q_weight"}, {args.k_weight, "k_weight"}});
  else
    check_pointers(who, {{args.q, "q"}, {args.k, "k"}, {args.v, "v"}, {args.q_weight, "q_weight"},
                         {args.k_weight, "k_weight"}});
  check(args.positions != nullptr, who, ": positions is null");
  check((args.key_cache == nullptr) == (args.value_cache == nullptr), who,
        ": key_cache and value_cache must both be given or both be null");
  if (args.key_cache) {
    check_pointers(who, {{args.key_cache, "key_cache"}, {args.value_cache, "value_cache"}});
    check(args.slot_mapping != nullptr, who, ": slot_mapping is null");
  }

  check(args.first_token >= 0 && args.first_token < args.tokens, who, ": first_token ", args.first_token,
        " outside 0..", args.tokens - 1);
  const QkParams p{args.q, args.k, args.v, args.qkv, args.v_out, args.q_weight, args.k_weight, args.positions,
                   args.slot_mapping, args.key_cache, args.value_cache, args.num_q_heads, args.num_kv_heads,
                   args.norm.eps, args.norm.clip, RopeTurns::of(args.head_dim, args.rope_theta), args.first_token};
  switch (args.head_dim) {
    case 64: return launch_qk<64>(p, split, args.tokens, stream);
    case 128: return launch_qk<128>(p, split, args.tokens, stream);
    default: return launch_qk<256>(p, split, args.tokens, stream);
  }
}

}  // namespace asynct::kernels
