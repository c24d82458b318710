// One file past 500 lines: the kernel, its two consumer forms (mma.sync, wgmma), its plan and
// its three entry points share the ring layout and the plan, which no split by job would keep apart.
//
// Few-row dense layers: see skinny_gemm.h for why. The layout of the work:
//   * a CTA owns a tile of 128 or 64 output columns (that many rows of W) and a range of K (its
//     split). The plan picks the width: 64-column tiles double the CTAs of a narrow product (o
//     and down, 2048 columns: 16 tiles of 128) without more splits for the reader to add. A
//     producer thread streams W and x through a ring of shared-memory stages, one
//     2-D tensor copy (TMA) per operand and stage, counted on mbarriers: the bytes in flight do
//     not depend on what the other warps are doing, which is what reading at the memory's rate
//     needs. The copies zero-fill past the edges of W and x (no tail cases) and store 128-byte
//     rows swizzled (16-byte chunk c of row r at c ^ (r % 8)), so ldmatrix reads them without
//     bank conflicts. (Earlier versions: every thread issuing cp.async behind a barrier per
//     stage read W at 0.5-0.7 of the copy ceiling at 32 rows; one 1-D bulk copy per 256-byte
//     row segment, 0.1-0.44: the copy engine issues small copies slowly.)
//   * the kernel is launched as a dependent launch (dependent_launch.cuh): W does not depend on
//     the kernel before it, so the producer fills the whole ring with W before it waits for
//     that kernel, and only then copies x. At decode sizes a stage ring holds most of a CTA's
//     share of W, so the weight stream overlaps the previous kernel and the launch;
//   * four consumer warps multiply the stage's W rows by all x rows and release the stage, in
//     one of two forms (MmaSyncConsumer, WgmmaConsumer below): each warp with ldmatrix and
//     mma.sync m16n8k16 (bf16 -> fp32) over 32 W rows, or (Hopper, for more than 16 rows of x)
//     the four as one warpgroup with wgmma reading W and x straight from shared memory;
//   * with several splits, either each CTA writes its fp32 partial tile to its split's matrix
//     and the kernel that reads y adds the splits (launch_skinny_gemm_partials: no epilogue),
//     or (launch_skinny_gemm) each CTA stores its tile in a global workspace and counts itself
//     on its column tile's counter; the last to arrive adds the tiles up in split order (so the
//     result does not depend on which CTA came last) and resets the counter. That epilogue, like
//     the cluster reduction of an earlier version, costs ~4 us at 32 rows: one CTA's loads of
//     every split's tile form a chain of L2 round trips.
// Before sm_90 the producer warp copies the tiles itself (same layout, same zero fill).
#include "kernels/gemm/skinny_gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include <cuda.h>  // CUtensorMap

#include "core/error.h"
#include "kernels/common/bf16.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_info.h"
#include "kernels/common/last_arrival.cuh"
#include "kernels/common/mma_sync.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/common/tuning.h"
#include "kernels/common/wgmma.cuh"

namespace asynct::kernels {
namespace {

// Four consumer warps: eight (two along each stage's K in a 128-column tile, four in a 64) made
// the decode step slower (AsyncT decode_heavy_b32 step 2.115 against 2.074 ms, bench/RESULTS.md).
constexpr int kConsumerWarps = 4;
constexpr int kThreads = 32 * (kConsumerWarps + 1);  // and the producer warp
constexpr int kWarpRows = 32;                        // W rows per consumer warp: two m16 tiles
constexpr int kWideTileN = kWarpRows * kConsumerWarps;  // output columns per CTA: 128 or 64
constexpr int kNarrowTileN = kWideTileN / 2;
constexpr int kTileK = 64;  // K per stage: 128-byte rows
constexpr int kRowBytes = kTileK * 2;
// The ring's shared memory per CTA. A product with at least as many CTAs as multiprocessors
// runs two per multiprocessor (110 KB each), so that one's start and end overlap the other's
// streaming; one with fewer runs one per multiprocessor with a ring twice as deep, which also
// doubles what the dependent launch prefetches. 1 KB of it aligns the ring for the swizzled
// copies.
constexpr int kRingAlign = 1024;
constexpr int kSmallRingBytes = 110 * 1024;
constexpr int kLargeRingBytes = 200 * 1024;  // Hopper's 227 KB per CTA; not taken before sm_90
// At most 12 stages: 16 (192 KB in flight for a narrow product's CTA instead of 144) made the
// decode step 0.06 ms slower (2.136 against 2.075 ms, bench/RESULTS.md).
constexpr int kMaxStages = 12;
constexpr int kMaxSplits = kMaxLinearSplits;
constexpr int kMinTilesPerSplit = 2;  // shorter splits are all prologue

// How a tile's consumer warps share it: kRowWarps side by side over its W rows, kKWarps along
// each stage's K.
template <int kTileN>
struct TileWarps {
  static_assert(kTileN == kWideTileN || kTileN == kNarrowTileN, "a column tile is 128 or 64 wide");
  static constexpr int kRowWarps = kTileN / kWarpRows;
  static constexpr int kKWarps = kConsumerWarps / kRowWarps;
  static_assert((kTileK / 16) % kKWarps == 0, "every K warp takes as many k16 steps");
};

template <int kTileN, int kXTiles, int kCtasPerSm>  // column tile width; x rows, padded to 16 * kXTiles
struct Ring {
  static constexpr int kBudget = kCtasPerSm == 2 ? kSmallRingBytes : kLargeRingBytes;
  static constexpr int kStageRows = kTileN + 16 * kXTiles;  // W rows, then x rows
  static constexpr int kStageBytes = kStageRows * kRowBytes;
  static constexpr int kStages = std::min(kMaxStages, (kBudget - kRingAlign) / kStageBytes);
  static constexpr int kBytes = kStages * kStageBytes;
  static_assert(kStageBytes % kRingAlign == 0, "every stage starts on a swizzle period");
  static_assert(kStages >= 2, "the ring needs two stages");
  // After the main loop the ring holds the CTA's fp32 partial tile [rows][kTileN] instead.
  static_assert(sizeof(float) * 16 * kXTiles * kTileN <= kBytes, "the partial tile fits the ring");
};

// How a product is cut: column tiles (of tile_n columns) x splits of K, and the CTAs per
// multiprocessor.
struct SkinnyPlan {
  int tile_n, col_tiles, k_tiles, splits, tiles_per_split;
  bool large_ring;
  bool wgmma;  // wgmma allowed (Hopper, not forced off); launch_ring picks it by the rows
};

// One CTA's partial tile in the workspace: [16 x 4 rows][kWideTileN] fp32 (the widest x and tile).
constexpr std::size_t kPartialTileFloats = std::size_t(16 * 4) * kWideTileN;

// The cost model behind the plan, in units of one 64-row W tile (64 x kTileK, 8 KB). A CTA
// streams its tiles at its own pace (its consumer warps' latency bounds it: ~33 GB/s at 32
// rows, gate_up's 96 CTAs in 19.2 us), an SM holds one CTA with a deep ring or, when there are
// more CTAs than SMs, two; so the time is the larger of one slot's tiles (over the waves) and
// all tiles over what the memory feeds, kMemoryCtas CTAs' worth (~3.9 TB/s / 33 GB/s), plus a
// start-up per wave and every split product's partial-sum epilogue. Measured on the H200
// (bench/RESULTS.md): gate_up at 32 rows runs faster as 192 CTAs of 64 columns, two
// on 60 SMs, than as 96 of 128 (decode step 2.098 against 2.142 ms), which a model of the
// busiest SM's bytes got wrong.
constexpr double kMemoryCtas = 118.0;
constexpr double kCtaCostUnits = 8.0;
constexpr double kSplitCostUnits = 8.0;
// With the splits left to the reading kernel there is no epilogue; what remains per split is
// the tile the CTA writes and the reader loads (16 KB per 32 rows and 128 columns, about one
// 16 KB W tile's worth of traffic through L2, half of it on the critical path).
constexpr double kPartialCostUnits = 1.0;
// ... and the reader loads every split of every value it reads: past 4 splits that costs the
// reader more than the product gains (decode_heavy_b32 on the H200, every split product forced
// to 2 / 4 / 8 splits: AsyncT step 2.385 / 2.184 / 2.218 ms).
constexpr int kMaxPartialSplits = 4;

// room_splits: how many splits the scratch can hold; partial_out: the splits are left to the
// reading kernel (no epilogue). The plan depends on the product's shape, never on its rows.
SkinnyPlan make_plan(int in, int out, int sm_count, bool large_rings, int room_splits, bool partial_out) {
  const KernelTuning::Skinny forced = kernel_tuning().skinny;
  const int k_tiles = (in + kTileK - 1) / kTileK;
  const int max_splits = std::clamp(std::min(k_tiles / kMinTilesPerSplit, room_splits), 1, kMaxSplits);
  SkinnyPlan p{};
  double best = 0.0;
  for (int tile_n : {kWideTileN, kNarrowTileN}) {  // on a tie, the wide tile (fewer CTAs)
    if (forced.tile_n > 0 && tile_n != (forced.tile_n <= kNarrowTileN ? kNarrowTileN : kWideTileN)) continue;
    const int col_tiles = (out + tile_n - 1) / tile_n;
    for (int s = 1; s <= max_splits; ++s) {
      if (forced.splits > 0 && s != std::clamp(forced.splits, 1, max_splits)) continue;
      const long long ctas = (long long)col_tiles * s;
      const long long slots = ctas <= sm_count ? sm_count : 2LL * sm_count;
      const long long waves = (ctas + slots - 1) / slots;
      const double cta_units = double((k_tiles + s - 1) / s) * tile_n / kNarrowTileN;
      const double split_cost = partial_out ? kPartialCostUnits * s : (s > 1 ? kSplitCostUnits : 0.0);
      const double cost = std::max(double(waves) * cta_units, double(ctas) * cta_units / kMemoryCtas) +
                          double(waves) * kCtaCostUnits + split_cost;
      if (p.tile_n == 0 || cost < best) {
        best = cost;
        p = SkinnyPlan{tile_n, col_tiles, k_tiles, s, 0, false, false};
      }
    }
  }
  p.tiles_per_split = (p.k_tiles + p.splits - 1) / p.splits;
  p.splits = (p.k_tiles + p.tiles_per_split - 1) / p.tiles_per_split;  // no empty split
  p.large_ring = large_rings && (long long)p.col_tiles * p.splits <= sm_count;
  // wgmma is Hopper's alone (a later GPU runs this build's tensor copies, not its wgmma).
  p.wgmma = large_rings && current_device_info().major == 9 && forced.wgmma != KernelTuning::Skinny::kOff;
  return p;
}

struct SkinnyArgs {
  CUtensorMap w_map;  // W [out][in], boxes of kTileN x kTileK (sm_90)
  CUtensorMap x_map;  // x [rows][in], boxes of 16 kXTiles x kTileK (sm_90)
  const bf16* x;
  const bf16* w;
  void* y;
  float* partials;     // [col_tiles][splits] partial tiles (splits > 1)
  unsigned* counters;  // [col_tiles], zero between launches (splits > 1)
  float* split_out;    // or, when set: split s writes split_out[s * split_stride + row * out + col]
  long long split_stride;
  bool glu;            // or: W is a merged gate/up projection (kGluBlock order) and y = SiLU(gate) * up
  int rows, in, out;
  bool out_fp32;
  SkinnyPlan plan;
};

#ifdef ASYNCT_BULK_COPY_EMULATED
// Before sm_90: the producer warp copies a box itself, with the tensor copy's layout and zero
// fill ([box_rows][kTileK] of the [rows][in] matrix at (row0, k0)).
__device__ void copy_box(bf16* dst, const bf16* src, int rows, int in, int row0, int k0,
                         int box_rows) {
  constexpr int kChunks = kTileK / 8;
  for (int i = threadIdx.x & 31; i < box_rows * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks, k = k0 + 8 * c;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < rows && k < in) v = *reinterpret_cast<const uint4*>(src + (long long)(row0 + r) * in + k);
    *reinterpret_cast<uint4*>(dst + swizzle<kTileK>(r, c)) = v;
  }
}
#endif

// The producer: per stage, one tensor copy of W's tile and one of x's (lane 0 alone). The
// first ring's worth of W is requested before waiting for the kernel that writes x.
template <int kTileN, int kXTiles, int kCtasPerSm>
__device__ void produce_stages(const SkinnyArgs& a, unsigned char* ring, SharedBarrier* full,
                               SharedBarrier* empty, int n0, int k_tile_begin, int k_tiles) {
  using R = Ring<kTileN, kXTiles, kCtasPerSm>;
  const int lane = threadIdx.x & 31;
  constexpr int kXOffset = kTileN * kTileK;  // elements: W rows, then x rows
  auto stage_of = [&](int t) { return reinterpret_cast<bf16*>(ring + (t % R::kStages) * R::kStageBytes); };
  const int prefetched = min(k_tiles, R::kStages);
#ifndef ASYNCT_BULK_COPY_EMULATED
  const std::uint64_t read_once = l2_evict_first_policy();  // W: each CTA reads its part once
  if (lane == 0) {
    for (int t = 0; t < prefetched; ++t) {
      full[t].arrive_expecting(unsigned(R::kStageBytes));  // W's and x's bytes; zero fill counts
      tensor_copy_2d_to_shared(stage_of(t), &a.w_map, (k_tile_begin + t) * kTileK, n0, full[t], read_once);
    }
  }
  wait_for_prior_grids();
  allow_next_grid();
  if (lane == 0)
    for (int t = 0; t < prefetched; ++t)
      tensor_copy_2d_to_shared(stage_of(t) + kXOffset, &a.x_map, (k_tile_begin + t) * kTileK, 0, full[t]);
  for (int t = prefetched; t < k_tiles; ++t) {
    const int s = t % R::kStages;
    empty[s].wait((t / R::kStages - 1) & 1);
    if (lane == 0) {
      const int k0 = (k_tile_begin + t) * kTileK;
      full[s].arrive_expecting(unsigned(R::kStageBytes));
      tensor_copy_2d_to_shared(stage_of(t), &a.w_map, k0, n0, full[s], read_once);
      tensor_copy_2d_to_shared(stage_of(t) + kXOffset, &a.x_map, k0, 0, full[s]);
    }
  }
#else
  (void)prefetched;
  for (int t = 0; t < k_tiles; ++t) {
    const int s = t % R::kStages;
    if (t >= R::kStages) empty[s].wait((t / R::kStages - 1) & 1);
    const int k0 = (k_tile_begin + t) * kTileK;
    copy_box(stage_of(t), a.w, a.out, a.in, n0, k0, kTileN);
    copy_box(stage_of(t) + kXOffset, a.x, a.rows, a.in, 0, k0, 16 * kXTiles);
    __syncwarp();
    if (lane == 0) full[s].arrive_expecting(unsigned(R::kStageBytes));
  }
#endif
}

// The consumer warps' main loop and their partial tile, in two forms (a policy of the kernel):
// consume() reads every stage of the CTA's split out of the ring and releases it;
// write_partial() leaves the CTA's fp32 tile [16 kXTiles x rows][kTileN] in the ring (it holds
// CTA-wide barriers, so every thread calls it).

// mma.sync (sm_80 and up): each warp multiplies 32 W rows (two m16 tiles of the mma's A operand,
// through ldmatrix) by all x rows (n8 tiles of its B operand) over its k16 steps of each stage.
// A 64-column tile has two warps across its rows and two along K, whose sums meet in the
// partial tile.
template <int kTileN, int kXTiles, int kStages, int kStageBytes>
struct MmaSyncConsumer {
  using Warps = TileWarps<kTileN>;
  static constexpr int kXBlocks = 2 * kXTiles;  // n8 tiles of x rows
  // [W row tile][x row n8 tile]; the m16n8 layout puts c0,c1 at (W row g, x rows 2q, 2q+1) and
  // c2,c3 at W row g + 8.
  float acc[2][kXBlocks][4] = {};

  __device__ void consume(const unsigned char* ring, SharedBarrier* full, SharedBarrier* empty, int k_tiles) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    // ldmatrix lane offsets: A (W rows; row = lane & 15, k half = lane >> 4) and B (x rows, not
    // transposed: row = (lane & 7) + 8 (lane >> 4), k half = (lane >> 3) & 1).
    // A 64-column tile: warps w and w + 2 own the same rows, and k16 steps of one parity.
    const int row_warp = warp % Warps::kRowWarps, k_warp = warp / Warps::kRowWarps;
    const int a_row = row_warp * kWarpRows + (lane & 15), a_half = lane >> 4;
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_half = (lane >> 3) & 1;
    for (int t = 0; t < k_tiles; ++t) {
      const int s = t % kStages;
      full[s].wait((t / kStages) & 1);
      const bf16* w_tile = reinterpret_cast<const bf16*>(ring + s * kStageBytes);
      const bf16* x_tile = w_tile + kTileN * kTileK;
#pragma unroll
      for (int step = 0; step < kTileK / 16 / Warps::kKWarps; ++step) {
        const int ks = step * Warps::kKWarps + k_warp;
        unsigned af[2][4], bf[kXTiles][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          ldmatrix_x4(af[mt], w_tile + swizzle<kTileK>(a_row + 16 * mt, 2 * ks + a_half));
#pragma unroll
        for (int xt = 0; xt < kXTiles; ++xt)
          ldmatrix_x4(bf[xt], x_tile + swizzle<kTileK>(b_row + 16 * xt, 2 * ks + b_half));
#pragma unroll
        for (int xt = 0; xt < kXTiles; ++xt) mma_row_blocks(acc, af, bf[xt], 2 * xt);
      }
      __syncwarp();  // every lane's reads of the stage are done
      if (lane == 0) empty[s].arrive();
    }
  }

  // The K warps' sums added in turn.
  __device__ void write_partial(float (*partial)[kTileN]) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int turn = 0; turn < Warps::kKWarps; ++turn) {
      if (warp < kConsumerWarps && warp / Warps::kRowWarps == turn) {
        const int row0 = (warp % Warps::kRowWarps) * kWarpRows;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int xb = 0; xb < kXBlocks; ++xb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float& at = partial[xb * 8 + 2 * q + (e & 1)][row0 + mt * 16 + g + 8 * (e >> 1)];
              at = turn == 0 ? acc[mt][xb][e] : at + acc[mt][xb][e];
            }
      }
      __syncthreads();
    }
  }
};

// wgmma (sm_90a): the four consumer warps are one warpgroup. Per stage it issues, for each k16
// step and each 64-row block of W, one m64 x (16 kXTiles) x k16 MMA that reads W and x straight
// from the stage (wgmma.cuh; no ldmatrix, and x is read once per CTA, not once per warp), then
// commits them as a group; a stage is released once the group after it has been issued and its
// own has completed, so the tensor cores always have a stage queued.
template <int kTileN, int kXTiles, int kStages, int kStageBytes>
struct WgmmaConsumer {
  static constexpr int kBlocks = kTileN / 64;  // m64 blocks of W rows
  static constexpr int kN = 16 * kXTiles;      // x rows
  static_assert(kConsumerWarps == 4, "the consumer warps are one warpgroup");
  float acc[kBlocks][kN / 2] = {};

  __device__ void consume(const unsigned char* ring, SharedBarrier* full, SharedBarrier* empty, int k_tiles) {
    const int lane = threadIdx.x & 31;
    const unsigned ring_address = shared_address(ring);
    for (int t = 0; t < k_tiles; ++t) {
      const int s = t % kStages;
      full[s].wait((t / kStages) & 1);
      __syncwarp();  // wgmma is issued by converged warps
      const unsigned w_tile = ring_address + unsigned(s * kStageBytes), x_tile = w_tile + kTileN * kRowBytes;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kTileK / 16; ++ks)
#pragma unroll
        for (int block = 0; block < kBlocks; ++block)
          WgmmaBf16<kN>::run(acc[block], wgmma_descriptor(w_tile + block * 64 * kRowBytes + ks * 32),
                             wgmma_descriptor(x_tile + ks * 32));
      wgmma_commit();
      wgmma_wait<1>();  // the previous stage's group has completed: release that stage
      if (t > 0 && lane == 0) empty[(t - 1) % kStages].arrive();
    }
    wgmma_wait<0>();
  }

  // The accumulator layout (wgmma.cuh): d[4 j + e] is W row 16 w + g + 8 (e >> 1) of the block,
  // x row 8 j + 2 q + (e & 1).
  __device__ void write_partial(float (*partial)[kTileN]) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, q = lane % 4;
    if (warp < kConsumerWarps) {
#pragma unroll
      for (int block = 0; block < kBlocks; ++block)
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            partial[8 * j + 2 * q + (e & 1)][block * 64 + 16 * warp + g + 8 * (e >> 1)] = acc[block][4 * j + e];
    }
    __syncthreads();
  }
};

template <int kTileN, int kXTiles, int kCtasPerSm, bool kWgmma>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) skinny_gemm_kernel(const __grid_constant__ SkinnyArgs a) {
  using R = Ring<kTileN, kXTiles, kCtasPerSm>;
  using Consumer = std::conditional_t<kWgmma, WgmmaConsumer<kTileN, kXTiles, R::kStages, R::kStageBytes>,
                                      MmaSyncConsumer<kTileN, kXTiles, R::kStages, R::kStageBytes>>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* ring = smem_raw + ((kRingAlign - shared_address(smem_raw) % kRingAlign) % kRingAlign);
  __shared__ SharedBarrier full[R::kStages], empty[R::kStages];
  const int warp = threadIdx.x / 32;
  const int col_tile = blockIdx.x, split = blockIdx.y;
  const int n0 = col_tile * kTileN;
  const int k_tile_begin = split * a.plan.tiles_per_split;
  const int k_tiles = min(a.plan.k_tiles, k_tile_begin + a.plan.tiles_per_split) - k_tile_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) full[s].init(1), empty[s].init(kConsumerWarps);
    SharedBarrier::fence_init();
  }
  __syncthreads();

  Consumer consumer;
  if (warp != kConsumerWarps) {  // the producer waits after its W prefetch
    wait_for_prior_grids();
    allow_next_grid();
  }
  if (warp == kConsumerWarps)
    produce_stages<kTileN, kXTiles, kCtasPerSm>(a, ring, full, empty, n0, k_tile_begin, k_tiles);
  else
    consumer.consume(ring, full, empty, k_tiles);
  __syncthreads();  // every stage has landed and been read: the ring becomes the partial tile

  float (*partial)[kTileN] = reinterpret_cast<float (*)[kTileN]>(ring);
  consumer.write_partial(partial);

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
  if (a.glu) {  // one split: this tile holds whole gate/up blocks, each gate columns then up
    static_assert(kTileN % (2 * kGluBlock) == 0, "a column tile holds whole gate/up blocks");
    const int inter = a.out / 2;
#pragma unroll
    for (int b = 0; b < kTileN / (2 * kGluBlock); ++b) {
      const int first = (n0 / 2) + b * kGluBlock;  // the block's first act column
      if (first >= inter) break;
      const GluColumns block = glu_columns(first, inter);
      const int gate = block.gate - n0, width = block.up - block.gate, vectors = width / 8;
      for (int i = threadIdx.x; i < a.rows * vectors; i += kThreads) {
        const int row = i / vectors, c = (i % vectors) * 8;
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = silu_times(partial[row][gate + c + e], partial[row][gate + width + c + e]);
        store_bf16x8(static_cast<bf16*>(a.y) + (long long)row * inter + first + c, from_float8(y));
      }
    }
    return;
  }
  if (a.split_out != nullptr) {  // the reading kernel adds the splits
    float* dst = a.split_out + split * a.split_stride;
    const bool vector_rows = a.out % 4 == 0 && a.split_stride % 4 == 0;  // 16-byte aligned float4s
    for (int i = threadIdx.x; i < quads; i += kThreads) {
      const int row = i / kQuadsPerRow, col = n0 + (i % kQuadsPerRow) * 4;
      const float4 v = reinterpret_cast<const float4*>(&partial[0][0])[i];
      float* at = dst + (long long)row * a.out + col;
      if (vector_rows && col + 3 < a.out) {
        *reinterpret_cast<float4*>(at) = v;
      } else {
        const float values[4] = {v.x, v.y, v.z, v.w};
        for (int e = 0; e < 4 && col + e < a.out; ++e) at[e] = values[e];
      }
    }
    return;
  }
  if (a.plan.splits == 1) {
    for (int i = threadIdx.x; i < quads; i += kThreads)
      store_quad(i, reinterpret_cast<const float4*>(&partial[0][0])[i]);
    return;
  }
  // Several splits: this CTA's tile goes to the workspace, and the last CTA of the column
  // tile to arrive adds them all up.
  const int splits = a.plan.splits;
  const int tile_quads = 16 * kXTiles * kQuadsPerRow;
  float4* tiles = reinterpret_cast<float4*>(a.partials) + (long long)col_tile * splits * (kPartialTileFloats / 4);
  for (int i = threadIdx.x; i < tile_quads; i += kThreads)
    __stcg(tiles + (long long)split * (kPartialTileFloats / 4) + i, reinterpret_cast<const float4*>(&partial[0][0])[i]);
  if (!last_to_arrive(&a.counters[col_tile], unsigned(splits), [] { __syncthreads(); })) return;
  for (int i = threadIdx.x; i < quads; i += kThreads) {
    float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float4 v = __ldcg(tiles + (long long)s * (kPartialTileFloats / 4) + i);
      total.x += v.x;
      total.y += v.y;
      total.z += v.z;
      total.w += v.w;
    }
    store_quad(i, total);
  }
}

// A 2-D tensor map of a row-major bf16 matrix [rows][cols] with boxes of box_rows x kTileK,
// 128-byte swizzle and zero fill past the edges.
CUtensorMap tensor_map(const bf16* base, int rows, int cols, int box_rows) {
  TensorMapShape shape;
  shape.rank = 2;
  shape.dims[0] = cuuint64_t(cols), shape.dims[1] = cuuint64_t(rows);
  shape.strides[0] = cuuint64_t(cols) * 2;
  shape.box[0] = cuuint32_t(kTileK), shape.box[1] = cuuint32_t(box_rows);
  CUtensorMap map;
  CUresult result = CUDA_SUCCESS;
  check(encode_bf16_tensor_map(map, base, shape, &result), "skinny_gemm: cuTensorMapEncodeTiled failed (", int(result),
        ") for a [", rows, " x ", cols, "] matrix");
  return map;
}

template <int kTileN, int kXTiles, int kCtasPerSm, bool kWgmma>
void launch_kernel(SkinnyArgs& a, cudaStream_t stream) {
  constexpr auto kernel = skinny_gemm_kernel<kTileN, kXTiles, kCtasPerSm, kWgmma>;
  const int smem = Ring<kTileN, kXTiles, kCtasPerSm>::kBytes + kRingAlign;
  allow_dynamic_smem<kernel>(smem);
  launch_dependent(kernel, dim3(a.plan.col_tiles, a.plan.splits), dim3(kThreads), smem, stream, "skinny_gemm", a);
}

template <int kTileN, int kXTiles, int kCtasPerSm>
void launch_ring(SkinnyArgs& a, cudaStream_t stream) {
  // Automatic: wgmma pays from two x tiles of rows up (see KernelTuning::Skinny::wgmma).
  const bool wgmma = a.plan.wgmma && (kernel_tuning().skinny.wgmma == KernelTuning::Skinny::kOn || a.rows > 16);
  if (wgmma)
    launch_kernel<kTileN, kXTiles, kCtasPerSm, true>(a, stream);
  else
    launch_kernel<kTileN, kXTiles, kCtasPerSm, false>(a, stream);
}

template <int kTileN, int kXTiles>
void launch_tiles(SkinnyArgs& a, bool tensor_maps, cudaStream_t stream) {
  if (tensor_maps) {
    a.w_map = tensor_map(a.w, a.out, a.in, kTileN);
    a.x_map = tensor_map(a.x, a.rows, a.in, 16 * kXTiles);
  }
  if (a.plan.large_ring)
    launch_ring<kTileN, kXTiles, 1>(a, stream);
  else
    launch_ring<kTileN, kXTiles, 2>(a, stream);
}

template <int kXTiles>
void launch_width(SkinnyArgs& a, bool tensor_maps, cudaStream_t stream) {
  if (a.plan.tile_n == kWideTileN)
    launch_tiles<kWideTileN, kXTiles>(a, tensor_maps, stream);
  else
    launch_tiles<kNarrowTileN, kXTiles>(a, tensor_maps, stream);
}

// The multiprocessor count and tensor-map support (sm_90) of the current device.
struct DeviceTraits {
  int sm_count = 0;
  bool tensor_maps = false;
};
DeviceTraits device_traits() {
  const DeviceInfo& info = current_device_info();
  return DeviceTraits{info.sm_count, info.major >= 9};
}

// The kernel instance for the product's row count (x rows padded to 16, 32, 48 or 64).
void launch_rows(SkinnyArgs& a, bool tensor_maps, cudaStream_t stream) {
  switch ((a.rows + 15) / 16) {
    case 1: return launch_width<1>(a, tensor_maps, stream);
    case 2: return launch_width<2>(a, tensor_maps, stream);
    case 3: return launch_width<3>(a, tensor_maps, stream);
    default: return launch_width<4>(a, tensor_maps, stream);
  }
}

}  // namespace

bool skinny_gemm_supports(const void* x, const void* weight, int rows, int in) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kSkinnyMaxRows && in >= 8 && in % 8 == 0 && aligned(x) && aligned(weight);
}

namespace {
void check_supported(const void* x, const void* weight, int rows, int in) {
  check(skinny_gemm_supports(x, weight, rows, in), "skinny_gemm: unsupported product [", rows, " x ", in,
        "] (rows 1..", kSkinnyMaxRows, ", in a multiple of 8, 16-byte aligned)");
}
}  // namespace

void launch_skinny_gemm(const bf16* x, const bf16* weight, void* y, int rows, int in, int out,
                        bool out_fp32, const SkinnyWorkspace& workspace, cudaStream_t stream) {
  check_supported(x, weight, rows, in);
  check(out >= 1 && y != nullptr, "skinny_gemm: no output");
  const DeviceTraits traits = device_traits();
  // Splits need a partial tile per CTA and a counter per column tile in the workspace (counted
  // for the narrow tiles, the most).
  const int col_tiles = (out + kNarrowTileN - 1) / kNarrowTileN;
  const std::size_t tiles_that_fit = workspace.partial_bytes / (kPartialTileFloats * sizeof(float));
  const bool room = col_tiles <= workspace.counter_count && workspace.partials && workspace.counters;
  const int room_splits = room ? int(std::min<std::size_t>(kMaxSplits, tiles_that_fit / col_tiles)) : 1;
  SkinnyArgs a{.x = x, .w = weight, .y = y, .partials = workspace.partials, .counters = workspace.counters,
               .split_out = nullptr, .split_stride = 0, .glu = false, .rows = rows, .in = in, .out = out, .out_fp32 = out_fp32,
               .plan = make_plan(in, out, traits.sm_count, traits.tensor_maps, room_splits, false)};
  launch_rows(a, traits.tensor_maps, stream);
}

LinearOutput launch_skinny_gemm_partials(const bf16* x, const bf16* weight, float* partials,
                                         std::size_t partial_floats, int rows, int in, int out,
                                         cudaStream_t stream) {
  check_supported(x, weight, rows, in);
  check(out >= 1 && partials != nullptr, "skinny_gemm: no output");
  // Room counted for the widest batch, so that the split count (and a row's sums) never depend
  // on how many rows this call has.
  const std::size_t split_floats = std::size_t(kSkinnyMaxRows) * out;
  check(partial_floats >= split_floats, "skinny_gemm: ", partial_floats, " floats of partials hold no split of [",
        kSkinnyMaxRows, " x ", out, "]");
  const DeviceTraits traits = device_traits();
  const int room_splits = int(std::min<std::size_t>(kMaxPartialSplits, partial_floats / split_floats));
  SkinnyArgs a{.x = x, .w = weight, .y = nullptr, .partials = nullptr, .counters = nullptr,
               .split_out = partials, .split_stride = (long long)rows * out, .glu = false, .rows = rows, .in = in, .out = out,
               .out_fp32 = true, .plan = make_plan(in, out, traits.sm_count, traits.tensor_maps, room_splits, true)};
  launch_rows(a, traits.tensor_maps, stream);
  return LinearOutput{nullptr, partials, a.plan.splits, a.split_stride};
}

void launch_skinny_gemm_glu(const bf16* x, const bf16* weight, bf16* act, int rows, int in, int inter,
                            cudaStream_t stream) {
  check_supported(x, weight, rows, in);
  check(inter >= 8 && inter % 8 == 0 && act != nullptr, "skinny_gemm: gated product of width ", inter,
        " (a positive multiple of 8) or no output");
  const DeviceTraits traits = device_traits();
  SkinnyArgs a{.x = x, .w = weight, .y = act, .partials = nullptr, .counters = nullptr, .split_out = nullptr,
               .split_stride = 0, .glu = true, .rows = rows, .in = in, .out = 2 * inter, .out_fp32 = false,
               .plan = make_plan(in, 2 * inter, traits.sm_count, traits.tensor_maps, 1, false)};
  launch_rows(a, traits.tensor_maps, stream);
}

bool skinny_gemm_fast_here() { return device_traits().tensor_maps; }

}  // namespace asynct::kernels
