// Paged decode attention: one query token per sequence against its cached K/V (docs/DESIGN.md §4,
// seed 000 §1.1.2). Async and softmax gates; sparse-P for async; split-K for long contexts; 1 to
// 8 query heads per KV head.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention_args.h"
#include "kernels/gemm/linear_output.h"
#include "kernels/norms/norms.h"  // NormArgs

namespace asynct::kernels {

// The decode step's q and newest key/value straight from the qkv projection: what
// launch_qk_norm_rope_cache_write (norms.h) computes for these rows, done by the decode kernel
// itself, which saves a launch and a dependency per layer. With `qkv` set, each sequence's
// query heads are normed and rotated from its projection row instead of read from `query`, and
// the sequence's newest key and value (position kv_lens - 1) are normed, rotated and written
// into the cache at slot_mapping before anything reads them. slot_mapping must be where the
// block table puts that position (the engine's slot mapping).
struct DecodeProjection {
  LinearOutput qkv;  // [num_seqs, (num_q_heads + 2 num_kv_heads) * head_dim]: q, k, v heads
  const bf16* q_weight = nullptr;  // [head_dim]
  const bf16* k_weight = nullptr;
  const std::int64_t* positions = nullptr;     // device, [num_seqs]: the rotation's positions
  const std::int64_t* slot_mapping = nullptr;  // device, [num_seqs]: the newest K/V's cache slots
  float rope_theta = 1e6f;
  NormArgs norm;
  __host__ __device__ bool enabled() const { return qkv.dense != nullptr || qkv.is_split(); }
};

struct DecodeParams {
  const bf16* query = nullptr;           // [num_seqs, num_q_heads, head_dim]; unused with projection
  bf16* out = nullptr;                   // [num_seqs, num_q_heads, head_dim]
  const std::int32_t* kv_lens = nullptr; // device, [num_seqs]; each >= 1, includes this token
  int num_seqs = 0;
  int num_q_heads = 0;
  int max_kv_len = 0;   // host-known upper bound of kv_lens (sizes split-K)
  float scale = 0.0f;   // 0: 1/sqrt(head_dim)
  PagedKv kv;
  GateArgs gate;
  int num_splits = 0;   // 0: chosen by decode_num_splits
  void* workspace = nullptr;          // decode_workspace_bytes() bytes, device
  // Optional device counters, added to: [0] non-zero P entries (one per query head and key),
  // [1] V rows the PV loop loaded (one per KV head and key). Dense softmax counts every key.
  unsigned long long* counters = nullptr;
  DecodeProjection projection;  // optional: q and the newest K/V from the qkv projection
};

// The split count the heuristic picks for a shape, given the GPU's multiprocessor count.
int decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count);
// Workspace for split-K partials (0 when num_splits is 1).
std::size_t decode_workspace_bytes(const DecodeParams& params, int num_splits);

// Split launches count their splits in per-device counters: launches on one device run in
// stream order.
void launch_decode(const DecodeParams& params, cudaStream_t stream);

}  // namespace asynct::kernels
