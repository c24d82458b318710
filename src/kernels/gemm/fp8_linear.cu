// FP8-weight products (fp8_linear.h). The layout of the work:
//   * a CTA takes 16 output columns at a time (16 rows of W: one m16 tile of mma.sync m16n8k16)
//     over a range of K (its split), looping over column tiles (as many CTAs as the GPU holds
//     at once); its eight warps share the range by 64-input chunks and add their results
//     through shared memory, in warp order;
//   * a lane reads 16 consecutive e4m3 weights (16 bytes) of W rows g and g + 8 per chunk
//     (g = lane / 4), straight from global memory into registers, and the loads of four chunks
//     are issued before any is used. Which inputs of a k16 step a lane holds is the mma's
//     business only as far as A and B agree: lane (g, t) takes the 16 inputs [16 t, 16 t + 16)
//     of the chunk, step s the four [16 t + 4 s, + 4), as the mma's k slots 2t, 2t+1, 2t+8,
//     2t+9 — for W's rows and x's alike, so every product pairs the same input;
//   * the weights become bf16 in registers: e4m3 -> half (exact) -> float, times the block's
//     scale (a lane's 16 weights lie in one block), rounded to bf16 (2^-9 relative, far under
//     e4m3's own 2^-4 step);
//   * x (up to 32 rows, four n8 tiles) sits in shared memory as bf16 for the CTA's K range,
//     staged once a CTA while its first weights load, rows padded by 16 bytes so the eight
//     rows a quarter-warp reads fall in distinct banks.
// The split count comes from the shape alone (fp8_linear.h): K is split only where x's 32 rows
// of the whole range would not fit the shared memory.
#include "kernels/gemm/fp8_linear.h"

#include <algorithm>
#include <cstdint>

#include <cuda_fp8.h>

#include "core/error.h"
#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_info.h"
#include "kernels/common/mma_sync.cuh"

namespace asynct::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileM = 16;          // W rows (output columns) per CTA
constexpr int kChunk = 64;          // inputs per chunk: 16 per lane group of four
constexpr int kChunksInFlight = 4;  // chunks whose loads a warp issues before using them
constexpr int kRowPad = 8;          // bf16 values of padding after each x row in shared memory
// Shared memory for x, counted at 32 rows: K splits only where a range longer than this holds
// cannot be staged (the split count is the shape's alone: fp8_linear.h).
constexpr int kXBytes = 200 * 1024;

struct Fp8Args {
  const bf16* x;
  Fp8Matrix w;
  int rows;
  int k_per_split;  // a multiple of kChunk
  // Dense output (y, bf16 or fp32) or split partials [split][rows][out] at split_out.
  void* y;
  bool out_fp32;
  float* split_out;
  long long split_stride;
};

__device__ __forceinline__ uint4 load_once(const std::uint8_t* p) {
  uint4 v;  // W is read once: keep it out of L1
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Two e4m3 values (the low 16 bits of `pair`, low byte first) times `scale`, as a bf16x2 register.
__device__ __forceinline__ unsigned scaled_bf16x2(unsigned pair, float scale) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3));
  const float2 f = __half22float2(h);
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  unsigned out;
  memcpy(&out, &b, 4);
  return out;
}

template <int kTilesN>  // n8 tiles of x rows: 1, 2 or 4
__global__ void __launch_bounds__(kThreads, 2) fp8_linear_kernel(Fp8Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kRowsPad = 8 * kTilesN;
  const Fp8Matrix& w = a.w;
  const int split = blockIdx.y, tiles_m = (w.out + kTileM - 1) / kTileM;
  const int k_begin = split * a.k_per_split, k_end = min(w.in, k_begin + a.k_per_split);
  const int chunks = (k_end - k_begin + kChunk - 1) / kChunk;
  const int x_stride = chunks * kChunk + kRowPad;  // bf16 values per x row in shared memory
  bf16* xs = reinterpret_cast<bf16*>(smem);       // [kRowsPad][x_stride]
  float* reduce = reinterpret_cast<float*>(smem + std::size_t(kRowsPad) * x_stride * sizeof(bf16));  // [warps][tiles][32][4]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int scale_cols = w.scale_cols();

  bool x_staged = false;
  for (int tile = blockIdx.x; tile < tiles_m; tile += gridDim.x) {  // CTA-uniform
    const int m0 = tile * kTileM, row_lo = m0 + g, row_hi = m0 + g + 8;
    const bool lo_valid = row_lo < w.out, hi_valid = row_hi < w.out;
    const std::uint8_t* w_lo = w.values + std::int64_t(lo_valid ? row_lo : 0) * w.in;
    const std::uint8_t* w_hi = w.values + std::int64_t(hi_valid ? row_hi : 0) * w.in;
    const float* s_lo = w.scales + std::int64_t(lo_valid ? row_lo : 0) * scale_cols;
    const float* s_hi = w.scales + std::int64_t(hi_valid ? row_hi : 0) * scale_cols;
    float c[kTilesN][4] = {};
    for (int first = warp; first < max(chunks, kWarps); first += kWarps * kChunksInFlight) {
      uint4 lo[kChunksInFlight], hi[kChunksInFlight];
#pragma unroll
      for (int i = 0; i < kChunksInFlight; ++i) {
        const int chunk = first + i * kWarps;
        const int k = k_begin + chunk * kChunk + 16 * t;
        const bool in_range = chunk < chunks && k < k_end;
        lo[i] = in_range && lo_valid ? load_once(w_lo + k) : make_uint4(0u, 0u, 0u, 0u);
        hi[i] = in_range && hi_valid ? load_once(w_hi + k) : make_uint4(0u, 0u, 0u, 0u);
      }
      // x's rows for the range (zeros past the rows and past `in`), once a CTA, while the first
      // weights are on their way. Every warp takes the loop's first pass (first < kWarps).
      if (!x_staged) {
        for (int i = threadIdx.x; i < kRowsPad * chunks * (kChunk / 8); i += kThreads) {
          const int r = i / (chunks * (kChunk / 8)), col = i % (chunks * (kChunk / 8));
          const int k = k_begin + 8 * col;
          Bf16x8 v{};
          if (r < a.rows && k < k_end) v = load_bf16x8(a.x + std::int64_t(r) * w.in + k);
          store_bf16x8(xs + r * x_stride + 8 * col, v);
        }
        __syncthreads();
        x_staged = true;
      }
#pragma unroll
      for (int i = 0; i < kChunksInFlight; ++i) {
        const int chunk = first + i * kWarps;
        if (chunk >= chunks) break;
        const int k = k_begin + chunk * kChunk + 16 * t;
        const int block = min(k, w.in - 1) / w.block_cols;
        const float scale_lo = lo_valid ? s_lo[block] : 0.0f, scale_hi = hi_valid ? s_hi[block] : 0.0f;
        const unsigned wl[4] = {lo[i].x, lo[i].y, lo[i].z, lo[i].w}, wh[4] = {hi[i].x, hi[i].y, hi[i].z, hi[i].w};
        // x row g of each n8 tile: the lane's 16 inputs of this chunk.
        unsigned xb[kTilesN][8];
#pragma unroll
        for (int n = 0; n < kTilesN; ++n) {
          const bf16* row = xs + (8 * n + g) * x_stride + chunk * kChunk + 16 * t;
          const uint4 v0 = *reinterpret_cast<const uint4*>(row), v1 = *reinterpret_cast<const uint4*>(row + 8);
          xb[n][0] = v0.x, xb[n][1] = v0.y, xb[n][2] = v0.z, xb[n][3] = v0.w;
          xb[n][4] = v1.x, xb[n][5] = v1.y, xb[n][6] = v1.z, xb[n][7] = v1.w;
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {  // k16 step s: inputs [16 t + 4 s, + 4) as slots 2t, 2t+1, 2t+8, 2t+9
          const unsigned afrag[4] = {scaled_bf16x2(wl[s], scale_lo), scaled_bf16x2(wh[s], scale_hi),
                                     scaled_bf16x2(wl[s] >> 16, scale_lo), scaled_bf16x2(wh[s] >> 16, scale_hi)};
#pragma unroll
          for (int n = 0; n < kTilesN; ++n) mma_bf16(c[n], afrag, xb[n][2 * s], xb[n][2 * s + 1]);
        }
      }
    }

    // The warps' sums, added in warp order.
#pragma unroll
    for (int n = 0; n < kTilesN; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) reduce[((warp * kTilesN + n) * 32 + lane) * 4 + r] = c[n][r];
    __syncthreads();
    for (int i = threadIdx.x; i < kTilesN * 32 * 4; i += kThreads) {
      float sum = 0.0f;
      for (int v = 0; v < kWarps; ++v) sum += reduce[v * kTilesN * 128 + i];
      const int n = i / 128, l = (i / 4) % 32, r = i % 4;
      const int col = m0 + (l >> 2) + (r >= 2 ? 8 : 0);  // W row: the output column
      const int x_row = 8 * n + 2 * (l & 3) + (r & 1);
      if (col >= w.out || x_row >= a.rows) continue;
      const std::int64_t at = std::int64_t(x_row) * w.out + col;
      if (a.split_out)
        a.split_out[split * a.split_stride + at] = sum;
      else if (a.out_fp32)
        static_cast<float*>(a.y)[at] = sum;
      else
        static_cast<bf16*>(a.y)[at] = __float2bfloat16_rn(sum);
    }
    __syncthreads();  // the reduce buffer is read before the next tile writes it
  }
}

// The longest K range whose x rows (32, padded) fit `bytes`, in whole chunks.
constexpr int max_k_per_split(int bytes) {
  return (bytes / (kFp8LinearMaxRows * int(sizeof(bf16))) - kRowPad) / kChunk * kChunk;
}
static_assert(max_k_per_split(kXBytes) == kFp8LinearDenseMaxIn, "fp8_linear.h states the dense limit");
static_assert(kMaxLinearSplits * max_k_per_split(kXBytes) == kFp8LinearPartialsMaxIn, "... and the split one");

std::size_t smem_bytes(int tiles_n, int k_per_split) {
  return std::size_t(8 * tiles_n) * (k_per_split + kRowPad) * sizeof(bf16) +
         std::size_t(kWarps) * tiles_n * 32 * 4 * sizeof(float);
}

template <int kTilesN>
void launch_tiles(const Fp8Args& a, int splits, cudaStream_t stream) {
  static const bool big_shared_memory_allowed = [] {  // above 48 KB needs an opt-in, once
    ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(fp8_linear_kernel<kTilesN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(smem_bytes(kTilesN, kFp8LinearDenseMaxIn))));
    return true;
  }();
  (void)big_shared_memory_allowed;
  const std::size_t smem = smem_bytes(kTilesN, a.k_per_split);
  // As many CTAs as fit the GPU at once (two a multiprocessor by registers, one when x's 32
  // rows fill the shared memory), each looping over column tiles: x is staged once a CTA.
  const int tiles_m = (a.w.out + kTileM - 1) / kTileM;
  const int per_sm = smem > 110 * 1024 ? 1 : 2;
  const int ctas = std::max(1, std::min(tiles_m, per_sm * current_device_info().sm_count / splits));
  fp8_linear_kernel<kTilesN><<<dim3(unsigned(ctas), unsigned(splits)), kThreads, smem, stream>>>(a);
  check_launch("fp8_linear");
}

void launch(Fp8Args a, int splits, cudaStream_t stream) {
  const int tiles_n = (a.rows + 7) / 8;
  if (tiles_n == 1) return launch_tiles<1>(a, splits, stream);
  if (tiles_n == 2) return launch_tiles<2>(a, splits, stream);
  return launch_tiles<4>(a, splits, stream);
}

void check_product(const char* who, const bf16* x, const Fp8Matrix& w, int rows) {
  check(rows >= 1 && rows <= kFp8LinearMaxRows && w.out >= 1 && w.in >= 1 && x && w.values && w.scales, who,
        ": product of [", rows, " x ", w.in, "] -> ", w.out, " (1 to ", kFp8LinearMaxRows, " rows)");
  check(fp8_linear_supports(x, w), who, ": needs `in` and the scale blocks multiples of 16 and 16-byte aligned x and ",
        "weights (in ", w.in, ", blocks of ", w.block_cols, ")");
}

__global__ void fp8_dequantize_kernel(Fp8Matrix w, bf16* out) {
  const std::int64_t pairs = std::int64_t(w.out) * w.in / 2;
  const int scale_cols = w.scale_cols();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < pairs; i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t at = 2 * i, row = at / w.in, col = at % w.in;  // `in` is even: a pair is in one row and block
    const unsigned pair = *reinterpret_cast<const unsigned short*>(w.values + at);
    const unsigned b = scaled_bf16x2(pair, w.scales[row * scale_cols + col / w.block_cols]);
    *reinterpret_cast<unsigned*>(out + at) = b;
  }
}

}  // namespace

bool fp8_linear_supports(const void* x, const Fp8Matrix& w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return w.in > 0 && w.in % 16 == 0 && w.block_cols > 0 && w.block_cols % 16 == 0 && aligned(x) && aligned(w.values);
}

void launch_fp8_linear(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream) {
  check_product("fp8_linear", x, w, rows);
  check(y != nullptr, "fp8_linear: no output");
  check(w.in <= kFp8LinearDenseMaxIn, "fp8_linear: ", w.in, " inputs; a dense product takes at most ", kFp8LinearDenseMaxIn,
        " (leave it to its reader as partials: launch_fp8_linear_partials)");
  Fp8Args a{x, w, rows, (w.in + kChunk - 1) / kChunk * kChunk, y, out_fp32, nullptr, 0};
  launch(a, 1, stream);
}

LinearOutput launch_fp8_linear_partials(const bf16* x, const Fp8Matrix& w, float* partials, std::size_t partial_floats,
                                        int rows, cudaStream_t stream) {
  check_product("fp8_linear_partials", x, w, rows);
  const long long stride = (std::int64_t(kFp8LinearMaxRows) * w.out + 3) / 4 * 4;
  check(partials != nullptr && reinterpret_cast<std::uintptr_t>(partials) % 16 == 0 &&
            partial_floats >= std::size_t(kMaxLinearSplits) * std::size_t(stride),
        "fp8_linear_partials: room for ", kMaxLinearSplits, " splits of ", kFp8LinearMaxRows, " x ", w.out,
        " floats needed (16-byte aligned)");
  // Splits: as many as x's shared memory needs.
  const int k_chunks = (w.in + kChunk - 1) / kChunk;
  int splits = (w.in + kFp8LinearDenseMaxIn - 1) / kFp8LinearDenseMaxIn;
  check(splits <= kMaxLinearSplits, "fp8_linear_partials: ", w.in, " inputs need ", splits, " splits (at most ",
        kMaxLinearSplits, ")");
  const int k_per_split = (k_chunks + splits - 1) / splits * kChunk;
  splits = (w.in + k_per_split - 1) / k_per_split;  // no empty split
  Fp8Args a{x, w, rows, k_per_split, nullptr, false, partials, stride};
  launch(a, splits, stream);
  LinearOutput out;
  out.partials = partials;
  out.splits = splits;
  out.split_stride = stride;
  return out;
}

void launch_fp8_dequantize(const Fp8Matrix& w, bf16* out, cudaStream_t stream) {
  check(w.out >= 1 && w.in >= 2 && w.in % 2 == 0 && w.values && w.scales && out && w.block_cols % 2 == 0,
        "fp8_dequantize: a [", w.out, " x ", w.in, "] matrix in blocks of ", w.block_cols);
  const std::int64_t pairs = std::int64_t(w.out) * w.in / 2;
  const int blocks = int(std::min<std::int64_t>((pairs + 255) / 256, 8LL * current_device_info().sm_count * 8));
  fp8_dequantize_kernel<<<blocks, 256, 0, stream>>>(w, out);
  check_launch("fp8_dequantize");
}

}  // namespace asynct::kernels
