// Few-row dense layers: see skinny_gemm.h for why. The layout of the work:
//   * a CTA (4 warps) owns a tile of kTileN output columns and a range of K (its split); each
//     warp takes one 16-wide K slice of every K tile, for all the tile's columns and rows (up
//     to 64 = kRowTiles m16 tiles), and the warps' sums are added in shared memory at the end;
//   * W and x tiles of kTileK go through a kStages-deep cp.async ring in shared memory; the
//     warps read them with ldmatrix and multiply with mma.sync m16n8k16 (bf16 -> fp32);
//   * the splits of one column tile form a thread-block cluster (Hopper): each CTA leaves its
//     fp32 partial tile in its shared memory and, after a cluster barrier, each adds up a
//     slice of the tile over every CTA's shared memory (DSMEM) and writes it. No global
//     scratch, no counters, no second launch; the sum is spread over all CTAs of the cluster
//     (a first version had the last CTA add partials from global memory alone: its tail grew
//     with the rows and made the kernel slower than cuBLASLt). Without clusters (before sm_90)
//     a product runs unsplit.
#include "kernels/skinny_gemm.h"

#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>

#include "core/error.h"
#include "kernels/cuda_check.h"
#include "kernels/mma_sync.cuh"

namespace asynct::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileN = 64;           // output columns per CTA
constexpr int kTileK = 64;
constexpr int kStages = 4;
constexpr int kPad = 8;                // bf16 per smem row of padding: ldmatrix without conflicts
constexpr int kRowStride = kTileK + kPad;
constexpr int kMaxSplits = 8;          // the portable thread-block cluster size
constexpr int kMinTilesPerSplit = 4;   // shorter splits are all prologue

// How a product is cut: column tiles x splits of K (one cluster per column tile).
struct SkinnyPlan {
  int col_tiles, k_tiles, splits, tiles_per_split;
};

// The split count that balances the CTAs over the multiprocessors best: with T CTAs of equal
// work over S multiprocessors the busiest one runs ceil(T / S) of them, so the efficiency is
// T / (S ceil(T / S)). Ties go to fewer splits (less partial-sum work).
SkinnyPlan make_plan(int in, int out, int sm_count, bool clusters) {
  SkinnyPlan p;
  p.col_tiles = (out + kTileN - 1) / kTileN;
  p.k_tiles = (in + kTileK - 1) / kTileK;
  const int max_splits = clusters ? std::clamp(p.k_tiles / kMinTilesPerSplit, 1, kMaxSplits) : 1;
  double best = -1.0;
  p.splits = 1;
  for (int s = 1; s <= max_splits; ++s) {
    const long long ctas = (long long)p.col_tiles * s;
    const long long busiest = (ctas + sm_count - 1) / sm_count;
    const double efficiency = double(ctas) / double(busiest * sm_count);
    if (efficiency > best + 0.02) {
      best = efficiency;
      p.splits = s;
    }
  }
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
};

template <int kRowTiles>
struct SkinnySmem {
  bf16 w[kStages][kTileN][kRowStride];
  bf16 x[kStages][16 * kRowTiles][kRowStride];
};
// After the main loop the ring holds each warp's fp32 partial tile instead.
template <int kRowTiles>
constexpr bool kPartialsFit = sizeof(float) * kWarps * 16 * kRowTiles * kTileN <= sizeof(SkinnySmem<kRowTiles>);

template <int kRowTiles>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyArgs a) {
  static_assert(kPartialsFit<kRowTiles>);
  static_assert(kTileK == 16 * kWarps, "each warp takes one 16-wide slice of a K tile");
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

  // Each warp multiplies its 16-wide K slice of every tile for all rows and all kTileN columns
  // (kTileN / 8 n8 tiles), so that the x fragments are read from shared memory once per CTA,
  // not once per warp: half the ldmatrix traffic of giving each warp its own columns (the
  // first two versions), which bounded the kernel at 32 rows. The warps' sums are added after
  // the loop.
  constexpr int kColTiles = kTileN / 8;
  float acc[kRowTiles][kColTiles][4] = {};
  const int kk = warp * 16;
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
    const int j = lane / 8, r = lane % 8;
    unsigned af[kRowTiles][4];
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt)
      ldmatrix_x4(af[mt], &sm.x[stage][mt * 16 + (j % 2) * 8 + r][kk + (j / 2) * 8]);
#pragma unroll
    for (int np = 0; np < kColTiles / 2; ++np) {
      // B fragments of 16 columns (two n8 tiles): W rows are columns of y.
      unsigned b[4];
      ldmatrix_x4(b, &sm.w[stage][np * 16 + (j / 2) * 8 + r][kk + (j % 2) * 8]);
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        mma_bf16(acc[mt][2 * np], af[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * np + 1], af[mt], b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done reading the ring: it becomes the warps' partial tiles

  // The warps' partial tiles, [kWarps][kRowsPadded][kTileN]; the accumulator layout of m16n8
  // is c0,c1 at (row g, cols 2q, 2q+1), c2,c3 at row g+8.
  float (*partials)[kRowsPadded][kTileN] = reinterpret_cast<float (*)[kRowsPadded][kTileN]>(smem_raw);
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kColTiles; ++nt) {
      const int col = nt * 8 + 2 * q;
      *reinterpret_cast<float2*>(&partials[warp][mt * 16 + g][col]) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(&partials[warp][mt * 16 + g + 8][col]) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  __syncthreads();

  auto store = [&](int row, int col, float value) {
    const long long at = (long long)row * a.out + col;
    if (a.out_fp32)
      static_cast<float*>(a.y)[at] = value;
    else
      static_cast<bf16*>(a.y)[at] = __float2bfloat16(value);
  };
  // The CTA's tile: the sum over its warps, float4 by float4, left in partials[0] (each float4
  // is read and written by one thread only). With one split it is the output.
  constexpr int kQuadsPerRow = kTileN / 4;
  const int quads = a.rows * kQuadsPerRow;
  for (int i = threadIdx.x; i < quads; i += kThreads) {
    float4 total = reinterpret_cast<const float4*>(&partials[0][0][0])[i];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const float4 v = reinterpret_cast<const float4*>(&partials[w][0][0])[i];
      total.x += v.x;
      total.y += v.y;
      total.z += v.z;
      total.w += v.w;
    }
    if (a.plan.splits == 1) {
      const int row = i / kQuadsPerRow, col = n0 + (i % kQuadsPerRow) * 4;
      const float values[4] = {total.x, total.y, total.z, total.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col + e < a.out) store(row, col + e, values[e]);
    } else {
      reinterpret_cast<float4*>(&partials[0][0][0])[i] = total;
    }
  }
  if (a.plan.splits == 1) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Several splits: the cluster adds the CTAs' tiles through distributed shared memory.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every CTA's tile is summed and visible to the cluster
  // CTA `split` adds up its slice of the tile's float4s over the whole cluster.
  const int splits = a.plan.splits;
  const int per_cta = (quads + splits - 1) / splits;
  for (int i = split * per_cta + threadIdx.x; i < min(quads, (split + 1) * per_cta); i += kThreads) {
    float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float4 v = reinterpret_cast<const float4*>(cluster.map_shared_rank(&partials[0][0][0], s))[i];
      total.x += v.x;
      total.y += v.y;
      total.z += v.z;
      total.w += v.w;
    }
    const int row = i / kQuadsPerRow, col = n0 + (i % kQuadsPerRow) * 4;
    const float values[4] = {total.x, total.y, total.z, total.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col + e < a.out) store(row, col + e, values[e]);
  }
  cluster.sync();  // no CTA leaves (freeing its shared memory) while others still read it
#endif
}

template <int kRowTiles>
void launch_tiles(const SkinnyArgs& a, cudaStream_t stream) {
  const int smem = int(sizeof(SkinnySmem<kRowTiles>));
  allow_dynamic_smem<skinny_gemm_kernel<kRowTiles>>(smem);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(a.plan.col_tiles, a.plan.splits);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = a.plan.splits;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = a.plan.splits > 1 ? 1 : 0;
  ASYNCT_CUDA_CHECK(cudaLaunchKernelEx(&config, skinny_gemm_kernel<kRowTiles>, a));
  check_launch("skinny_gemm");
}

// The multiprocessor count and cluster support of the current device, asked once per device.
struct DeviceTraits {
  int sm_count = 0;
  bool clusters = false;
};
DeviceTraits device_traits() {
  static DeviceTraits cached[64];
  int device = 0;
  ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
  DeviceTraits& t = cached[device % 64];
  if (t.sm_count == 0) {
    int major = 0;
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&t.sm_count, cudaDevAttrMultiProcessorCount, device));
    t.clusters = major >= 9;
  }
  return t;
}

}  // namespace

bool skinny_gemm_supports(const void* x, const void* weight, int rows, int in) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kSkinnyMaxRows && in >= 8 && in % 8 == 0 && aligned(x) && aligned(weight);
}

void launch_skinny_gemm(const bf16* x, const bf16* weight, void* y, int rows, int in, int out,
                        bool out_fp32, cudaStream_t stream) {
  check(skinny_gemm_supports(x, weight, rows, in), "skinny_gemm: unsupported product [", rows, " x ", in,
        "] (rows 1..", kSkinnyMaxRows, ", in a multiple of 8, 16-byte aligned)");
  check(out >= 1 && y != nullptr, "skinny_gemm: no output");
  const DeviceTraits traits = device_traits();
  SkinnyArgs a{x, weight, y, rows, in, out, out_fp32, make_plan(in, out, traits.sm_count, traits.clusters)};
  switch ((rows + 15) / 16) {
    case 1: return launch_tiles<1>(a, stream);
    case 2: return launch_tiles<2>(a, stream);
    case 3: return launch_tiles<3>(a, stream);
    default: return launch_tiles<4>(a, stream);
  }
}

}  // namespace asynct::kernels
