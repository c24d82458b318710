// Embedding, linear, SwiGLU and sampling against hand cases; sampling's determinism and
// distribution; clear errors for bad ids and parameters.
#include <cmath>
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "reference/layers.h"
#include "engine/sampler.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

TEST(Layers, EmbeddingLooksUpRowsAndRejectsBadIds) {
  Tensor table = Tensor::from_vector<float>({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor e = embedding(table, {2, 0, 2});
  EXPECT_EQ(e.to_float_vector(), (std::vector<float>{20, 21, 0, 1, 20, 21}));
  expect_error([&] { embedding(table, {1, 3}); }, "token id 3 at position 1 is outside the vocabulary [0, 3)");
  expect_error([&] { embedding(table, {-1}); }, "token id -1");
}

TEST(Layers, LinearIsXTimesWeightTransposed) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = Tensor::from_vector<float>({1, 0, 0, 0, 1, 1}, {2, 3});  // [out 2, in 3]
  EXPECT_EQ(linear(x, w).to_float_vector(), (std::vector<float>{1, 5, 4, 11}));
  expect_error([&] { linear(x, Tensor::empty(DType::F32, {2, 4})); }, "linear: weight: expected shape [*, 3]");
}

TEST(Layers, SwigluIsSiluOfGateTimesUp) {
  Tensor gu = Tensor::from_vector<float>({0, 1, 3, -2}, {1, 4});  // gate [0, 1], up [3, -2]
  std::vector<float> y = swiglu(gu).to_float_vector();
  EXPECT_NEAR(y[0], 0.0, 1e-7);
  EXPECT_NEAR(y[1], 1.0 / (1.0 + std::exp(-1.0)) * -2.0, 1e-6);
}

TEST(Sampling, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  EXPECT_EQ(sample_token({0.1f, 3.0f, -1.0f, 3.0f}, {}, 0), 1);
}

TEST(Sampling, SummaryHasTheArgmaxAndTheFirstNonFiniteLogit) {
  const std::vector<float> ties = {0.1f, 3.0f, -1.0f, 3.0f};
  LogitSummary s = summarize_logits(ties.data(), ties.size());
  EXPECT_EQ(s.greedy, 1);
  EXPECT_EQ(s.nonfinite, -1);
  const std::vector<float> zeros = {-1.0f, -0.0f, 0.0f};  // -0 and +0 are equal: the lower id
  EXPECT_EQ(summarize_logits(zeros.data(), zeros.size()).greedy, 1);
  const std::vector<float> bad = {1.0f, INFINITY, NAN, 2.0f};
  s = summarize_logits(bad.data(), bad.size());
  EXPECT_EQ(s.nonfinite, 1);
  EXPECT_EQ(s.nonfinite_value, INFINITY);
  expect_error([&] { check_finite(s); }, "sampling: logit 1 is not finite (inf)");
  EXPECT_EQ(sample_token(ties.data(), ties.size(), {}, 0), 1);
}

TEST(Sampling, SameSeedAndStepSameToken) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[std::size_t(i)] = float(std::sin(i * 0.7));
  SamplingParams p{1.0f, 0, 1.0f, 1234};
  for (std::uint64_t step = 0; step < 20; ++step)
    EXPECT_EQ(sample_token(logits, p, step), sample_token(logits, p, step));
  int differ = 0;
  for (std::uint64_t step = 0; step < 20; ++step) differ += sample_token(logits, p, step) != sample_token(logits, p, step + 100);
  EXPECT_GT(differ, 5);  // different steps draw differently
}

TEST(Sampling, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> logits = {0.5f, 0.2f, 2.0f, 1.9f};
  for (std::uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(sample_token(logits, {1.5f, 1, 1.0f, 7}, step), 2);
    EXPECT_EQ(sample_token(logits, {1.5f, 0, 1e-6f, 7}, step), 2);
  }
}

TEST(Sampling, FrequenciesFollowTheTemperedDistribution) {
  // logits log(1), log(2), log(3), log(4) at temperature 1: p = 0.1, 0.2, 0.3, 0.4.
  std::vector<float> logits = {0.0f, float(std::log(2.0)), float(std::log(3.0)), float(std::log(4.0))};
  std::map<int, int> counts;
  const int n = 20000;
  for (int step = 0; step < n; ++step) counts[sample_token(logits, {1.0f, 0, 1.0f, 99}, std::uint64_t(step))]++;
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(counts[t] / double(n), 0.1 * (t + 1), 0.015) << "token " << t;
  // top_k 2 keeps tokens 3 and 2 with p 4/7 and 3/7; top_p 0.5 then keeps token 3 only
  // (its 4/7 of the renormalised mass reaches 0.5).
  counts.clear();
  for (int step = 0; step < n; ++step) counts[sample_token(logits, {1.0f, 2, 1.0f, 5}, std::uint64_t(step))]++;
  EXPECT_EQ(counts[0] + counts[1], 0);
  EXPECT_NEAR(counts[3] / double(n), 4.0 / 7.0, 0.015);
  for (int step = 0; step < 200; ++step) EXPECT_EQ(sample_token(logits, {1.0f, 2, 0.5f, 5}, std::uint64_t(step)), 3);
}

TEST(Sampling, TopPOnALargeVocabularyKeepsExactlyTheNucleus) {
  // 5000 tokens with repeated logits (ties) and a nucleus of a few hundred, larger than the
  // first sorted prefix: the sampler sorts only a growing head of the order; the nucleus it
  // keeps must be the one a full sort gives.
  const int vocab = 5000;
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[std::size_t(i)] = float((i * 7919) % 997) / 100.0f;
  const float temperature = 2.0f, top_p = 0.3f;
  std::vector<int> order(vocab);
  for (int i = 0; i < vocab; ++i) order[std::size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[std::size_t(a)] > logits[std::size_t(b)]; });
  std::vector<double> w(vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) total += w[std::size_t(i)] = std::exp((logits[std::size_t(i)] - logits[std::size_t(order[0])]) / temperature);
  std::set<int> nucleus;
  double mass = 0.0;
  for (int id : order) {
    nucleus.insert(id);
    mass += w[std::size_t(id)];
    if (mass >= top_p * total) break;
  }
  ASSERT_GT(nucleus.size(), 64u);
  std::set<int> seen;
  for (int step = 0; step < 4000; ++step) {
    const int token = sample_token(logits, {temperature, 0, top_p, 3}, std::uint64_t(step));
    ASSERT_TRUE(nucleus.count(token)) << "token " << token << " at step " << step << " is outside the nucleus";
    seen.insert(token);
  }
  EXPECT_GT(seen.size(), nucleus.size() / 2);
}

// The sampler sorts only as much of the vocabulary as top-k/top-p need, by whatever shortcut;
// the token must be exactly the one of the plain definition: a full sort (logit down, id up
// on ties), masses summed in that order, one draw.
int sample_by_full_sort(const std::vector<float>& logits, const SamplingParams& p, std::uint64_t step) {
  const std::size_t vocab = logits.size();
  std::vector<int> order(vocab);
  for (std::size_t i = 0; i < vocab; ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[std::size_t(a)] > logits[std::size_t(b)]; });
  const double max_logit = logits[std::size_t(order[0])];
  const auto w = [&](int id) { return std::exp((double(logits[std::size_t(id)]) - max_logit) / p.temperature); };
  const double u = uniform_draw(p.seed, step);
  if (p.top_k == 0 && p.top_p >= 1.0f) {
    double total = 0.0, cumulative = 0.0;
    for (std::size_t i = 0; i < vocab; ++i) total += w(int(i));
    for (std::size_t i = 0; i < vocab; ++i)
      if (u * total < (cumulative += w(int(i)))) return int(i);
    return int(vocab - 1);
  }
  std::size_t keep = p.top_k > 0 ? std::min(vocab, std::size_t(p.top_k)) : vocab;
  double kept = 0.0;
  if (p.top_k > 0)
    for (std::size_t r = 0; r < keep; ++r) kept += w(order[r]);
  else
    for (std::size_t i = 0; i < vocab; ++i) kept += w(int(i));
  if (p.top_p < 1.0f) {
    const double needed = double(p.top_p) * kept;
    double mass = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      mass += w(order[n++]);
      if (mass >= needed) break;
    }
    keep = n;
    kept = mass;
  }
  double cumulative = 0.0;
  for (std::size_t r = 0; r < keep; ++r)
    if (u * kept < (cumulative += w(order[r]))) return order[r];
  return order[keep - 1];
}

TEST(Sampling, MatchesTheFullSortDefinitionExactly) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int vocab : {3, 1000, 20011}) {
    for (bool ties : {false, true}) {
      std::vector<float> logits(static_cast<std::size_t>(vocab));
      for (float& x : logits) x = normal(rng);
      if (ties)  // coarse values: many equal logits, including at the cut
        for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;
      for (float temperature : {0.3f, 1.0f, 4.0f})
        for (int top_k : {0, 1, 7, 100})
          for (float top_p : {1.0f, 0.3f, 0.9f, 0.999f}) {
            const SamplingParams p{temperature, top_k, top_p, 17};
            for (std::uint64_t step = 0; step < 6; ++step)
              ASSERT_EQ(sample_token(logits, p, step), sample_by_full_sort(logits, p, step))
                  << "vocab " << vocab << (ties ? " with ties" : "") << ", temperature " << temperature << ", top_k "
                  << top_k << ", top_p " << top_p << ", step " << step;
          }
    }
  }
}

TEST(Sampling, BadParametersAndLogitsGiveClearErrors) {
  expect_error([] { sample_token({1.0f}, {-1.0f, 0, 1.0f, 0}, 0); }, "temperature must be finite and >= 0");
  expect_error([] { sample_token({1.0f}, {1.0f, -2, 1.0f, 0}, 0); }, "top_k must be >= 0");
  expect_error([] { sample_token({1.0f}, {1.0f, 0, 0.0f, 0}, 0); }, "top_p must be in (0, 1]");
  expect_error([] { sample_token({1.0f, NAN}, {}, 0); }, "logit 1 is not finite");
  expect_error([] { sample_token({}, {}, 0); }, "empty logits");
}

TEST(Sampling, UniformDrawIsInTheUnitInterval) {
  for (std::uint64_t i = 0; i < 1000; ++i) {
    double u = uniform_draw(42, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

}  // namespace
}  // namespace asynct
