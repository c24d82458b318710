// Small memory-bound kernels of the model runner: row gathers (embedding lookup, picking the
// rows that need logits) and SwiGLU.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/common/bf16.h"
#include "kernels/gemm/linear_output.h"     // the gate/up block order

namespace asynct::kernels {

// out[i] = table[rows[i]] for i < count; table [num_rows, width], width a multiple of 8.
// Row ids outside [0, num_rows) produce zeros (the host validates ids before).
void launch_gather_rows(const bf16* table, const std::int32_t* rows, bf16* out, int count, int num_rows,
                        int width, cudaStream_t stream);

// out[t, i] = silu(gate) * up, with gate and up at glu_columns(i, inter) of row t of gate_up
// [tokens, 2 inter] (the kGluBlock order of linear_output.h); inter a multiple of 8.
void launch_silu_and_mul(const bf16* gate_up, bf16* out, int tokens, int inter, cudaStream_t stream);

}  // namespace asynct::kernels
