// Dense layers for few rows (decode steps): y[rows, out] = x[rows, in] W^T, W [out, in]
// row-major, bf16 in, fp32 accumulation, bf16 or fp32 out. With 64 rows or fewer the product is
// a stream over the weights (each weight is used rows times, far below what the tensor cores
// could do per byte), so this kernel is built to read W at the memory's rate: split-K over
// enough CTAs to fill the GPU evenly, a producer thread feeding a ring of shared-memory stages
// with Hopper's tensor copies (the weights' part started before the previous kernel ends: a
// dependent launch), and the split sums added by the last CTA of each column tile (no second
// launch) or left to the kernel that reads the output. The engine's choice (gemm.h) for
// products of 1-4 rows, and for the decode step's qkv, o and down products (as split partial
// sums) and gate/up product (with the SiLU in its epilogue) up to 32 rows; cuBLASLt stays faster
// for products of 16-64 rows on their own (bench/RESULTS.md).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "kernels/common/bf16.h"
#include "kernels/gemm/linear_output.h"

namespace asynct::kernels {

constexpr int kSkinnyMaxRows = 64;

// Whether the skinny kernel takes this product: rows <= kSkinnyMaxRows, `in` a multiple of 8
// and 16-byte aligned x and W (each row starts on a 16-byte boundary).
bool skinny_gemm_supports(const void* x, const void* weight, int rows, int in);

// Device scratch for split products: fp32 partial tiles, and one counter per column tile that
// must be zero before the first launch (each launch leaves them zero). Products on one
// workspace must run in stream order. Without room a product runs unsplit.
struct SkinnyWorkspace {
  float* partials = nullptr;
  std::size_t partial_bytes = 0;
  unsigned* counters = nullptr;
  int counter_count = 0;
};
constexpr std::size_t kSkinnyPartialBytes = std::size_t(16) << 20;
constexpr int kSkinnyCounters = 4096;

void launch_skinny_gemm(const bf16* x, const bf16* weight, void* y, int rows, int in, int out,
                        bool out_fp32, const SkinnyWorkspace& workspace, cudaStream_t stream);

// The same product left as split partial sums for the kernel that reads y (linear_output.h):
// split s of K writes its fp32 result to partials[s][rows][out]. The split count depends on
// (in, out) and on the room, partial_floats, counted for kSkinnyMaxRows rows, never on `rows`,
// so that a row's result does not depend on the batch it is in.
LinearOutput launch_skinny_gemm_partials(const bf16* x, const bf16* weight, float* partials,
                                         std::size_t partial_floats, int rows, int in, int out,
                                         cudaStream_t stream);

// act = SiLU(x Wg^T) * (x Wu^T) in one kernel, W the merged gate/up projection [2 inter][in] in
// the kGluBlock order of linear_output.h (a column tile is one gate/up block); act [rows][inter]
// bf16. Unsplit.
void launch_skinny_gemm_glu(const bf16* x, const bf16* weight, bf16* act, int rows, int in, int inter,
                            cudaStream_t stream);

// The column tile width, split count and consumer instructions of every product come from a
// cost model; KernelTuning::skinny (common/tuning.h) forces them for measuring and tests, read at
// each launch.

// Whether the skinny kernel runs at its designed speed on the current device (the tensor
// copies of sm_90); before sm_90 it is correct but slow.
bool skinny_gemm_fast_here();

}  // namespace asynct::kernels
