// Few-row dense layers: see skinny_gemm.h for why. The layout of the work:
//   * a CTA owns a tile of kTileN output columns (kTileN rows of W) and a range of K (its
//     split). A producer warp streams W and x through a ring of shared-memory stages with
//     bulk copies (cp.async.bulk, one per row segment of kTileK), counted on mbarriers, as the
//     decode kernel streams the KV cache: the bytes in flight do not depend on what the other
//     warps are doing, which is what reading at the memory's rate needs (the earlier
//     cp.async versions, where every thread issued copies behind a barrier per stage, read W
//     at 0.5-0.7 of the copy ceiling at 32 rows);
//   * four consumer warps each multiply 32 W rows (two m16 tiles of the mma's A operand) by all
//     x rows (n8 tiles of its B operand) over the stage's K, with ldmatrix and mma.sync
//     m16n8k16 (bf16 -> fp32), and release the stage;
//   * the splits of one column tile form a thread-block cluster (Hopper): each CTA leaves its
//     fp32 partial tile in its shared memory and, after a cluster barrier, each adds up a
//     slice of the tile over every CTA's shared memory (DSMEM) and writes it. No global
//     scratch, no counters, no second launch. Without clusters (before sm_90) a product runs
//     unsplit, and the bulk copies are made by the producer's threads (bulk_copy.cuh).
#include "kernels/skinny_gemm.h"

#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>

#include "core/error.h"
#include "kernels/bulk_copy.cuh"
#include "kernels/cuda_check.h"
#include "kernels/mma_sync.cuh"

namespace asynct::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kConsumerWarps = 4;
constexpr int kThreads = 32 * (kConsumerWarps + 1);  // and the producer warp
constexpr int kTileN = 32 * kConsumerWarps;         // output columns per CTA
constexpr int kTileK = 128;                          // K per stage
// A stage row (one row segment of W or x) padded by 16 bytes: the 8 rows an ldmatrix reads
// then start in 8 different bank groups.
constexpr int kRowBytes = kTileK * 2 + 16;
// The ring's shared memory per CTA: two CTAs per SM, so that one's start and end overlap the
// other's streaming.
constexpr int kRingBudget = 110 * 1024;
constexpr int kMaxStages = 4;
constexpr int kMaxSplits = 8;         // the portable thread-block cluster size
constexpr int kMinTilesPerSplit = 2;  // shorter splits are all prologue

template <int kXTiles>  // x rows, padded to 16 * kXTiles
struct Ring {
  static constexpr int kStageRows = kTileN + 16 * kXTiles;  // W rows, then x rows
  static constexpr int kStageBytes = kStageRows * kRowBytes;
  static constexpr int kStages = std::min(kMaxStages, kRingBudget / kStageBytes);
  static constexpr int kBytes = kStages * kStageBytes;
  static_assert(kStages >= 2, "the ring needs two stages");
  // After the main loop the ring holds the CTA's fp32 partial tile [rows][kTileN] instead.
  static_assert(sizeof(float) * 16 * kXTiles * kTileN <= kBytes, "the partial tile fits the ring");
};

// How a product is cut: column tiles x splits of K (one cluster per column tile).
struct SkinnyPlan {
  int col_tiles, k_tiles, splits, tiles_per_split;
};

// The split count that balances the CTAs over the multiprocessors best: with T CTAs of equal
// work over S slots (two CTAs per multiprocessor) the busiest slot runs ceil(T / S) of them, so
// the efficiency is T / (S ceil(T / S)). Ties go to fewer splits (less partial-sum work).
SkinnyPlan make_plan(int in, int out, int sm_count, bool clusters) {
  SkinnyPlan p;
  p.col_tiles = (out + kTileN - 1) / kTileN;
  p.k_tiles = (in + kTileK - 1) / kTileK;
  const int slots = 2 * sm_count;
  const int max_splits = clusters ? std::clamp(p.k_tiles / kMinTilesPerSplit, 1, kMaxSplits) : 1;
  double best = -1.0;
  p.splits = 1;
  for (int s = 1; s <= max_splits; ++s) {
    const long long ctas = (long long)p.col_tiles * s;
    const long long busiest = (ctas + slots - 1) / slots;
    const double efficiency = double(ctas) / double(busiest * slots);
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

// The producer warp: one bulk copy per row segment of the stage (W rows past `out` and x rows
// past `rows` are not copied: they only meet outputs that are not stored).
template <int kXTiles>
__device__ void produce_stages(const SkinnyArgs& a, unsigned char* ring, SharedBarrier* full,
                               SharedBarrier* empty, int n0, int k_tile_begin, int k_tiles) {
  using R = Ring<kXTiles>;
  const int lane = threadIdx.x & 31;
  const int w_rows = min(kTileN, a.out - n0);
  for (int t = 0; t < k_tiles; ++t) {
    const int s = t % R::kStages;
    if (t >= R::kStages) empty[s].wait((t / R::kStages - 1) & 1);
    const int k0 = (k_tile_begin + t) * kTileK;
    const unsigned bytes = unsigned(min(kTileK, a.in - k0)) * 2;
    unsigned char* stage = ring + s * R::kStageBytes;
    for (int r = lane; r < w_rows + a.rows; r += 32) {
      const bf16* src = r < w_rows ? a.w + (long long)(n0 + r) * a.in + k0
                                   : a.x + (long long)(r - w_rows) * a.in + k0;
      const int smem_row = r < w_rows ? r : kTileN + (r - w_rows);
      bulk_copy_to_shared(stage + smem_row * kRowBytes, src, bytes, full[s]);
    }
    __syncwarp();  // the copies are issued (or, emulated, done) before the arrival
    if (lane == 0) full[s].arrive_expecting(unsigned(w_rows + a.rows) * bytes);
  }
}

template <int kXTiles>
__global__ void __launch_bounds__(kThreads, 2) skinny_gemm_kernel(SkinnyArgs a) {
  using R = Ring<kXTiles>;
  constexpr int kXBlocks = 2 * kXTiles;  // n8 tiles of x rows
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ SharedBarrier full[R::kStages], empty[R::kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int col_tile = blockIdx.x, split = blockIdx.y;
  const int n0 = col_tile * kTileN;
  const int k_tile_begin = split * a.plan.tiles_per_split;
  const int k_tiles = min(a.plan.k_tiles, k_tile_begin + a.plan.tiles_per_split) - k_tile_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) full[s].init(1), empty[s].init(kConsumerWarps);
    SharedBarrier::fence_init();
  }
  __syncthreads();

  // Accumulators: [W row tile][x row n8 tile]; the m16n8 layout puts c0,c1 at (W row g, x rows
  // 2q, 2q+1) and c2,c3 at W row g + 8.
  float acc[2][kXBlocks][4] = {};
  if (warp == kConsumerWarps) {
    produce_stages<kXTiles>(a, ring, full, empty, n0, k_tile_begin, k_tiles);
  } else {
    // ldmatrix lane offsets: A (W rows; row = lane & 15, k half = lane >> 4) and B (x rows, not
    // transposed: row = (lane & 7) + 8 (lane >> 4), k half = (lane >> 3) & 1).
    const int a_row = warp * 32 + (lane & 15), a_k = (lane >> 4) * 8;
    const int b_row = kTileN + (lane & 7) + ((lane >> 4) << 3), b_k = ((lane >> 3) & 1) * 8;
    for (int t = 0; t < k_tiles; ++t) {
      const int s = t % R::kStages;
      full[s].wait((t / R::kStages) & 1);
      const unsigned char* stage = ring + s * R::kStageBytes;
      const int k_valid = min(kTileK, a.in - (k_tile_begin + t) * kTileK);  // a multiple of 8
#pragma unroll
      for (int ks = 0; ks < kTileK / 16; ++ks) {
        if (16 * ks >= k_valid) break;
        unsigned af[2][4], bf[kXTiles][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          ldmatrix_x4(af[mt], stage + (a_row + 16 * mt) * kRowBytes + (16 * ks + a_k) * 2);
#pragma unroll
        for (int xt = 0; xt < kXTiles; ++xt)
          ldmatrix_x4(bf[xt], stage + (b_row + 16 * xt) * kRowBytes + (16 * ks + b_k) * 2);
        if (16 * ks + 8 >= k_valid) {
          // Only 8 of the 16 k are in the product: zero the other half on both sides (the
          // stage holds stale bytes there, which could be anything).
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) af[mt][2] = af[mt][3] = 0u;
#pragma unroll
          for (int xt = 0; xt < kXTiles; ++xt) bf[xt][1] = bf[xt][3] = 0u;
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int xt = 0; xt < kXTiles; ++xt) {
            mma_bf16(acc[mt][2 * xt], af[mt], bf[xt][0], bf[xt][1]);
            mma_bf16(acc[mt][2 * xt + 1], af[mt], bf[xt][2], bf[xt][3]);
          }
      }
      __syncwarp();  // every lane's reads of the stage are done
      if (lane == 0) empty[s].arrive();
    }
  }
  __syncthreads();  // every stage has landed and been read: the ring becomes the partial tile

  // The CTA's partial tile, [16 kXTiles x rows][kTileN] fp32.
  float (*partial)[kTileN] = reinterpret_cast<float (*)[kTileN]>(ring);
  if (warp < kConsumerWarps) {
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int xb = 0; xb < kXBlocks; ++xb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          partial[xb * 8 + 2 * q + (e & 1)][warp * 32 + mt * 16 + g + 8 * (e >> 1)] = acc[mt][xb][e];
  }
  __syncthreads();

  auto store = [&](int row, int col, float value) {
    const long long at = (long long)row * a.out + col;
    if (a.out_fp32)
      static_cast<float*>(a.y)[at] = value;
    else
      static_cast<bf16*>(a.y)[at] = __float2bfloat16(value);
  };
  // Writes the sums of float4 number i of the tile (row i / kQuadsPerRow).
  constexpr int kQuadsPerRow = kTileN / 4;
  auto store_quad = [&](int i, float4 v) {
    const int row = i / kQuadsPerRow, col = n0 + (i % kQuadsPerRow) * 4;
    const float values[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col + e < a.out) store(row, col + e, values[e]);
  };
  const int quads = a.rows * kQuadsPerRow;
  if (a.plan.splits == 1) {
    for (int i = threadIdx.x; i < quads; i += kThreads)
      store_quad(i, reinterpret_cast<const float4*>(&partial[0][0])[i]);
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Several splits: the cluster adds the CTAs' tiles through distributed shared memory.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every CTA's tile is written and visible to the cluster
  // CTA `split` adds up its slice of the tile's float4s over the whole cluster.
  const int splits = a.plan.splits;
  const int per_cta = (quads + splits - 1) / splits;
  for (int i = split * per_cta + threadIdx.x; i < min(quads, (split + 1) * per_cta); i += kThreads) {
    float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float4 v = reinterpret_cast<const float4*>(cluster.map_shared_rank(&partial[0][0], s))[i];
      total.x += v.x;
      total.y += v.y;
      total.z += v.z;
      total.w += v.w;
    }
    store_quad(i, total);
  }
  cluster.sync();  // no CTA leaves (freeing its shared memory) while others still read it
#endif
}

template <int kXTiles>
void launch_tiles(const SkinnyArgs& a, cudaStream_t stream) {
  const int smem = Ring<kXTiles>::kBytes;
  allow_dynamic_smem<skinny_gemm_kernel<kXTiles>>(smem);
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
  ASYNCT_CUDA_CHECK(cudaLaunchKernelEx(&config, skinny_gemm_kernel<kXTiles>, a));
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
