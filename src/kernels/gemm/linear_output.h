// A linear layer's output as the kernel after it reads it. A GEMM of few rows (a decode step)
// is split over K to spread its weights over every multiprocessor; adding the splits inside the
// GEMM costs its last CTA a chain of L2 round trips (~4 us at 32 rows, bench/RESULTS.md), while
// the kernel that reads the output anyway (a row norm) can add them as it loads its row. So the
// output is either a dense bf16 matrix or fp32 partial sums, one matrix per split.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/common/bf16.h"

namespace asynct::kernels {

// The most splits a product is cut into (the readers unroll their loads to this many).
constexpr int kMaxLinearSplits = 8;

struct LinearOutput {
  // Dense: [rows][cols] bf16.
  const bf16* dense = nullptr;
  // Or split: element (r, c) = sum over s = 0 .. splits-1, in that order, of
  // partials[s * split_stride + r * cols + c] (fp32).
  const float* partials = nullptr;
  int splits = 0;
  std::int64_t split_stride = 0;

  static LinearOutput of(const bf16* dense) { return LinearOutput{dense, nullptr, 0, 0}; }
  __host__ __device__ bool is_split() const { return partials != nullptr; }
};

// Checks a split operand of a product of `elements` values before a kernel reads it: partials
// 16-byte aligned (the readers load float4s), a split count they unroll to, a stride past the
// whole product that keeps every split aligned.
inline void check_split_output(const char* who, const char* name, const LinearOutput& in, std::int64_t elements) {
  check(in.partials != nullptr, who, ": ", name, " is null");
  check(reinterpret_cast<std::uintptr_t>(in.partials) % 16 == 0, who, ": ", name, " is not 16-byte aligned");
  check(in.splits >= 1 && in.splits <= kMaxLinearSplits, who, ": ", name, " has ", in.splits, " splits; 1..",
        kMaxLinearSplits, " are supported");
  check(in.split_stride >= elements && in.split_stride % 4 == 0, who, ": ", name, "' split stride ",
        in.split_stride, " is not a multiple of 4 of at least ", elements);
}

// The merged gate/up projection (SwiGLU) on the device: its 2 x inter rows come in blocks of
// kGluBlock gate rows followed by the same up rows ([g0..g31, u0..u31, g32..g63, u32..], the
// last block narrower when inter is not a multiple of kGluBlock), so that a GEMM tile of a
// multiple of 2 x kGluBlock output columns (64 or 128 in the skinny kernel) holds matching gate
// and up columns and can apply SiLU(gate) * up itself. Products of few rows do that
// (Gemm::gated_linear); others go through launch_silu_and_mul, which reads the same order.
constexpr int kGluBlock = 32;

// Where act column j's gate and up values are in a row of the merged product.
struct GluColumns {
  int gate, up;
};
__host__ __device__ inline GluColumns glu_columns(int j, int inter) {
  const int block = j / kGluBlock, first = block * kGluBlock;
  const int width = inter - first < kGluBlock ? inter - first : kGluBlock;
  return {2 * first + (j - first), 2 * first + width + (j - first)};
}

#ifdef __CUDACC__  // device code only: __expf has no host declaration
__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }
#endif

}  // namespace asynct::kernels
