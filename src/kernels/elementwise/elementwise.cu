#include "kernels/elementwise/elementwise.h"

#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"

namespace asynct::kernels {
namespace {

__global__ void gather_rows_kernel(const bf16* table, const std::int32_t* rows, bf16* out, int num_rows,
                                   int width) {
  wait_for_prior_grids();
  allow_next_grid();
  const int i = blockIdx.x;
  const int row = rows[i];
  const bool valid = row >= 0 && row < num_rows;
  for (int c = threadIdx.x * 8; c < width; c += blockDim.x * 8) {
    Bf16x8 v{};
    if (valid) v = load_bf16x8(table + (long long)row * width + c);
    store_bf16x8(out + (long long)i * width + c, v);
  }
}

// One 8-wide vector per thread, the grid spread over the row's width too: at decode row counts
// a loop over the row would chain its loads (out may alias gate_up, so they are not hoisted).
constexpr int kSiluThreads = 128;
__global__ void __launch_bounds__(kSiluThreads) silu_and_mul_kernel(const bf16* gate_up, bf16* out, int inter) {
  wait_for_prior_grids();
  allow_next_grid();
  const long long t = blockIdx.x;
  const int c = (blockIdx.y * kSiluThreads + threadIdx.x) * 8;
  if (c >= inter) return;
  // The 8 columns lie in one gate/up block (its width is a multiple of 8).
  const GluColumns at = glu_columns(c, inter);
  float g[8], u[8], y[8];
  to_float8(load_bf16x8(gate_up + t * 2 * inter + at.gate), g);
  to_float8(load_bf16x8(gate_up + t * 2 * inter + at.up), u);
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = silu_times(g[i], u[i]);
  store_bf16x8(out + t * inter + c, from_float8(y));
}

int threads_for(int width) { return width / 8 >= 256 ? 256 : ((width / 8 + 31) / 32) * 32; }

}  // namespace

void launch_gather_rows(const bf16* table, const std::int32_t* rows, bf16* out, int count, int num_rows,
                        int width, cudaStream_t stream) {
  check(width > 0 && width % 8 == 0, "gather_rows: width ", width, " must be a positive multiple of 8");
  check(table && rows && out, "gather_rows: null pointer");
  if (count == 0) return;
  launch_dependent(gather_rows_kernel, count, threads_for(width), 0, stream, "gather_rows", table, rows, out, num_rows,
                   width);
}

void launch_silu_and_mul(const bf16* gate_up, bf16* out, int tokens, int inter, cudaStream_t stream) {
  check(inter > 0 && inter % 8 == 0, "silu_and_mul: width ", inter, " must be a positive multiple of 8");
  check(gate_up && out, "silu_and_mul: null pointer");
  if (tokens == 0) return;
  const dim3 grid(tokens, (inter / 8 + kSiluThreads - 1) / kSiluThreads);
  launch_dependent(silu_and_mul_kernel, grid, kSiluThreads, 0, stream, "silu_and_mul", gate_up, out, inter);
}

}  // namespace asynct::kernels
