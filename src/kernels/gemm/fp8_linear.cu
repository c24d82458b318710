// FP8-weight products (fp8_linear.h). The layout of the work:
//   * a warp owns one output column at a time (one row of W) and walks it with each lane
//     reading 16 consecutive weights (16 bytes) per 512 inputs; the loads of up to four such
//     steps are issued before any is used, so a lane keeps 64 bytes in flight (a 2,048-input
//     row is then one round trip per warp);
//   * a lane's 16 weights lie in one scale block (block_cols is a multiple of 16), so their dot
//     product with x is accumulated unscaled and multiplied by the block's scale once;
//   * the CTA's x rows (a pass of up to four) sit in shared memory as bf16, read by every warp
//     for every column it owns; the warps stride over the columns, a few CTAs per
//     multiprocessor, so the whole GPU streams W.
#include "kernels/gemm/fp8_linear.h"

#include <algorithm>
#include <cstdint>

#include <cuda_fp8.h>

#include "core/error.h"
#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_info.h"

namespace asynct::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kValuesPerLane = 16;                   // one 16-byte load of e4m3
constexpr int kValuesPerStep = 32 * kValuesPerLane;  // a warp's 512 inputs per step
constexpr int kStepsInFlight = 4;
constexpr int kCtasPerSm = 4;

__device__ __forceinline__ uint4 load_once(const std::uint8_t* p) {
  uint4 v;  // W is read once per pass: keep it out of L1
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The 16 e4m3 values of a 16-byte word as floats (e4m3 -> half is exact).
__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float (&out)[16]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int half_word = 0; half_word < 2; ++half_word) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>((words[w] >> (16 * half_word)) & 0xffffu);
      const __half2 h(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
      const float2 f = __half22float2(h);
      out[4 * w + 2 * half_word] = f.x;
      out[4 * w + 2 * half_word + 1] = f.y;
    }
  }
}

// One pass: x rows [row0, row0 + kRows) (those past `rows` are zeros and not written).
template <int kRows>
__global__ void __launch_bounds__(kThreads) fp8_linear_kernel(const bf16* __restrict__ x, Fp8Matrix w, void* y,
                                                              int rows, bool out_fp32) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [kRows][in]
  const int row0 = blockIdx.y * kRows, in = w.in;
  {
    const int chunks = kRows * in / 8;
    for (int i = threadIdx.x; i < chunks; i += kThreads) {
      const int r = i / (in / 8), c = i % (in / 8);
      Bf16x8 v{};
      if (row0 + r < rows) v = load_bf16x8(x + std::int64_t(row0 + r) * in + 8 * c);
      store_bf16x8(xs + std::int64_t(r) * in + 8 * c, v);
    }
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int scale_cols = w.scale_cols();
  for (int n = blockIdx.x * kWarps + warp; n < w.out; n += gridDim.x * kWarps) {
    const std::uint8_t* w_row = w.values + std::int64_t(n) * in;
    const float* s_row = w.scales + std::int64_t(n) * scale_cols;
    float acc[kRows] = {};
    for (int k_begin = 0; k_begin < in; k_begin += kStepsInFlight * kValuesPerStep) {
      uint4 words[kStepsInFlight];
#pragma unroll
      for (int s = 0; s < kStepsInFlight; ++s) {
        const int k = k_begin + s * kValuesPerStep + lane * kValuesPerLane;
        words[s] = k < in ? load_once(w_row + k) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int s = 0; s < kStepsInFlight; ++s) {
        const int k = k_begin + s * kValuesPerStep + lane * kValuesPerLane;
        if (k >= in) break;
        float wf[kValuesPerLane];
        fp8x16_to_float(words[s], wf);
        const float scale = s_row[k / w.block_cols];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float xf[kValuesPerLane];
          to_float8(load_bf16x8(xs + std::int64_t(r) * in + k), xf);
          to_float8(load_bf16x8(xs + std::int64_t(r) * in + k + 8), xf + 8);
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < kValuesPerLane; ++e) dot = fmaf(wf[e], xf[e], dot);
          acc[r] = fmaf(scale, dot, acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int offset = 16; offset >= 1; offset >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
    if (lane < kRows && row0 + lane < rows) {
      float value = acc[0];
#pragma unroll
      for (int r = 1; r < kRows; ++r)
        if (lane == r) value = acc[r];
      const std::int64_t at = std::int64_t(row0 + lane) * w.out + n;
      if (out_fp32)
        static_cast<float*>(y)[at] = value;
      else
        static_cast<bf16*>(y)[at] = __float2bfloat16_rn(value);
    }
  }
}

template <int kRows>
void launch_rows(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream) {
  const std::size_t smem = std::size_t(kRows) * w.in * sizeof(bf16);
  if (smem > 48 * 1024)
    ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(fp8_linear_kernel<kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(smem)));
  const int column_ctas = (w.out + kWarps - 1) / kWarps;
  const int passes = (rows + kRows - 1) / kRows;
  const int ctas = std::max(1, std::min(column_ctas, kCtasPerSm * current_device_info().sm_count));
  fp8_linear_kernel<kRows><<<dim3(unsigned(ctas), unsigned(passes)), kThreads, smem, stream>>>(x, w, y, rows, out_fp32);
  check_launch("fp8_linear");
}

}  // namespace

bool fp8_linear_supports(const void* x, const Fp8Matrix& w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return w.in > 0 && w.in % kValuesPerLane == 0 && w.in <= kFp8LinearMaxIn && w.block_cols > 0 &&
         w.block_cols % kValuesPerLane == 0 && aligned(x) && aligned(w.values);
}

void launch_fp8_linear(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream) {
  check(rows >= 1 && w.out >= 1 && w.in >= 1 && x && y && w.values && w.scales, "fp8_linear: empty product [", rows,
        " x ", w.in, "] -> ", w.out);
  check((rows + kFp8LinearRowsPerPass - 1) / kFp8LinearRowsPerPass <= 65535, "fp8_linear: ", rows, " rows (at most ",
        65535 * kFp8LinearRowsPerPass, ")");
  check(fp8_linear_supports(x, w), "fp8_linear: needs `in` a multiple of 16 up to ", kFp8LinearMaxIn,
        ", scale blocks of a multiple of 16 inputs and 16-byte aligned x and weights (in ", w.in, ", blocks of ",
        w.block_cols, ")");
  switch (std::min(rows, kFp8LinearRowsPerPass)) {
    case 1: return launch_rows<1>(x, w, y, rows, out_fp32, stream);
    case 2: return launch_rows<2>(x, w, y, rows, out_fp32, stream);
    case 3: return launch_rows<3>(x, w, y, rows, out_fp32, stream);
    default: return launch_rows<kFp8LinearRowsPerPass>(x, w, y, rows, out_fp32, stream);
  }
}

}  // namespace asynct::kernels
