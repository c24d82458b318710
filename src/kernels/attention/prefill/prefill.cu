// launch_prefill: checks the parameters and picks the kernel: on a Hopper GPU (from a build for
// sm_90a) head_dim 128 runs the wgmma kernel (hopper.cu), everything else the portable mma.sync
// one (portable.cu); KernelTuning::prefill (common/tuning.h) can force either.
#include "kernels/attention/prefill/prefill.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/attention/prefill/kernels.h"
#include "kernels/attention/prefill/split_keys.cuh"

namespace asynct::kernels {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

}  // namespace

std::size_t prefill_workspace_bytes(const PrefillParams& p) {
  if (p.total_q == 0 || p.max_q_len == 0) return 0;
  return prefill::split_workspace_bytes(p, prefill_hopper_applies(p) ? prefill_hopper_kv_splits(p)
                                                                     : prefill_portable_kv_splits(p));
}

void launch_prefill(const PrefillParams& p, cudaStream_t stream) {
  const char* who = "launch_prefill";
  validate_paged_kv(p.kv, who);
  validate_gate(p.gate, who);
  check(p.kv.element != KvElement::Fp8E4M3 || p.kv.head_dim <= 128, who,
        ": an FP8 KV cache is read at head_dim 64 and 128, got ", p.kv.head_dim);
  check(p.num_seqs >= 1 && p.num_seqs <= 65535, who, ": num_seqs must be in 1..65535, got ",
        p.num_seqs);
  check(p.num_q_heads >= 1 && p.num_q_heads <= 65535, who,
        ": num_q_heads must be in 1..65535, got ", p.num_q_heads);
  check(p.num_q_heads % p.kv.num_kv_heads == 0, who, ": ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.total_q >= 0 && p.max_q_len >= 0 && p.max_q_len <= p.total_q, who,
        ": need 0 <= max_q_len <= total_q, got max_q_len ", p.max_q_len, ", total_q ", p.total_q);
  check(p.max_kv_len >= p.max_q_len, who, ": max_kv_len ", p.max_kv_len, " < max_q_len ",
        p.max_q_len);
  check((long long)p.max_kv_len <= (long long)p.kv.max_blocks_per_seq * p.kv.block_size, who,
        ": max_kv_len ", p.max_kv_len, " exceeds the block table's ", p.kv.max_blocks_per_seq,
        " blocks of ", p.kv.block_size, " tokens");
  // (> 0 matters: both gates keep raw scores and fold the scale into constants.)
  check(std::isfinite(p.scale) && p.scale >= 0.0f, who,
        ": scale must be finite and positive (0: 1/sqrt(head_dim)), got ", p.scale);
  check(p.cu_seqlens_q && p.kv_lens, who, ": null cu_seqlens_q or kv_lens");
  if (p.total_q == 0 || p.max_q_len == 0) return;
  check(p.query && p.key && p.value && p.out, who, ": null query, key, value or out pointer");
  check(aligned16(p.query) && aligned16(p.key) && aligned16(p.value) && aligned16(p.out) &&
            aligned16(p.kv.key_cache) && aligned16(p.kv.value_cache),
        who, ": query, key, value, out and the caches must be 16-byte aligned");

  const float scale = p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.kv.head_dim)));
  if (prefill_hopper_applies(p)) return launch_prefill_hopper(p, scale, stream);
  launch_prefill_portable(p, scale, stream);
}

}  // namespace asynct::kernels
