// The skinny products' kernel (skinny_gemm.h says why it exists), shared by the weight formats
// that feed it: bf16 weights (skinny_gemm.cu) and FP8 weights with block scales (fp8_linear.cu).
// One file past 500 lines: the ring, its producer, the plan and the kernel's epilogues are one
// mechanism, which every consumer (skinny_consumers.cuh) and both formats share. The layout of
// the work:
//   * a CTA owns a tile of 128 or 64 output columns (that many rows of W) and a range of K (its
//     split). The plan picks the width: 64-column tiles double the CTAs of a narrow product (o
//     and down, 2048 columns: 16 tiles of 128) without more splits for the reader to add. A
//     producer thread streams W and x through a ring of shared-memory stages, one 2-D tensor
//     copy (TMA) per operand box and stage, counted on mbarriers: the bytes in flight do not
//     depend on what the other warps are doing, which is what reading at the memory's rate
//     needs. The copies zero-fill past the edges of W and x (no tail cases) and store 128-byte
//     rows swizzled (16-byte chunk c of row r at c ^ (r % 8)), so ldmatrix reads them without
//     bank conflicts. A stage is 128 bytes of every W row (64 bf16 or 128 e4m3 inputs), x's rows
//     for those inputs (one or two 64-input boxes) and, for FP8, the W rows' scales of the
//     stage's block in a side array. (Earlier versions: every thread issuing cp.async behind a
//     barrier per stage read W at 0.5-0.7 of the copy ceiling at 32 rows; one 1-D bulk copy per
//     256-byte row segment, 0.1-0.44: the copy engine issues small copies slowly.)
//   * the kernel is launched as a dependent launch (dependent_launch.cuh): W does not depend on
//     the kernel before it, so the producer fills the whole ring with W before it waits for
//     that kernel, and only then copies x. At decode sizes a stage ring holds most of a CTA's
//     share of W, so the weight stream overlaps the previous kernel and the launch;
//   * four consumer warps multiply the stage's W rows by all x rows and release the stage
//     (skinny_consumers.cuh);
//   * with several splits, either each CTA writes its fp32 partial tile to its split's matrix
//     and the kernel that reads y adds the splits (partials: no epilogue), or each CTA stores
//     its tile in a global workspace and counts itself on its column tile's counter; the last
//     to arrive adds the tiles up in split order (so the result does not depend on which CTA
//     came last) and resets the counter. That epilogue, like the cluster reduction of an
//     earlier version, costs ~4 us at 32 rows: one CTA's loads of every split's tile form a
//     chain of L2 round trips.
// Before sm_90 the producer warp copies the tiles itself (same layout, same zero fill).
#pragma once

#include <algorithm>
#include <cstdint>
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
#include "kernels/gemm/linear_output.h"
#include "kernels/gemm/skinny_gemm.h"

namespace asynct::kernels::skinny {

// Four consumer warps: eight (two along each stage's K in a 128-column tile, four in a 64) made
// the decode step slower (AsyncT decode_heavy_b32 step 2.115 against 2.074 ms, bench/RESULTS.md).
constexpr int kConsumerWarps = 4;
constexpr int kThreads = 32 * (kConsumerWarps + 1);  // and the producer warp
constexpr int kWarpRows = 32;                        // W rows per consumer warp: two m16 tiles
constexpr int kWideTileN = kWarpRows * kConsumerWarps;  // output columns per CTA: 128 or 64
constexpr int kNarrowTileN = kWideTileN / 2;
constexpr int kRowBytes = 128;  // of every W row and x box row per stage (the swizzle's span)
constexpr int kXBoxK = 64;      // x's inputs per box: 128-byte bf16 rows
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

// The weight formats. A stage is 128 bytes of each W row either way.
struct Bf16Format {
  static constexpr int kTileK = 64;  // inputs per stage
  static constexpr bool kScaled = false;
};
// e4m3 values in the device order of fp8_linear.h, one float scale per row and block of a
// multiple of 128 inputs (so a stage lies in one block).
struct Fp8Format {
  static constexpr int kTileK = 128;
  static constexpr bool kScaled = true;
};

// How a tile's consumer warps share it: kRowWarps side by side over its W rows, kKWarps along
// each stage's k16 steps.
template <int kTileN, int kSteps>
struct TileWarps {
  static_assert(kTileN == kWideTileN || kTileN == kNarrowTileN, "a column tile is 128 or 64 wide");
  static constexpr int kRowWarps = kTileN / kWarpRows;
  static constexpr int kKWarps = kConsumerWarps / kRowWarps;
  static_assert(kSteps % kKWarps == 0, "every K warp takes as many k16 steps");
};

template <class Format, int kTileN, int kXTiles, int kCtasPerSm>  // x rows padded to 16 * kXTiles
struct Ring {
  static constexpr int kBudget = kCtasPerSm == 2 ? kSmallRingBytes : kLargeRingBytes;
  static constexpr int kXBoxes = Format::kTileK / kXBoxK;
  static constexpr int kXBoxBytes = 16 * kXTiles * kRowBytes;
  static constexpr int kStageBytes = kTileN * kRowBytes + kXBoxes * kXBoxBytes;  // W rows, then x's boxes
  static constexpr int kScaleBytes = Format::kScaled ? kTileN * int(sizeof(float)) : 0;  // the side array's
  static constexpr int kStages = std::min(kMaxStages, (kBudget - kRingAlign) / (kStageBytes + kScaleBytes));
  static constexpr int kBytes = kStages * kStageBytes;
  static constexpr int kSharedBytes = kRingAlign + kBytes + kStages * kScaleBytes;  // scales after the ring
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

// The cost model behind the plan, in units of one 64-row W tile of a stage (8 KB). A CTA
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
inline SkinnyPlan make_plan(int k_tile, int in, int out, int sm_count, bool large_rings, int room_splits,
                            bool partial_out) {
  const KernelTuning::Skinny forced = kernel_tuning().skinny;
  const int k_tiles = (in + k_tile - 1) / k_tile;
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
  CUtensorMap w_map;      // W [out][in], boxes of kTileN rows x 128 bytes (sm_90)
  CUtensorMap x_map;      // x [rows][in], boxes of 16 kXTiles x kXBoxK (sm_90)
  CUtensorMap scale_map;  // FP8: scales [scale_cols][out], boxes of 1 x kTileN (sm_90)
  const bf16* x;
  const void* w;
  const float* scales;  // FP8: [scale_cols][out]
  int block_cols;       // FP8: inputs per scale block, a multiple of Fp8Format::kTileK
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
// fill (box_rows x 128 bytes of a row-major matrix of `rows` rows of row_bytes, at (row0, byte0)).
__device__ void copy_box(unsigned char* dst, const unsigned char* src, int rows, long long row_bytes, int row0,
                         long long byte0, int box_rows) {
  constexpr int kChunks = kRowBytes / 16;
  for (int i = threadIdx.x & 31; i < box_rows * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    const long long at = byte0 + 16 * c;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < rows && at < row_bytes) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * row_bytes + at);
    *reinterpret_cast<uint4*>(dst + r * kRowBytes + ((c ^ (r & 7)) << 4)) = v;
  }
}
#endif

// The producer: per stage, one tensor copy of W's tile, one per x box and (FP8) one of the
// scales (lane 0 alone). The first ring's worth of W and its scales is requested before waiting
// for the kernel that writes x.
template <class Format, int kTileN, int kXTiles, int kCtasPerSm>
__device__ void produce_stages(const SkinnyArgs& a, unsigned char* ring, float* scales, SharedBarrier* full,
                               SharedBarrier* empty, int n0, int k_tile_begin, int k_tiles) {
  using R = Ring<Format, kTileN, kXTiles, kCtasPerSm>;
  const int lane = threadIdx.x & 31;
  auto stage_of = [&](int t) { return ring + (t % R::kStages) * R::kStageBytes; };
  auto x_box_of = [&](int t, int b) { return stage_of(t) + kTileN * kRowBytes + b * R::kXBoxBytes; };
  auto scales_of = [&](int t) { return scales + (t % R::kStages) * kTileN; };
  auto k0_of = [&](int t) { return (k_tile_begin + t) * Format::kTileK; };
  constexpr unsigned kStageBytes = unsigned(R::kStageBytes + R::kScaleBytes);  // zero fill counts
  const int prefetched = min(k_tiles, R::kStages);
#ifndef ASYNCT_BULK_COPY_EMULATED
  const std::uint64_t read_once = l2_evict_first_policy();  // W: each CTA reads its part once
  auto copy_weights = [&](int t) {
    tensor_copy_2d_to_shared(stage_of(t), &a.w_map, k0_of(t), n0, full[t % R::kStages], read_once);
    if constexpr (Format::kScaled)
      tensor_copy_2d_to_shared(scales_of(t), &a.scale_map, n0, k0_of(t) / a.block_cols, full[t % R::kStages]);
  };
  auto copy_x = [&](int t) {
#pragma unroll
    for (int b = 0; b < R::kXBoxes; ++b)
      tensor_copy_2d_to_shared(x_box_of(t, b), &a.x_map, k0_of(t) + b * kXBoxK, 0, full[t % R::kStages]);
  };
  if (lane == 0) {
    for (int t = 0; t < prefetched; ++t) {
      full[t].arrive_expecting(kStageBytes);
      copy_weights(t);
    }
  }
  wait_for_prior_grids();
  allow_next_grid();
  if (lane == 0)
    for (int t = 0; t < prefetched; ++t) copy_x(t);
  for (int t = prefetched; t < k_tiles; ++t) {
    const int s = t % R::kStages;
    empty[s].wait((t / R::kStages - 1) & 1);
    if (lane == 0) {
      full[s].arrive_expecting(kStageBytes);
      copy_weights(t);
      copy_x(t);
    }
  }
#else
  (void)prefetched;
  constexpr long long kWeightBytes = Format::kScaled ? 1 : 2;
  for (int t = 0; t < k_tiles; ++t) {
    const int s = t % R::kStages;
    if (t >= R::kStages) empty[s].wait((t / R::kStages - 1) & 1);
    const int k0 = k0_of(t);
    copy_box(stage_of(t), static_cast<const unsigned char*>(a.w), a.out, a.in * kWeightBytes, n0, k0 * kWeightBytes,
             kTileN);
    for (int b = 0; b < R::kXBoxes; ++b)
      copy_box(x_box_of(t, b), reinterpret_cast<const unsigned char*>(a.x), a.rows, a.in * 2LL, 0,
               (k0 + b * kXBoxK) * 2LL, 16 * kXTiles);
    if constexpr (Format::kScaled) {
      const float* from = a.scales + (long long)(k0 / a.block_cols) * a.out;
      for (int c = lane; c < kTileN; c += 32) scales_of(t)[c] = n0 + c < a.out ? from[n0 + c] : 0.0f;
    }
    __syncwarp();
    if (lane == 0) full[s].arrive_expecting(kStageBytes);
  }
#endif
}

}  // namespace asynct::kernels::skinny

#include "kernels/gemm/skinny_consumers.cuh"

namespace asynct::kernels::skinny {

template <class Format, int kTileN, int kXTiles, int kCtasPerSm, bool kWgmma>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) skinny_kernel(const __grid_constant__ SkinnyArgs a) {
  using R = Ring<Format, kTileN, kXTiles, kCtasPerSm>;
  using Consumer = typename ConsumerOf<Format, kTileN, kXTiles, R::kStages, R::kStageBytes, kWgmma>::type;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* ring = smem_raw + ((kRingAlign - shared_address(smem_raw) % kRingAlign) % kRingAlign);
  float* scales = reinterpret_cast<float*>(ring + R::kBytes);  // [kStages][kTileN] (FP8)
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
    produce_stages<Format, kTileN, kXTiles, kCtasPerSm>(a, ring, scales, full, empty, n0, k_tile_begin, k_tiles);
  else
    consumer.consume(ring, scales, full, empty, k_tiles);
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

// A 2-D tensor map of a row-major matrix [rows][cols] of `element`, boxes of box_rows x box_cols,
// zero fill past the edges.
inline CUtensorMap tensor_map(const void* base, TensorMapElement element, int element_bytes, bool swizzle, int rows,
                              int cols, int box_rows, int box_cols) {
  TensorMapShape shape;
  shape.rank = 2;
  shape.dims[0] = cuuint64_t(cols), shape.dims[1] = cuuint64_t(rows);
  shape.strides[0] = cuuint64_t(cols) * element_bytes;
  shape.box[0] = cuuint32_t(box_cols), shape.box[1] = cuuint32_t(box_rows);
  CUtensorMap map;
  CUresult result = CUDA_SUCCESS;
  check(encode_tensor_map(map, base, shape, element, swizzle, &result), "skinny_gemm: cuTensorMapEncodeTiled failed (",
        int(result), ") for a [", rows, " x ", cols, "] matrix");
  return map;
}

template <class Format, int kTileN, int kXTiles, int kCtasPerSm, bool kWgmma>
void launch_kernel(SkinnyArgs& a, cudaStream_t stream) {
  constexpr auto kernel = skinny_kernel<Format, kTileN, kXTiles, kCtasPerSm, kWgmma>;
  const int smem = Ring<Format, kTileN, kXTiles, kCtasPerSm>::kSharedBytes;
  allow_dynamic_smem<kernel>(smem);
  launch_dependent(kernel, dim3(a.plan.col_tiles, a.plan.splits), dim3(kThreads), smem, stream, "skinny_gemm", a);
}

template <class Format, int kTileN, int kXTiles, int kCtasPerSm>
void launch_ring(SkinnyArgs& a, cudaStream_t stream) {
  if constexpr (Format::kScaled) {
    launch_kernel<Format, kTileN, kXTiles, kCtasPerSm, false>(a, stream);  // FP8 converts W in registers
  } else {
    // Automatic: wgmma pays from two x tiles of rows up (see KernelTuning::Skinny::wgmma).
    const bool wgmma = a.plan.wgmma && (kernel_tuning().skinny.wgmma == KernelTuning::Skinny::kOn || a.rows > 16);
    if (wgmma)
      launch_kernel<Format, kTileN, kXTiles, kCtasPerSm, true>(a, stream);
    else
      launch_kernel<Format, kTileN, kXTiles, kCtasPerSm, false>(a, stream);
  }
}

template <class Format, int kTileN, int kXTiles>
void launch_tiles(SkinnyArgs& a, bool tensor_maps, cudaStream_t stream) {
  if (tensor_maps) {
    if constexpr (Format::kScaled) {
      a.w_map = tensor_map(a.w, TensorMapElement::kByte, 1, true, a.out, a.in, kTileN, kRowBytes);
      const int scale_cols = (a.in + a.block_cols - 1) / a.block_cols;
      a.scale_map = tensor_map(a.scales, TensorMapElement::kFloat, 4, false, scale_cols, a.out, 1, kTileN);
    } else {
      a.w_map = tensor_map(a.w, TensorMapElement::kBf16, 2, true, a.out, a.in, kTileN, kXBoxK);
    }
    a.x_map = tensor_map(a.x, TensorMapElement::kBf16, 2, true, a.rows, a.in, 16 * kXTiles, kXBoxK);
  }
  if (a.plan.large_ring)
    launch_ring<Format, kTileN, kXTiles, 1>(a, stream);
  else
    launch_ring<Format, kTileN, kXTiles, 2>(a, stream);
}

template <class Format, int kXTiles>
void launch_width(SkinnyArgs& a, bool tensor_maps, cudaStream_t stream) {
  if (a.plan.tile_n == kWideTileN)
    launch_tiles<Format, kWideTileN, kXTiles>(a, tensor_maps, stream);
  else
    launch_tiles<Format, kNarrowTileN, kXTiles>(a, tensor_maps, stream);
}

// The multiprocessor count and tensor-map support (sm_90) of the current device.
struct DeviceTraits {
  int sm_count = 0;
  bool tensor_maps = false;
};
inline DeviceTraits device_traits() {
  const DeviceInfo& info = current_device_info();
  return DeviceTraits{info.sm_count, info.major >= 9};
}

// Plans the product (see make_plan) and launches the kernel instance for its row count (x rows
// padded to 16, 32, 48 or 64).
template <class Format>
void plan_and_launch(SkinnyArgs& a, int room_splits, bool partial_out, cudaStream_t stream) {
  const DeviceTraits traits = device_traits();
  a.plan = make_plan(Format::kTileK, a.in, a.out, traits.sm_count, traits.tensor_maps, room_splits, partial_out);
  switch ((a.rows + 15) / 16) {
    case 1: return launch_width<Format, 1>(a, traits.tensor_maps, stream);
    case 2: return launch_width<Format, 2>(a, traits.tensor_maps, stream);
    case 3: return launch_width<Format, 3>(a, traits.tensor_maps, stream);
    default: return launch_width<Format, 4>(a, traits.tensor_maps, stream);
  }
}

// How many splits a product left to its reader may have: room counted for the widest batch, so
// that the split count (and a row's sums) never depend on how many rows a call has.
inline int partial_room_splits(const char* who, std::size_t partial_floats, int out) {
  const std::size_t split_floats = std::size_t(kSkinnyMaxRows) * out;
  check(partial_floats >= split_floats, who, ": ", partial_floats, " floats of partials hold no split of [",
        kSkinnyMaxRows, " x ", out, "]");
  return int(std::min<std::size_t>(kMaxPartialSplits, partial_floats / split_floats));
}

// The arguments every form starts from.
inline SkinnyArgs skinny_args(const bf16* x, const void* w, int rows, int in, int out) {
  SkinnyArgs a{};
  a.x = x;
  a.w = w;
  a.rows = rows;
  a.in = in;
  a.out = out;
  return a;
}

}  // namespace asynct::kernels::skinny
