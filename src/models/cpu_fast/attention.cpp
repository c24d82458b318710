#include "models/cpu_fast/attention.h"

#include <algorithm>
#include <vector>

#include "models/cpu_fast/kernels.h"

namespace asynct::cpu_fast {

namespace {

struct Row {
  int seq, pos;  // the sequence and the query's absolute position: it sees keys 0 .. pos
};


}  // namespace

void paged_attention(ThreadPool& pool, const float* q, int num_q_heads, const StepBatch& batch, const PagedKv& kv,
                     const Gate& gate, float scale, float* out) {
  std::vector<Row> rows(std::size_t(batch.num_tokens()));
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int begin = batch.cu_seqlens_q[std::size_t(s)], end = batch.cu_seqlens_q[std::size_t(s) + 1];
    const int prefix = batch.kv_lens[std::size_t(s)] - (end - begin);
    for (int r = begin; r < end; ++r) rows[std::size_t(r)] = {s, prefix + (r - begin)};
  }
  const int d = kv.head_dim, group = num_q_heads / kv.num_kv_heads;
  // Each sequence's key positions as offsets of their rows in the cache (KV head 0), once.
  std::vector<std::vector<std::int64_t>> key_rows(std::size_t(batch.num_seqs()));
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const std::vector<int>& table = batch.block_tables[std::size_t(s)];
    std::vector<std::int64_t>& rows_of = key_rows[std::size_t(s)];
    rows_of.resize(std::size_t(batch.kv_lens[std::size_t(s)]));
    for (std::size_t j = 0; j < rows_of.size(); ++j)
      rows_of[j] = (std::int64_t(table[j / std::size_t(kv.block_size)]) * kv.block_size +
                    std::int64_t(j % std::size_t(kv.block_size))) * kv.num_kv_heads * d;
  }
  // A task is a pack of a KV head's query heads for one row: each key and value row is read once
  // for the pack. Packs are made smaller while the tasks would not give every thread two.
  const std::size_t row_kv_heads = rows.size() * std::size_t(kv.num_kv_heads);
  int pack = std::min(group, kMaxHeadPack);
  while (pack > 1 && row_kv_heads * std::size_t((group + pack - 1) / pack) < 2 * std::size_t(pool.size())) --pack;
  const int packs = (group + pack - 1) / pack;
  pool.run(row_kv_heads * std::size_t(packs), [&](std::size_t task) {
    const std::size_t t = task / (std::size_t(kv.num_kv_heads) * std::size_t(packs));
    const int kv_head = int(task / std::size_t(packs) % std::size_t(kv.num_kv_heads));
    const int first = kv_head * group + int(task % std::size_t(packs)) * pack;  // the pack's first query head
    const int heads = std::min(pack, (kv_head + 1) * group - first);
    const Row row = rows[t];
    const int n = row.pos + 1;
    const float* qh = q + (std::int64_t(t) * num_q_heads + first) * d;
    float* o = out + (std::int64_t(t) * num_q_heads + first) * d;
    thread_local std::vector<float> scores;  // [heads][n]
    scores.resize(std::size_t(heads) * std::size_t(n));
    const std::int64_t* rows_of = key_rows[std::size_t(row.seq)].data();
    const std::int64_t head_at = std::int64_t(kv_head) * d;
    const bool fp8 = kv.key == nullptr;
    if (fp8)
      scores_fp8(qh, heads, kv.key_fp8 + head_at, rows_of, n, d, scale * kv.key_scales[kv_head], scores.data());
    else
      scores_bf16(qh, heads, kv.key + head_at, rows_of, n, d, scale, scores.data());
    std::fill(o, o + std::int64_t(heads) * d, 0.0f);
    for (int i = 0; i < heads; ++i) {
      float* s = scores.data() + std::size_t(i) * std::size_t(n);
      if (gate.kind == GateKind::Softmax) {
        const float max_score = *std::max_element(s, s + n);
        const float inv_sum = 1.0f / exp_shifted(s, n, max_score);
        for (int j = 0; j < n; ++j) s[j] *= inv_sum;
      } else {
        // P[j] = gamma * clamp(alpha * (S[j] - sigma * A[j]), 0, 1), A[j] the mean of max(S, 0)
        // over keys j - W + 1 .. j (none left of key 0); computed in place from the right.
        const AsyncGateParams& p = gate.async;
        const std::size_t h = std::size_t(first + i);
        const float alpha = p.alpha[h], sigma = p.sigma[h], gamma = p.gamma[h];
        const int w = p.pool_window;
        const float inv_w = 1.0f / float(w);
        for (int j = n - 1; j >= 0; --j) {
          float pooled = 0.0f;
          for (int k = std::max(0, j - w + 1); k <= j; ++k) pooled += std::max(s[k], 0.0f);
          s[j] = gamma * std::clamp(alpha * (s[j] - sigma * pooled * inv_w), 0.0f, 1.0f);
        }
      }
    }
    if (fp8) {
      weighted_sum_fp8(scores.data(), heads, kv.value_fp8 + head_at, rows_of, n, d, o);
      const float value_scale = kv.value_scales[kv_head];
      for (int i = 0; i < heads * d; ++i) o[i] *= value_scale;
    } else {
      weighted_sum_bf16(scores.data(), heads, kv.value + head_at, rows_of, n, d, o);
    }
  });
}

}  // namespace asynct::cpu_fast
