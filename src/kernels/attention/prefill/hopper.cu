// Over 500 lines: one kernel (its producer, its consumers, the split path's parts and their
// combine, the persistent form's walk over its tiles), whose pieces share the tile shape, the
// ring and the turn barriers.
// Hopper prefill attention (sm_90a) for head_dim 128: the portable kernel's algorithm (portable.cu)
// on warpgroup MMA (wgmma.cuh), with the same gates, tile order, K/V sources and cache write
// (traits.cuh, mainloop.cuh, gates.cuh, epilogue.cuh), in the FlashAttention-3 form: a producer
// warpgroup that copies and two consumer warpgroups that multiply.
//
// One CTA handles 128 query rows of one (sequence, query head), or, for a split tile of at most
// 64 rows, those rows of two query heads of one KV head (below). Its three warpgroups:
// - the producer copies Q and the K/V tiles (128 keys) into a ring of three stages: a tile of new
//   tokens by tensor copies (one thread, four copies: NewKvMaps), a tile with cached keys by
//   cp.async from every thread (the cache is paged, so a row's source goes through the block
//   table), as is Q; it announces each stage on its "full" barrier once the stage has landed,
//   waits on the stage's "empty" barrier before refilling it, and copies the tile's new K/V rows
//   from shared memory into the paged cache. It gives its registers to the consumers.
// - each consumer owns 64 query rows:
//     S = Q K^T  eight m64n128k16 steps, Q and K read by the tensor cores from shared memory;
//     P = gate(S) in registers (the m16n8 fragment layout both gates already work on);
//     O += P V   eight m64n128k16 steps with P as the register operand and V read MN-major;
//   and releases a stage once its P V is done.
// Every tile in shared memory is two panels of [rows][64] in the 128-byte swizzle, the layout the
// wgmma descriptors read: K-major for Q and K (the product's K is head_dim), and the same bytes
// read MN-major for V (its K is the key).
//
// What overlaps what (the tensor cores should never wait for a gate, nor the consumers for a copy):
// - within a consumer, tile t's Q K^T is issued first and tile t-1's P V right behind it, so the
//   P V runs while the gate of tile t works (the gates' apply() leaves O alone; softmax's rescale
//   of O, when a row's max moved, waits for the P V);
// - the two consumers take turns at Q K^T (0, 1, 0, 1, ...), so that they do not reach their gates
//   at the same moment;
// - the producer runs up to three tiles ahead.
//
// When the query tiles alone would leave most of the GPU idle (a short prompt after a long cached
// prefix: 16 CTAs for 132 multiprocessors at 1.7B), each tile's keys are split over several CTAs
// (prefill_hopper_kv_splits). Each writes its rows' output in fp32 to the workspace, softmax's
// normalised by its own sum with that sum's log2 beside it; a second kernel adds the parts
// (softmax's weighted by their sums). The async gate's P of a split's first keys needs the
// scores of the W-1 keys before them: its CTA runs the tile before its keys through Q K^T and
// the gate (not P V) to carry them in. When every sequence has at most 64 new tokens and a KV
// head serves an even number of query heads, a split CTA takes two query heads, one a consumer:
// a tile of 64 rows would leave one consumer idle, and the pair shares each K/V tile, so the
// GPU holds twice the splits (the 64 tokens after 4,096 cached at 1.7B: 8 pairs x 16 splits
// instead of 16 heads x 8).
//
// The work around the products is kept small, as ncu's source page showed it mattered more than
// the gates (bench/history/2026-12-02-tensor-copies.md): the wgmma descriptors are built once and
// moved by one add per product, in uniform registers; a new-token tile costs the producer four
// instructions of one thread.
//
// Persistent CTAs (KernelTuning::prefill_ctas, off by default): at most one CTA a multiprocessor
// takes pairs of query tiles; the producer copies the next tile's Q once the consumers have run
// the current tile's last Q K^T (Q has one buffer: with three K/V stages the shared memory holds
// no second), and the output goes from the registers. Measured slower: a tile costs 8.3 us
// besides its key tiles against 6.1 us with one CTA a tile (async 0.86x at 16 x 1024, 0.88x at
// 8 x 2048, 0.99x at 1 x 16384). Likely, not measured apart: the next tile waits for its Q,
// copied only after the last Q K^T, and for the producer, which first writes the cache from the
// tile before (bench/RESULTS.md, the prefill bounds).
//
// Not done (FlashAttention-3 does it): tensor copies for cached pages of at least 128 tokens.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cuda.h>  // CUtensorMap

#include "core/error.h"
#include "kernels/attention/prefill/epilogue.cuh"
#include "kernels/attention/prefill/gates.cuh"
#include "kernels/attention/prefill/kernels.h"
#include "kernels/attention/prefill/mainloop.cuh"
#include "kernels/attention/prefill/split_keys.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/common/bf16.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_info.h"
#include "kernels/common/mma_sync.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/common/tuning.h"
#include "kernels/common/wgmma.cuh"

namespace asynct::kernels {
namespace {

using namespace prefill;          // TileInfo, the gates, kv_row, store_new_rows, the split parts
using namespace prefill::hopper;  // the tile shape, RingBarriers

// The new tokens' K and V ([total_q][num_kv_heads][128] each) as tensor maps whose box is one
// 64-column panel of a key tile, rows in the key order of traits.cuh: shared row 8 b + 2 a + e
// holds key 32 a + 2 b + e. So the dimensions after the columns are e (the next token), a (32
// tokens on) and b (2 tokens on), and a box is (64, 2, 4, 16), written in that order. A tile's
// first token is e's coordinate (a and b's stay 0). The map checks each coordinate against its
// own dimension, not the token they add up to, so it would not stop a copy at the arrays' end;
// the kernel copies this way only tiles whose 128 tokens are all its sequence's (another
// sequence's keys would be masked, but a masked key's P of 0 times an infinite value is NaN:
// one request's overflow must not reach another's output). The sequence's last, partial tile
// goes by cp.async, which zero-fills the keys past the CTA's last row. `usable`: the driver
// took the maps.
struct NewKvMaps {
  CUtensorMap key, value;
  bool usable;
};

NewKvMaps new_kv_maps(const PrefillParams& p) {
  NewKvMaps maps{};
  TensorMapShape shape;
  shape.rank = 4;
  const cuuint64_t row_bytes = cuuint64_t(p.kv.num_kv_heads) * kD * 2;
  shape.dims[0] = cuuint64_t(p.kv.num_kv_heads) * kD, shape.dims[1] = cuuint64_t(p.total_q);
  shape.dims[2] = 4, shape.dims[3] = kBlockN / 8;
  shape.strides[0] = row_bytes, shape.strides[1] = 32 * row_bytes, shape.strides[2] = 2 * row_bytes;
  shape.box[0] = kPanelCols, shape.box[1] = 2, shape.box[2] = 4, shape.box[3] = kBlockN / 8;
  static_assert(2 * 4 * (kBlockN / 8) == kBlockN && key_of_column<kBlockN / 8>(8 + 2 + 1) == 32 + 2 + 1,
                "the box's rows in the key order");
  const bool encoded = p.total_q >= kBlockN && encode_bf16_tensor_map(maps.key, p.key, shape) &&
                       encode_bf16_tensor_map(maps.value, p.value, shape);
  maps.usable = encoded;
  return maps;
}

// A persistent CTA's work: the query tiles of each (head, sequence) go in pairs, tile z with
// tile m - 1 - z (the middle one of an odd count alone). The kernel walks them, the host sizes
// the grid by them.
struct TilePairs {
  int m_tiles, pairs_a_seq;
  long long pairs;
  __host__ __device__ explicit TilePairs(const PrefillParams& p)
      : m_tiles((p.max_q_len + kBlockM - 1) / kBlockM),
        pairs_a_seq((m_tiles + 1) / 2),
        pairs((long long)p.num_q_heads * p.num_seqs * pairs_a_seq) {}
};

// The device code exists only where wgmma does (sm_90a); elsewhere the kernel is a trapping stub.
#ifdef ASYNCT_WGMMA

// How the producer's 128 threads copy a 128-row tile: in 4 passes of 32 rows, lane l of warp w
// takes row 8 w + l % 8 (+ 32 per pass) and chunks 4 j + l / 8, j = 0..3. One copy instruction of a
// warp reads 64 contiguous bytes of each of 8 rows, and the 8 threads of a shared-memory phase
// hold 8 consecutive rows at one chunk (distinct banks after the swizzle).
constexpr int kCopyPasses = 4;
struct CopySlot {
  int row0, sub;  // the thread's row in pass 0, its chunk within each group of 4
  __device__ __forceinline__ CopySlot()
      : row0(8 * ((threadIdx.x % 128) / 32) + threadIdx.x % 8), sub((threadIdx.x % 32) / 8) {}
};
static_assert(kBlockM == kBlockN && kCopyPasses * 32 == kBlockN, "the producer copies 128-row tiles");

// Q rows [m0, m0 + 128) of the tile's head, or with two heads rows [m0, m0 + 64) of each (head
// t.head in rows 0..63, t.head + 1 in 64..127); rows past the sequence's new tokens zero-filled.
__device__ __forceinline__ void load_q(bf16* sQ, const PrefillParams& p, const TileInfo& t, int rows, int heads) {
  const CopySlot slot;
  const int rows_per_head = kBlockM / heads;
#pragma unroll
  for (int pass = 0; pass < kCopyPasses; ++pass) {
    const int row = slot.row0 + 32 * pass, head = t.head + row / rows_per_head, q = row % rows_per_head;
    const bool valid = q < rows;
    const bf16* src = p.query + (valid ? ((long long)(t.q_begin + t.m0 + q) * p.num_q_heads + head) * kD : 0);
#pragma unroll
    for (int j = 0; j < kChunks / 4; ++j) {
      const int c = 4 * j + slot.sub;
      cp_async16(sQ + wgmma_panel_offset<kBlockM>(row, c), src + (valid ? c * 8 : 0), valid);
    }
  }
}

// K/V tile `tile` (keys [128 tile, 128 tile + 128), in the key order of traits.cuh):
// keys past kv_end zero-filled. Kv: the cache's element type; a cached row of an e4m3 cache is
// copied as it is stored, each 8-byte chunk into the first half of the slot its bf16 fills, and
// once all of this thread's copies of the tile have landed (one wait a tile, not one a row: the
// copies need no registers) each such slot is expanded in place (mainloop.cuh). Returns whether
// this thread expanded any (its arrival then follows its own stores: produce()).
template <class Kv>
__device__ __forceinline__ bool load_kv(bf16* k_stage, bf16* v_stage, int tile, const PrefillParams& p,
                                        const TileInfo& t) {
  const CopySlot slot;
  unsigned cached_passes = 0;  // bit `pass`: that pass's row is a cached e4m3 row
#pragma unroll
  for (int pass = 0; pass < kCopyPasses; ++pass) {
    const int row = slot.row0 + 32 * pass;                          // in shared memory
    const int pos = tile * kBlockN + key_of_column<kBlockN / 8>(row);  // (the key order)
    const bool valid = pos < t.kv_end;
    KvRow source{reinterpret_cast<const unsigned char*>(p.key), reinterpret_cast<const unsigned char*>(p.value),
                 false};  // (any valid address: an invalid copy reads nothing)
    if (valid) source = kv_row<kD, Kv>(p, t, pos);
    if (!Kv::kIsBf16 && source.cached_e4m3) {
#pragma unroll
      for (int j = 0; j < kChunks / 4; ++j) {
        const int c = 4 * j + slot.sub, dst = wgmma_panel_offset<kBlockN>(row, c);
        cp_async8(k_stage + dst, source.key + c * 8);
        cp_async8(v_stage + dst, source.value + c * 8);
      }
      cached_passes |= 1u << pass;
      continue;
    }
#pragma unroll
    for (int j = 0; j < kChunks / 4; ++j) {
      const int c = 4 * j + slot.sub;
      const int dst = wgmma_panel_offset<kBlockN>(row, c), src = valid ? c * 16 : 0;
      cp_async16(k_stage + dst, source.key + src, valid);
      cp_async16(v_stage + dst, source.value + src, valid);
    }
  }
  if (Kv::kIsBf16 || cached_passes == 0) return false;
  cp_async_wait_all();
  const float key_scale = p.kv.key_scales[t.kv_head], value_scale = p.kv.value_scales[t.kv_head];
#pragma unroll
  for (int pass = 0; pass < kCopyPasses; ++pass) {
    if (!(cached_passes >> pass & 1u)) continue;
#pragma unroll
    for (int j = 0; j < kChunks / 4; ++j) {
      const int dst = wgmma_panel_offset<kBlockN>(slot.row0 + 32 * pass, 4 * j + slot.sub);
      expand_e4m3_slot(smem_addr(k_stage + dst), key_scale);
      expand_e4m3_slot(smem_addr(v_stage + dst), value_scale);
    }
  }
  return true;
}

// load_kv for a tile of new tokens, by the copy engine: producer thread 0 announces the tile's
// bytes on the stage's "full" barrier and issues one tensor copy per panel of K and of V
// (NewKvMaps lays their boxes out in the key order); the other producer threads issue nothing.
__device__ __forceinline__ void copy_new_kv(bf16* k_stage, bf16* v_stage, int tile, const TileInfo& t,
                                            const NewKvMaps& maps, SharedBarrier& full) {
  if (threadIdx.x % 128 != 0) return;
  const int token = t.q_begin - t.prefix + tile * kBlockN;  // the tile's first key, in the arrays
  full.expect(2 * kTileElems * 2);
#pragma unroll
  for (int panel = 0; panel < kD / kPanelCols; ++panel) {
    const int column = t.kv_head * kD + panel * kPanelCols;
    tensor_copy_4d_to_shared(k_stage + panel * kBlockN * kPanelCols, &maps.key, column, token, 0, 0, full);
    tensor_copy_4d_to_shared(v_stage + panel * kBlockN * kPanelCols, &maps.value, column, token, 0, 0, full);
  }
}

// Named barriers (0 is __syncthreads): 1 + c, the 128 threads of consumer c; turn_barrier(c),
// consumer c's turn to issue its Q K^T (256 threads: the other consumer's 128 arrive, c's 128
// wait).
__device__ __forceinline__ int turn_barrier(int c) { return 3 + c; }
__device__ __forceinline__ void consumer_barrier(int c) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
}
__device__ __forceinline__ void wait_for_turn(int c) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(turn_barrier(c)) : "memory");
}
__device__ __forceinline__ void give_turn(int to) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(turn_barrier(to)) : "memory");
}

// The register hand-over between warpgroups (each warpgroup executes one, all its warps together).
template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// What the warpgroups share about the CTA's current tile. Its key tiles are [begin, end); it
// visits [first, end), where first is begin - 1 when the gate's halo needs the tile before (a
// split's warm-up tile) and begin otherwise. The ring's stages and barriers' phases count the
// visits of all the CTA's tiles: this tile's visit `local` (tile first + local) is the CTA's
// visit base + local. Q's barriers count tiles: this is the CTA's tile `index` (from 0).
struct Cta {
  const PrefillParams& p;
  const TileInfo& t;
  bf16 *sQ, *sK, *sV;
  RingBarriers& ring;
  int rows;   // query rows of each head
  int heads;  // query heads (1, or 2: one a consumer)
  int first, begin, end;
  int base, index;
  const NewKvMaps& maps;
  __device__ int visits() const { return end - first; }
};

// The producer: visit v into stage v % kStages once both consumers released visit v - kStages.
// A visit is announced by the copies themselves: each thread's arrival on full[v % kStages] is
// made when its copies have landed, so the producer never waits for a copy, except to write the
// cache from a tile with new rows. The tile's Q follows its first K/V tile, once the consumers
// have run the CTA's previous tile's last Q K^T (a persistent CTA's producer is a tile ahead).
template <class Kv>
__device__ __forceinline__ void produce(const Cta& cta) {
  const PrefillParams& p = cta.p;
  const TileInfo& t = cta.t;
  // The first query head of each KV-head group writes the new tokens' K/V into the cache.
  // (A split writes the new rows of its own tiles, not of its warm-up tile.)
  const bool writes_cache = t.head % (p.num_q_heads / p.kv.num_kv_heads) == 0;
  for (int local = 0; local < cta.visits(); ++local) {
    const int tile = cta.first + local, visit = cta.base + local, stage = visit % kStages;
    bf16 *k_stage = cta.sK + stage * kTileElems, *v_stage = cta.sV + stage * kTileElems;
    if (visit >= kStages) cta.ring.empty[stage].wait((visit / kStages - 1) & 1);
    // Tensor copies for a tile of the sequence's new tokens alone (NewKvMaps says why); cp.async
    // through the block table for the cached keys, the sequence's last, partial tile, or no maps.
    bool stored_itself = false;
    if (cta.maps.usable && tile * kBlockN >= t.prefix && (tile + 1) * kBlockN <= t.prefix + t.q_len)
      copy_new_kv(k_stage, v_stage, tile, t, cta.maps, cta.ring.full[stage]);
    else
      stored_itself = load_kv<Kv>(k_stage, v_stage, tile, p, t);
    if (stored_itself) {  // rows of an e4m3 cache: its copies landed and its stores made (load_kv)
      fence_proxy_async_shared();  // (the consumers' wgmma read them)
      cta.ring.full[stage].arrive();
    } else {
      cta.ring.full[stage].arrive_when_copies_land();
    }
    if (local == 0) {
      if (cta.index > 0) cta.ring.q_empty.wait((cta.index - 1) & 1);
      load_q(cta.sQ, p, t, cta.rows, cta.heads);
      cta.ring.q_full.arrive_when_copies_land();
    }
    if (writes_cache && tile >= cta.begin && (tile + 1) * kBlockN > t.prefix + t.m0) {  // the tile holds new rows
      cta.ring.full[stage].wait((visit / kStages) & 1);  // every copy of the tile has landed
      store_new_rows<kD, kBlockN, 128, Kv>(k_stage, v_stage, tile, p, t,
                                           [](int row, int chunk) { return wgmma_panel_offset<kBlockN>(row, chunk); });
    }
  }
}

// Consumer c: rows [64 c, 64 c + 64) of the CTA's tile, or with two heads rows [0, 64) of head
// t.head + c; with splits > 1 its part of their output goes to the workspace. kPersistent: the
// output goes straight from the registers (Q's buffer already holds the CTA's next tile).
template <class Gate, bool kSplit, bool kPersistent>
__device__ __forceinline__ void consume(const Cta& cta, int c, float scale, int splits) {
  const PrefillParams& p = cta.p;
  const TileInfo& t = cta.t;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int head = t.head + (cta.heads == 2 ? c : 0);
  const int row0 = cta.heads == 2 ? 0 : 64 * c;  // the consumer's first row among its head's
  Gate gate(p, head, scale);
  float acc_o[16][4];
#pragma unroll
  for (int db = 0; db < 16; ++db)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[db][e] = 0.0f;

  const int c_pos = t.prefix + t.m0 + row0;       // position of the consumer's first row
  const int pos0 = c_pos + 16 * warp + lane / 4;  // position of the thread's row g
  // The first tile with a key past the consumer's first row needs the causal mask; a tile whose
  // first key is past its last row has nothing for it (nor has any later tile).
  const int first_masked = (c_pos + 1) / kBlockN;
  const int last_pos = c_pos + 63;
  // The operands' descriptors, built once: the consumer's 64 rows of Q's first panel, stage 0's
  // K and V tiles; each product moves them along with wgmma_descriptor_plus (one add each, where
  // building one costs five instructions and two moves to uniform registers).
  constexpr unsigned kQPanelBytes = kBlockM * kRowBytes, kKvPanelBytes = kBlockN * kRowBytes;
  constexpr unsigned kStageBytes = kTileElems * 2;
  const std::uint64_t q_desc = wgmma_descriptor(smem_addr(cta.sQ) + 64 * c * kRowBytes);
  const std::uint64_t k_desc = wgmma_descriptor(smem_addr(cta.sK));
  const std::uint64_t v_desc = wgmma_descriptor_mn(smem_addr(cta.sV), kKvPanelBytes);
  const auto release = [&](int local) { cta.ring.empty[(cta.base + local) % kStages].arrive(); };
  const int visits = cta.visits();

  // The consumers take turns at Q K^T, visit by visit over all the CTA's tiles: 0, 1, 0, 1, ...
  // Consumer 1 never skips a tile (its rows are the later ones, and the last tile holds a key of
  // its last row; with two heads both hold the same rows, at most 64, and neither skips);
  // consumer 0 skips at most a query tile's last key tile (its last row is at most 64 keys
  // before the tile's end) and still takes and passes its turn there. Each waits for its turn,
  // but consumer 0 at the CTA's first visit, and passes it on; consumer 0 takes consumer 1's last
  // pass when the CTA is done (the kernel). Both directions wait, so neither runs a turn ahead:
  // a consumer that arrived twice at one barrier before the other waited would complete it alone.
  const auto take_turn = [&](int local) {
    if (c == 1 || cta.base + local > 0) wait_for_turn(c);
  };
  const auto pass_turn = [&] { give_turn(1 - c); };
  // After the tile's last Q K^T (this consumer's): Q's buffer may take the CTA's next tile.
  const auto done_with_q = [&](int local) {
    if (local + 1 == visits) cta.ring.q_empty.arrive();
  };

  // P of the tile whose Q K^T and gate are done and whose P V is not yet issued (bf16 pairs: the
  // register operand, key step kk = n8 blocks 2kk and 2kk+1 of S).
  unsigned p_frag[kBlockN / 16][4];
  // O += P V for visit `of_local`: V's k16 step kk starts 16 rows (2048 bytes) into its panels.
  const auto issue_pv = [&](int of_local) {
    const std::uint64_t v_stage = wgmma_descriptor_plus(v_desc, ((cta.base + of_local) % kStages) * kStageBytes);
    wgmma_fence();  // p_frag (and O, after a softmax rescale) written before the wgmma read them
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      WgmmaBf16x128::run_rs(acc_o, p_frag[kk], wgmma_descriptor_plus(v_stage, kk * 16 * kRowBytes));
    wgmma_commit();
  };

  // Visit `local`'s S = Q K^T (k16 step ks is 32 bytes into the rows of panel ks / 4), then its
  // gate, into p_frag. With kPendingPv the previous visit's P V is issued right behind the Q K^T,
  // so the tensor cores run it while the gate works (apply() leaves O alone; softmax's rescale of
  // O waits for the product), and its stage is released once it is done.
  const auto scores_to_p = [&]<bool kPendingPv>(int local) {
    const int tile = cta.first + local;
    float acc_s[16][4];
#pragma unroll
    for (int nb = 0; nb < 16; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nb][e] = 0.0f;
    take_turn(local);
    const std::uint64_t k_stage = wgmma_descriptor_plus(k_desc, ((cta.base + local) % kStages) * kStageBytes);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const unsigned offset = (ks % 4) * 32;
      WgmmaBf16x128::run(acc_s, wgmma_descriptor_plus(q_desc, (ks / 4) * kQPanelBytes + offset),
                         wgmma_descriptor_plus(k_stage, (ks / 4) * kKvPanelBytes + offset));
    }
    wgmma_commit();
    pass_turn();
    if constexpr (kPendingPv) {
      issue_pv(local - 1);
      wgmma_wait<1>();  // Q K^T done; the P V may still run
    } else {
      wgmma_wait<0>();
    }
    done_with_q(local);
    wgmma_fence_operand(acc_s);
    if (tile >= first_masked)
      gate.template apply<true>(0, acc_s, tile * kBlockN, pos0);
    else
      gate.template apply<false>(0, acc_s, tile * kBlockN, pos0);
    if constexpr (kPendingPv) {
      wgmma_wait<0>();  // the P V is done with p_frag, with O and with its stage
      wgmma_fence_operand(acc_o);
      release(local - 1);
    }
    gate.rescale(0, acc_o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      p_frag[kk][0] = pack_bf16(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      p_frag[kk][1] = pack_bf16(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      p_frag[kk][2] = pack_bf16(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      p_frag[kk][3] = pack_bf16(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
    }
  };

  cta.ring.q_full.wait(cta.index & 1);
  for (int local = 0; local < visits; ++local) {
    const int tile = cta.first + local, visit = cta.base + local;
    cta.ring.full[visit % kStages].wait((visit / kStages) & 1);
    fence_proxy_async_shared();  // the landed copies (generic proxy) before this thread's wgmma reads
    if (tile < cta.begin) {  // the warm-up tile: its gate carries the halo in; no P V
      scores_to_p.template operator()<false>(local);
      release(local);
    } else if (tile == cta.begin) {
      scores_to_p.template operator()<false>(local);
    } else if (tile * kBlockN <= last_pos) {
      scores_to_p.template operator()<true>(local);
    } else {  // (consumer 0, its last tile)
      take_turn(local);
      pass_turn();
      done_with_q(local);
      issue_pv(local - 1);
      wgmma_wait<0>();
      release(local - 1);
      release(local);
    }
  }
  if ((cta.end - 1) * kBlockN <= last_pos || cta.end - 1 == cta.begin) {  // the last tile's P V
    issue_pv(visits - 1);
    wgmma_wait<0>();
    release(visits - 1);
  }
  wgmma_fence_operand(acc_o);

  const int g = lane / 4, quad = lane % 4;
  if constexpr (kSplit) {  // this split's part, in fp32, to the workspace
    write_part_block(p, t, head, splits, gate, 0, acc_o, row0 + 16 * warp, cta.rows);
    return;
  }
  gate.finish(0, acc_o);
  if constexpr (kPersistent) {
    // O straight from the registers: Q's buffer already holds the CTA's next tile.
#pragma unroll
    for (int db = 0; db < 16; ++db)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = 64 * c + 16 * warp + g + 8 * hh;
        if (row < cta.rows) {
          const long long dst = ((long long)(t.q_begin + t.m0 + row) * p.num_q_heads + t.head) * kD + 8 * db + 2 * quad;
          *reinterpret_cast<__nv_bfloat162*>(p.out + dst) = __floats2bfloat162_rn(acc_o[db][2 * hh], acc_o[db][2 * hh + 1]);
        }
      }
  } else {
    // O (bf16) through the consumer's own rows of sQ (its wgmma reads of them are complete), then
    // 16-byte coalesced stores.
#pragma unroll
    for (int db = 0; db < 16; ++db)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = 64 * c + 16 * warp + g + 8 * hh;
        *reinterpret_cast<__nv_bfloat162*>(cta.sQ + wgmma_panel_offset<kBlockM>(row, db) + 2 * quad) =
            __floats2bfloat162_rn(acc_o[db][2 * hh], acc_o[db][2 * hh + 1]);
      }
    consumer_barrier(c);
#pragma unroll
    for (int i = 0; i < 64 * kChunks / 128; ++i) {
      const int idx = i * 128 + tid;
      const int row = 64 * c + idx / kChunks, chunk = idx % kChunks;
      if (row < cta.rows) {
        const long long dst = ((long long)(t.q_begin + t.m0 + row) * p.num_q_heads + t.head) * kD + chunk * 8;
        store_bf16x8(p.out + dst, load_bf16x8(cta.sQ + wgmma_panel_offset<kBlockM>(row, chunk)));
      }
    }
  }
}

#endif  // ASYNCT_WGMMA

// kSplit: the query tiles' keys are split over `splits` CTAs each (else splits is 1; the
// unsplit form is its own instantiation, so that its consumers keep every register they had).
// `heads` query heads a CTA (2 only when split: heads_per_cta). kPersistent (unsplit only): the
// grid is at most one CTA a multiprocessor, and they take pairs of query tiles: a pair is the
// tile z of the grid order (tile_order.cuh, with z over half the query tiles, heaviest first)
// and its counterpart m - 1 - z of the same head and sequence (the lightest), so that every pair
// of an equal-length batch holds the same work; CTA b of G takes pairs b, b + G, b + 2G, ... (a
// static order: taking the tiles themselves in rounds left CTAs 1.3-1.6x the mean work at 1024
// to 4096 tokens). The producer copies the next tile's Q and first K/V tiles while the
// consumers finish the current one. Kv: the cache's element type (the producer's alone).
template <class Gate, bool kSplit, bool kPersistent, class Kv>
__global__ void __launch_bounds__(kThreads, 1) prefill_hopper_kernel(const PrefillParams p, float scale, int splits,
                                                                     int heads, int seq_group,
                                                                     const __grid_constant__ NewKvMaps maps) {
#ifdef ASYNCT_WGMMA
  static_assert(!(kSplit && kPersistent), "a persistent CTA does not split keys");
  if constexpr (!kSplit) splits = 1;
  if constexpr (!kSplit && !kPersistent) heads = 1;  // (a persistent CTA's tiles are of one head)
  // One CTA a tile: its tile and key tiles (all of the query tile's, or its split's even share).
  TileInfo own{};
  SplitRange range{0, 0, 0};
  if constexpr (!kPersistent) {
    if (!make_tile_info(p, kBlockM / heads, this_ctas_grid_tile(seq_group), gridDim.z, own, splits, heads)) return;
    range = split_range<Gate>((own.kv_end + kBlockN - 1) / kBlockN, own.split, splits);
    if (kSplit && range.begin >= range.end) {  // a split with no keys (a short sequence among longer ones)
      write_empty_part<Gate>(p, own, own.head, heads, min(kBlockM / heads, own.q_len - own.m0), own.split, splits);
      return;
    }
  }

  extern __shared__ unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t(1023));
  bf16* sK = sQ + kBlockM * kD;
  bf16* sV = sK + kStages * kTileElems;
  RingBarriers& ring = *reinterpret_cast<RingBarriers*>(sV + kStages * kTileElems);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ring.full[s].init(128);
      ring.empty[s].init(128 * kConsumers);
    }
    ring.q_full.init(128);
    ring.q_empty.init(128 * kConsumers);
    SharedBarrier::fence_init();
  }
  __syncthreads();

  // Runs work(cta) for each of the CTA's tiles, in order; returns the CTA's visits. (What the
  // ring's stages follow is read from lane 0, so that the compiler knows it is the same across
  // the warp: the wgmma descriptors that move with the stages stay in uniform registers.)
  const auto each_tile = [&](auto&& work) {
    if constexpr (!kPersistent) {
      const Cta cta{p, own, sQ, sK, sV, ring, min(kBlockM / heads, own.q_len - own.m0), heads,
                    range.first, range.begin, range.end, 0, 0, maps};
      work(cta);
      return cta.visits();
    } else {
      int base = 0, index = 0;
      for (int k = 0;; ++k) {  // the CTA's k-th tile: of its pair k / 2, the heavier first
        const TilePairs work_pairs(p);
        const int m_tiles = work_pairs.m_tiles;
        const long long pair = blockIdx.x + (long long)(k / 2) * gridDim.x;
        if (pair >= work_pairs.pairs) break;
        GridTile place = grid_tile(pair, p.num_q_heads, p.num_seqs, work_pairs.pairs_a_seq, seq_group);
        if (k % 2 == 1) {
          if (m_tiles - 1 - place.z == place.z) continue;  // (the middle tile of an odd count is a pair alone)
          place.z = m_tiles - 1 - place.z;
        }
        TileInfo t;
        if (!make_tile_info(p, kBlockM, place, m_tiles, t)) continue;
        const int key_tiles = __shfl_sync(0xffffffffu, (t.kv_end + kBlockN - 1) / kBlockN, 0);
        const Cta cta{p, t, sQ, sK, sV, ring, min(kBlockM, t.q_len - t.m0), 1, 0, 0, key_tiles, base, index, maps};
        work(cta);
        base += key_tiles;
        ++index;
      }
      return base;
    }
  };

  // (Read from lane 0, so that the compiler knows it is the same across the warp: the branches on
  // it do not split a warp, and what derives from it may live in uniform registers.)
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    release_registers<Registers<kPersistent>::kProducer>();
    each_tile([&](const Cta& cta) { produce<Kv>(cta); });
    return;  // (the producer's path must not join the consumers': they hold other register counts)
  }
  claim_registers<Registers<kPersistent>::kConsumer>();
  const int visits = each_tile([&](const Cta& cta) { consume<Gate, kSplit, kPersistent>(cta, wg - 1, scale, splits); });
  if (wg == 1 && visits > 0) wait_for_turn(0);  // consumer 0 takes consumer 1's last pass
#else
  __trap();  // launched only where the build has sm_90a code (prefill_hopper_applies)
#endif
}

// Query heads a CTA when the keys are split: two (of one KV head) when every sequence's new
// tokens fit one consumer's 64 rows and the KV heads' groups are even, else one.
int heads_per_cta(const PrefillParams& p) {
  const int group = p.num_q_heads / p.kv.num_kv_heads;
  return p.max_q_len <= kBlockM / 2 && group % 2 == 0 ? 2 : 1;
}

// How many persistent CTAs the unsplit kernel runs (KernelTuning::prefill_ctas, at most one a
// multiprocessor and one a pair of query tiles); 0: one CTA a tile.
long long prefill_hopper_persistent_ctas(const PrefillParams& p) {
  const int forced = kernel_tuning().prefill_ctas;
  return forced > 0 ? std::min<long long>({forced, current_device_info().sm_count, TilePairs(p).pairs}) : 0;
}

// (An e4m3 cache runs one CTA a tile: persistent CTAs are a measuring form, off by default.)
template <class Gate, class Kv>
void launch_with(const PrefillParams& p, float scale, int splits, cudaStream_t stream) {
  const char* who = "launch_prefill (Hopper)";
  const int heads = splits > 1 ? heads_per_cta(p) : 1;
  const int block_m = kBlockM / heads;
  const int m_tiles = (p.max_q_len + block_m - 1) / block_m;
  check((long long)m_tiles * splits <= 65535, who, ": max_q_len ", p.max_q_len, " needs ", m_tiles, " query tiles of ", splits,
        " CTAs; the grid allows 65535");
  const dim3 grid(p.num_q_heads / heads, p.num_seqs, m_tiles * splits);
  const NewKvMaps maps = new_kv_maps(p);
  const int seq_group = prefill_seq_group(p);
  if constexpr (Kv::kIsBf16)
    if (const long long ctas = prefill_hopper_persistent_ctas(p); splits == 1 && ctas > 0) {
      allow_dynamic_smem<prefill_hopper_kernel<Gate, false, true, Kv>>(kSmemBytes);
      prefill_hopper_kernel<Gate, false, true, Kv>
          <<<unsigned(ctas), kThreads, kSmemBytes, stream>>>(p, scale, 1, 1, seq_group, maps);
      check_launch(who);
      return;
    }
  if (splits == 1) {
    allow_dynamic_smem<prefill_hopper_kernel<Gate, false, false, Kv>>(kSmemBytes);
    prefill_hopper_kernel<Gate, false, false, Kv><<<grid, kThreads, kSmemBytes, stream>>>(p, scale, 1, 1, seq_group, maps);
    check_launch(who);
    return;
  }
  allow_dynamic_smem<prefill_hopper_kernel<Gate, true, false, Kv>>(kSmemBytes);
  prefill_hopper_kernel<Gate, true, false, Kv><<<grid, kThreads, kSmemBytes, stream>>>(p, scale, splits, heads, seq_group, maps);
  check_launch(who);
  launch_combine_splits<kD, Gate>(p, splits, stream);
}

// Whether this build holds the kernel's sm_90a code for the current device: the binary the
// runtime picked for it must be Hopper's (a build without sm_90a would run the trapping stub).
bool hopper_code_here() {
  static const bool here = [] {
    cudaFuncAttributes attributes{};
    ASYNCT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, prefill_hopper_kernel<SoftmaxGate<1>, false, false, KvBf16>));
    return attributes.binaryVersion == 90;
  }();
  return here;
}

}  // namespace

bool prefill_hopper_available() { return current_device_info().major == 9 && hopper_code_here(); }

bool prefill_hopper_applies(const PrefillParams& p) {
  if (kernel_tuning().prefill == PrefillKernel::kPortable || p.kv.head_dim != kD) return false;
  return prefill_hopper_available();
}

int prefill_hopper_kv_splits(const PrefillParams& p) {
  const long long tiles = (long long)p.num_q_heads * p.num_seqs * ((p.max_q_len + kBlockM - 1) / kBlockM);
  return kv_splits_to_fill(p, tiles, tiles / heads_per_cta(p), 1, kBlockN);
}

bool prefill_hopper_tensor_copies(const PrefillParams& p) { return new_kv_maps(p).usable; }

void launch_prefill_hopper(const PrefillParams& p, float scale, cudaStream_t stream) {
  const int splits = splits_the_workspace_holds(p, prefill_hopper_kv_splits(p));
  with_gate<1>(p.gate, [&]<class Gate>() {
    if (p.kv.element == KvElement::Fp8E4M3) return launch_with<Gate, KvFp8>(p, scale, splits, stream);
    launch_with<Gate, KvBf16>(p, scale, splits, stream);
  });
}

}  // namespace asynct::kernels
