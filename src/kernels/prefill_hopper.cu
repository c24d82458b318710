// Hopper prefill attention (sm_90a) for head_dim 128: the portable kernel's algorithm (prefill.cu)
// on warpgroup MMA (wgmma.cuh), with the same gates, tile order, K/V sources and cache write
// (prefill_common.cuh).
//
// One CTA of two warpgroups handles 128 query rows of one (sequence, query head); each warpgroup
// owns 64 of them and multiplies on its own:
//   S = Q K^T  eight m64n128k16 steps, Q and K read by the tensor cores from shared memory;
//   P = gate(S) in registers (the m16n8 fragment layout both gates already work on);
//   O += P V   eight m64n128k16 steps with P as the register operand and V read MN-major.
// The K and V tiles (128 keys) sit in a ring of three stages in shared memory; all 256 threads
// copy them with cp.async (the cache is paged, so a row's source goes through the block table;
// one 2-D tensor copy could not follow it), the next tile while the current one is multiplied,
// issued once the tile's Q K^T runs. Every tile in shared memory is two panels of [rows][64] in
// the 128-byte swizzle, the layout the wgmma descriptors read: K-major for Q and K (the
// product's K is head_dim), and the same bytes read MN-major for V (its K is the key).
//
// What overlaps what (the tensor cores should never wait for a gate):
// - within a warpgroup, tile t's Q K^T is issued first and tile t-1's P V right behind it, so the
//   P V runs while the gate of tile t works (FlashAttention-3's intra-warpgroup overlap; for the
//   async gate fully, for softmax, whose gate may rescale O, only up to the gate);
// - across the two, warpgroup 1 issues its Q K^T only after warpgroup 0 has issued its own, so
//   that they do not reach their gates at the same moment.
//
// Not done (FlashAttention-3 does it): a producer warp with mbarriers instead of a CTA barrier per
// tile, and softmax's rescale split from its exponentials.
#include "kernels/prefill_hopper.h"

#include <cstdint>

#include "core/error.h"
#include "kernels/bf16.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_info.h"
#include "kernels/mma_sync.cuh"
#include "kernels/prefill_common.cuh"
#include "kernels/wgmma.cuh"

namespace asynct::kernels {
namespace {

using namespace prefill;  // TileInfo, the gates, kv_row, store_new_rows

constexpr int kD = 128;
constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kBlockM = 64 * kWarpgroups;  // query rows per CTA, 64 per warpgroup
constexpr int kBlockN = 128;               // keys per tile
constexpr int kStages = 3;                 // K/V tiles in flight (see the main loop)
constexpr int kChunks = kD / 8;            // 16-byte chunks per row
constexpr int kPanelCols = 64;             // one 128-byte swizzle row
constexpr int kRowBytes = kPanelCols * 2;
constexpr int kTileElems = kBlockN * kD;
// Q, then kStages K tiles, then kStages V tiles; + 1024 to align the base to a swizzle period.
constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * kD * 2 + 1024;
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
static_assert(kRowBytes == 128 && kTileElems % 8192 == 0 && kChunks == 16, "tiles of whole swizzle atoms");

// The device code exists only where wgmma does (sm_90a); elsewhere the kernel is a trapping stub.
#ifdef ASYNCT_WGMMA

// The copy pattern of a 128-row tile by the CTA's 256 threads: thread t copies chunks h, h+2, ..
// of row r, so one copy instruction of a warp reads 16 rows' 32-byte sectors, and the 8 threads
// of a shared-memory phase hold 8 consecutive rows (distinct banks after the swizzle).
struct CopySlot {
  int row, h;
  __device__ __forceinline__ CopySlot() : row((threadIdx.x & 7) | ((threadIdx.x >> 4) << 3)), h((threadIdx.x >> 3) & 1) {}
};
static_assert(kThreads == 2 * kBlockN && kBlockM == kBlockN, "two threads per tile row");

// Q rows [m0, m0 + 128) of the tile's head; rows past the sequence's new tokens zero-filled.
__device__ __forceinline__ void load_q(bf16* sQ, const PrefillParams& p, const TileInfo& t, int rows) {
  const CopySlot slot;
  const bool valid = slot.row < rows;
  const bf16* src =
      p.query + (valid ? ((long long)(t.q_begin + t.m0 + slot.row) * p.num_q_heads + t.head) * kD : 0);
#pragma unroll
  for (int j = 0; j < kChunks / 2; ++j) {
    const int c = 2 * j + slot.h;
    cp_async16(sQ + wgmma_panel_offset<kBlockM>(slot.row, c), src + (valid ? c * 8 : 0), valid);
  }
}

// K/V tile `tile` (keys [128 tile, 128 tile + 128)): keys past kv_end zero-filled.
__device__ __forceinline__ void load_kv(bf16* k_stage, bf16* v_stage, int tile, const PrefillParams& p,
                                        const TileInfo& t) {
  const CopySlot slot;
  const int pos = tile * kBlockN + slot.row;
  const bool valid = pos < t.kv_end;
  KvRow source{p.key, p.value};  // (any valid address: an invalid copy reads nothing)
  if (valid) source = kv_row<kD>(p, t, pos);
#pragma unroll
  for (int j = 0; j < kChunks / 2; ++j) {
    const int c = 2 * j + slot.h;
    const int dst = wgmma_panel_offset<kBlockN>(slot.row, c), src = valid ? c * 8 : 0;
    cp_async16(k_stage + dst, source.key + src, valid);
    cp_async16(v_stage + dst, source.value + src, valid);
  }
}

// Named barriers (0 is __syncthreads): 1 + wg, the 128 threads of warpgroup wg; kTurnBarrier,
// warpgroup 0 letting warpgroup 1 issue its Q K^T (256 threads: 128 arrive, 128 wait).
constexpr int kTurnBarrier = 3;
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}
__device__ __forceinline__ void wait_for_turn() {
  asm volatile("bar.sync %0, 256;\n" ::"n"(kTurnBarrier) : "memory");
}
__device__ __forceinline__ void give_turn() {
  asm volatile("bar.arrive %0, 256;\n" ::"n"(kTurnBarrier) : "memory");
}

#endif  // ASYNCT_WGMMA

template <class Gate>
__global__ void __launch_bounds__(kThreads, 1) prefill_hopper_kernel(const PrefillParams p, float scale) {
#ifdef ASYNCT_WGMMA
  TileInfo t;
  if (!make_tile_info(p, kBlockM, t)) return;
  const int rows = min(kBlockM, t.q_len - t.m0);  // valid query rows of this tile

  extern __shared__ unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t(1023));
  bf16* sK = sQ + kBlockM * kD;         // kStages K tiles
  bf16* sV = sK + kStages * kTileElems;  // kStages V tiles

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  load_q(sQ, p, t, rows);
  load_kv(sK, sV, 0, p, t);
  cp_async_commit();

  Gate gate(p, t.head, scale);
  float acc_o[16][4];
#pragma unroll
  for (int db = 0; db < 16; ++db)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[db][e] = 0.0f;

  const int wg_pos = t.prefix + t.m0 + 64 * wg;  // position of the warpgroup's first row
  const int pos0 = wg_pos + 16 * warp + lane / 4;  // position of the thread's row g
  // The first tile with a key past the warpgroup's first row needs the causal mask; a tile whose
  // first key is past its last row has nothing for it (nor has any later tile).
  const int first_masked = (wg_pos + 1) / kBlockN;
  const int wg_last_pos = wg_pos + 63;
  // The first query head of each KV-head group writes the new tokens' K/V into the cache.
  const bool writes_cache = t.head % (p.num_q_heads / p.kv.num_kv_heads) == 0;
  const int n_tiles = (t.kv_end + kBlockN - 1) / kBlockN;
  // Shared addresses in bytes: the warpgroup's 64 rows of each Q panel; the panels' sizes.
  const unsigned q_base = smem_addr(sQ) + 64 * wg * kRowBytes;
  constexpr unsigned kQPanelBytes = kBlockM * kRowBytes, kKvPanelBytes = kBlockN * kRowBytes;

  // The next tile's copies (into the stage that held tile - 2: both its products are complete,
  // and the barrier at the top of this tile says so for every warpgroup).
  const auto load_next = [&](int tile) {
    if (tile + 1 < n_tiles) {
      const int next = (tile + 1) % kStages;
      load_kv(sK + next * kTileElems, sV + next * kTileElems, tile + 1, p, t);
    }
    cp_async_commit();
  };

  // P of the tile whose Q K^T and gate are done and whose P V is not yet issued (bf16 pairs: the
  // register operand, key step kk = n8 blocks 2kk and 2kk+1 of S).
  unsigned p_frag[kBlockN / 16][4];
  // O += P V for tile `of_tile`: V's k16 step kk starts 16 rows (2048 bytes) into its panels.
  const auto issue_pv = [&](int of_tile) {
    const unsigned v_base = smem_addr(sV + (of_tile % kStages) * kTileElems);
    wgmma_fence();  // p_frag (and O, after a softmax rescale) written before the wgmma read them
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      WgmmaBf16x128::run_rs(acc_o, p_frag[kk], wgmma_descriptor_mn(v_base + kk * 16 * kRowBytes, kKvPanelBytes));
    wgmma_commit();
  };

  // Tile `tile`'s S = Q K^T (k16 step ks is 32 bytes into the rows of panel ks / 4), then its gate,
  // into p_frag. With kPendingPv the previous tile's P V is issued right behind the Q K^T, so the
  // tensor cores run it while the gate works (the async gate leaves O alone; softmax's may rescale
  // O, so it first waits for that product).
  const auto scores_to_p = [&]<bool kPendingPv>(int tile) {
    float acc_s[16][4];
#pragma unroll
    for (int nb = 0; nb < 16; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nb][e] = 0.0f;
    if (wg == 1) wait_for_turn();
    const unsigned k_base = smem_addr(sK + (tile % kStages) * kTileElems);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const unsigned offset = (ks % 4) * 32;
      WgmmaBf16x128::run(acc_s, wgmma_descriptor(q_base + (ks / 4) * kQPanelBytes + offset),
                         wgmma_descriptor(k_base + (ks / 4) * kKvPanelBytes + offset));
    }
    wgmma_commit();
    if (wg == 0) give_turn();
    if constexpr (kPendingPv) issue_pv(tile - 1);
    load_next(tile);
    if constexpr (kPendingPv) {
      wgmma_wait<1>();  // Q K^T done; the P V may still run
      if constexpr (Gate::kRescalesOutput) wgmma_wait<0>();
    } else {
      wgmma_wait<0>();
    }
    if (tile >= first_masked)
      gate.template apply<true>(0, acc_s, acc_o, tile * kBlockN, pos0);
    else
      gate.template apply<false>(0, acc_s, acc_o, tile * kBlockN, pos0);
    if constexpr (kPendingPv) wgmma_wait<0>();  // the P V is done with p_frag
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      p_frag[kk][0] = pack_bf16(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      p_frag[kk][1] = pack_bf16(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      p_frag[kk][2] = pack_bf16(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      p_frag[kk][3] = pack_bf16(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
    }
  };

  // Warpgroup 1 never skips a tile (its rows are the later ones, and the last tile holds a key of
  // its last row); warpgroup 0 skips at most the last tile (its last row is at most 64 keys
  // before the tile's end). So warpgroup 1 waits for its turn on every tile, and warpgroup 0 gives
  // it on every tile: after issuing its Q K^T, or at once when it skips.
  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_all();
    fence_proxy_async_shared();  // the copies (generic proxy) before the wgmma reads (async proxy)
    __syncthreads();             // tile landed for all; every warpgroup is done with tile-2's stage
    if (tile == 0) {
      scores_to_p.template operator()<false>(tile);
    } else if (tile * kBlockN <= wg_last_pos) {
      scores_to_p.template operator()<true>(tile);
    } else {  // (warpgroup 0, its last tile)
      give_turn();
      load_next(tile);
      issue_pv(tile - 1);
      wgmma_wait<0>();
    }
    // The tile's new rows into the cache, while its stage is still untouched.
    if (writes_cache && (tile + 1) * kBlockN > t.prefix + t.m0) {
      const int stage = tile % kStages;
      store_new_rows<kD, kBlockN, kThreads>(sK + stage * kTileElems, sV + stage * kTileElems, tile, p, t,
                                            [](int row, int chunk) { return wgmma_panel_offset<kBlockN>(row, chunk); });
    }
  }
  if ((n_tiles - 1) * kBlockN <= wg_last_pos) {  // the last tile's P V
    issue_pv(n_tiles - 1);
    wgmma_wait<0>();
  }

  // O (bf16) through the warpgroup's own rows of sQ (its wgmma reads of them are complete), then
  // 16-byte coalesced stores.
  gate.finish(0, acc_o);
  const int g = lane / 4, quad = lane % 4;
#pragma unroll
  for (int db = 0; db < 16; ++db)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = 64 * wg + 16 * warp + g + 8 * hh;
      *reinterpret_cast<__nv_bfloat162*>(sQ + wgmma_panel_offset<kBlockM>(row, db) + 2 * quad) =
          __floats2bfloat162_rn(acc_o[db][2 * hh], acc_o[db][2 * hh + 1]);
    }
  warpgroup_barrier(wg);
#pragma unroll
  for (int i = 0; i < 64 * kChunks / 128; ++i) {
    const int idx = i * 128 + tid % 128;
    const int row = 64 * wg + idx / kChunks, chunk = idx % kChunks;
    if (row < rows) {
      const long long dst = ((long long)(t.q_begin + t.m0 + row) * p.num_q_heads + t.head) * kD + chunk * 8;
      store_bf16x8(p.out + dst, load_bf16x8(sQ + wgmma_panel_offset<kBlockM>(row, chunk)));
    }
  }
#else
  __trap();  // launched only where the build has sm_90a code (prefill_hopper_applies)
#endif
}

template <class Gate>
void launch_with(const PrefillParams& p, float scale, cudaStream_t stream) {
  allow_dynamic_smem<prefill_hopper_kernel<Gate>>(kSmemBytes);
  const int m_tiles = (p.max_q_len + kBlockM - 1) / kBlockM;
  check(m_tiles <= 65535, "launch_prefill: max_q_len ", p.max_q_len, " needs ", m_tiles,
        " query tiles; the grid allows 65535");
  const dim3 grid(p.num_q_heads, p.num_seqs, m_tiles);
  prefill_hopper_kernel<Gate><<<grid, kThreads, kSmemBytes, stream>>>(p, scale);
  check_launch("launch_prefill (Hopper)");
}

// Whether this build holds the kernel's sm_90a code for the current device: the binary the
// runtime picked for it must be Hopper's (a build without sm_90a would run the trapping stub).
bool hopper_code_here() {
  static const bool here = [] {
    cudaFuncAttributes attributes{};
    ASYNCT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, prefill_hopper_kernel<SoftmaxGate<1>>));
    return attributes.binaryVersion == 90;
  }();
  return here;
}

}  // namespace

bool prefill_hopper_available() { return current_device_info().major == 9 && hopper_code_here(); }

bool prefill_hopper_applies(const PrefillParams& p) {
  if (prefill_kernel_override() == PrefillKernel::kPortable || p.kv.head_dim != kD) return false;
  return prefill_hopper_available();
}

void launch_prefill_hopper(const PrefillParams& p, float scale, cudaStream_t stream) {
  with_gate<1>(p.gate, [&]<class Gate>() { launch_with<Gate>(p, scale, stream); });
}

}  // namespace asynct::kernels
