// Paged decode attention: one query token per sequence against its cached K/V (SPEC §3,
// seed 000 §1.1.2). Async and softmax gates; sparse-P for async; split-K for long contexts.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/attention_args.h"

namespace asynct::kernels {

struct DecodeParams {
  const bf16* query = nullptr;           // [num_seqs, num_q_heads, head_dim]
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
};

// The split count the heuristic picks for a shape, given the GPU's multiprocessor count.
int decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count);
// Workspace for split-K partials (0 when num_splits is 1).
std::size_t decode_workspace_bytes(const DecodeParams& params, int num_splits);

// Split launches count their splits in per-device counters: launches on one device run in
// stream order.
void launch_decode(const DecodeParams& params, cudaStream_t stream);

}  // namespace asynct::kernels
