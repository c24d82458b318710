// Hopper's wgmma primitive (kernels/wgmma.cuh) on its own, against the CPU reference: the
// operand layout it is fed (K-major rows of 64 bf16 in the 128-byte swizzle, as the skinny
// GEMM's tensor copies leave them), the descriptor's K steps and the accumulator layout the
// skinny GEMM's epilogue reads. When the GEMM tests of the wgmma consumer fail, this tells
// whether the primitive or the pipeline around it is wrong.
#include <gtest/gtest.h>

#include "gpu/device_buffer.h"
#include "kernels/bulk_copy.cuh"
#include "kernels/mma_sync.cuh"
#include "kernels/skinny_gemm.h"
#include "kernels/wgmma.cuh"
#include "reference/layers.h"
#include "support/compare.h"
#include "support/random.h"

namespace asynct {
namespace {

using kernels::bf16;
using testing::close_to;
using testing::DeviceBuffer;

constexpr int kM = 64, kK = 64;

// d[64][N] = a[64][64] b[N][64]^T by one warpgroup: four k16 steps of one m64nNk16 wgmma.
template <int N>
__global__ void wgmma_tile(const bf16* a, const bf16* b, float* d) {
  __shared__ __align__(1024) bf16 sa[kM * kK];
  __shared__ __align__(1024) bf16 sb[N * kK];
  // Rows of 8 chunks of 16 bytes, chunk c of row r stored at c ^ (r % 8): the 128-byte swizzle.
  for (int i = threadIdx.x; i < kM * 8; i += blockDim.x)
    *reinterpret_cast<uint4*>(sa + kernels::swizzle<kK>(i / 8, i % 8)) = reinterpret_cast<const uint4*>(a)[i];
  for (int i = threadIdx.x; i < N * 8; i += blockDim.x)
    *reinterpret_cast<uint4*>(sb + kernels::swizzle<kK>(i / 8, i % 8)) = reinterpret_cast<const uint4*>(b)[i];
  // Written by plain stores, read by the tensor cores' (async) proxy.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
  __syncthreads();
  float acc[N / 2] = {};
  const unsigned a_address = kernels::shared_address(sa), b_address = kernels::shared_address(sb);
  kernels::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks)
    kernels::WgmmaBf16<N>::run(acc, kernels::wgmma_descriptor(a_address + ks * 32),
                               kernels::wgmma_descriptor(b_address + ks * 32));
  kernels::wgmma_commit();
  kernels::wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[(16 * warp + g + 8 * (e >> 1)) * N + 8 * j + 2 * q + (e & 1)] = acc[4 * j + e];
}

template <int N>
void check_wgmma_tile(testing::Random& rng) {
  SCOPED_TRACE("N = " + std::to_string(N));
  Tensor a = rng.normal({kM, kK}, 1.0f, true), b = rng.normal({N, kK}, 1.0f, true);
  Tensor expected = linear(a, b);  // a b^T: [64][N]
  DeviceBuffer da = DeviceBuffer::upload(a, DType::BF16), db = DeviceBuffer::upload(b, DType::BF16);
  DeviceBuffer d(DType::F32, {kM, N});
  d.poison();
  wgmma_tile<N><<<1, 128>>>(da.as<bf16>(), db.as<bf16>(), d.as<float>());
  testing::check_launch("wgmma_tile");
  EXPECT_TRUE(close_to(d.download_float(), expected, 1e-5));  // exact products, fp32 sums
}

TEST(Wgmma, SmallTileMatchesTheReferenceForEveryWidth) {
  testing::require_gpu();
  if (!kernels::skinny_gemm_fast_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
  testing::Random rng(11);
  check_wgmma_tile<16>(rng);
  check_wgmma_tile<32>(rng);
  check_wgmma_tile<48>(rng);
  check_wgmma_tile<64>(rng);
}

}  // namespace
}  // namespace asynct
