// Paged decode attention: one query token per sequence against its cached K/V.
//
// Decode reads every cached key (and, for softmax, every value) once and does little arithmetic
// on it, so the kernel is a stream: what matters is keeping enough bytes in flight to cover HBM
// latency, and never stopping the stream at a block-wide barrier. Hence:
//   * one CTA per (group of up to 8 KV heads, sequence, split): a producer warp and one
//     consumer warp per KV head. The producer streams tiles of keys (and, for softmax, values)
//     for all the CTA's heads into a ring of shared-memory stages with bulk copies (TMA); with
//     every head of the cache in one CTA, a tile of a cache block is one contiguous copy. The
//     bytes in flight then depend on the stage ring, not on how many warps are resident or
//     how long their math takes (bench/kv_read_probe.cu: warps loading 256-byte head rows
//     themselves, 3 CTAs of 4 warps per SM, read 3.3 TB/s; bulk copies 4.3 TB/s);
//   * the query heads that share a KV head are computed by its warp together, so each K/V row
//     is read once for all of them (GQA). The warp's arithmetic is laid out for a power of two
//     of heads (kGroup: 1, 2, 4 or 8); a group of 3, 5, 6 or 7 (kHeads) runs padded to the next
//     power of two, the padding heads' q zero and their outputs never stored (decode_stage1);
//   * a consumer warp reads its head's rows of a tile from the stage: a key's head_dim is spread
//     over kLanesPerKey lanes (8 bf16 = 16 bytes each), kKeysPerLoad keys per warp read, kUnroll
//     reads per tile. The dot products finish with a reduce-scatter inside the lane group, so
//     each score is finished (and gated or exponentiated) in one lane, not in all of them.
//     The async gate's 16-key tiles are scored on tensor cores instead (ldmatrix from a bf16
//     stage, or an e4m3 stage's bytes converted in registers; mma.m16n8k16 against q in bf16):
//     0.9 us less per CTA at 32 x 512 on H200 (RESULTS);
//   * the gate is a policy (SoftmaxGate / AsyncGate) and is all that differs between the two:
//     softmax keeps an online max and sum per head and has V staged with K; the async gate
//     pools the ReLU'd scores over the window (a W-1 halo of scores carried from tile to tile
//     in warp-private shared memory), compacts the keys whose P is non-zero for some head of the
//     group (sparse-P) and bulk-copies only their V rows into the warp's shared memory, used
//     two tiles later;
//   * with the qkv projection as input (DecodeProjection, decode.h), the consumer warps norm and
//     rotate their q heads themselves before their first tile, and the CTA holding a sequence's
//     newest key writes that key and value into the cache and uses them from registers, so the
//     decode step needs no separate qk-norm kernel;
//   * with several splits, each CTA leaves its partial outputs in the workspace and counts
//     itself on its (head group, sequence) counter; the last of the splits to arrive combines
//     them, in split order: a plain sum for the async gate (additivity; each warp recomputes the
//     scores of its W-1 halo keys), the log-sum-exp merge for softmax. No second kernel: at
//     decode sizes its launch and its wait on this one cost more than the combine (2.5 us per
//     layer, 32 sequences, bench/RESULTS.md).
//
// The pieces: traits.cuh (layout constants, the kernel's arguments), mainloop.cuh (the paged
// rows, the stage ring and its producer, a consumer's staged tile, the reduce-scattered scores),
// gates.cuh (the two gate policies, on the contract of attention/gate_policy.cuh), projection.cuh
// (the new token's q/k norm, RoPE and cache write), combine.cuh (the split combine); this file:
// the kernel, its dispatch, the split heuristic and launch_decode.
#include "kernels/attention/decode/decode.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/attention/decode/combine.cuh"
#include "kernels/attention/decode/gates.cuh"
#include "kernels/attention/decode/mainloop.cuh"
#include "kernels/attention/decode/projection.cuh"
#include "kernels/attention/decode/traits.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_info.h"
#include "kernels/common/last_arrival.cuh"

namespace asynct::kernels {
namespace {

using namespace decode;  // the layout, the stage ring, the gates, the projection, the combine

// The split counters, one per (head group, sequence): zero when the module loads, and left zero
// by every launch (the last split resets its counter). Per device; decode launches on one
// device run in stream order (like every user of one workspace).
constexpr int kMaxSplitCounters = 1 << 18;
__device__ unsigned g_split_counters[kMaxSplitCounters];

// kGroup: the query heads a consumer warp computes (a power of two); kHeads <= kGroup: those
// that exist (the query heads per KV head). Heads kHeads .. kGroup - 1 are padding: q zero, the
// async gate's parameters zero (P is 0), never stored.
template <int kHeadDim, int kGroup, typename Gate, int kHeads, typename Kv>
__global__ void __launch_bounds__(kMaxThreads) decode_stage1(Stage1Args a, Gate gate) {
  static_assert(kHeads >= 1 && kHeads <= kGroup && kGroup <= 2 * kHeads, "kGroup pads kHeads to a power of two");
  using L = Layout<kHeadDim, kGroup, Kv>;
  constexpr bool kSoftmax = is_softmax_gate<Gate>;
  using Ring = StageRing<kHeadDim, kGroup, Kv, Gate>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ SharedBarrier full[Ring::kStages], empty[Ring::kStages];
  // A dependent launch: the kernel before writes q and the newest key of each sequence, or the
  // projection (see produce_tiles); the metadata and the older keys were written before it.
  const DecodeParams& p = a.p;
  const int heads = a.heads_per_cta;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int slice = lane % L::kLanesPerKey, key_lane = lane / L::kLanesPerKey;
  const int seq = blockIdx.y, split = blockIdx.z;
  const int row_bytes = heads * L::kRowBytes;  // one token's K (or V) for the CTA's heads
  const int row_stride = row_bytes + Ring::kRowPad;
  const int stage_bytes = Ring::kParts * L::kTile * row_stride;
  unsigned char* scratch_base = smem + Ring::kStages * stage_bytes;
  auto scratch = [&](int w) -> typename Ring::Scratch& {
    return *reinterpret_cast<typename Ring::Scratch*>(scratch_base + w * Ring::kScratchBytes);
  };

  // This split's keys, clamped to what the block table can address. The splits share each
  // sequence's own length (not the batch's longest, nor the capacity a CUDA graph was captured
  // for), so every split of every sequence has work; they start on multiples of the tile.
  const int kv_len = max(0, min(p.kv_lens[seq], p.kv.max_blocks_per_seq * p.kv.block_size));
  const int splits = int(gridDim.z);
  const int keys_per_split = ((kv_len + splits - 1) / splits + L::kTile - 1) / L::kTile * L::kTile;
  const int begin = split * keys_per_split;
  const int end = min(kv_len, begin + keys_per_split);

  // With the projection, the CTA that holds the newest key writes it (project_new_token). Its
  // producer may copy that cache row before the write lands (the copy races the write and is
  // not used): the consumers take the row from their registers instead.
  const bool writes_newest = p.projection.enabled() && begin < end && end == kv_len;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Ring::kStages; ++s) full[s].init(1), empty[s].init(unsigned(heads));
    for (int w = 0; w < heads; ++w) Gate::init_scratch(scratch(w));
    SharedBarrier::fence_init();
  }
  __syncthreads();  // the only CTA-wide barrier: the producer leaves early

  // The cache seen from this warp's KV head (the producer's: the CTA's first).
  const int kv_head = blockIdx.x * heads + (warp < heads ? warp : 0);
  const SeqCache cache{p.kv.block_table + (long long)seq * p.kv.max_blocks_per_seq, a.block_shift,
                       p.kv.block_size - 1, p.kv.num_kv_heads * kHeadDim, kv_head * kHeadDim};
  if (warp == heads) {
    produce_tiles<L::kTile, Ring::kStages, Ring::kParts, Kv::kBytes>(a, cache, smem, stage_bytes, row_bytes, row_stride,
                                                                     full, empty, begin, end, kv_len - 1);
    return;
  }
  wait_for_prior_grids();  // q (or the projection), and the newest key the halo or V gathers may read
  allow_next_grid();

  // A consumer warp: this lane's 8 elements of each query head, pre-scaled (padding heads zero).
  const int first_head = kv_head * kHeads;
  float q[kGroup][8];
  typename Kv::Raw newest_k{}, newest_v{};  // with writes_newest: the newest key's row, as stored
  if (p.projection.enabled()) {
    project_new_token<kHeadDim, kGroup, kHeads, Kv>(a, seq, kv_head, writes_newest, q, newest_k, newest_v);
  } else {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h < kHeads)
        to_float8(load_bf16x8(p.query + ((long long)seq * p.num_q_heads + first_head + h) * kHeadDim + slice * 8), q[h]);
      else
#pragma unroll
        for (int e = 0; e < 8; ++e) q[h][e] = 0.0f;
    }
  }
  // An e4m3 cache holds key / key_scale and value / value_scale, read as that / Kv::kReadUnit:
  // the key scale goes into q (kReadUnit into each score, scattered_scores), both the value's
  // into the output.
  const float key_scale = Kv::kIsBf16 ? 1.0f : p.kv.key_scales[kv_head];
  const float value_scale = Kv::kIsBf16 ? 1.0f : p.kv.value_scales[kv_head];
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] *= a.scale * key_scale;
  typename Gate::template State<kHeadDim, kGroup> state;
  gate.template start<kHeadDim, kGroup, kHeads>(state, first_head);
  float o[kGroup][8] = {};
  unsigned long long counts[2] = {0, 0};  // non-zero P entries, V rows loaded

  if (begin < end) {
    const auto* key_bytes = reinterpret_cast<const unsigned char*>(p.kv.key_cache);
    const auto* value_bytes = reinterpret_cast<const unsigned char*>(p.kv.value_cache);
    gate.template start_warp<kHeadDim, kGroup, Kv>(state, scratch(warp), cache, key_bytes, q, begin, end);
    // The tile's stage, first key and barrier are set in the loop.
    StagedTile<kHeadDim, kGroup, Kv> staged{nullptr, row_stride, begin, end, writes_newest, kv_len - 1,
                                            newest_k, newest_v, nullptr};
    for (int t = 0; begin + t * L::kTile < end; ++t) {
      const int s = t % Ring::kStages, first_key = begin + t * L::kTile;
      full[s].wait((t / Ring::kStages) & 1);
      staged.head_rows = smem + s * stage_bytes + warp * L::kRowBytes;
      staged.first_key = first_key;
      staged.empty = &empty[s];
      gate.template tile<kHeadDim, kGroup, Kv>(state, scratch(warp), q, staged, o, cache, value_bytes, counts);
    }
    gate.template finish<kHeadDim, kGroup, Kv>(state, scratch(warp), o);
  }
  // Softmax counts every key once per computed head: the padding heads' share is not P.
  if constexpr (kSoftmax && kHeads < kGroup) counts[0] = counts[0] / kGroup * kHeads;
  if (p.counters) {  // counts live in the lanes that own a key (non-zero P) and in lane 0
    if (counts[0]) atomicAdd(p.counters, counts[0]);
    if (counts[1]) atomicAdd(p.counters + 1, counts[1]);
  }

  // The warp's output: the lane groups that served different keys add up; then the lanes of
  // the first group hold 8 elements each of every query head (the padding heads are dropped).
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int off = L::kLanesPerKey; off < 32; off <<= 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] += __shfl_xor_sync(kFull, o[h][e], off);
      if constexpr (kSoftmax) state.sum[h] += __shfl_xor_sync(kFull, state.sum[h], off);
    }
  }
  const long long first_row = (long long)seq * p.num_q_heads + first_head;
#pragma unroll
  for (int h = 0; h < kHeads && key_lane == 0; ++h) {
    const long long row = first_row + h;
    if (a.partial_out == nullptr) {  // one split: finish here
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        out[e] = o[h][e] * Kv::kReadUnit * value_scale;
        if constexpr (kSoftmax) out[e] = state.sum[h] > 0.0f ? out[e] / state.sum[h] : 0.0f;
      }
      store_bf16x8(p.out + row * kHeadDim + slice * 8, from_float8(out));
    } else {
      const long long prow = (long long)split * p.num_seqs * p.num_q_heads + row;
      float* dst = a.partial_out + prow * kHeadDim + slice * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = o[h][e] * Kv::kReadUnit * value_scale;
      if constexpr (kSoftmax)
        if (slice == 0) {  // an empty split leaves max -FLT_MAX, sum 0: weight 0 in the combine
          a.partial_max[prow] = state.max[h];
          a.partial_sum[prow] = state.sum[h];
        }
    }
  }
  if (a.partial_out == nullptr) return;

  // Several splits: the last CTA of the (head group, sequence) to arrive combines them.
  unsigned* counter = g_split_counters + (long long)seq * gridDim.x + blockIdx.x;
  if (!last_to_arrive(counter, unsigned(splits), [heads] { consumer_barrier(heads); })) return;
  combine_splits<kHeadDim, kHeads, kSoftmax>(a, splits, first_row);
}

template <int kHeadDim, int kGroup, int kHeads, typename Kv, typename Gate>
void launch_with(const Stage1Args& a, const Gate& gate, int splits, cudaStream_t stream) {
  using Ring = StageRing<kHeadDim, kGroup, Kv, Gate>;
  static const bool big_shared_memory_allowed = [] {  // above 48 KB needs an opt-in, once
    ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(decode_stage1<kHeadDim, kGroup, Gate, kHeads, Kv>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(Ring::bytes(kMaxHeadsPerCta))));
    return true;
  }();
  (void)big_shared_memory_allowed;
  dim3 grid(a.p.kv.num_kv_heads / a.heads_per_cta, a.p.num_seqs, splits);
  launch_dependent(decode_stage1<kHeadDim, kGroup, Gate, kHeads, Kv>, grid, (a.heads_per_cta + 1) * 32,
                   Ring::bytes(a.heads_per_cta), stream, "decode_stage1", a, gate);
}

// A group of query heads per KV head that is not a power of two runs padded to the next one
// (decode_stage1): groups 3, 5, 6 and 7 compute as 4, 8, 8 and 8 heads, reading K and V once.
template <int kHeadDim, typename Kv, typename Gate>
void dispatch_group(int group, const Stage1Args& a, const Gate& gate, int splits,
                    cudaStream_t stream) {
  switch (group) {
    case 1: return launch_with<kHeadDim, 1, 1, Kv>(a, gate, splits, stream);
    case 2: return launch_with<kHeadDim, 2, 2, Kv>(a, gate, splits, stream);
    case 3: return launch_with<kHeadDim, 4, 3, Kv>(a, gate, splits, stream);
    case 4: return launch_with<kHeadDim, 4, 4, Kv>(a, gate, splits, stream);
    case 5: return launch_with<kHeadDim, 8, 5, Kv>(a, gate, splits, stream);
    case 6: return launch_with<kHeadDim, 8, 6, Kv>(a, gate, splits, stream);
    case 7: return launch_with<kHeadDim, 8, 7, Kv>(a, gate, splits, stream);
    case 8: return launch_with<kHeadDim, 8, 8, Kv>(a, gate, splits, stream);
  }
  check(false, "decode: ", group, " query heads per KV head; supported: 1 to 8");
}

// An e4m3 cache is read for head_dim 64 and 128 (the models' sizes; 256 would double the
// kernels built for no model).
template <typename Gate>
void dispatch(int head_dim, int group, KvElement element, const Stage1Args& a, const Gate& gate, int splits,
              cudaStream_t stream) {
  if (element == KvElement::Fp8E4M3) {
    switch (head_dim) {
      case 64: return dispatch_group<64, KvFp8>(group, a, gate, splits, stream);
      case 128: return dispatch_group<128, KvFp8>(group, a, gate, splits, stream);
    }
    check(false, "decode: head_dim ", head_dim, " with an FP8 cache not supported (64, 128)");
  }
  switch (head_dim) {
    case 64: return dispatch_group<64, KvBf16>(group, a, gate, splits, stream);
    case 128: return dispatch_group<128, KvBf16>(group, a, gate, splits, stream);
    case 256: return dispatch_group<256, KvBf16>(group, a, gate, splits, stream);
  }
  check(false, "decode: head_dim ", head_dim, " not supported (64, 128, 256)");
}

int ceil_div(long long a, long long b) { return int((a + b - 1) / b); }

// How many KV heads one CTA serves: the most (8, 4, 2 or 1) that divides the head count.
int kv_heads_per_cta(int num_kv_heads) {
  for (int n = kMaxHeadsPerCta; n > 1; n /= 2)
    if (num_kv_heads % n == 0) return n;
  return 1;
}

}  // namespace

int decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count) {
  // One wave: as many CTAs as fit on the GPU at once, each streaming an equal share of the
  // keys. A multiprocessor holds the stage rings of kMaxHeadsPerCta heads (one CTA of 8 heads,
  // two of 4, ...). More CTAs than that only add a ragged second wave; fewer leave bandwidth
  // idle. Each split keeps at least 64 keys so that the halo, the pipeline's fill and the combine
  // stay cheap.
  const int heads_per_cta = kv_heads_per_cta(num_kv_heads);
  const long long ctas = (long long)num_seqs * (num_kv_heads / heads_per_cta);
  const long long resident = (long long)(kMaxHeadsPerCta / heads_per_cta) * sm_count;
  const long long wanted = std::max(1LL, resident / ctas);
  const int most = std::max(1, ceil_div(max_kv_len, 64));
  return int(std::min<long long>({wanted, most, kMaxSplits}));
}

std::size_t decode_workspace_bytes(const DecodeParams& p, int num_splits) {
  if (num_splits <= 1) return 0;
  const std::size_t rows = std::size_t(num_splits) * p.num_seqs * p.num_q_heads;
  return rows * p.kv.head_dim * sizeof(float) + 2 * rows * sizeof(float);
}

void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  validate_paged_kv(p.kv, "decode");
  validate_gate(p.gate, "decode");
  check((p.query || p.projection.enabled()) && p.out && p.kv_lens, "decode: null query (and no projection), out or kv_lens");
  check(p.num_seqs >= 1, "decode: no sequences");
  check(p.num_q_heads % p.kv.num_kv_heads == 0, "decode: ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.max_kv_len >= 1 && p.max_kv_len <= p.kv.max_blocks_per_seq * p.kv.block_size,
        "decode: max_kv_len ", p.max_kv_len, " outside 1..", p.kv.max_blocks_per_seq * p.kv.block_size);
  check(p.gate.kind == GateKind::Softmax || p.gate.pool_window - 1 <= kMaxHalo, "decode: pool window ",
        p.gate.pool_window, " above the supported ", kMaxHalo + 1);
  // Bulk copies and 16-byte loads need 16-byte aligned rows (head_dim is a multiple of 64).
  check(reinterpret_cast<std::uintptr_t>(p.kv.key_cache) % 16 == 0 &&
            reinterpret_cast<std::uintptr_t>(p.kv.value_cache) % 16 == 0 &&
            reinterpret_cast<std::uintptr_t>(p.query) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0,
        "decode: the query, output and K/V cache pointers must be 16-byte aligned");
  const int group = p.num_q_heads / p.kv.num_kv_heads;

  int splits = p.num_splits;
  if (splits <= 0) splits = decode_num_splits(p.num_seqs, p.kv.num_kv_heads, p.max_kv_len, current_device_info().sm_count);
  splits = std::min({splits, p.max_kv_len, kMaxSplits});

  Stage1Args a{p, 0, kv_heads_per_cta(p.kv.num_kv_heads), 0.0f, nullptr, nullptr, nullptr, {}};
  while ((1 << a.block_shift) < p.kv.block_size) ++a.block_shift;
  a.scale = p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.kv.head_dim)));
  if (splits > 1) {
    check(p.workspace != nullptr, "decode: ", splits, " splits need a workspace of ",
          decode_workspace_bytes(p, splits), " bytes");
    const std::size_t rows = std::size_t(splits) * p.num_seqs * p.num_q_heads;
    a.partial_out = static_cast<float*>(p.workspace);
    a.partial_max = a.partial_out + rows * p.kv.head_dim;
    a.partial_sum = a.partial_max + rows;
    const long long counters = (long long)p.num_seqs * (p.kv.num_kv_heads / a.heads_per_cta);
    check(counters <= kMaxSplitCounters, "decode: ", p.num_seqs, " sequences x ", p.kv.num_kv_heads / a.heads_per_cta,
          " head groups need more split counters than the ", kMaxSplitCounters, " there are");
  }

  if (p.projection.enabled()) {
    const DecodeProjection& pr = p.projection;
    check(pr.q_weight && pr.k_weight && pr.positions && pr.slot_mapping,
          "decode: the projection needs q_weight, k_weight, positions and slot_mapping");
    check(std::isfinite(pr.rope_theta) && pr.rope_theta > 0, "decode: rope_theta must be finite and > 0, got ",
          pr.rope_theta);
    check_norm_args("decode (projection)", pr.norm);
    const std::int64_t elements = std::int64_t(p.num_seqs) * (p.num_q_heads + 2 * p.kv.num_kv_heads) * p.kv.head_dim;
    if (pr.qkv.is_split())
      check_split_output("decode", "qkv partials", pr.qkv, elements);
    else
      check(reinterpret_cast<std::uintptr_t>(pr.qkv.dense) % 16 == 0, "decode: the projection is not 16-byte aligned");
    a.turns = RopeTurns::of(p.kv.head_dim, pr.rope_theta);
  }

  const bool softmax = p.gate.kind == GateKind::Softmax;
  if (softmax)
    dispatch(p.kv.head_dim, group, p.kv.element, a, SoftmaxGate{{}, SoftmaxGate::params_of(p.gate)}, splits, stream);
  else
    dispatch(p.kv.head_dim, group, p.kv.element, a, AsyncGate{{}, AsyncGate::params_of(p.gate)}, splits, stream);
}

}  // namespace asynct::kernels
