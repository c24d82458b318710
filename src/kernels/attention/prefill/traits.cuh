// The conventions both prefill kernels (portable.cu: mma.sync; hopper.cu: sm_90a, wgmma) work
// in, and each kernel's tile shape.
//
// The gates work on the m16n8 accumulator fragment that mma.sync and wgmma both produce: lane
// 4g+q of a warp holds columns 8n+2q, 8n+2q+1 of rows g and g+8 of the warp's 16-row block.
#pragma once

#include "kernels/common/bf16.cuh"
#include "kernels/common/bulk_copy.cuh"  // SharedBarrier

namespace asynct::kernels::prefill {

// ---- Small helpers ------------------------------------------------------------------------

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- The order of a tile's keys ------------------------------------------------------------
//
// S's m16n8 fragments (mma.sync and wgmma alike) give the thread of quad lane `quad` the columns
// 8 nb + 2 quad + {0, 1} of each 8-column block nb = 0 .. NB-1. Both kernels store a tile's
// keys in shared memory in an order that makes those columns consecutive keys: column
// j = 8 nb + 2 quad + e holds key 2 NB quad + 2 nb + e, so quad lane q holds the run of keys
// [2 NB q, 2 NB q + 2 NB). The async gate's window sums then stay within the thread, except for
// the first W-1 keys of each run (one exchange per run instead of one per block). K and V rows
// share the order, so P V is unchanged; softmax does not care.
template <int NB>
__host__ __device__ constexpr int key_of_column(int j) {
  return 2 * NB * ((j % 8) / 2) + 2 * (j / 8) + (j & 1);
}
template <int NB>
__device__ __forceinline__ int column_of_key(int k) {
  constexpr int kRun = 2 * NB;
  return 8 * ((k % kRun) / 2) + 2 * (k / kRun) + (k & 1);
}

// Whether element e (0..3) of 8-column block nb of the warp's S fragment is causally masked.
// key0: the tile's first key; pos0: the position of the thread's first row.
template <int NB>
__device__ __forceinline__ bool is_masked(int key0, int pos0, int nb, int e, int quad) {
  return key0 + 2 * NB * quad + 2 * nb + (e & 1) > pos0 + 8 * (e >> 1);
}

// ---- The portable kernel's shape (portable.cu) ----------------------------------------------

namespace portable {

template <int D>
struct Config {
  // 16-row mma blocks per warp: 2 halves the shared-memory reads per mma; head_dim 256 keeps 1
  // (its O accumulators alone take 128 registers per row block).
  static constexpr int kRowBlocks = D <= 128 ? 2 : 1;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16 * kRowBlocks;  // query rows per CTA
  static constexpr int kBlockN = D <= 128 ? 64 : 32;        // keys per tile
  static constexpr int kStages = 2;                         // K/V tiles in flight
  static constexpr int kCtasPerSm = 2;
  static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * D * 2;
  static_assert(kSmemBytes * kCtasPerSm <= 227 * 1024, "two CTAs must fit one SM");
};

}  // namespace portable

// ---- The Hopper kernel's shape (hopper.cu) ---------------------------------------------------

namespace hopper {

constexpr int kD = 128;
constexpr int kConsumers = 2;                     // consumer warpgroups, 64 query rows each
constexpr int kThreads = 128 * (kConsumers + 1);  // and the producer warpgroup
constexpr int kBlockM = 64 * kConsumers;          // query rows per CTA
constexpr int kBlockN = 128;                      // keys per tile
constexpr int kStages = 3;                        // K/V tiles in the ring
constexpr int kChunks = kD / 8;                   // 16-byte chunks per row
constexpr int kPanelCols = 64;                    // one 128-byte swizzle row
constexpr int kRowBytes = kPanelCols * 2;
constexpr int kTileElems = kBlockN * kD;
// Registers per thread after the hand-over (setmaxnreg). The CTA starts with kLaunchRegisters per
// thread (what ptxas gives 384 threads, one CTA per SM); setmaxnreg.inc takes registers only from
// what the producer's setmaxnreg.dec gave back, so the two must add up to no more than that, or
// the consumers wait forever. The producer keeps enough for its addresses, the consumers fit in
// 216 without spilling (ptxas -v; the runtime windows 4..8 spill some). A persistent CTA's
// producer walks its tiles too and needs 88 (at 72 it spilled 52 bytes); its consumers fit in 208.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;  // 168
template <bool kPersistent>
struct Registers {
  static constexpr int kProducer = kPersistent ? 88 : 72, kConsumer = kPersistent ? 208 : 216;
  static_assert(128 * kProducer + 128 * kConsumers * kConsumer <= kThreads * kLaunchRegisters,
                "the consumers can only claim what the producer gave back");
};

// The ring's barriers: full[s] completes when stage s has landed (the producer's 128 threads
// arrive), empty[s] when both consumers are done with it (their 256 threads arrive); q_full when
// a tile's Q has landed, q_empty when both consumers have run their last Q K^T of a tile (Q's
// buffer may take the CTA's next tile).
struct RingBarriers {
  SharedBarrier full[kStages], empty[kStages];
  SharedBarrier q_full, q_empty;
};
// Q, kStages K tiles, kStages V tiles, the barriers; + 1024 to align the base to a swizzle period.
constexpr int kTileBytes = (kBlockM + 2 * kStages * kBlockN) * kD * 2;
constexpr int kSmemBytes = kTileBytes + int(sizeof(RingBarriers)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
static_assert(kRowBytes == 128 && kTileElems % 8192 == 0 && kChunks == 16, "tiles of whole swizzle atoms");

}  // namespace hopper

}  // namespace asynct::kernels::prefill
