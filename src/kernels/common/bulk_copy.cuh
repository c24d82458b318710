// Hopper's bulk copies (cp.async.bulk, the 1-D form of TMA) and the shared-memory barriers
// that count their bytes: the pieces of a producer/consumer pipeline. A producer starts a
// stage's copies, then one of its threads arrives on the stage's "full" barrier announcing the
// bytes (the barrier's byte count may go below zero while copies land first); the copy engine
// completes the phase when the bytes have landed. Consumers wait on it, read the stage and
// arrive on its "empty" barrier, which the producer waits on before it refills the stage.
// The copies run without the threads, so the bytes in flight do not depend on how many warps
// are resident or what they are computing.
//
// Before sm_90 the same calls still work, without the copy engine: a copy is made by the
// calling thread with 16-byte loads and stores before it returns, and the barriers count
// arrivals only. Correct and slow: the kernels built on this are tuned for Hopper.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define ASYNCT_BULK_COPY_EMULATED 1
#endif

namespace asynct::kernels {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Orders this thread's earlier global writes before the bulk copies that later read them (the
// copy engine reads through the async proxy); the thread that issues those copies must learn of
// the writes through a barrier or a warp synchronisation after this fence.
__device__ __forceinline__ void fence_generic_to_async_global() {
#ifndef ASYNCT_BULK_COPY_EMULATED
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Orders this thread's earlier shared-memory writes before later bulk copies into the same
// shared memory (the async proxy), for a buffer the threads write into between refills.
__device__ __forceinline__ void fence_generic_to_async_shared() {
#ifndef ASYNCT_BULK_COPY_EMULATED
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// A barrier in shared memory that completes a phase when `count` threads have arrived and
// every byte announced with arrive_expecting has been written.
struct SharedBarrier {
  std::uint64_t word;

  __device__ __forceinline__ void init(unsigned count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(shared_address(&word)), "r"(count));
  }
  // After init and before any other thread or the copy engine uses the barrier (then a
  // __syncthreads()).
  __device__ static void fence_init() {
#ifndef ASYNCT_BULK_COPY_EMULATED
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }

  // One arrival that also announces `bytes` of bulk copies to this barrier (issued before or
  // after it); the caller's warp must have synchronised after issuing its copies.
  __device__ __forceinline__ void arrive_expecting(unsigned bytes) {
#ifndef ASYNCT_BULK_COPY_EMULATED
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(&word)),
                 "r"(bytes)
                 : "memory");
#else
    (void)bytes;  // the emulated copies are complete when they return
    arrive();
#endif
  }
  // Announces `bytes` of bulk copies to this barrier's current phase without arriving (the
  // thread arrives otherwise: a plain or a cp.async arrival). Before the phase can complete.
  __device__ __forceinline__ void expect(unsigned bytes) {
#ifndef ASYNCT_BULK_COPY_EMULATED
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(shared_address(&word)), "r"(bytes)
                 : "memory");
#else
    (void)bytes;
#endif
  }
  // Returns the phase token (the kernels wait by parity instead).
  __device__ __forceinline__ std::uint64_t arrive() {
    std::uint64_t state;
    asm volatile("mbarrier.arrive.shared.b64 %0, [%1];" : "=l"(state) : "r"(shared_address(&word)) : "memory");
    return state;
  }
  // One arrival, made when every cp.async this thread issued before it has landed (the count the
  // barrier was initialised with includes it: .noinc). The thread does not wait.
  __device__ __forceinline__ void arrive_when_copies_land() {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(shared_address(&word)) : "memory");
  }
  // Waits until the phase with this parity (0, 1, 0, ... for its 1st, 2nd, 3rd use) completes.
  __device__ __forceinline__ void wait(unsigned parity) {
#ifndef ASYNCT_BULK_COPY_EMULATED
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}" ::"r"(shared_address(&word)),
        "r"(parity)
        : "memory");
#else
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n"
        " mbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}" ::"r"(shared_address(&word)),
        "r"(parity)
        : "memory");
#endif
  }
};

// A policy for data streamed once (weights, K and V in a decode step): its lines leave L2
// first, so that what is read again soon (activations, partial sums, norm weights, block
// tables) stays. Measured on H200: -0.03 (AsyncT) and -0.05 ms (Qwen3) per decode step at 32
// sequences (bench/RESULTS.md).
__device__ __forceinline__ std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy = 0;
#ifndef ASYNCT_BULK_COPY_EMULATED
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
// memory under an L2 eviction policy (from l2_evict_first_policy) and counts them on `barrier`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes,
                                                    SharedBarrier& barrier, std::uint64_t policy) {
#ifndef ASYNCT_BULK_COPY_EMULATED
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(&barrier.word)), "l"(policy)
      : "memory");
#else
  (void)barrier, (void)policy;
  const uint4* from = static_cast<const uint4*>(src);
  uint4* to = static_cast<uint4*>(dst);
  for (unsigned i = 0; i < bytes / 16; ++i) to[i] = from[i];
#endif
}

#ifndef ASYNCT_BULK_COPY_EMULATED
// Copies the box at coordinates (x0 innermost, y0) of a 2-D tensor map (its box size, swizzle
// and zero fill past the tensor's edges are the map's) into shared memory and counts the box's
// bytes on `barrier`. `tensor_map` is the address of a __grid_constant__ kernel parameter.
// Hopper only: there is no emulation of tensor maps before sm_90.
__device__ __forceinline__ void tensor_copy_2d_to_shared(void* dst, const void* tensor_map, int x0, int y0,
                                                         SharedBarrier& barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          shared_address(dst)),
      "l"(tensor_map), "r"(x0), "r"(y0), "r"(shared_address(&barrier.word))
      : "memory");
}
// The same with an L2 eviction policy (from l2_evict_first_policy).
__device__ __forceinline__ void tensor_copy_2d_to_shared(void* dst, const void* tensor_map, int x0, int y0,
                                                         SharedBarrier& barrier, std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(
          shared_address(dst)),
      "l"(tensor_map), "r"(x0), "r"(y0), "r"(shared_address(&barrier.word)), "l"(policy)
      : "memory");
}
// The box at coordinates (c0 innermost, .., c3) of a 4-D tensor map, as tensor_copy_2d_to_shared.
__device__ __forceinline__ void tensor_copy_4d_to_shared(void* dst, const void* tensor_map, int c0, int c1, int c2,
                                                         int c3, SharedBarrier& barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(
          shared_address(dst)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(&barrier.word))
      : "memory");
}
#endif

}  // namespace asynct::kernels
