// Few-row dense layers on bf16 weights (skinny_gemm.h): the entry points of the skinny kernel
// (skinny_ring.cuh) in its bf16 format, whose consumers read W with ldmatrix and mma.sync or,
// on Hopper past 16 rows, with wgmma.
#include "kernels/gemm/skinny_gemm.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/gemm/skinny_ring.cuh"

namespace asynct::kernels {

bool skinny_gemm_supports(const void* x, const void* weight, int rows, int in) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kSkinnyMaxRows && in >= 8 && in % 8 == 0 && aligned(x) && aligned(weight);
}

namespace {
using skinny::Bf16Format;

void check_supported(const void* x, const void* weight, int rows, int in) {
  check(skinny_gemm_supports(x, weight, rows, in), "skinny_gemm: unsupported product [", rows, " x ", in,
        "] (rows 1..", kSkinnyMaxRows, ", in a multiple of 8, 16-byte aligned)");
}
}  // namespace

void launch_skinny_gemm(const bf16* x, const bf16* weight, void* y, int rows, int in, int out,
                        bool out_fp32, const SkinnyWorkspace& workspace, cudaStream_t stream) {
  check_supported(x, weight, rows, in);
  check(out >= 1 && y != nullptr, "skinny_gemm: no output");
  // Splits need a partial tile per CTA and a counter per column tile in the workspace (counted
  // for the narrow tiles, the most).
  const int col_tiles = (out + skinny::kNarrowTileN - 1) / skinny::kNarrowTileN;
  const std::size_t tiles_that_fit = workspace.partial_bytes / (skinny::kPartialTileFloats * sizeof(float));
  const bool room = col_tiles <= workspace.counter_count && workspace.partials && workspace.counters;
  const int room_splits = room ? int(std::min<std::size_t>(skinny::kMaxSplits, tiles_that_fit / col_tiles)) : 1;
  skinny::SkinnyArgs a = skinny::skinny_args(x, weight, rows, in, out);
  a.y = y;
  a.out_fp32 = out_fp32;
  a.partials = workspace.partials;
  a.counters = workspace.counters;
  skinny::plan_and_launch<Bf16Format>(a, room_splits, false, stream);
}

LinearOutput launch_skinny_gemm_partials(const bf16* x, const bf16* weight, float* partials,
                                         std::size_t partial_floats, int rows, int in, int out,
                                         cudaStream_t stream) {
  check_supported(x, weight, rows, in);
  check(out >= 1 && partials != nullptr, "skinny_gemm: no output");
  skinny::SkinnyArgs a = skinny::skinny_args(x, weight, rows, in, out);
  a.split_out = partials;
  a.split_stride = (long long)rows * out;
  a.out_fp32 = true;
  skinny::plan_and_launch<Bf16Format>(a, skinny::partial_room_splits("skinny_gemm", partial_floats, out), true, stream);
  return LinearOutput{nullptr, partials, a.plan.splits, a.split_stride};
}

void launch_skinny_gemm_glu(const bf16* x, const bf16* weight, bf16* act, int rows, int in, int inter,
                            cudaStream_t stream) {
  check_supported(x, weight, rows, in);
  check(inter >= 8 && inter % 8 == 0 && act != nullptr, "skinny_gemm: gated product of width ", inter,
        " (a positive multiple of 8) or no output");
  skinny::SkinnyArgs a = skinny::skinny_args(x, weight, rows, in, 2 * inter);
  a.y = act;
  a.glu = true;
  skinny::plan_and_launch<Bf16Format>(a, 1, false, stream);
}

bool skinny_gemm_fast_here() { return skinny::device_traits().tensor_maps; }

}  // namespace asynct::kernels
