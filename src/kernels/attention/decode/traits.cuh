// The decode kernel's layout constants (decode.cu): CTA shape, shared-memory budget, tile
// shapes per (head_dim, query heads per KV head), and the kernel's arguments.
#pragma once

#include <cstdint>

#include "kernels/attention/decode/decode.h"
#include "kernels/attention/kv_element.cuh"
#include "kernels/norms/head_norm_rope.cuh"  // RopeTurns

namespace asynct::kernels::decode {

// One consumer warp per KV head, up to this many per CTA, plus the producer warp.
constexpr int kMaxHeadsPerCta = 8;
constexpr int kMaxThreads = (kMaxHeadsPerCta + 1) * 32;
// Shared memory for the stage ring, per KV head of the CTA: 8 heads x 24 KB = 192 KB (of 227).
constexpr int kStageBudgetPerHead = 24 * 1024;
constexpr int kMaxHalo = 7;  // pool window <= 8
constexpr int kMaxSplits = 256;
constexpr unsigned kFull = 0xffffffffu;

template <int kHeadDim, int kGroup, typename Kv = KvBf16>
struct Layout {
  static constexpr int kLanesPerKey = kHeadDim / 8;          // 8, 16 or 32 lanes share a key
  static constexpr int kKeysPerLoad = 32 / kLanesPerKey;     // whole keys per warp read
  // 16-byte reads per lane and per tile (a tile is one stage for one head); fewer for big
  // groups (registers: q and o hold 8 floats per query head). kTile * kHeadDim is then the same
  // for every head_dim, and so is a stage's size.
  static constexpr int kUnroll = kGroup <= 2 ? 8 : (kGroup == 4 ? 4 : 2);
  static constexpr int kTile = kKeysPerLoad * kUnroll;       // keys per warp iteration
  // One m16 tile of keys, scored on tensor cores from the stage (see StageRing; e4m3 rows are
  // converted to bf16 in registers on the way, AsyncGate::tile). The same for every Kv.
  static constexpr bool kMmaTile = kTile == 16;
  static constexpr int kRowBytes = kHeadDim * Kv::kBytes;     // one KV head's row of a token
  static_assert(kTile <= 32, "the async list gives each key of a tile one lane");
};

// ---- Stage 1: one CTA per (group of KV heads, sequence, split) ------------------------------

struct Stage1Args {
  DecodeParams p;
  int block_shift;
  int heads_per_cta;  // KV heads of a CTA, one consumer warp each (see kv_heads_per_cta)
  float scale;
  float* partial_out;  // [splits, seqs, Hq, D] (null when one split)
  float* partial_max;  // [splits, seqs, Hq] softmax only
  float* partial_sum;
  RopeTurns turns;  // with p.projection
};
}  // namespace asynct::kernels::decode
