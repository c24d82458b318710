// Dense layers for few rows (decode steps): y[rows, out] = x[rows, in] W^T, W [out, in]
// row-major, bf16 in, fp32 accumulation, bf16 or fp32 out. With 64 rows or fewer the product is
// a stream over the weights (each weight is used rows times, far below what the tensor cores
// could do per byte), so this kernel is built to read W at the memory's rate: split-K over
// enough CTAs to fill the GPU evenly, a producer thread feeding a ring of shared-memory stages
// with Hopper's tensor copies, and the split sums added inside each thread-block cluster
// through distributed shared memory (no scratch, no second launch). Opt-in
// (ASYNCT_GEMM=skinny): on the H200 it is still slower than cuBLASLt on most decode shapes
// (bench/RESULTS.md).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention_args.h"  // bf16

namespace asynct::kernels {

constexpr int kSkinnyMaxRows = 64;

// Whether the skinny kernel takes this product: rows <= kSkinnyMaxRows, `in` a multiple of 8
// and 16-byte aligned x and W (each row starts on a 16-byte boundary).
bool skinny_gemm_supports(const void* x, const void* weight, int rows, int in);

void launch_skinny_gemm(const bf16* x, const bf16* weight, void* y, int rows, int in, int out,
                        bool out_fp32, cudaStream_t stream);

}  // namespace asynct::kernels
