// Fused UClipNorm / RMSNorm kernels (docs/DESIGN.md §4). They are memory-bound, so each makes one pass
// over memory: a thread reads its share of a row with 16-byte loads, keeps it in registers as
// fp32 while the row's sum of squares is reduced, and writes its outputs once.
//
// Rows of hidden <= 1024 get one warp each (several rows per block), so that small hidden
// sizes still fill the GPU; wider rows get a block each, sized so that every thread holds
// VECS vectors of 8 values. At hidden 2048 plain norm uses 128 threads of two vectors each:
// two loads in flight per thread before the reduction stalls it (3.8 TB/s on H200 at 32k rows,
// against 3.5 with one vector per thread). Rows wider than the register-resident limit go
// through a multi-pass fallback that re-reads the row.
//
// The per-head q/k norm + RoPE + cache write is qk_norm_rope.cu.
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
#include "kernels/norms/norms_common.h"

namespace asynct::kernels {
namespace {

using namespace norms;  // kWarp, kMaxThreads, round_up, check_pointers

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

// Norm: out = norm(x). Start: residual = x; out = norm(x) (a stream's first norm, which keeps its
// input). FusedAdd: residual += x; out = norm(residual). PostAttnPreMlp: residual += norm(x,
// first_weight); out = norm(residual).
enum class RowOp { Norm, Start, FusedAdd, PostAttnPreMlp };

struct RowParams {
  const bf16* x = nullptr;             // Norm/FusedAdd: x; PostAttnPreMlp: attn_out
  LinearOutput x_split;                // or x as split partial sums (linear_output.h)
  void* residual = nullptr;            // all but Norm: bf16 or float (the kernels' RES), in place
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
template <int VECS, class T, class Thread>
__device__ __forceinline__ void load_row(const T* row, int vectors, const Thread& t,
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

template <int VECS, class T, class Thread>
__device__ __forceinline__ void store_row(T* row, int vectors, const Thread& t,
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

template <RowOp OP, class RES, int VECS, bool WARP_PER_ROW, bool SPLIT_X>
__global__ void __launch_bounds__(kMaxThreads) row_norm_kernel(RowParams p) {
  RES* const residual = static_cast<RES*>(p.residual);
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
  if constexpr (OP == RowOp::Start) store_row(residual + base, p.vectors, t, x);
  if constexpr (OP == RowOp::FusedAdd || OP == RowOp::PostAttnPreMlp) {
    float r[VECS][8];
    load_row(residual + base, p.vectors, t, r);  // issued before the reduction waits
    if constexpr (OP == RowOp::PostAttnPreMlp) {
      Bf16x8 first_w[VECS];
      load_weights(p.first_weight, p.vectors, t, first_w);
      norm_row(x, first_w, p.vectors, t, row_inv_rms(x, t, partial[0], p), p.clip);
    }
#pragma unroll
    for (int k = 0; k < VECS; ++k) add8(x[k], r[k]);
    // A bf16 residual is stored rounded; the norm below uses the exact fp32 sum either way.
    store_row(residual + base, p.vectors, t, x);
  }
  norm_row(x, w, p.vectors, t, row_inv_rms(x, t, partial[1], p), p.clip);
  store_row(p.out + base, p.vectors, t, x);
}

// Rows too wide to hold in registers: one block per row, re-reading the row from memory (L2
// mostly). Unlike the register path, the fused forms normalise the residual as stored, i.e.
// after its rounding when it is bf16.
template <RowOp OP, class RES>
__global__ void __launch_bounds__(kMaxThreads) row_norm_multipass_kernel(RowParams p) {
  __shared__ float partial[2][kMaxWarps];
  wait_for_prior_grids();
  allow_next_grid();
  RES* const residual = static_cast<RES*>(p.residual);
  const std::int64_t base = std::int64_t(blockIdx.x) * p.vectors * 8;
  constexpr bool kAdds = OP == RowOp::FusedAdd || OP == RowOp::PostAttnPreMlp;

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
    if constexpr (kAdds) {
      if constexpr (OP == RowOp::PostAttnPreMlp)
        apply_norm8(x, p.first_weight + 8 * j, first_inv, p.clip);
      float r[8];
      load8(residual + base + 8 * j, r);
      add8(x, r);
      // Each thread re-reads below exactly the vectors it writes here: no barrier needed.
      store8(residual + base + 8 * j, x);
    }
    if constexpr (OP == RowOp::Start) store8(residual + base + 8 * j, x);
    s += sum_squares8(x);
  }
  const float inv = inv_rms(block_sum(s, partial[1]), p.inv_hidden, p.eps);
  for (int j = threadIdx.x; j < p.vectors; j += blockDim.x) {
    float x[8];
    if constexpr (kAdds) load8(residual + base + 8 * j, x);
    else load8(p.x + base + 8 * j, x);
    apply_norm8(x, p.weight + 8 * j, inv, p.clip);
    store8(p.out + base + 8 * j, x);
  }
}

template <RowOp OP, class RES, int VECS, bool SPLIT_X>
void launch_warp_per_row(const RowParams& p, cudaStream_t stream, const char* who) {
  constexpr int kRowsPerBlock = 4;
  const int blocks = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  launch_dependent(row_norm_kernel<OP, RES, VECS, true, SPLIT_X>, blocks, kRowsPerBlock * kWarp, 0, stream, who, p);
}

template <RowOp OP, class RES, int VECS, bool SPLIT_X>
void launch_block_per_row(const RowParams& p, cudaStream_t stream, const char* who) {
  const int threads = round_up((p.vectors + VECS - 1) / VECS, kWarp);
  launch_dependent(row_norm_kernel<OP, RES, VECS, false, SPLIT_X>, p.rows, threads, 0, stream, who, p);
}

// The widest row each configuration holds in registers: 8 vectors of 8 per thread at most,
// which keeps the fused forms (two such arrays live) clear of spills.
constexpr int kMaxRegisterVectors = kMaxThreads * 8;

template <RowOp OP, class RES>
void launch_row(const RowParams& p, cudaStream_t stream, const char* who) {
  const int v = p.vectors;
  if (v <= kWarp) launch_warp_per_row<OP, RES, 1, false>(p, stream, who);
  else if (v <= 2 * kWarp) launch_warp_per_row<OP, RES, 2, false>(p, stream, who);
  else if (v <= 4 * kWarp) launch_warp_per_row<OP, RES, 4, false>(p, stream, who);
  // FusedAdd already has two loads (x, residual) in flight per vector: one vector per thread
  // measured ~4% faster for it at hidden 2048; the others measured faster with two.
  else if (OP == RowOp::FusedAdd && v <= kMaxThreads) launch_block_per_row<OP, RES, 1, false>(p, stream, who);
  else if (v <= 2 * kMaxThreads) launch_block_per_row<OP, RES, 2, false>(p, stream, who);
  else if (v <= 4 * kMaxThreads) launch_block_per_row<OP, RES, 4, false>(p, stream, who);
  else if (v <= kMaxRegisterVectors) launch_block_per_row<OP, RES, 8, false>(p, stream, who);
  else launch_dependent(row_norm_multipass_kernel<OP, RES>, p.rows, kMaxThreads, 0, stream, who, p);
}

// x from split partial sums (decode-sized products): each thread loads every split of its
// vectors, so one vector per thread up to kMaxThreads vectors keeps the loads in flight wide.
template <RowOp OP, class RES>
void launch_row_from_splits(const RowParams& p, cudaStream_t stream, const char* who) {
  const int v = p.vectors;
  if (v <= kWarp) launch_warp_per_row<OP, RES, 1, true>(p, stream, who);
  else if (v <= 2 * kWarp) launch_warp_per_row<OP, RES, 2, true>(p, stream, who);
  else if (v <= kMaxThreads) launch_block_per_row<OP, RES, 1, true>(p, stream, who);
  else if (v <= 2 * kMaxThreads) launch_block_per_row<OP, RES, 2, true>(p, stream, who);
  else if (v <= 4 * kMaxThreads) launch_block_per_row<OP, RES, 4, true>(p, stream, who);
  else check(false, who, ": rows of ", 8 * v, " values from split partial sums are not supported (at most ",
             32 * kMaxThreads, ")");
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
  launch_row<RowOp::Norm, bf16>(p, stream, who);
}

void launch_norm_keeping_input(const bf16* x, float* residual, const bf16* weight, bf16* out, int rows, int hidden,
                               NormArgs args, cudaStream_t stream) {
  constexpr const char* who = "launch_norm_keeping_input";
  RowParams p = row_params(who, rows, hidden, args,
                           {{x, "x"}, {residual, "residual"}, {weight, "weight"}, {out, "out"}});
  p.x = x;
  p.residual = residual;
  p.weight = weight;
  p.out = out;
  launch_row<RowOp::Start, float>(p, stream, who);
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

template <RowOp OP, class RES>
void launch_with_x(const RowParams& p, cudaStream_t stream, const char* who) {
  if (p.x_split.is_split()) launch_row_from_splits<OP, RES>(p, stream, who);
  else launch_row<OP, RES>(p, stream, who);
}

template <class RES>
void fused_add_norm(const LinearOutput& x, RES* residual, const bf16* weight, bf16* out, int rows, int hidden,
                    NormArgs args, cudaStream_t stream) {
  constexpr const char* who = "launch_fused_add_norm";
  RowParams p = row_params(who, rows, hidden, args, {{residual, "residual"}, {weight, "weight"}, {out, "out"}});
  set_x(p, x, who);
  p.residual = residual;
  p.weight = weight;
  p.out = out;
  launch_with_x<RowOp::FusedAdd, RES>(p, stream, who);
}

template <class RES>
void post_attn_pre_mlp(const LinearOutput& attn_out, RES* residual, const bf16* out_weight, const bf16* next_weight,
                       bf16* mlp_in, int rows, int hidden, NormArgs args, cudaStream_t stream) {
  constexpr const char* who = "launch_post_attn_pre_mlp";
  RowParams p = row_params(who, rows, hidden, args,
                           {{residual, "residual"}, {out_weight, "out_weight"},
                            {next_weight, "next_weight"}, {mlp_in, "mlp_in"}});
  set_x(p, attn_out, who);
  p.residual = residual;
  p.first_weight = out_weight;
  p.weight = next_weight;
  p.out = mlp_in;
  launch_with_x<RowOp::PostAttnPreMlp, RES>(p, stream, who);
}

}  // namespace

void launch_fused_add_norm(const LinearOutput& x, bf16* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream) {
  fused_add_norm(x, residual, weight, out, rows, hidden, args, stream);
}
void launch_fused_add_norm(const LinearOutput& x, float* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream) {
  fused_add_norm(x, residual, weight, out, rows, hidden, args, stream);
}
void launch_fused_add_norm(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                           int rows, int hidden, NormArgs args, cudaStream_t stream) {
  fused_add_norm(LinearOutput::of(x), residual, weight, out, rows, hidden, args, stream);
}

void launch_post_attn_pre_mlp(const LinearOutput& attn_out, bf16* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream) {
  post_attn_pre_mlp(attn_out, residual, out_weight, next_weight, mlp_in, rows, hidden, args, stream);
}
void launch_post_attn_pre_mlp(const LinearOutput& attn_out, float* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream) {
  post_attn_pre_mlp(attn_out, residual, out_weight, next_weight, mlp_in, rows, hidden, args, stream);
}
void launch_post_attn_pre_mlp(const bf16* attn_out, bf16* residual, const bf16* out_weight,
                              const bf16* next_weight, bf16* mlp_in, int rows, int hidden,
                              NormArgs args, cudaStream_t stream) {
  post_attn_pre_mlp(LinearOutput::of(attn_out), residual, out_weight, next_weight, mlp_in, rows, hidden, args,
                    stream);
}


namespace norms {

void check_pointers(const char* who, std::initializer_list<NamedPointer> pointers) {
  for (const auto& [pointer, name] : pointers) {
    check(pointer != nullptr, who, ": ", name, " is null");
    // The kernels move 8 bf16 per 16-byte access.
    check(reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0, who, ": ", name,
          " is not 16-byte aligned");
  }
}

}  // namespace norms

}  // namespace asynct::kernels
