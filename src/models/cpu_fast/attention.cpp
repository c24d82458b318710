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
  pool.run(rows.size() * std::size_t(num_q_heads), [&](std::size_t task) {
    const std::size_t t = task / std::size_t(num_q_heads);
    const int h = int(task % std::size_t(num_q_heads)), kv_head = h / group;
    const Row row = rows[t];
    const int n = row.pos + 1;
    const float* qh = q + (std::int64_t(t) * num_q_heads + h) * d;
    float* o = out + (std::int64_t(t) * num_q_heads + h) * d;
    thread_local std::vector<float> scores;
    scores.resize(std::size_t(n));
    const std::int64_t* rows_of = key_rows[std::size_t(row.seq)].data();
    const std::int64_t head_at = std::int64_t(kv_head) * d;
    const bool fp8 = kv.key == nullptr;
    if (fp8)
      scores_fp8(qh, kv.key_fp8 + head_at, rows_of, n, d, scale * kv.key_scales[kv_head], scores.data());
    else
      scores_bf16(qh, kv.key + head_at, rows_of, n, d, scale, scores.data());
    std::fill(o, o + d, 0.0f);
    if (gate.kind == GateKind::Softmax) {
      const float max_score = *std::max_element(scores.begin(), scores.end());
      const float inv_sum = 1.0f / exp_shifted(scores.data(), n, max_score);
      for (float& s : scores) s *= inv_sum;
    } else {
      // P[j] = gamma * clamp(alpha * (S[j] - sigma * A[j]), 0, 1), A[j] the mean of max(S, 0)
      // over keys j - W + 1 .. j (none left of key 0); computed in place from the right.
      const AsyncGateParams& p = gate.async;
      const float alpha = p.alpha[std::size_t(h)], sigma = p.sigma[std::size_t(h)], gamma = p.gamma[std::size_t(h)];
      const int w = p.pool_window;
      const float inv_w = 1.0f / float(w);
      for (int j = n - 1; j >= 0; --j) {
        float pooled = 0.0f;
        for (int k = std::max(0, j - w + 1); k <= j; ++k) pooled += std::max(scores[std::size_t(k)], 0.0f);
        scores[std::size_t(j)] = gamma * std::clamp(alpha * (scores[std::size_t(j)] - sigma * pooled * inv_w), 0.0f, 1.0f);
      }
    }
    if (fp8) {
      weighted_sum_fp8(scores.data(), kv.value_fp8 + head_at, rows_of, n, d, o);
      const float value_scale = kv.value_scales[kv_head];
      for (int i = 0; i < d; ++i) o[i] *= value_scale;
    } else {
      weighted_sum_bf16(scores.data(), kv.value + head_at, rows_of, n, d, o);
    }
  });
}

}  // namespace asynct::cpu_fast
