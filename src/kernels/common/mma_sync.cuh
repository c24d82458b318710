// The sm_80+ PTX that the tensor-core kernels (prefill, skinny GEMM) are written in:
// asynchronous 16-byte copies into shared memory, ldmatrix, and the bf16 m16n8k16 mma.sync.
#pragma once

#include <cuda_runtime.h>

namespace asynct::kernels {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared (through L2 only); when !valid the destination is
// zero-filled and nothing is read.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}
// The same with the destination as a shared-memory address (what smem_addr returns).
__device__ __forceinline__ void cp_async16_shared(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 8-byte asynchronous copy global -> shared (through L1: the L2-only form takes 16 bytes alone).
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// The element offset of 16-byte chunk `chunk` of row `row` in a shared-memory tile of
// kRowElems bf16 per row, with each row's chunks XOR-swizzled by the row's low 3 bits: the 8
// rows one ldmatrix (or one phase of 16-byte copies) touches at a chunk fall in 8 distinct bank
// groups. For 64-element rows it is also the layout of Hopper's 128-byte tensor-copy swizzle
// (on a 1024-byte aligned tile).
template <int kRowElems>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kRowElems + ((chunk ^ (row & 7)) << 3);
}

// c += a * b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c[mb][n] and c[mb][n + 1] += a[mb] times the two n8 tiles of one ldmatrix_x4 B fragment, for
// each of a warp's MB m16 row blocks: every B fragment read from shared memory feeds all of them.
template <int MB, int N>
__device__ __forceinline__ void mma_row_blocks(float (&c)[MB][N][4], const unsigned (&a)[MB][4],
                                               const unsigned (&b)[4], int n) {
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    mma_bf16(c[mb][n], a[mb], b[0], b[1]);
    mma_bf16(c[mb][n + 1], a[mb], b[2], b[3]);
  }
}

}  // namespace asynct::kernels
