// x W^T over the weights (bf16 as loaded, e4m3 with block scales, or int8), on every thread of the
// pool: several projections of the same input in one parallel region (q, k and v; gate and up),
// each writing its columns of y.
#pragma once

#include <cstdint>
#include <vector>

#include "models/cpu_fast/kernels.h"
#include "core/thread_pool.h"

namespace asynct::cpu_fast {

// A projection [out, in]: bf16 as loaded; e4m3 values with float32 block scales
// ([ceil(out / block_rows)][ceil(in / block_cols)]; weight (r, k) is its value times its block's);
// or 8-bit integers (kernels.h: Int8Matrix).
struct Projection {
  const std::uint16_t* bf16 = nullptr;
  const std::uint8_t* fp8 = nullptr;
  const float* scales = nullptr;
  int block_rows = 0, block_cols = 0;
  const Int8Matrix* int8 = nullptr;
};

struct LinearPart {
  Projection weight;
  int out = 0;
  std::int64_t y_offset = 0;  // the part's first column in y
};

// y[r * ldy + part.y_offset + o] = sum_i x[r * ldx + i] * part.weight[o * in + i].
void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t ldx, int in,
                 const std::vector<LinearPart>& parts, float* y, std::int64_t ldy);

}  // namespace asynct::cpu_fast
