// What the attention kernels (prefill and decode) share: the paged KV cache and the gate, as
// device pointers. Host code fills these; the kernels read them. See docs/DESIGN.md §2-§3.
#pragma once

#include <cstdint>

#include "kernels/common/bf16.h"
#include "kernels/common/kv_element.h"
#include "core/gate.h"  // GateKind

namespace asynct::kernels {

// The paged cache of docs/DESIGN.md §3: key_cache/value_cache [num_blocks, block_size, num_kv_heads,
// head_dim]; token t of sequence s is in block block_table[s * max_blocks_per_seq + t /
// block_size], slot t % block_size. block_size is a power of two in 16..256. The pointers are
// typed for bf16; with an e4m3 cache they point at its bytes. Decode and prefill read and write
// either type.
struct PagedKv {
  bf16* key_cache = nullptr;
  bf16* value_cache = nullptr;
  KvElement element = KvElement::Bf16;
  const float* key_scales = nullptr;    // device, [num_kv_heads]: e4m3 only
  const float* value_scales = nullptr;
  const std::int32_t* block_table = nullptr;
  int max_blocks_per_seq = 0;
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// The gate as the kernels see it. For GateKind::Async, alpha/sigma/gamma are device arrays of
// one fp32 per query head and pool_window is W; for GateKind::Softmax, softcap (0 = none).
struct GateArgs {
  GateKind kind = GateKind::Softmax;
  int pool_window = 3;
  const float* alpha = nullptr;
  const float* sigma = nullptr;
  const float* gamma = nullptr;
  float softcap = 0.0f;
};

// Host-side checks shared by the attention entry points; throw asynct::Error. An e4m3 cache needs
// its scales.
void validate_paged_kv(const PagedKv& kv, const char* who);
void validate_gate(const GateArgs& gate, const char* who);

}  // namespace asynct::kernels
