// Dense layers on FP8 weights: y[rows, out] = x[rows, in] W^T with W [out, in] e4m3 and one
// float scale per row and block of `block_cols` inputs (weight (n, k) = e4m3 value times
// scales[n][k / block_cols]), x bf16, fp32 accumulation. For up to kFp8LinearMaxRows rows (the
// decode steps, where a product is a stream over the weights) one kernel reads the e4m3 values
// and scales as they are and multiplies on the tensor cores; products of more rows (prefill,
// compute-bound) dequantize the weights into a bf16 scratch matrix for cuBLASLt
// (launch_fp8_dequantize), which costs them ~3 bytes a weight of extra traffic.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/host_device.h"
#include "kernels/common/bf16.h"
#include "kernels/gemm/linear_output.h"

namespace asynct::kernels {

// An FP8 matrix on the device with per-row block scales. Checkpoints with blocks of several
// rows (HF's 128 x 128) are expanded to one scale row per weight row when they are uploaded,
// so that rows can be reordered (the merged qkv and gate/up projections) freely.
struct Fp8Matrix {
  const std::uint8_t* values = nullptr;  // [out][in] e4m3
  const float* scales = nullptr;         // [out][ceil(in / block_cols)]
  int out = 0, in = 0;
  int block_cols = 128;
  ASYNCT_HOST_DEVICE int scale_cols() const { return (in + block_cols - 1) / block_cols; }
};

constexpr int kFp8LinearMaxRows = 32;
// The widest `in` of a dense product (launch_fp8_linear): one CTA holds x's rows for all of K.
constexpr int kFp8LinearDenseMaxIn = 3136;
// ... and of one left as partials (launch_fp8_linear_partials): kMaxLinearSplits ranges.
constexpr int kFp8LinearPartialsMaxIn = 25088;

// Whether the kernel takes this matrix: `in` and block_cols multiples of 16 (a lane's 16
// weights lie in one block), x and the values 16-byte aligned. launch_* throw asynct::Error
// otherwise, naming what is wrong.
bool fp8_linear_supports(const void* x, const Fp8Matrix& w);

// y [rows][out], bf16 or fp32; rows <= kFp8LinearMaxRows, in <= kFp8LinearDenseMaxIn.
void launch_fp8_linear(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream);

// The same product left as split partial sums for the kernel that reads it (linear_output.h):
// split s of K writes partials[s][rows][out] (fp32). The split count depends on the matrix's
// shape alone, never on `rows` (a row's result does not depend on its batch); partial_floats
// must hold kMaxLinearSplits * kFp8LinearMaxRows * out.
LinearOutput launch_fp8_linear_partials(const bf16* x, const Fp8Matrix& w, float* partials,
                                        std::size_t partial_floats, int rows, cudaStream_t stream);

// out [w.out][w.in] bf16 = the weights dequantized (value times scale, rounded to bf16).
void launch_fp8_dequantize(const Fp8Matrix& w, bf16* out, cudaStream_t stream);

}  // namespace asynct::kernels
