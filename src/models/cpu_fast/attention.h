// Paged attention over the production CPU runner's cache (bf16 or e4m3), for both gates: softmax, and
// AsyncT's additive gate (core/gate.h), causal, GQA, each query row's pack of a KV head's query
// heads (kernels.h: kMaxHeadPack) a task of the pool.
#pragma once

#include <cstdint>

#include "core/gate.h"
#include "engine/step_batch.h"
#include "core/thread_pool.h"

namespace asynct::cpu_fast {

// One layer's cache: [num_blocks, block_size, num_kv_heads, head_dim] for keys and values, bf16,
// or e4m3 (fp8) with a scale per KV head (a value is its e4m3 times its head's scale).
struct PagedKv {
  const std::uint16_t* key = nullptr;  // bf16
  const std::uint16_t* value = nullptr;
  const std::uint8_t* key_fp8 = nullptr;  // e4m3, when the bf16 pointers are null
  const std::uint8_t* value_fp8 = nullptr;
  const float* key_scales = nullptr;  // e4m3: [num_kv_heads]
  const float* value_scales = nullptr;
  int block_size = 0, num_kv_heads = 0, head_dim = 0;
};

// q: float32 [T, Hq, D] (after RoPE); out: float32 [T, Hq, D]. The batch's sequences, kv_lens
// and block tables say which keys each row sees (check_step_batch has checked them). `scale`
// multiplies every score (1/sqrt(D) in the models).
void paged_attention(ThreadPool& pool, const float* q, int num_q_heads, const StepBatch& batch, const PagedKv& kv,
                     const Gate& gate, float scale, float* out);

}  // namespace asynct::cpu_fast
