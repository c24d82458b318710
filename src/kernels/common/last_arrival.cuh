// "The last to arrive combines": several blocks each leave a part of one result in global
// memory and count themselves on that result's counter; the block that brings the count to
// the number of parts adds them up. No second kernel and no grid-wide barrier: at decode sizes
// a launch (and its wait on this one) costs more than the combine. Used by decode stage 1's
// splits, the split skinny GEMM and the split logit summaries.
#pragma once

namespace asynct::kernels {

#ifdef __CUDACC__

// Called, after writing its share of the block's part, by every thread of the block that
// wrote the part or will read the others; `sync` is a barrier over exactly those threads (a
// no-op when only one thread calls), and thread 0 of the block must be among them. The counter
// is zero between launches: the last block resets it for the next launch, as every other block
// has counted by then. Returns true, in every calling thread, in the last block, whose threads
// then see every block's part.
template <typename Sync>
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, unsigned parts, Sync sync) {
  __shared__ bool last;
  __threadfence();  // this thread's writes are visible before the count says so
  sync();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == parts - 1;
    if (last) *counter = 0u;  // ready for the next launch
  }
  sync();
  if (!last) return false;
  __threadfence();  // the other blocks' parts are read after their counts
  return true;
}

#endif  // __CUDACC__

}  // namespace asynct::kernels
