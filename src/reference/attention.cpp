#include "reference/attention.h"

#include <cmath>
#include <limits>

namespace asynct {

float AttentionBatch::effective_scale() const {
  return scale != 0.0f ? scale : float(1.0 / std::sqrt(double(head_dim())));
}

void validate_attention(const AttentionBatch& batch, const Gate& gate) {
  expect_dtype(batch.query, DType::F32, "attention: query");
  expect_shape(batch.query, {any, any, any}, "attention: query");
  check(batch.kv != nullptr, "attention: no KV cache given");
  const KvCache& kv = *batch.kv;
  const int num_seqs = batch.num_seqs();
  const int hq = batch.num_q_heads();
  check(num_seqs >= 1, "attention: the batch has no sequences");
  check(int(batch.cu_seqlens_q.size()) == num_seqs + 1, "attention: cu_seqlens_q has ",
        batch.cu_seqlens_q.size(), " entries for ", num_seqs, " sequences (want ", num_seqs + 1,
        ")");
  check(batch.cu_seqlens_q.front() == 0, "attention: cu_seqlens_q must start at 0");
  check(batch.cu_seqlens_q.back() == batch.query.size(0), "attention: cu_seqlens_q ends at ",
        batch.cu_seqlens_q.back(), " but query has ", batch.query.size(0), " rows");
  check(num_seqs <= kv.num_seqs(), "attention: ", num_seqs, " sequences but the KV cache has ",
        kv.num_seqs());
  check(batch.head_dim() == kv.head_dim(), "attention: query head_dim ", batch.head_dim(),
        " differs from the cache's ", kv.head_dim());
  check(hq >= 1 && kv.num_kv_heads() >= 1 && hq % kv.num_kv_heads() == 0,
        "attention: ", hq, " query heads are not a multiple of ", kv.num_kv_heads(), " KV heads");
  for (int s = 0; s < num_seqs; ++s) {
    int q_len = batch.cu_seqlens_q[std::size_t(s) + 1] - batch.cu_seqlens_q[std::size_t(s)];
    int kv_len = batch.kv_lens[std::size_t(s)];
    check(q_len >= 0, "attention: cu_seqlens_q decreases at sequence ", s);
    check(q_len <= kv_len, "attention: sequence ", s, " has q_len ", q_len, " > kv_len ", kv_len);
    check(kv_len <= kv.capacity(s), "attention: sequence ", s, " has kv_len ", kv_len,
          " but the cache holds ", kv.capacity(s));
  }
  float scale = batch.effective_scale();
  check(std::isfinite(scale), "attention: scale is not finite");
  if (gate.kind == GateKind::Async) {
    const AsyncGateParams& p = gate.async;
    check(p.pool_window >= 1, "attention: pool window must be >= 1, got ", p.pool_window);
    check(int(p.alpha.size()) == hq && int(p.sigma.size()) == hq && int(p.gamma.size()) == hq,
          "attention: async gate needs alpha, sigma and gamma for each of the ", hq,
          " query heads");
    for (int h = 0; h < hq; ++h)
      check(std::isfinite(p.alpha[std::size_t(h)]) && std::isfinite(p.sigma[std::size_t(h)]) &&
                std::isfinite(p.gamma[std::size_t(h)]),
            "attention: async gate parameters of head ", h, " are not finite");
  } else {
    check(gate.softmax.softcap >= 0 && std::isfinite(gate.softmax.softcap),
          "attention: softcap must be finite and >= 0");
  }
}

namespace {

// Scores of one query row against keys first..last-1 (absolute positions).
std::vector<double> row_scores(const float* q, const KvCache& kv, int seq, int kv_head,
                               int first, int last, double scale) {
  std::vector<double> scores;
  for (int j = first; j < last; ++j) {
    const float* k = kv.key(seq, j, kv_head);
    double dot = 0.0;
    for (int d = 0; d < kv.head_dim(); ++d) dot += double(q[d]) * double(k[d]);
    scores.push_back(scale * dot);
  }
  return scores;
}

// out[d] += weight * v_j[d]
void accumulate(std::vector<double>& out, double weight, const float* v) {
  for (std::size_t d = 0; d < out.size(); ++d) out[d] += weight * double(v[d]);
}

// The async gate's output over keys [begin, end) for the query at `pos`, where end <= pos + 1.
std::vector<double> async_row(const float* q, const KvCache& kv, int seq, int kv_head, int head,
                              int begin, int end, double scale, const AsyncGateParams& p,
                              AttentionStats* stats) {
  std::vector<double> out(std::size_t(kv.head_dim()), 0.0);
  if (begin >= end) return out;
  // The pool of key `begin` looks back W-1 keys: score those too (the halo).
  int first_scored = std::max(0, begin - (p.pool_window - 1));
  std::vector<double> scores = row_scores(q, kv, seq, kv_head, first_scored, end, scale);
  for (int j = begin; j < end; ++j) {
    double s = scores[std::size_t(j - first_scored)];
    double a = async_pooled_relu(scores, first_scored, j, p.pool_window);
    double weight = async_gate_value(s, a, p.alpha[std::size_t(head)], p.sigma[std::size_t(head)],
                                     p.gamma[std::size_t(head)]);
    if (stats) {
      ++stats->gate_entries;
      if (weight != 0.0) ++stats->nonzero_entries;
    }
    if (weight != 0.0) accumulate(out, weight, kv.value(seq, j, kv_head));
  }
  return out;
}

// Softmax over keys [begin, end): the normalised output and the log-sum-exp of the scores.
std::vector<double> softmax_row(const float* q, const KvCache& kv, int seq, int kv_head,
                                int begin, int end, double scale, double softcap, double* lse) {
  std::vector<double> out(std::size_t(kv.head_dim()), 0.0);
  if (begin >= end) {
    *lse = -std::numeric_limits<double>::infinity();
    return out;
  }
  std::vector<double> scores = row_scores(q, kv, seq, kv_head, begin, end, scale);
  for (double& s : scores) s = softcapped(s, softcap);
  double max_score = -std::numeric_limits<double>::infinity();
  for (double s : scores) max_score = std::max(max_score, s);
  double sum = 0.0;
  for (int j = begin; j < end; ++j) {
    double e = std::exp(scores[std::size_t(j - begin)] - max_score);
    sum += e;
    accumulate(out, e, kv.value(seq, j, kv_head));
  }
  for (double& o : out) o /= sum;
  *lse = max_score + std::log(sum);
  return out;
}

PartialAttention run(const AttentionBatch& batch, const Gate& gate,
                     const std::vector<KeyRange>& ranges, AttentionStats* stats) {
  validate_attention(batch, gate);
  const KvCache& kv = *batch.kv;
  const int hq = batch.num_q_heads(), dim = batch.head_dim();
  const int group = hq / kv.num_kv_heads();
  const double scale = batch.effective_scale();
  const std::int64_t total_q = batch.query.size(0);

  PartialAttention result;
  result.out = Tensor::empty(DType::F32, {total_q, hq, dim});
  if (gate.kind == GateKind::Softmax) result.lse = Tensor::empty(DType::F32, {total_q, hq});
  const float* query = batch.query.data_as<float>();
  float* out = result.out.data_as<float>();

  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int q_begin = batch.cu_seqlens_q[std::size_t(s)];
    const int q_len = batch.cu_seqlens_q[std::size_t(s) + 1] - q_begin;
    const int kv_len = batch.kv_lens[std::size_t(s)];
    const int prefix = kv_len - q_len;
    for (int r = 0; r < q_len; ++r) {
      const int pos = prefix + r;  // absolute position; sees keys 0..pos
      const int begin = std::max(0, ranges[std::size_t(s)].first);
      const int end = std::min(pos + 1, ranges[std::size_t(s)].second);
      const std::int64_t row = q_begin + r;
      for (int h = 0; h < hq; ++h) {
        const float* q = query + (row * hq + h) * dim;
        const int kv_head = h / group;
        std::vector<double> o;
        if (gate.kind == GateKind::Async) {
          o = async_row(q, kv, s, kv_head, h, begin, end, scale, gate.async, stats);
        } else {
          double lse;
          o = softmax_row(q, kv, s, kv_head, begin, end, scale, gate.softmax.softcap, &lse);
          result.lse.data_as<float>()[row * hq + h] = float(lse);
        }
        for (int d = 0; d < dim; ++d) out[(row * hq + h) * dim + d] = float(o[std::size_t(d)]);
      }
    }
  }
  return result;
}

}  // namespace

Tensor attention(const AttentionBatch& batch, const Gate& gate, AttentionStats* stats) {
  std::vector<KeyRange> everything(std::size_t(batch.num_seqs()),
                                   {0, std::numeric_limits<int>::max()});
  return run(batch, gate, everything, stats).out;
}

PartialAttention attention_partial(const AttentionBatch& batch, const Gate& gate,
                                   const std::vector<KeyRange>& key_range_per_seq) {
  check(int(key_range_per_seq.size()) == batch.num_seqs(), "attention_partial: ",
        key_range_per_seq.size(), " key ranges for ", batch.num_seqs(), " sequences");
  return run(batch, gate, key_range_per_seq, nullptr);
}

PartialAttention merge_partials(const std::vector<PartialAttention>& parts, GateKind kind) {
  check(!parts.empty(), "merge_partials: nothing to merge");
  const Shape& shape = parts.front().out.shape();
  for (const PartialAttention& p : parts) {
    expect_shape(p.out, shape, "merge_partials: out");
    if (kind == GateKind::Softmax) expect_shape(p.lse, {shape[0], shape[1]}, "merge_partials: lse");
  }
  PartialAttention merged;
  merged.out = Tensor::empty(DType::F32, shape);
  float* out = merged.out.data_as<float>();
  const std::int64_t rows = shape[0] * shape[1], dim = shape[2];
  if (kind == GateKind::Async) {  // additivity: the partials simply add up
    for (const PartialAttention& p : parts)
      for (std::int64_t i = 0; i < rows * dim; ++i) out[i] += p.out.data_as<float>()[i];
    return merged;
  }
  merged.lse = Tensor::empty(DType::F32, {shape[0], shape[1]});
  for (std::int64_t r = 0; r < rows; ++r) {
    double max_lse = -std::numeric_limits<double>::infinity();
    for (const PartialAttention& p : parts) max_lse = std::max(max_lse, double(p.lse.data_as<float>()[r]));
    if (std::isinf(max_lse)) {  // no part saw a key: output 0, lse -inf
      merged.lse.data_as<float>()[r] = float(max_lse);
      continue;
    }
    double total = 0.0;
    for (const PartialAttention& p : parts) total += std::exp(double(p.lse.data_as<float>()[r]) - max_lse);
    const double lse = max_lse + std::log(total);
    merged.lse.data_as<float>()[r] = float(lse);
    for (const PartialAttention& p : parts) {
      const double w = std::exp(double(p.lse.data_as<float>()[r]) - lse);
      for (std::int64_t d = 0; d < dim; ++d) out[r * dim + d] += float(w * p.out.data_as<float>()[r * dim + d]);
    }
  }
  return merged;
}

}  // namespace asynct
