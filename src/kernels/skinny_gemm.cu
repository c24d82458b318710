// Few-row dense layers: see skinny_gemm.h for why. The layout of the work:
//   * a CTA (4 warps) owns a tile of kTileN output columns and a range of K (its split); each
//     warp owns 16 of the columns for all rows (up to 64 = kRowTiles m16 tiles);
//   * W and x tiles of kTileK go through a kStages-deep cp.async ring in shared memory; the
//     warps read them with ldmatrix and multiply with mma.sync m16n8k16 (bf16 -> fp32);
//   * with one split the CTA writes y; with several, each CTA writes its fp32 partial tile to
//     the workspace, and the last CTA to finish a column tile (a counter per tile) adds the
//     partials, writes y and resets the counter.
#include "kernels/skinny_gemm.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda_check.h"
#include "kernels/mma_sync.cuh"

namespace asynct::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileN = 16 * kWarps;  // output columns per CTA
constexpr int kTileK = 64;
constexpr int kStages = 4;
constexpr int kPad = 8;                // bf16 per smem row of padding: ldmatrix without conflicts
constexpr int kRowStride = kTileK + kPad;
constexpr int kTargetCtas = 4 * 132;   // about four per multiprocessor on an H200-class GPU
constexpr std::size_t kCounterBytes = 64 << 10;  // room for 16384 column tiles

// How a product is cut: column tiles x splits of K.
struct SkinnyPlan {
  int col_tiles, k_tiles, splits, tiles_per_split;
};

SkinnyPlan make_plan(int in, int out) {
  SkinnyPlan p;
  p.col_tiles = (out + kTileN - 1) / kTileN;
  p.k_tiles = (in + kTileK - 1) / kTileK;
  // Enough CTAs to keep every multiprocessor streaming, each split at least two K tiles long.
  const int wanted = std::max(1, kTargetCtas / p.col_tiles);
  p.splits = std::clamp(wanted, 1, std::max(1, p.k_tiles / 2));
  p.tiles_per_split = (p.k_tiles + p.splits - 1) / p.splits;
  p.splits = (p.k_tiles + p.tiles_per_split - 1) / p.tiles_per_split;  // no empty split
  return p;
}

struct SkinnyArgs {
  const bf16* x;
  const bf16* w;
  void* y;
  int rows, in, out;
  bool out_fp32;
  SkinnyPlan plan;
  unsigned* counters;  // [col_tiles]
  float* partials;     // [splits, rows, out]
};

template <int kRowTiles>
struct SkinnySmem {
  bf16 w[kStages][kTileN][kRowStride];
  bf16 x[kStages][16 * kRowTiles][kRowStride];
};

template <int kRowTiles>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<SkinnySmem<kRowTiles>*>(smem_raw);
  constexpr int kRowsPadded = 16 * kRowTiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int col_tile = blockIdx.x, split = blockIdx.y;
  const int n0 = col_tile * kTileN;
  const int k_tile_begin = split * a.plan.tiles_per_split;
  const int k_tiles = min(a.plan.k_tiles, k_tile_begin + a.plan.tiles_per_split) - k_tile_begin;

  // One K tile of W (kTileN rows) and x (kRowsPadded rows) into a ring stage; rows and columns
  // outside the product are zero-filled.
  auto load_stage = [&](int stage, int k_tile) {
    const int k0 = (k_tile_begin + k_tile) * kTileK;
    constexpr int kChunksPerRow = kTileK / 8;
    for (int c = threadIdx.x; c < kTileN * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
      const bool valid = n0 + r < a.out && k0 + kc < a.in;
      cp_async16(&sm.w[stage][r][kc], a.w + (valid ? (long long)(n0 + r) * a.in + k0 + kc : 0), valid);
    }
    for (int c = threadIdx.x; c < kRowsPadded * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
      const bool valid = r < a.rows && k0 + kc < a.in;
      cp_async16(&sm.x[stage][r][kc], a.x + (valid ? (long long)r * a.in + k0 + kc : 0), valid);
    }
  };

  float acc[kRowTiles][2][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt is in; every warp is done with the stage about to be refilled
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    cp_async_commit();
    const int stage = kt % kStages;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      // B fragments of the warp's 16 columns (two n8 tiles): W rows are columns of y.
      unsigned b[4];
      {
        const int j = lane / 8, r = lane % 8;
        ldmatrix_x4(b, &sm.w[stage][warp * 16 + (j / 2) * 8 + r][kk + (j % 2) * 8]);
      }
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        unsigned af[4];
        const int j = lane / 8, r = lane % 8;
        ldmatrix_x4(af, &sm.x[stage][mt * 16 + (j % 2) * 8 + r][kk + (j / 2) * 8]);
        mma_bf16(acc[mt][0], af, b[0], b[1]);
        mma_bf16(acc[mt][1], af, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  // The accumulator layout of m16n8: c0,c1 at (row g, cols 2q, 2q+1), c2,c3 at row g+8.
  const int g = lane / 4, q = lane % 4;
  auto for_each_value = [&](auto&& fn) {
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = mt * 16 + g + (i / 2) * 8;
          const int col = n0 + warp * 16 + nt * 8 + 2 * q + (i % 2);
          if (row < a.rows && col < a.out) fn(row, col, acc[mt][nt][i]);
        }
  };
  auto store = [&](int row, int col, float value) {
    const long long at = (long long)row * a.out + col;
    if (a.out_fp32)
      static_cast<float*>(a.y)[at] = value;
    else
      static_cast<bf16*>(a.y)[at] = __float2bfloat16(value);
  };

  if (a.plan.splits == 1) {
    for_each_value(store);
    return;
  }
  // Several splits: publish this partial, and the last CTA of the column tile adds them up.
  float* mine = a.partials + (long long)split * a.rows * a.out;
  for_each_value([&](int row, int col, float value) { mine[(long long)row * a.out + col] = value; });
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&a.counters[col_tile], 1u) == unsigned(a.plan.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int cols = min(kTileN, a.out - n0);
  for (int idx = threadIdx.x; idx < a.rows * cols; idx += kThreads) {
    const int row = idx / cols, col = n0 + idx % cols;
    float total = 0.0f;
    for (int s = 0; s < a.plan.splits; ++s)
      total += __ldcg(a.partials + ((long long)s * a.rows + row) * a.out + col);  // L2, not a stale L1
    store(row, col, total);
  }
  if (threadIdx.x == 0) a.counters[col_tile] = 0;  // ready for the next product
}

template <int kRowTiles>
void launch_tiles(const SkinnyArgs& a, cudaStream_t stream) {
  const int smem = int(sizeof(SkinnySmem<kRowTiles>));
  allow_dynamic_smem<skinny_gemm_kernel<kRowTiles>>(smem);
  dim3 grid(a.plan.col_tiles, a.plan.splits);
  skinny_gemm_kernel<kRowTiles><<<grid, kThreads, smem, stream>>>(a);
  check_launch("skinny_gemm");
}

}  // namespace

bool skinny_gemm_supports(const void* x, const void* weight, int rows, int in) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kSkinnyMaxRows && in >= 8 && in % 8 == 0 && aligned(x) && aligned(weight);
}

std::size_t skinny_gemm_max_workspace_bytes() {
  // With several splits, splits x col_tiles <= kTargetCtas, so splits x out <= kTargetCtas x
  // kTileN: one bound for every shape, so the workspace is allocated once (CUDA graphs keep
  // its address).
  return kCounterBytes + std::size_t(kTargetCtas) * kTileN * kSkinnyMaxRows * sizeof(float);
}

std::size_t skinny_gemm_workspace_bytes(int rows, int in, int out) {
  const SkinnyPlan p = make_plan(in, out);
  return kCounterBytes + (p.splits > 1 ? std::size_t(p.splits) * rows * out * sizeof(float) : 0);
}

void launch_skinny_gemm(const bf16* x, const bf16* weight, void* y, int rows, int in, int out,
                        bool out_fp32, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream) {
  check(skinny_gemm_supports(x, weight, rows, in), "skinny_gemm: unsupported product [", rows, " x ", in,
        "] (rows 1..", kSkinnyMaxRows, ", in a multiple of 8, 16-byte aligned)");
  check(out >= 1 && y != nullptr, "skinny_gemm: no output");
  const SkinnyPlan plan = make_plan(in, out);
  check(std::size_t(plan.col_tiles) * sizeof(unsigned) <= kCounterBytes, "skinny_gemm: ", out,
        " output columns exceed the counter space");
  check(workspace != nullptr && workspace_bytes >= skinny_gemm_workspace_bytes(rows, in, out),
        "skinny_gemm: workspace of ", workspace_bytes, " bytes, needs ", skinny_gemm_workspace_bytes(rows, in, out));
  SkinnyArgs a{x, weight, y, rows, in, out, out_fp32, plan, static_cast<unsigned*>(workspace),
               reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + kCounterBytes)};
  switch ((rows + 15) / 16) {
    case 1: return launch_tiles<1>(a, stream);
    case 2: return launch_tiles<2>(a, stream);
    case 3: return launch_tiles<3>(a, stream);
    default: return launch_tiles<4>(a, stream);
  }
}

}  // namespace asynct::kernels
