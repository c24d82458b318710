// Hopper's bulk copies (cp.async.bulk, the 1-D form of TMA) and the shared-memory barriers
// that count their bytes: the pieces of a producer/consumer pipeline. A producer thread
// announces a stage's bytes on its "full" barrier and starts the copies; the copy engine
// completes the barrier when the bytes have landed; consumers wait on it, read the stage and
// arrive on its "empty" barrier, which the producer waits on before it refills the stage.
// The copies run without the threads, so the bytes in flight do not depend on how many warps
// are resident or what they are computing. sm_90 only.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace asynct::kernels {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// A barrier in shared memory that completes a phase when `count` threads have arrived and
// every byte announced with expect_bytes has been written.
struct SharedBarrier {
  std::uint64_t word;

  __device__ __forceinline__ void init(unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(&word)), "r"(count));
  }
  // After init and before any other thread or the copy engine uses the barrier (then a
  // __syncthreads()).
  __device__ static void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

  // One arrival that also announces `bytes` still to come from bulk copies.
  __device__ __forceinline__ void arrive_expecting(unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(&word)),
                 "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void arrive() {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(&word)) : "memory");
  }
  // Waits until the phase with this parity (0, 1, 0, ... for its 1st, 2nd, 3rd use) completes.
  __device__ __forceinline__ void wait(unsigned parity) {
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}" ::"r"(shared_address(&word)),
        "r"(parity)
        : "memory");
  }
};

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
// memory and counts them on `barrier`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes,
                                                    SharedBarrier& barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(&barrier.word))
      : "memory");
}

}  // namespace asynct::kernels
