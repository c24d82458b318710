// Portable prefill attention (sm_80 and up): varlen, paged, causal with a cached prefix, GQA,
// async and softmax gates; writes the new tokens' K/V into the paged cache in the same launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention_args.h"
#include "kernels/common/tuning.h"  // PrefillKernel

namespace asynct::kernels {

// Sequence s has q_len = cu_seqlens_q[s+1] - cu_seqlens_q[s] new tokens at positions
// kv_lens[s] - q_len .. kv_lens[s] - 1. Keys before that prefix are read from the paged cache;
// the new tokens' keys and values come from `key`/`value` and are also written into the cache
// (at their positions, through the block table). The cache may be e4m3 (head_dim 64 and 128):
// cached rows are read as bf16 at their scales, new rows written as e4m3.
struct PrefillParams {
  const bf16* query = nullptr;  // [total_q, num_q_heads, head_dim]
  const bf16* key = nullptr;    // [total_q, num_kv_heads, head_dim], the new tokens
  const bf16* value = nullptr;  // [total_q, num_kv_heads, head_dim]
  bf16* out = nullptr;          // [total_q, num_q_heads, head_dim]
  const std::int32_t* cu_seqlens_q = nullptr;  // device, [num_seqs + 1]
  const std::int32_t* kv_lens = nullptr;       // device, [num_seqs]
  int num_seqs = 0;
  int total_q = 0;
  int max_q_len = 0;   // host-known bounds, size the grid
  int max_kv_len = 0;
  int num_q_heads = 0;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim)
  PagedKv kv;
  GateArgs gate;
  // Room for partial outputs, device: when the query tiles alone would leave most of the GPU
  // idle (a short prompt after a long cached prefix), either kernel spreads each tile's keys
  // over several CTAs and combines their outputs from here. prefill_workspace_bytes(*this) says
  // how much it needs; null (or smaller): the keys are not split.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

void launch_prefill(const PrefillParams& params, cudaStream_t stream);

// The workspace launch_prefill would use for these parameters on this device (0: none). The
// parameters' sizes and the tuning matter (KernelTuning::prefill, prefill_kv_splits), not their
// pointers.
std::size_t prefill_workspace_bytes(const PrefillParams& params);

// Which kernel launch_prefill runs: on a Hopper GPU (from a build for sm_90a), head_dim 128 runs
// the wgmma kernel, everything else the portable mma.sync one. KernelTuning::prefill
// (kernels/common/tuning.h) forces one for tests and measuring.
//
// Whether the Hopper kernel can run here: a Hopper device, and this build holds its sm_90a code.
bool prefill_hopper_available();

}  // namespace asynct::kernels
