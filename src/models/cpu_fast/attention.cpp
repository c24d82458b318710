#include "models/cpu_fast/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  // A task is a pack of a KV head's query heads for one row and one chunk of its keys: each key
  // and value row is read once for the pack. In a step of up to kBatchInvariantRows rows (decode,
  // draft verification) a row's keys come in chunks of kKeyChunk, so that a long row spreads
  // over the threads; a row of one chunk (and every row of a larger step) is computed whole in
  // its task, as a row of several chunks is combined after them. Either way a row's sums depend
  // on the row alone within the steps kernels.h promises that for (the packs do not change
  // them). Packs are made smaller while the tasks would not give every thread two.
  const int chunk_keys = rows.size() <= std::size_t(kBatchInvariantRows) ? kKeyChunk : std::numeric_limits<int>::max();
  std::vector<int> first_task(rows.size() + 1, 0);  // chunks of rows before
  for (std::size_t t = 0; t < rows.size(); ++t) first_task[t + 1] = first_task[t] + rows[t].pos / chunk_keys + 1;
  const std::size_t chunks = std::size_t(first_task.back()) * std::size_t(kv.num_kv_heads);
  int pack = std::min(group, kMaxHeadPack);
  while (pack > 1 && chunks * std::size_t((group + pack - 1) / pack) < 2 * std::size_t(pool.size())) --pack;
  const int packs = (group + pack - 1) / pack;
  // A chunk task's part (rows of several chunks): its pack's weighted sums [pack][d], and
  // (softmax) its scores' largest value and the sum of their exponentials [pack].
  const std::size_t tasks = chunks * std::size_t(packs);
  const bool parts = std::size_t(first_task.back()) > rows.size();
  std::vector<float> part_out(parts ? tasks * std::size_t(pack) * std::size_t(d) : 0),
      part_max(parts ? tasks * std::size_t(pack) : 0), part_sum(parts ? tasks * std::size_t(pack) : 0);
  // Task index: ((row's first chunk + chunk) * KV heads + KV head) * packs + pack.
  std::vector<int> row_of_chunk(std::size_t(first_task.back()));
  for (std::size_t t = 0; t < rows.size(); ++t)
    for (int c = first_task[t]; c < first_task[t + 1]; ++c) row_of_chunk[std::size_t(c)] = int(t);
  const bool softmax = gate.kind == GateKind::Softmax;
  const int halo = softmax ? 0 : gate.async.pool_window - 1;  // earlier keys a chunk's pooled scores need
  pool.run(tasks, [&](std::size_t task) {
    const int chunk_index = int(task / (std::size_t(kv.num_kv_heads) * std::size_t(packs)));
    const int kv_head = int(task / std::size_t(packs) % std::size_t(kv.num_kv_heads));
    const std::size_t t = std::size_t(row_of_chunk[std::size_t(chunk_index)]);
    const int first = kv_head * group + int(task % std::size_t(packs)) * pack;  // the pack's first query head
    const int heads = std::min(pack, (kv_head + 1) * group - first);
    const Row row = rows[t];
    const bool whole = first_task[t + 1] - first_task[t] == 1;  // the row in this one task
    const int k0 = whole ? 0 : (chunk_index - first_task[t]) * kKeyChunk;
    const int k1 = whole ? row.pos + 1 : std::min(row.pos + 1, k0 + kKeyChunk);
    const int from = std::max(0, k0 - halo), n = k1 - from, lead = k0 - from;  // scores from `from`
    const float* qh = q + (std::int64_t(t) * num_q_heads + first) * d;
    float* o = whole ? out + (std::int64_t(t) * num_q_heads + first) * d
                     : part_out.data() + task * std::size_t(pack) * std::size_t(d);
    thread_local std::vector<float> scores;  // [heads][n]
    scores.resize(std::size_t(heads) * std::size_t(n));
    const std::int64_t* rows_of = key_rows[std::size_t(row.seq)].data();
    const std::int64_t head_at = std::int64_t(kv_head) * d;
    const bool fp8 = kv.key == nullptr;
    if (fp8)
      scores_fp8(qh, heads, kv.key_fp8 + head_at, rows_of + from, n, d, scale * kv.key_scales[kv_head], scores.data());
    else
      scores_bf16(qh, heads, kv.key + head_at, rows_of + from, n, d, scale, scores.data());
    std::fill(o, o + std::int64_t(heads) * d, 0.0f);
    for (int i = 0; i < heads; ++i) {
      float* s = scores.data() + std::size_t(i) * std::size_t(n);
      if (softmax) {
        const float max_score = *std::max_element(s, s + n);
        const float sum = exp_shifted(s, n, max_score);
        if (whole) {
          const float inv_sum = 1.0f / sum;
          for (int j = 0; j < n; ++j) s[j] *= inv_sum;
        } else {
          part_max[task * std::size_t(pack) + std::size_t(i)] = max_score;
          part_sum[task * std::size_t(pack) + std::size_t(i)] = sum;
        }
      } else {
        // P[j] = gamma * clamp(alpha * (S[j] - sigma * A[j]), 0, 1), A[j] the mean of max(S, 0)
        // over keys j - W + 1 .. j (none left of key 0); computed in place from the right, for
        // the chunk's own keys (the `lead` halo keys before them only pool).
        const AsyncGateParams& p = gate.async;
        const std::size_t h = std::size_t(first + i);
        const float alpha = p.alpha[h], sigma = p.sigma[h], gamma = p.gamma[h];
        const int w = p.pool_window;
        const float inv_w = 1.0f / float(w);
        for (int j = n - 1; j >= lead; --j) {
          float pooled = 0.0f;
          for (int k = std::max(0, j - w + 1); k <= j; ++k) pooled += std::max(s[k], 0.0f);
          s[j] = gamma * std::clamp(alpha * (s[j] - sigma * pooled * inv_w), 0.0f, 1.0f);
        }
      }
      // The chunk's own keys' P, packed to the front: head i's at [i * (n - lead), ...).
      if (lead > 0) std::copy(s + lead, s + n, scores.data() + std::size_t(i) * std::size_t(n - lead));
    }
    if (fp8)
      weighted_sum_fp8(scores.data(), heads, kv.value_fp8 + head_at, rows_of + k0, k1 - k0, d, o);
    else
      weighted_sum_bf16(scores.data(), heads, kv.value + head_at, rows_of + k0, k1 - k0, d, o);
    if (whole && fp8)
      for (int i = 0; i < heads * d; ++i) o[i] *= kv.value_scales[kv_head];
  });
  if (!parts) return;
  // Each row's chunks combined in order: softmax rescales each to the row's largest score and
  // divides by the total; the async gate's sums add. Then an e4m3 cache's value scale. Rows in
  // parallel (a prompt's).
  pool.run(rows.size(), [&](std::size_t t) {
    if (first_task[t + 1] - first_task[t] == 1) return;  // computed whole
    for (int kv_head = 0; kv_head < kv.num_kv_heads; ++kv_head)
      for (int pk = 0; pk < packs; ++pk) {
        const int first = kv_head * group + pk * pack, heads = std::min(pack, (kv_head + 1) * group - first);
        const auto task_of = [&](int c) {
          return (std::size_t(c) * std::size_t(kv.num_kv_heads) + std::size_t(kv_head)) * std::size_t(packs) + std::size_t(pk);
        };
        for (int i = 0; i < heads; ++i) {
          float* o = out + (std::int64_t(t) * num_q_heads + first + i) * d;
          std::fill(o, o + d, 0.0f);
          float largest = -std::numeric_limits<float>::infinity(), total = 0.0f;
          if (softmax)
            for (int c = first_task[t]; c < first_task[t + 1]; ++c)
              largest = std::max(largest, part_max[task_of(c) * std::size_t(pack) + std::size_t(i)]);
          for (int c = first_task[t]; c < first_task[t + 1]; ++c) {
            const std::size_t part = task_of(c) * std::size_t(pack) + std::size_t(i);
            const float weight = softmax ? std::exp(part_max[part] - largest) : 1.0f;
            if (softmax) total += weight * part_sum[part];
            const float* po = part_out.data() + part * std::size_t(d);
            for (int e = 0; e < d; ++e) o[e] += weight * po[e];
          }
          const float factor = (softmax ? 1.0f / total : 1.0f) * (kv.key == nullptr ? kv.value_scales[kv_head] : 1.0f);
          for (int e = 0; e < d; ++e) o[e] *= factor;
        }
      }
  });
}

}  // namespace asynct::cpu_fast
