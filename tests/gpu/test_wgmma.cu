// Hopper's wgmma primitive (kernels/common/wgmma.cuh) on its own, against the CPU reference: the
// operand layout it is fed (K-major rows of 64 bf16 in the 128-byte swizzle, as the skinny
// GEMM's tensor copies leave them), the descriptor's K steps and the accumulator layout the
// skinny GEMM's epilogue reads. When the GEMM tests of the wgmma consumer fail, this tells
// whether the primitive or the pipeline around it is wrong. The same for the 128-wide forms of
// the Hopper prefill kernel: S = Q K^T over two 64-wide panels of K, and O = P V with P in
// registers and V read MN-major.
#include <cstdint>

#include <gtest/gtest.h>

#include "gpu/device_buffer.h"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/mma_sync.cuh"
#include "kernels/attention/prefill/prefill.h"
#include "kernels/common/wgmma.cuh"
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
  if (!kernels::prefill_hopper_available()) GTEST_SKIP() << "needs a Hopper GPU and sm_90a code";
  testing::Random rng(11);
  check_wgmma_tile<16>(rng);
  check_wgmma_tile<32>(rng);
  check_wgmma_tile<48>(rng);
  check_wgmma_tile<64>(rng);
}

// Stores a [rows][128] bf16 matrix (global, row-major) into the two-panel layout.
template <int kRows>
__device__ void store_panels(bf16* dst, const bf16* src) {
  for (int i = threadIdx.x; i < kRows * 16; i += blockDim.x)
    *reinterpret_cast<uint4*>(dst + kernels::wgmma_panel_offset<kRows>(i / 16, i % 16)) =
        reinterpret_cast<const uint4*>(src)[i];
}

// The dynamic shared memory, from its first 1024-byte boundary (the swizzle atoms need it; the
// launches add 1024 bytes).
__device__ bf16* aligned_smem() {
  extern __shared__ unsigned char smem[];
  return reinterpret_cast<bf16*>((reinterpret_cast<std::uintptr_t>(smem) + 1023) & ~std::uintptr_t(1023));
}

// Writes the [64][128] accumulators d[16][4] of the warpgroup to out (row-major).
__device__ void store_accumulators(const float (&acc)[16][4], float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  for (int j = 0; j < 16; ++j)
    for (int e = 0; e < 4; ++e) out[(16 * warp + g + 8 * (e >> 1)) * 128 + 8 * j + 2 * q + (e & 1)] = acc[j][e];
}

// s[64][128] = q[64][128] k[128][128]^T: eight k16 steps, four per 64-wide panel.
__global__ void wgmma_scores(const bf16* q, const bf16* k, float* s) {
  bf16* sq = aligned_smem();
  bf16* sk = sq + 64 * 128;
  store_panels<64>(sq, q);
  store_panels<128>(sk, k);
  kernels::fence_proxy_async_shared();
  __syncthreads();
  float acc[16][4] = {};
  const unsigned qa = kernels::shared_address(sq), ka = kernels::shared_address(sk);
  kernels::wgmma_fence();
  for (int ks = 0; ks < 8; ++ks)
    kernels::WgmmaBf16x128::run(acc, kernels::wgmma_descriptor(qa + (ks / 4) * 64 * 128 + (ks % 4) * 32),
                                kernels::wgmma_descriptor(ka + (ks / 4) * 128 * 128 + (ks % 4) * 32));
  kernels::wgmma_commit();
  kernels::wgmma_wait<0>();
  store_accumulators(acc, s);
}

// o[64][128] = p[64][32] v[32][128]: p in registers (the m16k16 A fragment per warp), v MN-major.
__global__ void wgmma_values(const bf16* p, const bf16* v, float* o) {
  bf16* sv = aligned_smem();
  store_panels<32>(sv, v);
  kernels::fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const auto pair = [&](int row, int col) {  // p[row][col], p[row][col + 1] in one register
    __nv_bfloat162 two{p[row * 32 + col], p[row * 32 + col + 1]};
    return *reinterpret_cast<unsigned*>(&two);
  };
  unsigned a[2][4];
  for (int kk = 0; kk < 2; ++kk) {
    const int row = 16 * warp + g, col = 16 * kk + 2 * q;
    a[kk][0] = pair(row, col);
    a[kk][1] = pair(row + 8, col);
    a[kk][2] = pair(row, col + 8);
    a[kk][3] = pair(row + 8, col + 8);
  }
  float acc[16][4] = {};
  const unsigned va = kernels::shared_address(sv);
  kernels::wgmma_fence();
  for (int kk = 0; kk < 2; ++kk)
    kernels::WgmmaBf16x128::run_rs(acc, a[kk], kernels::wgmma_descriptor_mn(va + kk * 16 * 128, 32 * 128));
  kernels::wgmma_commit();
  kernels::wgmma_wait<0>();
  store_accumulators(acc, o);
}

TEST(Wgmma, AttentionFormsMatchTheReference) {
  testing::require_gpu();
  if (!kernels::prefill_hopper_available()) GTEST_SKIP() << "needs a Hopper GPU and sm_90a code";
  testing::Random rng(12);
  {
    SCOPED_TRACE("S = Q K^T");
    Tensor q = rng.normal({64, 128}, 1.0f, true), k = rng.normal({128, 128}, 1.0f, true);
    DeviceBuffer dq = DeviceBuffer::upload(q, DType::BF16), dk = DeviceBuffer::upload(k, DType::BF16);
    DeviceBuffer s(DType::F32, {64, 128});
    s.poison();
    const int smem = (64 + 128) * 128 * 2 + 1024;
    ASSERT_EQ(cudaFuncSetAttribute(wgmma_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
    wgmma_scores<<<1, 128, smem>>>(dq.as<bf16>(), dk.as<bf16>(), s.as<float>());
    testing::check_launch("wgmma_scores");
    EXPECT_TRUE(close_to(s.download_float(), linear(q, k), 1e-5));
  }
  {
    SCOPED_TRACE("O = P V");
    Tensor p = rng.normal({64, 32}, 1.0f, true), v = rng.normal({32, 128}, 1.0f, true);
    DeviceBuffer dp = DeviceBuffer::upload(p, DType::BF16), dv = DeviceBuffer::upload(v, DType::BF16);
    DeviceBuffer o(DType::F32, {64, 128});
    o.poison();
    wgmma_values<<<1, 128, 32 * 128 * 2 + 1024>>>(dp.as<bf16>(), dv.as<bf16>(), o.as<float>());
    testing::check_launch("wgmma_values");
    // linear(x, w) = x w^T, so p v = linear(p, v^T).
    Tensor vt = Tensor::empty(DType::F32, {128, 32});
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 128; ++c) vt.data_as<float>()[c * 32 + r] = v.data_as<float>()[r * 128 + c];
    EXPECT_TRUE(close_to(o.download_float(), linear(p, vt), 1e-5));
  }
}

}  // namespace
}  // namespace asynct
