#include "jobs/attention_demo.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <random>

#include "reference/attention.h"

namespace asynct {
namespace {

struct Sequence {
  const char* role;
  int q_len;
  int kv_len;
};

// Three sequences as a serving step would have them: a fresh prefill, a prefill chunk after a
// cached prefix, and a decode step.
const Sequence kSequences[] = {{"prefill", 45, 45}, {"chunked prefill", 20, 97}, {"decode", 1, 130}};

double frobenius(const Tensor& t) {
  double sum = 0;
  for (float v : t.to_float_vector()) sum += double(v) * v;
  return std::sqrt(sum);
}

double relative_difference(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    norm += double(y[i]) * y[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace

int run_attention_demo(const DemoOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal;
  auto random_tensor = [&](Shape shape) {
    Tensor t = Tensor::empty(DType::F32, std::move(shape));
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
    return t;
  };

  // Queries, and each sequence's K/V laid out in a paged cache block by block.
  std::vector<int> cu_seqlens_q = {0}, kv_lens;
  int max_blocks = 0, total_blocks = 0;
  for (const Sequence& s : kSequences) {
    cu_seqlens_q.push_back(cu_seqlens_q.back() + s.q_len);
    kv_lens.push_back(s.kv_len);
    int blocks = (s.kv_len + o.block_size - 1) / o.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  const int num_seqs = int(kv_lens.size());
  Tensor query = random_tensor({cu_seqlens_q.back(), o.num_q_heads, o.head_dim});
  Tensor key_cache = random_tensor({total_blocks, o.block_size, o.num_kv_heads, o.head_dim});
  Tensor value_cache = random_tensor({total_blocks, o.block_size, o.num_kv_heads, o.head_dim});
  Tensor block_table = Tensor::empty(DType::I32, {num_seqs, max_blocks});
  std::vector<int> physical(static_cast<std::size_t>(total_blocks));
  for (int b = 0; b < total_blocks; ++b) physical[std::size_t(b)] = b;
  std::shuffle(physical.begin(), physical.end(), rng);  // blocks anywhere in the cache
  for (int s = 0, next = 0; s < num_seqs; ++s)
    for (int b = 0; b < max_blocks; ++b)
      block_table.data_as<std::int32_t>()[s * max_blocks + b] =
          b * o.block_size < kv_lens[std::size_t(s)] ? physical[std::size_t(next++)] : 0;
  KvCache cache = KvCache::paged(key_cache, value_cache, block_table);
  AttentionBatch batch{query, cu_seqlens_q, kv_lens, &cache, 0.0f};

  std::printf("asynct reference attention demo (seed %llu)\n",
              static_cast<unsigned long long>(o.seed));
  std::printf("  heads %d query / %d kv, head_dim %d, paged cache of %d blocks x %d tokens\n",
              o.num_q_heads, o.num_kv_heads, o.head_dim, total_blocks, o.block_size);
  std::printf("  %-16s %6s %7s %7s\n", "sequence", "q_len", "kv_len", "prefix");
  for (const Sequence& s : kSequences)
    std::printf("  %-16s %6d %7d %7d\n", s.role, s.q_len, s.kv_len, s.kv_len - s.q_len);

  Gate async_gate = Gate::make_async(o.num_q_heads, o.pool_window);
  Gate softmax_gate = Gate::make_softmax();
  AttentionStats stats;
  auto t0 = std::chrono::steady_clock::now();
  Tensor async_out = attention(batch, async_gate, &stats);
  auto t1 = std::chrono::steady_clock::now();
  Tensor softmax_out = attention(batch, softmax_gate);
  auto t2 = std::chrono::steady_clock::now();

  // Additivity: cut each sequence's keys in half and add the two partial outputs.
  std::vector<KeyRange> left, right;
  for (int kv_len : kv_lens) {
    left.push_back({0, kv_len / 2});
    right.push_back({kv_len / 2, kv_len});
  }
  PartialAttention async_sum = merge_partials(
      {attention_partial(batch, async_gate, left), attention_partial(batch, async_gate, right)},
      GateKind::Async);
  PartialAttention softmax_merge = merge_partials(
      {attention_partial(batch, softmax_gate, left), attention_partial(batch, softmax_gate, right)},
      GateKind::Softmax);

  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("\n  %-8s %12s %10s %22s\n", "gate", "||O||", "time", "split-K merge error");
  std::printf("  %-8s %12.4f %8.1f ms %22.2e   (plain sum of partials)\n", "async",
              frobenius(async_out), ms(t0, t1), relative_difference(async_sum.out, async_out));
  std::printf("  %-8s %12.4f %8.1f ms %22.2e   (log-sum-exp merge)\n", "softmax",
              frobenius(softmax_out), ms(t1, t2), relative_difference(softmax_merge.out, softmax_out));
  std::printf("\n  async gate W=%d: %.1f%% of the %lld causal P entries are non-zero "
              "(a decode kernel skips the V rows of the rest)\n",
              o.pool_window, 100.0 * stats.nonzero_fraction(),
              static_cast<long long>(stats.gate_entries));
  return 0;
}

}  // namespace asynct
