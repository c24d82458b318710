// A linear layer's output as the kernel after it reads it. A GEMM of few rows (a decode step)
// is split over K to spread its weights over every multiprocessor; adding the splits inside the
// GEMM costs its last CTA a chain of L2 round trips (~4 us at 32 rows, bench/RESULTS.md), while
// the kernel that reads the output anyway (a row norm) can add them as it loads its row. So the
// output is either a dense bf16 matrix or fp32 partial sums, one matrix per split.
#pragma once

#include <cstdint>

#include "kernels/attention_args.h"  // bf16

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
  bool is_split() const { return partials != nullptr; }
};

}  // namespace asynct::kernels
