// Hopper's warpgroup MMA (wgmma, sm_90a): D[64 x N] += A[64 x 16] B[16 x N]^T with both operands
// read by the tensor cores straight from shared memory, issued by the four warps of a warpgroup
// together and completed asynchronously. The operands are K-major tiles of 128-byte rows in the
// layout of the 128-byte tensor-copy swizzle (bulk_copy.cuh, mma_sync.cuh's swizzle<64>) on a
// 1024-byte aligned base: what a 2-D tensor copy of a 64-wide bf16 box leaves in shared memory.
//
// The accumulator fragment of thread t of the warpgroup (warp w = t / 32, g = (t % 32) / 4,
// q = t % 4): d[4 j + e] is D[16 w + g + 8 (e >> 1)][8 j + 2 q + (e & 1)], the m16n8 layout of
// mma.sync repeated over the warps and the n8 blocks.
//
// Compiled only for sm_90a; on other targets the calls trap (their callers must not be launched
// there: skinny_gemm.cu launches its wgmma form only on a Hopper device, from a build for sm_90a).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ASYNCT_WGMMA 1
#endif

namespace asynct::kernels {

// The matrix descriptor of a K-major operand tile with the 128-byte swizzle (PTX ISA, "matrix
// descriptor format"): the start address, 16 bytes to the next 16-byte chunk along K (unused
// within a swizzle atom, 1 by convention), 1024 bytes between groups of 8 rows, swizzle mode 1.
// Moving along K inside the 128-byte row is moving the start address by 32 bytes per k16 step.
__device__ __forceinline__ std::uint64_t wgmma_descriptor(unsigned shared_address) {
  std::uint64_t d = 0;
  d |= std::uint64_t((shared_address >> 4) & 0x3fffu);
  d |= std::uint64_t(16u >> 4) << 16;
  d |= std::uint64_t(1024u >> 4) << 32;
  d |= std::uint64_t(1) << 62;
  return d;
}

// Orders the warpgroup's earlier register accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() {
#ifdef ASYNCT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
#ifdef ASYNCT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef ASYNCT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// d += A B^T for one k16 step, bf16 in, fp32 accumulators (N / 2 per thread), N = 16, 32, 48 or
// 64: one specialisation per N, as the instruction names its accumulator registers one by one.
#ifdef ASYNCT_WGMMA
template <int N>
struct WgmmaBf16;

template <>
struct WgmmaBf16<16> {
  __device__ __forceinline__ static void run(float (&d)[8], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(a), "l"(b));
  }
};

template <>
struct WgmmaBf16<32> {
  __device__ __forceinline__ static void run(float (&d)[16], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b));
  }
};

template <>
struct WgmmaBf16<48> {
  __device__ __forceinline__ static void run(float (&d)[24], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23}, %24, %25, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "l"(a), "l"(b));
  }
};

template <>
struct WgmmaBf16<64> {
  __device__ __forceinline__ static void run(float (&d)[32], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b));
  }
};
#else
template <int N>
struct WgmmaBf16 {
  __device__ __forceinline__ static void run(float (&)[N / 2], std::uint64_t, std::uint64_t) { __trap(); }
};
#endif

}  // namespace asynct::kernels
