#include "kernels/attention/attention_args.h"

#include "core/error.h"

namespace asynct::kernels {

void validate_paged_kv(const PagedKv& kv, const char* who) {
  check(kv.key_cache && kv.value_cache && kv.block_table, who, ": null KV cache pointer");
  if (kv.element == KvElement::Fp8E4M3)
    check(kv.key_scales && kv.value_scales, who, ": an FP8 KV cache needs its key and value scales");
  check(kv.block_size >= 16 && kv.block_size <= 256 && (kv.block_size & (kv.block_size - 1)) == 0,
        who, ": block_size must be a power of two in 16..256, got ", kv.block_size);
  check(kv.head_dim == 64 || kv.head_dim == 128 || kv.head_dim == 256, who,
        ": head_dim must be 64, 128 or 256, got ", kv.head_dim);
  check(kv.num_kv_heads >= 1, who, ": num_kv_heads must be >= 1");
  check(kv.max_blocks_per_seq >= 1 && kv.num_blocks >= 1, who, ": empty block table or cache");
}

void validate_gate(const GateArgs& gate, const char* who) {
  if (gate.kind == GateKind::Async) {
    check(gate.alpha && gate.sigma && gate.gamma, who, ": async gate needs alpha, sigma, gamma");
    check(gate.pool_window >= 1 && gate.pool_window <= 8, who,
          ": pool window must be in 1..8, got ", gate.pool_window);
  } else {
    check(gate.softcap >= 0.0f, who, ": softcap must be >= 0");
  }
}

}  // namespace asynct::kernels
