// Dense layers on FP8 weights: y[rows, out] = x[rows, in] W^T with W [out, in] e4m3 and one
// float scale per row and block of `block_cols` inputs (weight (n, k) = e4m3 value times
// scales[n][k / block_cols]), x bf16, fp32 accumulation, bf16 or fp32 out. The scales are
// applied in the kernel: each lane's 16 weights lie in one block, so their dot product with x is
// scaled once. A decode product is a stream over the weights, and this kernel is built to read
// them at the memory's rate for few rows (the decode steps); more rows run in passes of four
// over the weights (correct, not fast: a prefill-sized product belongs on the tensor cores).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/host_device.h"
#include "kernels/common/bf16.h"

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

// The x rows a pass reads from shared memory, and the widest `in` its shared memory holds.
constexpr int kFp8LinearRowsPerPass = 4;
constexpr int kFp8LinearMaxIn = 16384;

// Whether the kernel takes this product: `in` a multiple of 16 up to kFp8LinearMaxIn,
// block_cols a multiple of 16, x and the values 16-byte aligned. Throws asynct::Error otherwise
// from launch_fp8_linear, naming what is wrong.
bool fp8_linear_supports(const void* x, const Fp8Matrix& w);

void launch_fp8_linear(const bf16* x, const Fp8Matrix& w, void* y, int rows, bool out_fp32, cudaStream_t stream);

}  // namespace asynct::kernels
