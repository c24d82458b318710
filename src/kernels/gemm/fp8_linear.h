// Dense layers on FP8 weights: y[rows, out] = x[rows, in] W^T with W [out, in] e4m3 and one
// float scale per row and block of `block_cols` inputs (weight (n, k) = e4m3 value times its
// block's scale), x bf16, fp32 accumulation. For up to kFp8LinearMaxRows rows (the decode steps,
// where a product is a stream over the weights) the skinny kernel (skinny_ring.cuh) reads the
// e4m3 values and scales as they are, converts the values to bf16 in registers (exactly) and
// applies the scales to each block's fp32 sums; products of more rows (prefill, compute-bound)
// dequantize the weights into a bf16 scratch matrix for cuBLASLt (launch_fp8_dequantize), which
// costs them ~3 bytes a weight of extra traffic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/host_device.h"
#include "kernels/common/bf16.h"
#include "kernels/gemm/linear_output.h"
#include "kernels/gemm/skinny_gemm.h"

namespace asynct::kernels {

// An FP8 matrix on the device, in the device order (fp8_to_device_order): values [out][in]
// e4m3, scales [scale_cols][out] (by block column, then row). Checkpoints with blocks of several
// rows (HF's 128 x 128) are expanded to one scale per weight row when they are uploaded, so that
// rows can be reordered (the merged qkv and gate/up projections) freely.
struct Fp8Matrix {
  const std::uint8_t* values = nullptr;
  const float* scales = nullptr;
  int out = 0, in = 0;
  int block_cols = 128;
  ASYNCT_HOST_DEVICE int scale_cols() const { return (in + block_cols - 1) / block_cols; }
};

// The device order, made on the host from a checkpoint's row-major values [out][in] and scales
// [out][scale_cols]: within every 16 inputs of a row the values are interleaved (inputs 0,8,1,9,
// 2,10,3,11, 4,12,5,13, 6,14,7,15), so that the four bytes an ldmatrix lane reads become its A
// fragment's k slots in two bf16x2 registers with a few integer operations; the scales are
// transposed, so that a column tile's scales of one block are contiguous. `in` a multiple of 16.
void fp8_values_to_device_order(std::uint8_t* values, int out, int in);
std::vector<float> fp8_scales_to_device_order(const float* scales, int out, int scale_cols);

constexpr int kFp8LinearMaxRows = kSkinnyMaxRows;
// The scale blocks the product takes: a multiple of its stage's 128 inputs (FP8 checkpoints and
// --quantization fp8 use 128); other blocks go through launch_fp8_dequantize.
constexpr int kFp8LinearBlockCols = 128;

// Whether the product takes this matrix and batch: rows 1..kFp8LinearMaxRows, `in` a multiple
// of 16, blocks a multiple of kFp8LinearBlockCols, `out` a multiple of 4 (the scales' rows are
// copied in 16-byte units), x, values and scales 16-byte aligned. launch_* throw asynct::Error
// otherwise, naming what is wrong.
bool fp8_linear_supports(const void* x, const Fp8Matrix& w, int rows);

// y [rows][out], bf16 or fp32, unsplit (for tests and lone products: the decode step's readers
// take partials).
void launch_fp8_linear(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream);

// The same product left as split partial sums for the kernel that reads it (linear_output.h):
// split s of K writes partials[s][rows][out] (fp32). The split count depends on the matrix's
// shape and on the room (counted for kFp8LinearMaxRows rows), never on `rows`, so a row's result
// does not depend on its batch.
LinearOutput launch_fp8_linear_partials(const bf16* x, const Fp8Matrix& w, float* partials,
                                        std::size_t partial_floats, int rows, cudaStream_t stream);

// act [rows][w.out / 2] = SiLU(x Wg^T) * (x Wu^T), W the merged gate/up projection in the
// kGluBlock order of linear_output.h, in one kernel.
void launch_fp8_linear_glu(const bf16* x, const Fp8Matrix& w, bf16* act, int rows, cudaStream_t stream);

// out [w.out][w.in] bf16, row-major in input order = the weights dequantized (value times scale,
// rounded to bf16).
void launch_fp8_dequantize(const Fp8Matrix& w, bf16* out, cudaStream_t stream);

}  // namespace asynct::kernels
