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
// The 128-wide forms (WgmmaBf16x128, for attention) take their accumulators as 16 blocks of
// n8 ([16][4], the shape the attention gates work on) and add a second form with A in registers
// (the m16k16 A fragment of mma.sync per warp) and B MN-major: B[k][n] stored with n contiguous,
// 64-element panels of the same 128-byte swizzle (wgmma_descriptor_mn), which is how a value
// tile [keys][head_dim] lies when it was copied like a key tile.
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

// The element offset of 16-byte chunk `chunk` of row `row` in a [kRows][64 p] bf16 tile stored as
// p panels of [kRows][64] (panel c / 8 holds chunks 8 (c / 8) .. 8 (c / 8) + 7 of every row),
// each row 128 bytes with chunk c at c % 8 ^ row % 8: the layout both descriptors read, K-major
// (wgmma_descriptor, one panel per 64 of K) and MN-major (wgmma_descriptor_mn). On a 1024-byte
// aligned base.
template <int kRows>
__host__ __device__ constexpr int wgmma_panel_offset(int row, int chunk) {
  return (chunk >> 3) * kRows * 64 + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// The descriptor of an MN-major operand tile with the 128-byte swizzle: B[k][n] with n
// contiguous, in panels of 64 n (128-byte rows, one per k), each panel [k rows][64] in the
// K-major tile's layout. Leading byte offset: from one 64-wide panel to the next
// (panel_bytes); stride byte offset: 1024 bytes between groups of 8 k rows. A k16 step moves the
// start address by 16 rows (2048 bytes).
__device__ __forceinline__ std::uint64_t wgmma_descriptor_mn(unsigned shared_address, unsigned panel_bytes) {
  std::uint64_t d = 0;
  d |= std::uint64_t((shared_address >> 4) & 0x3fffu);
  d |= std::uint64_t((panel_bytes >> 4) & 0x3fffu) << 16;
  d |= std::uint64_t(1024u >> 4) << 32;
  d |= std::uint64_t(1) << 62;
  return d;
}

// A descriptor moved `bytes` (a multiple of 16) along the shared memory it reads: one add to its
// start-address field (address / 16 in the low 14 bits) instead of building it anew. Exact: a
// CTA's shared addresses lie below 228 KB, so the field (< 14592) cannot carry into the next.
// (On the low word alone: a 64-bit add would spend a carry that never comes.)
__device__ __forceinline__ std::uint64_t wgmma_descriptor_plus(std::uint64_t descriptor, unsigned bytes) {
  const unsigned low = unsigned(descriptor) + (bytes >> 4);
  return (descriptor & 0xffffffff00000000ull) | low;
}

// Makes this thread's earlier generic-proxy writes to shared memory (plain stores, cp.async)
// visible to the async proxy the tensor cores read through; a barrier must follow.
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifdef ASYNCT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
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

// Pins the accumulators at this point of the program: the compiler may not move reads or writes
// of them across it. After wgmma_wait, before the thread touches accumulators that an async
// wgmma wrote (the wait itself names no registers).
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
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
// ... and their place holders in the instruction.
#define ASYNCT_WGMMA_REGS128                                         \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"          \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
// The 64 accumulator operands of an m64n128 wgmma, d[16][4].
#define ASYNCT_WGMMA_ACC128(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),      \
  "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),      \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),      \
  "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),      \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),      \
  "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),      \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),      \
  "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),      \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),      \
  "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),      \
  "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),  \
  "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),  \
  "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),  \
  "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),  \
  "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),  \
  "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])

// The 128-wide forms for attention: d[16][4] (n8 block j, element e as in the layout above).
struct WgmmaBf16x128 {
  // d += A B^T, A [64][16] and B [128][16] K-major in shared memory (wgmma_descriptor).
  __device__ __forceinline__ static void run(float (&d)[16][4], std::uint64_t a, std::uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ASYNCT_WGMMA_REGS128 "%64, %65, 1, 1, 1, 0, 0;\n"
        : ASYNCT_WGMMA_ACC128(d)
        : "l"(a), "l"(b));
  }
  // d += A B, A [64][16] in registers (per warp the mma.sync m16k16 A fragment of its 16 rows,
  // two bf16 per register), B [16][128] MN-major in shared memory (wgmma_descriptor_mn).
  __device__ __forceinline__ static void run_rs(float (&d)[16][4], const unsigned (&a)[4], std::uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ASYNCT_WGMMA_REGS128 "{%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
        : ASYNCT_WGMMA_ACC128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
#else
template <int N>
struct WgmmaBf16 {
  __device__ __forceinline__ static void run(float (&)[N / 2], std::uint64_t, std::uint64_t) { __trap(); }
};
struct WgmmaBf16x128 {
  __device__ __forceinline__ static void run(float (&)[16][4], std::uint64_t, std::uint64_t) { __trap(); }
  __device__ __forceinline__ static void run_rs(float (&)[16][4], const unsigned (&)[4], std::uint64_t) { __trap(); }
};
#endif

}  // namespace asynct::kernels
