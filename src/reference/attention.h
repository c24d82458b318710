// Reference attention (docs/DESIGN.md §2): async and softmax gates over a varlen batch, causal, GQA, K/V
// contiguous or paged. Written for clarity; accumulates in float64. Every GPU attention kernel
// is tested against these functions.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "reference/gate.h"
#include "reference/kv_cache.h"

namespace asynct {

// One attention call. Sequence s has q_len = cu_seqlens_q[s+1] - cu_seqlens_q[s] queries, which
// are the last q_len of its kv_lens[s] tokens: query row r of the sequence sits at absolute
// position (kv_len - q_len) + r and sees keys 0 .. that position.
struct AttentionBatch {
  Tensor query;                   // float32 [total_q, num_q_heads, head_dim]
  std::vector<int> cu_seqlens_q;  // [num_seqs + 1], starts at 0, ends at total_q
  std::vector<int> kv_lens;       // [num_seqs]
  const KvCache* kv = nullptr;    // holds at least kv_lens[s] tokens of each sequence
  float scale = 0.0f;             // 0 means 1/sqrt(head_dim)

  int num_seqs() const { return int(kv_lens.size()); }
  int num_q_heads() const { return int(query.size(1)); }
  int head_dim() const { return int(query.size(2)); }
  float effective_scale() const;
};

// Counts the gate saw: for the async gate, how many causal P entries were non-zero.
struct AttentionStats {
  std::int64_t gate_entries = 0;
  std::int64_t nonzero_entries = 0;
  double nonzero_fraction() const {
    return gate_entries ? double(nonzero_entries) / double(gate_entries) : 0.0;
  }
};

// O: float32 [total_q, num_q_heads, head_dim].
Tensor attention(const AttentionBatch& batch, const Gate& gate, AttentionStats* stats = nullptr);

// The contribution of the keys [begin, end) of each sequence (absolute positions, clipped to
// what each query may see), for testing split-K. For the async gate `out` is the plain partial
// sum (halo scores left of `begin` are recomputed) and `lse` is empty. For softmax `out` is
// normalised over the range and `lse` (float32 [total_q, num_q_heads], natural log) is the
// log-sum-exp of its scores; an empty range gives out = 0 and lse = -inf.
struct PartialAttention {
  Tensor out;
  Tensor lse;
};
using KeyRange = std::pair<int, int>;
PartialAttention attention_partial(const AttentionBatch& batch, const Gate& gate,
                                   const std::vector<KeyRange>& key_range_per_seq);

// Combines partials over disjoint key ranges into the full output: a plain sum for the async
// gate, the log-sum-exp merge for softmax.
PartialAttention merge_partials(const std::vector<PartialAttention>& parts, GateKind kind);

// Checks a batch and gate against each other; throws Error naming the first problem.
void validate_attention(const AttentionBatch& batch, const Gate& gate);

}  // namespace asynct
