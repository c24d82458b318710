// Portable prefill attention (sm_80 and up), FlashAttention-2 style on mma.sync tensor cores.
// On Hopper, head_dim 128 runs the wgmma kernel of hopper.cu instead (launch_prefill, prefill.cu,
// picks); what the two share is in traits.cuh (key order, tile shapes), mainloop.cuh (tile
// bookkeeping, K/V row sources), gates.cuh and epilogue.cuh (the cache write).
//
// One CTA of 4 warps handles a tile of kBlockM query rows (128 for head_dim <= 128, 64 for 256)
// of one (sequence, query head); each warp owns 16 * kRowBlocks consecutive rows (32 or 16), so
// every K/V fragment it reads from shared memory feeds kRowBlocks mma rows. Two CTAs share an SM,
// so one's barrier waits and gate math overlap the other's tensor-core work. The CTA walks the
// key tiles (kBlockN keys) from key 0 up to the tile's last visible key; K and V tiles are
// double-buffered in shared memory with cp.async (tile t+1 loads while tile t is computed, one
// barrier per tile). S and O live in fp32 registers (mma.sync m16n8k16 bf16 -> fp32); P is
// rounded to bf16 for the PV product. The grid takes a sequence's tiles before the next
// sequence's (tile_order.cuh), its heaviest (last) query tiles first, so that the short causal
// tiles fill the tail.
//
// The gate is a policy (SoftmaxGate<MB>, AsyncGate<MB, kMaxW, kExact>; MB row blocks per warp)
// with three hooks: apply() turns one tile of a row block's raw scores into P in place (softmax:
// online max/sum with lazy rescaling; async: the pooled-ReLU gate), rescale() brings O to P's
// base (softmax, when a row's max moved; async: nothing), finish()
// runs once before the output is written (softmax: the 1/l normalisation; async: gamma).
// Everything else is shared.
//
// When the query tiles fill less than half of the GPU's CTA places (a short prompt after a long
// cached prefix: SmolLM2's 9 heads make 9 CTAs), each tile's keys are split over several CTAs
// (split_keys.cuh): a split visits its share of the key tiles (the async gate's splits run the
// tile before theirs through Q K^T and the gate, not P V, for the halo), writes its part of the
// output in fp32 to the workspace, and a second kernel adds the parts.
//
// Keys at positions < prefix come from the paged cache through the block table; keys at
// positions >= prefix come from the `key`/`value` inputs. The CTAs of the first query head of
// each KV-head group also copy their tile's new K/V rows from shared memory into the paged cache
// (exactly one CTA writes each new row; no CTA reads the cache at new positions, so there is no
// race).
#include <cstdint>

#include "kernels/attention/prefill/epilogue.cuh"
#include "kernels/attention/prefill/gates.cuh"
#include "kernels/attention/prefill/kernels.h"
#include "kernels/attention/prefill/mainloop.cuh"
#include "kernels/attention/prefill/split_keys.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/common/bf16.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/mma_sync.cuh"

namespace asynct::kernels {
namespace {

using namespace prefill;            // TileInfo, the gates, kv_row, store_new_rows, the split parts
using namespace prefill::portable;  // Config

// ---- Tile loads ----------------------------------------------------------------------------

// Copies key/value tile `tile` (kBlockN rows, in the key order of traits.cuh) into
// shared memory with cp.async: positions < prefix from the paged cache, positions in [prefix,
// kv_end) from the new-token arrays, rows at or past kv_end zero-filled. Kv: the cache's element
// type; an e4m3 cache's rows go through registers (mainloop.cuh), each chunk loaded at issue(j)
// and stored at issue(j + 1) or finish(), one k-step of Q K^T later.
//
// Each thread copies part of one row (kThreadsPerRow threads per row), so the row's address (a
// block-table lookup, or a linear index; the same for K and V) is computed once per tile. Chunk
// c = kThreadsPerRow * j + h of the row goes to thread h: one copy instruction of a warp reads
// whole 32-byte sectors, and the 8 threads of a shared-memory phase hold 8 consecutive rows,
// whose swizzled chunks fall in 8 distinct banks. The kCopies copies per thread are issued one
// pair (K and V) at a time between the Q K^T steps (issue(j)): a burst of them ahead of the
// ldmatrix reads queued those reads behind the copies.
template <int D, class Kv>
struct KvTileLoader {
  using C = Config<D>;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kThreadsPerRow = C::kThreads / C::kBlockN;
  static constexpr int kCopies = kChunks / kThreadsPerRow;  // per thread, K and V each
  // A V stage lies this far after its K stage.
  static constexpr unsigned kValueOffsetBytes = C::kStages * C::kBlockN * D * 2;
  static_assert(C::kThreads % C::kBlockN == 0 && kChunks % kThreadsPerRow == 0, "tile shape");
  static_assert(kCopies <= D / 16, "the copies are issued within the k-steps of Q K^T");

  // Few live registers (the Q K^T loop around issue() is at the register limit): the sources
  // point at chunk h of the thread's row; dst is the row's shared address in the K stage; the
  // swizzled chunk of copy j is (kThreadsPerRow * j + h) ^ (row & 7) = (kThreadsPerRow * j) ^ hr.
  const unsigned char *k_src, *v_src;
  unsigned dst;
  int hr;
  bool valid;
  // An e4m3 cache's row (Kv = KvFp8): its scales, and the chunk loaded but not yet stored.
  bool cached_e4m3 = false;
  float key_scale = 1.0f, value_scale = 1.0f;
  uint2 k_bytes, v_bytes;

  __device__ __forceinline__ KvTileLoader(bf16* k_stage, int tile, const PrefillParams& p,
                                          const TileInfo& t) {
    const int tid = threadIdx.x;
    const int row = (tid & 7) | ((tid / (8 * kThreadsPerRow)) << 3);  // in shared memory
    const int h = (tid / 8) % kThreadsPerRow;
    const int pos = tile * C::kBlockN + key_of_column<C::kBlockN / 8>(row);  // (the key order)
    valid = pos < t.kv_end;
    k_src = reinterpret_cast<const unsigned char*>(p.key);  // (any valid address: an invalid copy reads nothing)
    v_src = reinterpret_cast<const unsigned char*>(p.value);
    if (valid) {
      const KvRow source = kv_row<D, Kv>(p, t, pos);
      if constexpr (!Kv::kIsBf16) {
        cached_e4m3 = source.cached_e4m3;
        if (cached_e4m3) {
          key_scale = p.kv.key_scales[t.kv_head];
          value_scale = p.kv.value_scales[t.kv_head];
        }
      }
      const int chunk_bytes = cached_e4m3 ? 8 : 16;
      k_src = source.key + h * chunk_bytes;
      v_src = source.value + h * chunk_bytes;
    }
    dst = smem_addr(k_stage + row * D);
    hr = h ^ (row & 7);
  }

  __device__ __forceinline__ unsigned destination(int j) const { return dst + (((kThreadsPerRow * j) ^ hr) << 4); }
  __device__ __forceinline__ void store_loaded(int j) const {
    store_e4m3_chunk_as_bf16(destination(j), k_bytes, key_scale);
    store_e4m3_chunk_as_bf16(destination(j) + kValueOffsetBytes, v_bytes, value_scale);
  }

  __device__ __forceinline__ void issue(int j) {
    if constexpr (!Kv::kIsBf16) {
      if (cached_e4m3) {
        if (j > 0) store_loaded(j - 1);
        k_bytes = load_e4m3_chunk(k_src + kThreadsPerRow * j * 8);
        v_bytes = load_e4m3_chunk(v_src + kThreadsPerRow * j * 8);
        return;
      }
    }
    const unsigned d = destination(j);
    const int src = valid ? kThreadsPerRow * j * 16 : 0;
    cp_async16_shared(d, k_src + src, valid);
    cp_async16_shared(d + kValueOffsetBytes, v_src + src, valid);
  }
  // After the last issue(): the last chunk loaded into registers goes to shared memory.
  __device__ __forceinline__ void finish() const {
    if constexpr (!Kv::kIsBf16)
      if (cached_e4m3) store_loaded(kCopies - 1);
  }
  __device__ __forceinline__ void issue_all() {
#pragma unroll
    for (int j = 0; j < kCopies; ++j) issue(j);
    finish();
  }
};

// ---- The kernel ----------------------------------------------------------------------------

// kSplit: the query tiles' keys are split over `splits` CTAs each (else splits is 1; the unsplit
// form is its own instantiation and keeps its registers). Kv: the cache's element type.
template <int D, class Gate, bool kSplit, class Kv>
__global__ void __launch_bounds__(Config<D>::kThreads, Config<D>::kCtasPerSm)
    prefill_kernel(const PrefillParams p, float scale, int splits, int seq_group) {
  using C = Config<D>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  constexpr int MB = C::kRowBlocks;  // 16-row blocks per warp
  constexpr int NB = kBlockN / 8;    // 8-key column blocks of S
  constexpr int DB = D / 8;          // 8-wide column blocks of O
  constexpr int KS = D / 16;         // k-steps of Q K^T
  constexpr int kChunks = D / 8;
  constexpr int kTileElems = kBlockN * D;

  if constexpr (!kSplit) splits = 1;
  TileInfo t;
  if (!make_tile_info(p, kBlockM, this_ctas_grid_tile(seq_group), gridDim.z, t, splits)) return;
  const int rows = min(kBlockM, t.q_len - t.m0);  // valid query rows of this tile
  // The key tiles it visits: all of the query tile's, or its split's share (and the one before).
  const SplitRange range = split_range<Gate>((t.kv_end + kBlockN - 1) / kBlockN, t.split, splits);
  if (kSplit && range.begin >= range.end) {  // a split with no keys (a short sequence among longer ones)
    write_empty_part<Gate>(p, t, t.head, 1, rows, t.split, splits);
    return;
  }

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBlockM * D;              // kStages K tiles
  bf16* sV = sK + C::kStages * kTileElems;  // kStages V tiles

  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const int hq = p.num_q_heads;
  const int warp_row0 = warp * 16 * MB;  // the warp's first row within the tile

  // Q tile (rows past q_len zero-filled) and the first K/V tile: one cp.async group.
  {
    constexpr int kRowsPerPass = C::kThreads / kChunks;
    const int chunk = tid % kChunks;
#pragma unroll
    for (int i = 0; i < kBlockM / kRowsPerPass; ++i) {
      const int row = tid / kChunks + i * kRowsPerPass;
      const bool valid = row < rows;
      const bf16* src =
          p.query + (valid ? ((long long)(t.q_begin + t.m0 + row) * hq + t.head) * D + chunk * 8
                           : 0);
      cp_async16(sQ + swizzle<D>(row, chunk), src, valid);
    }
  }
  KvTileLoader<D, Kv>(sK, range.first, p, t).issue_all();
  cp_async_commit();

  Gate gate(p, t.head, scale);
  float acc_o[MB][DB][4];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int db = 0; db < DB; ++db)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mb][db][e] = 0.0f;

  const int q_row = warp_row0 + (lane & 15);               // ldmatrix row (A operand), block 0
  const int pos0 = t.prefix + t.m0 + warp_row0 + lane / 4;  // position of the thread's row g
  const int warp_last_pos = t.prefix + t.m0 + warp_row0 + 16 * MB - 1;
  // The first query head of each KV-head group writes the new tokens' K/V into the cache.
  const bool writes_cache = t.head % (hq / p.kv.num_kv_heads) == 0;
  // The first tile with a key past the tile's first row needs the causal mask.
  const int first_masked = (t.prefix + t.m0 + 1) / kBlockN;
  // ldmatrix lane offsets: K (B operand, not transposed) and V (B operand, transposed).
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_chunk = (lane >> 3) & 1;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;

  // Stages count visits (tile - range.first), not tiles.
  for (int tile = range.first; tile < range.end; ++tile) {
    const int visit = tile - range.first;
    cp_async_wait_all();
    __syncthreads();  // K/V(tile) (and Q) landed; every warp is done with the previous tile's stage
    // The next tile goes into the stage that the previous one used.
    const bool has_next = tile + 1 < range.end;
    const int next = (visit + 1) % C::kStages;
    KvTileLoader<D, Kv> next_tile(sK + next * kTileElems, has_next ? tile + 1 : tile, p, t);
    const bf16* k_tile = sK + (visit % C::kStages) * kTileElems;
    const bf16* v_tile = sV + (visit % C::kStages) * kTileElems;
    // On the diagonal, a warp whose rows all precede the tile's first key has nothing to do
    // (nor on any later tile): its P would be all zero.
    if (tile * kBlockN > warp_last_pos) {
      if (has_next) next_tile.issue_all();
      cp_async_commit();
    } else {

      // S = Q K^T for the warp's MB row blocks; each K fragment feeds all of them.
      float acc_s[MB][NB][4];
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mb][nb][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        if (has_next && ks < KvTileLoader<D, Kv>::kCopies) next_tile.issue(ks);
        unsigned a[MB][4];
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
          ldmatrix_x4(a[mb], sQ + swizzle<D>(q_row + 16 * mb, 2 * ks + (lane >> 4)));
#pragma unroll
        for (int nb2 = 0; nb2 < NB / 2; ++nb2) {
          unsigned b[4];
          ldmatrix_x4(b, k_tile + swizzle<D>(nb2 * 16 + k_row, 2 * ks + k_chunk));
          mma_row_blocks(acc_s, a, b, 2 * nb2);
        }
      }
      if (has_next) next_tile.finish();
      cp_async_commit();

#pragma unroll
      for (int mb = 0; mb < MB; ++mb) {
        if (tile >= first_masked)
          gate.template apply<true>(mb, acc_s[mb], tile * kBlockN, pos0 + 16 * mb);
        else
          gate.template apply<false>(mb, acc_s[mb], tile * kBlockN, pos0 + 16 * mb);
        gate.rescale(mb, acc_o[mb]);
      }

      // O += P V; each V fragment feeds all row blocks (not for a split's warm-up tile, whose
      // gate only carried the halo in).
      if (tile >= range.begin) {
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          unsigned a[MB][4];
#pragma unroll
          for (int mb = 0; mb < MB; ++mb) {
            a[mb][0] = pack_bf16(acc_s[mb][2 * kk][0], acc_s[mb][2 * kk][1]);
            a[mb][1] = pack_bf16(acc_s[mb][2 * kk][2], acc_s[mb][2 * kk][3]);
            a[mb][2] = pack_bf16(acc_s[mb][2 * kk + 1][0], acc_s[mb][2 * kk + 1][1]);
            a[mb][3] = pack_bf16(acc_s[mb][2 * kk + 1][2], acc_s[mb][2 * kk + 1][3]);
          }
#pragma unroll
          for (int db2 = 0; db2 < DB / 2; ++db2) {
            unsigned b[4];
            ldmatrix_x4_trans(b, v_tile + swizzle<D>(kk * 16 + v_row, 2 * db2 + v_chunk));
            mma_row_blocks(acc_o, a, b, 2 * db2);
          }
        }
      }
    }
    // After the math, where S's registers are free: the tile's new rows into the cache.
    if (writes_cache && tile >= range.begin && (tile + 1) * kBlockN > t.prefix + t.m0)
      store_new_rows<D, kBlockN, C::kThreads, Kv>(k_tile, v_tile, tile, p, t,
                                              [](int row, int chunk) { return swizzle<D>(row, chunk); });
  }

  const int g = lane / 4, quad = lane & 3;
  if constexpr (kSplit) {  // this split's part, in fp32, to the workspace
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) write_part_block(p, t, t.head, splits, gate, mb, acc_o[mb], warp_row0 + 16 * mb, rows);
    return;
  }
  // Stage O (bf16) through this warp's own rows of sQ, then 16-byte coalesced stores.
  {
    __syncwarp();  // the warp's ldmatrix reads of sQ are done
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      gate.finish(mb, acc_o[mb]);
#pragma unroll
      for (int db = 0; db < DB; ++db) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = warp_row0 + 16 * mb + g + 8 * hh;
          *reinterpret_cast<__nv_bfloat162*>(sQ + swizzle<D>(row, db) + 2 * quad) =
              __floats2bfloat162_rn(acc_o[mb][db][2 * hh], acc_o[mb][db][2 * hh + 1]);
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * MB * kChunks / 32; ++i) {
      const int idx = i * 32 + lane;
      const int row = warp_row0 + idx / kChunks, chunk = idx % kChunks;
      if (row < rows) {
        const long long dst = ((long long)(t.q_begin + t.m0 + row) * hq + t.head) * D + chunk * 8;
        store_bf16x8(p.out + dst, load_bf16x8(sQ + swizzle<D>(row, chunk)));
      }
    }
  }

}

// ---- Host side -----------------------------------------------------------------------------

template <int D>
int kv_splits(const PrefillParams& p) {
  using C = Config<D>;
  const long long tiles = (long long)p.num_q_heads * p.num_seqs * ((p.max_q_len + C::kBlockM - 1) / C::kBlockM);
  return kv_splits_to_fill(p, tiles, tiles, C::kCtasPerSm, C::kBlockN);
}

template <int D, class Gate, class Kv>
void launch_with(const PrefillParams& p, float scale, int splits, cudaStream_t stream) {
  using C = Config<D>;
  const char* who = "launch_prefill";
  const int m_tiles = (p.max_q_len + C::kBlockM - 1) / C::kBlockM;
  check((long long)m_tiles * splits <= 65535, who, ": max_q_len ", p.max_q_len, " needs ", m_tiles, " query tiles of ",
        splits, " CTAs; the grid allows 65535");
  const dim3 grid(p.num_q_heads, p.num_seqs, m_tiles * splits);
  const int seq_group = prefill_seq_group(p);
  if (splits == 1) {
    allow_dynamic_smem<prefill_kernel<D, Gate, false, Kv>>(C::kSmemBytes);
    prefill_kernel<D, Gate, false, Kv><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, scale, 1, seq_group);
    check_launch(who);
    return;
  }
  allow_dynamic_smem<prefill_kernel<D, Gate, true, Kv>>(C::kSmemBytes);
  prefill_kernel<D, Gate, true, Kv><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, scale, splits, seq_group);
  check_launch(who);
  launch_combine_splits<D, Gate>(p, splits, stream);
}

// An e4m3 cache at head_dim 64 and 128 (what the decode kernel reads too; launch_prefill checks).
template <int D>
void dispatch_gate(const PrefillParams& p, float scale, cudaStream_t stream) {
  const int splits = splits_the_workspace_holds(p, kv_splits<D>(p));
  with_gate<Config<D>::kRowBlocks>(p.gate, [&]<class Gate>() {
    if constexpr (D <= 128)
      if (p.kv.element == KvElement::Fp8E4M3) return launch_with<D, Gate, KvFp8>(p, scale, splits, stream);
    launch_with<D, Gate, KvBf16>(p, scale, splits, stream);
  });
}

}  // namespace

int prefill_portable_kv_splits(const PrefillParams& p) {
  switch (p.kv.head_dim) {
    case 64: return kv_splits<64>(p);
    case 128: return kv_splits<128>(p);
    default: return kv_splits<256>(p);
  }
}

void launch_prefill_portable(const PrefillParams& p, float scale, cudaStream_t stream) {
  switch (p.kv.head_dim) {
    case 64: return dispatch_gate<64>(p, scale, stream);
    case 128: return dispatch_gate<128>(p, scale, stream);
    default: return dispatch_gate<256>(p, scale, stream);
  }
}

}  // namespace asynct::kernels
