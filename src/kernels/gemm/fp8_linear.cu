// FP8-weight products (fp8_linear.h): the skinny kernel (skinny_ring.cuh) in its FP8 format, the
// dequantization for products of more rows, and the device order both read.
#include "kernels/gemm/fp8_linear.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "kernels/gemm/skinny_ring.cuh"

namespace asynct::kernels {
namespace {

using skinny::Fp8Format;
static_assert(kFp8LinearBlockCols == Fp8Format::kTileK, "a scale block holds whole stages");
constexpr int kGroup = 16;  // inputs interleaved together: one k16 step

// The input a group's stored position p holds: p = 4t + j holds 2t, 2t+8, 2t+1, 2t+9 for j = 0..3.
__host__ __device__ constexpr int input_of_position(int p) { return 2 * (p / 4) + (p % 4) / 2 + 8 * (p % 2); }

void check_product(const char* who, const bf16* x, const Fp8Matrix& w, int rows) {
  check(rows >= 1 && rows <= kFp8LinearMaxRows && w.out >= 1 && w.in >= 1 && x && w.values && w.scales, who,
        ": product of [", rows, " x ", w.in, "] -> ", w.out, " (1 to ", kFp8LinearMaxRows, " rows)");
  check(fp8_linear_supports(x, w, rows), who, ": needs `in` a multiple of 16 (", w.in, "), scale blocks a multiple of ",
        kFp8LinearBlockCols, " inputs (", w.block_cols, "), `out` a multiple of 4 (", w.out,
        ") and 16-byte aligned x, values and scales");
}

skinny::SkinnyArgs fp8_args(const bf16* x, const Fp8Matrix& w, int rows) {
  skinny::SkinnyArgs a = skinny::skinny_args(x, w.values, rows, w.in, w.out);
  a.scales = w.scales;
  a.block_cols = w.block_cols;
  return a;
}

// One bf16 pair of the output from two e4m3 values (the low 16 bits of `pair`) and their scale.
__device__ __forceinline__ __nv_bfloat162 dequantized_pair(unsigned pair, float scale) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3));
  const float2 f = __half22float2(h);
  return __floats2bfloat162_rn(f.x * scale, f.y * scale);
}

__global__ void fp8_dequantize_kernel(Fp8Matrix w, bf16* out) {
  const std::int64_t words = std::int64_t(w.out) * w.in / 4;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < words; i += std::int64_t(gridDim.x) * blockDim.x) {
    // A stored word (positions 4t..4t+3) holds inputs k, k + 8, k + 1, k + 9 (k = 2t of its group).
    const std::int64_t at = 4 * i, row = at / w.in, position = at % w.in;
    const std::int64_t k = position / kGroup * kGroup + input_of_position(int(position % kGroup));
    const unsigned word = *reinterpret_cast<const unsigned*>(w.values + at);
    const unsigned low = (word & 0xffu) | ((word >> 8) & 0xff00u), high = ((word >> 8) & 0xffu) | ((word >> 16) & 0xff00u);
    const float scale = w.scales[(k / w.block_cols) * w.out + row];  // a block is a multiple of 16 inputs
    *reinterpret_cast<__nv_bfloat162*>(out + row * w.in + k) = dequantized_pair(low, scale);
    *reinterpret_cast<__nv_bfloat162*>(out + row * w.in + k + 8) = dequantized_pair(high, scale);
  }
}

}  // namespace

void fp8_values_to_device_order(std::uint8_t* values, int out, int in) {
  check(in % kGroup == 0, "fp8_to_device_order: rows of ", in, " inputs (a multiple of ", kGroup, ")");
  std::uint8_t group[kGroup];
  for (std::int64_t at = 0; at < std::int64_t(out) * in; at += kGroup) {
    for (int p = 0; p < kGroup; ++p) group[p] = values[at + input_of_position(p)];
    std::memcpy(values + at, group, kGroup);
  }
}

std::vector<float> fp8_scales_to_device_order(const float* scales, int out, int scale_cols) {
  std::vector<float> by_column(std::size_t(out) * scale_cols);
  for (int row = 0; row < out; ++row)
    for (int c = 0; c < scale_cols; ++c) by_column[std::size_t(c) * out + row] = scales[std::size_t(row) * scale_cols + c];
  return by_column;
}

bool fp8_linear_supports(const void* x, const Fp8Matrix& w, int rows) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kFp8LinearMaxRows && w.in > 0 && w.in % kGroup == 0 && w.out > 0 && w.out % 4 == 0 &&
         w.block_cols > 0 && w.block_cols % kFp8LinearBlockCols == 0 && aligned(x) && aligned(w.values) &&
         aligned(w.scales);
}

void launch_fp8_linear(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream) {
  check_product("fp8_linear", x, w, rows);
  check(y != nullptr, "fp8_linear: no output");
  skinny::SkinnyArgs a = fp8_args(x, w, rows);
  a.y = y;
  a.out_fp32 = out_fp32;
  skinny::plan_and_launch<Fp8Format>(a, 1, false, stream);
}

LinearOutput launch_fp8_linear_partials(const bf16* x, const Fp8Matrix& w, float* partials, std::size_t partial_floats,
                                        int rows, cudaStream_t stream) {
  check_product("fp8_linear_partials", x, w, rows);
  check(partials != nullptr && reinterpret_cast<std::uintptr_t>(partials) % 16 == 0,
        "fp8_linear_partials: no 16-byte aligned partials");
  skinny::SkinnyArgs a = fp8_args(x, w, rows);
  a.split_out = partials;
  a.split_stride = (long long)rows * w.out;
  a.out_fp32 = true;
  skinny::plan_and_launch<Fp8Format>(a, skinny::partial_room_splits("fp8_linear_partials", partial_floats, w.out), true,
                                     stream);
  return LinearOutput{nullptr, partials, a.plan.splits, a.split_stride};
}

void launch_fp8_linear_glu(const bf16* x, const Fp8Matrix& w, bf16* act, int rows, cudaStream_t stream) {
  check_product("fp8_linear_glu", x, w, rows);
  const int inter = w.out / 2;
  check(w.out % 2 == 0 && inter >= 8 && inter % 8 == 0 && act != nullptr, "fp8_linear_glu: gated product of width ",
        inter, " (a positive multiple of 8) or no output");
  skinny::SkinnyArgs a = fp8_args(x, w, rows);
  a.y = act;
  a.glu = true;
  skinny::plan_and_launch<Fp8Format>(a, 1, false, stream);
}

void launch_fp8_dequantize(const Fp8Matrix& w, bf16* out, cudaStream_t stream) {
  check(w.out >= 1 && w.in >= kGroup && w.in % kGroup == 0 && w.values && w.scales && out && w.block_cols % kGroup == 0,
        "fp8_dequantize: a [", w.out, " x ", w.in, "] matrix in blocks of ", w.block_cols, " (both multiples of ",
        kGroup, ")");
  const std::int64_t words = std::int64_t(w.out) * w.in / 4;
  const int blocks = int(std::min<std::int64_t>((words + 255) / 256, 8LL * current_device_info().sm_count * 8));
  fp8_dequantize_kernel<<<blocks, 256, 0, stream>>>(w, out);
  check_launch("fp8_dequantize");
}

}  // namespace asynct::kernels
