// Properties of the reference attention that the GPU kernels rely on: additivity of async
// partials, the softmax LSE merge, paged == contiguous, chunked prefill == one pass,
// decode == last row, GQA == repeated K/V, and clear errors for bad batches.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "reference/attention.h"
#include "reference/rope.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::AttentionCase;
using testing::close_to;
using testing::expect_error;
using testing::Random;
using testing::random_async_gate;

// Awkward lengths: odd, crossing 16- and 256-token blocks, a decode (q_len 1), a prefix.
const std::vector<testing::SequenceLengths> kMixedBatch = {
    {37, 37}, {1, 300}, {5, 17}, {64, 129}, {0, 3}};

std::vector<Gate> gates_under_test(Random& rng, int hq) {
  return {random_async_gate(rng, hq, 3), random_async_gate(rng, hq, 1),
          random_async_gate(rng, hq, 2), Gate::make_softmax(), Gate::make_softmax(5.0f)};
}

TEST(Attention, AsyncPartialsAddUpOverRandomSplits) {
  Random rng(1);
  AttentionCase c(rng, kMixedBatch, 4, 2, 16);
  for (int window : {1, 2, 3, 5}) {
    Gate gate = random_async_gate(rng, 4, window);
    Tensor full = attention(c.batch(), gate);
    for (int trial = 0; trial < 4; ++trial) {
      // Cut every sequence's keys at two random points: three partials.
      std::vector<PartialAttention> parts(3);
      std::vector<std::vector<KeyRange>> ranges(3);
      for (const auto& s : c.seqs) {
        int a = rng.integer(0, s.kv_len), b = rng.integer(0, s.kv_len);
        if (a > b) std::swap(a, b);
        ranges[0].push_back({0, a});
        ranges[1].push_back({a, b});
        ranges[2].push_back({b, s.kv_len});
      }
      for (int p = 0; p < 3; ++p) parts[std::size_t(p)] = attention_partial(c.batch(), gate, ranges[std::size_t(p)]);
      PartialAttention merged = merge_partials(parts, GateKind::Async);
      EXPECT_TRUE(close_to(merged.out, full, 1e-6)) << "window " << window;
      EXPECT_FALSE(merged.lse.defined() && merged.lse.numel() > 0);
    }
  }
}

TEST(Attention, SoftmaxPartialsMergeByLogSumExp) {
  Random rng(2);
  AttentionCase c(rng, kMixedBatch, 4, 4, 16);
  for (float softcap : {0.0f, 3.0f}) {
    Gate gate = Gate::make_softmax(softcap);
    Tensor full = attention(c.batch(), gate);
    std::vector<KeyRange> left, right;
    for (const auto& s : c.seqs) {
      int cut = rng.integer(0, s.kv_len);
      left.push_back({0, cut});
      right.push_back({cut, s.kv_len});
    }
    PartialAttention merged = merge_partials(
        {attention_partial(c.batch(), gate, left), attention_partial(c.batch(), gate, right)},
        GateKind::Softmax);
    EXPECT_TRUE(close_to(merged.out, full, 1e-6));
    // The merged LSE equals the LSE of the whole range.
    std::vector<KeyRange> all;
    for (const auto& s : c.seqs) all.push_back({0, s.kv_len});
    PartialAttention whole = attention_partial(c.batch(), gate, all);
    EXPECT_TRUE(close_to(merged.lse, whole.lse, 1e-6));
  }
}

TEST(Attention, SoftmaxMatchesItsFormulaOnOneRow) {
  Random rng(3);
  AttentionCase c(rng, {{1, 6}}, 1, 1, 8);
  Tensor o = attention(c.batch(), Gate::make_softmax());
  const float* q = c.query.data_as<float>();
  std::vector<double> w(6);
  double total = 0.0;
  for (int j = 0; j < 6; ++j) {
    double dot = 0.0;
    for (int d = 0; d < 8; ++d) dot += double(q[d]) * c.key.data_as<float>()[j * 8 + d];
    w[std::size_t(j)] = std::exp(dot / std::sqrt(8.0));
    total += w[std::size_t(j)];
  }
  for (int d = 0; d < 8; ++d) {
    double expected = 0.0;
    for (int j = 0; j < 6; ++j) expected += w[std::size_t(j)] / total * c.value.data_as<float>()[j * 8 + d];
    EXPECT_NEAR(o.data_as<float>()[d], expected, 1e-5);
  }
}

TEST(Attention, PagedEqualsContiguousForEveryBlockSize) {
  Random rng(4);
  AttentionCase c(rng, kMixedBatch, 6, 2, 8);
  for (const Gate& gate : gates_under_test(rng, 6)) {
    Tensor expected = attention(c.batch(), gate);
    for (int block_size : {16, 32, 64, 128, 256}) {
      auto paged = c.paged(rng, block_size);
      EXPECT_TRUE(close_to(attention(c.batch(paged.cache), gate), expected, 1e-6))
          << "block_size " << block_size;
    }
  }
}

TEST(Attention, ChunkedPrefillOverAGrowingCacheEqualsOnePass) {
  Random rng(5);
  const int n = 300, hq = 4, hkv = 2, dim = 16, block_size = 16;
  AttentionCase c(rng, {{n, n}}, hq, hkv, dim);
  for (const Gate& gate : gates_under_test(rng, hq)) {
    const std::vector<float> full = attention(c.batch(), gate).to_float_vector();
    // An empty paged cache (filled with garbage) that the chunks write into as they go.
    const int blocks = (n + block_size - 1) / block_size + 2;
    Tensor key_cache = rng.normal({blocks, block_size, hkv, dim});
    Tensor value_cache = rng.normal({blocks, block_size, hkv, dim});
    std::vector<int> physical = rng.permutation(blocks);
    Tensor table = Tensor::empty(DType::I32, {1, blocks});
    for (int b = 0; b < blocks; ++b) table.data_as<std::int32_t>()[b] = physical[std::size_t(b)];
    KvCache cache = KvCache::paged(key_cache, value_cache, table);

    const std::int64_t row = std::int64_t(hq) * dim, kv_row = std::int64_t(hkv) * dim;
    int start = 0;
    for (int chunk : {1, 15, 17, 100, 167}) {  // crosses block boundaries, sums to 300
      Tensor k = Tensor::empty(DType::F32, {chunk, hkv, dim});
      Tensor v = Tensor::empty(DType::F32, {chunk, hkv, dim});
      std::copy_n(c.key.data_as<float>() + start * kv_row, chunk * kv_row, k.data_as<float>());
      std::copy_n(c.value.data_as<float>() + start * kv_row, chunk * kv_row, v.data_as<float>());
      std::vector<std::int64_t> slots;
      for (int t = start; t < start + chunk; ++t)
        slots.push_back(std::int64_t(physical[std::size_t(t / block_size)]) * block_size + t % block_size);
      write_kv_cache(key_cache, value_cache, k, v, slots);

      Tensor q = Tensor::empty(DType::F32, {chunk, hq, dim});
      std::copy_n(c.query.data_as<float>() + start * row, chunk * row, q.data_as<float>());
      AttentionBatch batch{q, {0, chunk}, {start + chunk}, &cache, 0.0f};
      Tensor out = attention(batch, gate);
      std::vector<float> expected(full.begin() + start * row, full.begin() + (start + chunk) * row);
      EXPECT_TRUE(close_to(out.to_float_vector(), expected, 1e-6)) << "chunk at " << start;
      start += chunk;
    }
    ASSERT_EQ(start, n);
  }
}

TEST(Attention, DecodeStepEqualsLastRowOfFullPass) {
  Random rng(6);
  const int n = 129, hq = 4, dim = 16;
  AttentionCase c(rng, {{n, n}}, hq, 2, dim);
  for (const Gate& gate : gates_under_test(rng, hq)) {
    const std::vector<float> full = attention(c.batch(), gate).to_float_vector();
    AttentionBatch decode = c.batch();
    decode.query = Tensor::empty(DType::F32, {1, hq, dim});
    std::copy_n(c.query.data_as<float>() + (n - 1) * hq * dim, hq * dim, decode.query.data_as<float>());
    decode.cu_seqlens_q = {0, 1};
    std::vector<float> last(full.end() - hq * dim, full.end());
    EXPECT_TRUE(close_to(attention(decode, gate).to_float_vector(), last, 1e-6));
  }
}

TEST(Attention, GroupedQueryEqualsRepeatedKeysAndValues) {
  Random rng(7);
  const int hq = 8, hkv = 2, dim = 8;
  AttentionCase c(rng, {{20, 33}, {7, 7}}, hq, hkv, dim);
  // The same K/V with each KV head repeated for the hq/hkv query heads that use it.
  const std::int64_t tokens = c.key.size(0);
  Tensor k = Tensor::empty(DType::F32, {tokens, hq, dim});
  Tensor v = Tensor::empty(DType::F32, {tokens, hq, dim});
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < hq; ++h) {
      const int src = h / (hq / hkv);
      std::copy_n(c.key.data_as<float>() + (t * hkv + src) * dim, dim, k.data_as<float>() + (t * hq + h) * dim);
      std::copy_n(c.value.data_as<float>() + (t * hkv + src) * dim, dim, v.data_as<float>() + (t * hq + h) * dim);
    }
  KvCache repeated = KvCache::contiguous(k, v, c.cu_seqlens_k);
  for (const Gate& gate : gates_under_test(rng, hq))
    EXPECT_TRUE(close_to(attention(c.batch(repeated), gate), attention(c.batch(), gate), 1e-7));
}

TEST(Attention, AsyncGateZeroesAboutTwoThirdsOnRandomData) {
  // docs/DESIGN.md §2: on unit-variance scores with alpha = sigma = gamma = 1, about 64% of P is zero.
  Random rng(8);
  AttentionCase c(rng, {{64, 256}}, 2, 2, 128);
  AttentionStats stats;
  attention(c.batch(), Gate::make_async(2, 3), &stats);
  EXPECT_GT(stats.gate_entries, 0);
  EXPECT_NEAR(stats.nonzero_fraction(), 0.36, 0.05);
}

TEST(Attention, ScaleDefaultsToInverseSqrtHeadDim) {
  Random rng(9);
  AttentionCase c(rng, {{9, 9}}, 2, 1, 16);
  AttentionBatch explicit_scale = c.batch();
  explicit_scale.scale = 0.25f;
  Gate gate = Gate::make_async(2, 3);
  EXPECT_TRUE(close_to(attention(c.batch(), gate), attention(explicit_scale, gate), 1e-7));
  explicit_scale.scale = 0.5f;
  EXPECT_FALSE(close_to(attention(c.batch(), gate), attention(explicit_scale, gate), 1e-3));
}

// Bad batches: each gives an Error whose message names the problem.
TEST(Attention, BadBatchesGiveClearErrors) {
  Random rng(10);
  AttentionCase c(rng, {{4, 6}, {3, 3}}, 4, 2, 8);
  Gate gate = Gate::make_async(4, 3);

  AttentionBatch b = c.batch();
  b.kv_lens[1] = 2;  // q_len 3 > kv_len 2
  expect_error([&] { attention(b, gate); }, "q_len 3 > kv_len 2");

  b = c.batch();
  b.kv_lens[0] = 7;  // more than the 6 rows the sequence owns
  expect_error([&] { attention(b, gate); }, "cache holds 6");

  b = c.batch();
  b.cu_seqlens_q = {0, 4};
  expect_error([&] { attention(b, gate); }, "cu_seqlens_q has 2 entries");

  expect_error([&] { attention(c.batch(), Gate::make_async(3, 3)); }, "each of the 4 query heads");
  expect_error([&] { attention(c.batch(), Gate::make_async(4, 0)); }, "pool window must be >= 1");

  AttentionCase odd(rng, {{2, 2}}, 3, 2, 8);
  expect_error([&] { attention(odd.batch(), Gate::make_softmax()); }, "not a multiple of 2 KV heads");

  b = c.batch();
  b.query = c.query.reshape({c.query.size(0), 2, 16});
  expect_error([&] { attention(b, gate); }, "head_dim 16 differs");

  auto paged = c.paged(rng, 16);
  paged.block_table.data_as<std::int32_t>()[0] = 999;
  KvCache broken = KvCache::paged(paged.key_cache, paged.value_cache, paged.block_table);
  expect_error([&] { attention(c.batch(broken), gate); }, "block_table[0][0] = 999");
}

}  // namespace
}  // namespace asynct
