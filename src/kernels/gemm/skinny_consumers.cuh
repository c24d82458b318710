// The skinny kernel's consumer warps (skinny_ring.cuh), a policy of the kernel: consume() reads
// every stage of the CTA's split out of the ring and releases it; write_partial() leaves the
// CTA's fp32 tile [16 kXTiles x rows][kTileN] in the ring (it holds CTA-wide barriers, so every
// thread calls it). Three forms: bf16 W through ldmatrix and mma.sync, bf16 W through wgmma,
// and FP8 W converted to bf16 in registers before mma.sync.
#pragma once

#include <cuda_fp8.h>

namespace asynct::kernels::skinny {

// The mma.sync forms' accumulators: [W row tile][x row n8 tile]; the m16n8 layout puts c0,c1 at
// (W row g, x rows 2q, 2q+1) and c2,c3 at W row g + 8. Each warp owns 32 W rows (two m16 tiles);
// a 64-column tile has two warps across its rows and two along K, whose sums meet in the
// partial tile, added in turn.
template <int kTileN, int kXTiles, int kSteps>
struct MmaSyncAccumulators {
  using Warps = TileWarps<kTileN, kSteps>;
  static constexpr int kXBlocks = 2 * kXTiles;  // n8 tiles of x rows
  float acc[2][kXBlocks][4] = {};

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

// ldmatrix lane offsets of x's B fragments (x rows, not transposed: row = (lane & 7) + 8 (lane >> 4),
// k half = (lane >> 3) & 1).
__device__ __forceinline__ int x_fragment_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
__device__ __forceinline__ int x_fragment_half(int lane) { return (lane >> 3) & 1; }

// bf16 W, mma.sync (sm_80 and up): each warp multiplies its 32 W rows (through ldmatrix) by all
// x rows (n8 tiles of its B operand) over its k16 steps of each stage.
template <int kTileN, int kXTiles, int kStages, int kStageBytes>
struct MmaSyncConsumer : MmaSyncAccumulators<kTileN, kXTiles, Bf16Format::kTileK / 16> {
  using Base = MmaSyncAccumulators<kTileN, kXTiles, Bf16Format::kTileK / 16>;
  using Warps = typename Base::Warps;
  using Base::acc;

  __device__ void consume(const unsigned char* ring, const float*, SharedBarrier* full, SharedBarrier* empty,
                          int k_tiles) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    // A's ldmatrix lane offsets: row = lane & 15, k half = lane >> 4.
    // A 64-column tile: warps w and w + 2 own the same rows, and k16 steps of one parity.
    const int row_warp = warp % Warps::kRowWarps, k_warp = warp / Warps::kRowWarps;
    const int a_row = row_warp * kWarpRows + (lane & 15), a_half = lane >> 4;
    const int b_row = x_fragment_row(lane), b_half = x_fragment_half(lane);
    constexpr int kTileK = Bf16Format::kTileK;
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
};

// Four e4m3 values (bytes b0..b3 of q) as two bf16x2 registers, {b0, b2} and {b1, b3}, exactly,
// on the integer and half-precision pipes (the conversion instructions' pipe, a quarter of their
// rate, bound the product [F32]): each byte's sign and exponent-mantissa bits are moved to a
// bf16's places, which makes the value times 2^-120 (bf16's exponent bias is 120 more than
// e4m3's; subnormals map to subnormals), then multiplied by 2^120 (a power of two: exact, and
// every result a normal bf16).
__device__ __forceinline__ void e4m3x4_to_bf16x2(unsigned q, unsigned& even, unsigned& odd) {
  constexpr unsigned kSign = 0x80008000u, kMagnitude = 0x7f007f00u;
  odd = (q & kSign) | ((q & kMagnitude) >> 4);  // the high byte of each half: b1, b3
  q <<= 8;
  even = (q & kSign) | ((q & kMagnitude) >> 4);  // b0, b2
  const __nv_bfloat162 bias = __float2bfloat162_rn(0x1p120f);
  __nv_bfloat162 e, o;
  memcpy(&e, &even, 4);
  memcpy(&o, &odd, 4);
  e = __hmul2(e, bias);
  o = __hmul2(o, bias);
  memcpy(&even, &e, 4);
  memcpy(&odd, &o, 4);
}

// FP8 W, mma.sync: a stage's 128-byte W row is 128 inputs, 16 bytes per k16 step. ldmatrix reads
// the warp's 32 rows' 16 bytes of a step as four 8 x 8 b16 matrices, giving lane (g, t) the four
// bytes 4t..4t+3 of rows g, g + 8, g + 16, g + 24, which the device order (fp8_linear.h) made
// the inputs 2t, 2t+8, 2t+1, 2t+9 of the step: converted, the A fragment's k slots. They become bf16
// exactly; each stage's products go into per-stage sums that are scaled by their W row's block
// scale as the stage ends (a stage lies in one block), so the scales are applied in fp32 to the
// sums, never rounded into the weights.
template <int kTileN, int kXTiles, int kStages, int kStageBytes>
struct Fp8MmaSyncConsumer : MmaSyncAccumulators<kTileN, kXTiles, Fp8Format::kTileK / 16> {
  using Base = MmaSyncAccumulators<kTileN, kXTiles, Fp8Format::kTileK / 16>;
  using Warps = typename Base::Warps;
  using Base::acc;
  static constexpr int kXBlocks = Base::kXBlocks;
  static constexpr int kSteps = Fp8Format::kTileK / 16;
  static constexpr int kStepsPerXBox = kXBoxK / 16;
  static constexpr int kXBoxElems = 16 * kXTiles * kXBoxK;

  __device__ void consume(const unsigned char* ring, const float* scales, SharedBarrier* full, SharedBarrier* empty,
                          int k_tiles) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4;
    const int row_warp = warp % Warps::kRowWarps, k_warp = warp / Warps::kRowWarps;
    const int a_row = row_warp * kWarpRows + lane;  // lane l addresses row l of the warp's 32
    const int b_row = x_fragment_row(lane), b_half = x_fragment_half(lane);
    for (int t = 0; t < k_tiles; ++t) {
      const int s = t % kStages;
      full[s].wait((t / kStages) & 1);
      const unsigned char* w_tile = ring + s * kStageBytes;
      const bf16* x_tile = reinterpret_cast<const bf16*>(w_tile + kTileN * kRowBytes);
      float sums[2][kXBlocks][4] = {};
#pragma unroll
      for (int step = 0; step < kSteps / Warps::kKWarps; ++step) {
        const int ks = step * Warps::kKWarps + k_warp;
        unsigned raw[4];
        ldmatrix_x4(raw, w_tile + a_row * kRowBytes + ((ks ^ (a_row & 7)) << 4));
        unsigned af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          e4m3x4_to_bf16x2(raw[2 * mt], af[mt][0], af[mt][2]);      // row g: k slots 2t, 2t+1 and 2t+8, 2t+9
          e4m3x4_to_bf16x2(raw[2 * mt + 1], af[mt][1], af[mt][3]);  // row g + 8
        }
        const bf16* x_box = x_tile + (ks / kStepsPerXBox) * kXBoxElems;
        unsigned bf[kXTiles][4];
#pragma unroll
        for (int xt = 0; xt < kXTiles; ++xt)
          ldmatrix_x4(bf[xt], x_box + swizzle<kXBoxK>(b_row + 16 * xt, 2 * (ks % kStepsPerXBox) + b_half));
#pragma unroll
        for (int xt = 0; xt < kXTiles; ++xt) mma_row_blocks(sums, af, bf[xt], 2 * xt);
      }
      const float* stage_scales = scales + s * kTileN + row_warp * kWarpRows + g;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const float lo = stage_scales[16 * mt], hi = stage_scales[16 * mt + 8];
#pragma unroll
        for (int xb = 0; xb < kXBlocks; ++xb)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][xb][e] += (e < 2 ? lo : hi) * sums[mt][xb][e];
      }
      __syncwarp();  // every lane's reads of the stage are done
      if (lane == 0) empty[s].arrive();
    }
  }
};

// bf16 W, wgmma (sm_90a): the four consumer warps are one warpgroup. Per stage it issues, for
// each k16 step and each 64-row block of W, one m64 x (16 kXTiles) x k16 MMA that reads W and x
// straight from the stage (wgmma.cuh; no ldmatrix, and x is read once per CTA, not once per
// warp), then commits them as a group; a stage is released once the group after it has been
// issued and its own has completed, so the tensor cores always have a stage queued.
template <int kTileN, int kXTiles, int kStages, int kStageBytes>
struct WgmmaConsumer {
  static constexpr int kBlocks = kTileN / 64;  // m64 blocks of W rows
  static constexpr int kN = 16 * kXTiles;      // x rows
  static_assert(kConsumerWarps == 4, "the consumer warps are one warpgroup");
  float acc[kBlocks][kN / 2] = {};

  __device__ void consume(const unsigned char* ring, const float*, SharedBarrier* full, SharedBarrier* empty,
                          int k_tiles) {
    const int lane = threadIdx.x & 31;
    const unsigned ring_address = shared_address(ring);
    for (int t = 0; t < k_tiles; ++t) {
      const int s = t % kStages;
      full[s].wait((t / kStages) & 1);
      __syncwarp();  // wgmma is issued by converged warps
      const unsigned w_tile = ring_address + unsigned(s * kStageBytes), x_tile = w_tile + kTileN * kRowBytes;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Bf16Format::kTileK / 16; ++ks)
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

template <class Format, int kTileN, int kXTiles, int kStages, int kStageBytes, bool kWgmma>
struct ConsumerOf {
  using type = std::conditional_t<kWgmma, WgmmaConsumer<kTileN, kXTiles, kStages, kStageBytes>,
                                  MmaSyncConsumer<kTileN, kXTiles, kStages, kStageBytes>>;
};
template <int kTileN, int kXTiles, int kStages, int kStageBytes, bool kWgmma>
struct ConsumerOf<Fp8Format, kTileN, kXTiles, kStages, kStageBytes, kWgmma> {
  static_assert(!kWgmma, "FP8 weights are converted in registers: mma.sync");
  using type = Fp8MmaSyncConsumer<kTileN, kXTiles, kStages, kStageBytes>;
};

}  // namespace asynct::kernels::skinny
