// x W^T over bf16 weights as loaded, on every thread of the pool: several projections of the
// same input in one parallel region (q, k and v; gate and up), each writing its columns of y.
#pragma once

#include <cstdint>
#include <vector>

#include "models/cpu_fast/thread_pool.h"

namespace asynct::cpu_fast {

struct LinearPart {
  const std::uint16_t* weight = nullptr;  // bf16 [out, in]
  int out = 0;
  std::int64_t y_offset = 0;  // the part's first column in y
};

// y[r * ldy + part.y_offset + o] = sum_i x[r * ldx + i] * part.weight[o * in + i].
void linear_bf16(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t ldx, int in,
                 const std::vector<LinearPart>& parts, float* y, std::int64_t ldy);

}  // namespace asynct::cpu_fast
