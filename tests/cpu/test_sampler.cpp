// The host sampler (engine/sampler.h): each option on small hand-made rows (top-k, top-p, min-p,
// the penalties, their order), the distribution of many draws against the exact probabilities
// (chi-square, fixed seeds: the test is deterministic), the tokens of the plain full-sort
// definition (reference/sampler.h) exactly, logprobs against a naive log_softmax, and clear errors.
// (Over 500 lines: every option's tests share the hand-made rows and the chi-square check written here.)
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "engine/penalty_history.h"
#include "engine/sampler.h"
#include "reference/sampler.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

SamplingParams tempered(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f,
                        std::uint64_t seed = 0) {
  return {.temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = min_p, .seed = seed};
}

// ---- The plain definition (reference/sampler.h): a full sort, masses summed in that order, one draw.

std::vector<std::pair<int, double>> naive_kept(const std::vector<float>& x, const SamplingParams& p) {
  return reference_kept(x, reference_sampling_order(x), p);
}

// The exact probability of each token under the definition.
std::vector<double> exact_probabilities(const std::vector<float>& x, const SamplingParams& p) {
  std::vector<double> prob(x.size(), 0.0);
  double mass = 0.0;
  const auto kept = naive_kept(x, p);
  for (const auto& k : kept) mass += k.second;
  for (const auto& k : kept) prob[std::size_t(k.first)] = k.second / mass;
  return prob;
}

// n draws at steps 0..n-1: counts per token.
std::vector<int> draw_counts(const std::vector<float>& x, const SamplingParams& p, int n) {
  std::vector<int> counts(x.size(), 0);
  for (int step = 0; step < n; ++step) ++counts[std::size_t(sample_token(x, p, std::uint64_t(step)))];
  return counts;
}

// Pearson's chi-square of the counts against the probabilities, bins expecting fewer than 5
// draws pooled, below the 0.1% critical value of its degrees of freedom (Wilson-Hilferty);
// a token of probability 0 is never drawn.
void expect_fits(const std::vector<int>& counts, const std::vector<double>& prob, const std::string& what) {
  int n = 0;
  for (int c : counts) n += c;
  double chi2 = 0.0, pooled_expected = 0.0;
  int pooled_count = 0, bins = 0;
  for (std::size_t i = 0; i < prob.size(); ++i) {
    if (prob[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << what << ": token " << i << " is outside the kept set";
      continue;
    }
    const double expected = prob[i] * n;
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_count += counts[i];
      continue;
    }
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++bins;
  }
  if (pooled_expected > 0.0) {
    chi2 += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / pooled_expected;
    ++bins;
  }
  if (bins < 2) return;  // one outcome: nothing to test beyond the zeros
  const double df = bins - 1, z = 3.09;  // 0.1% upper tail
  const double critical = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3.0);
  EXPECT_LT(chi2, critical) << what << ": chi-square " << chi2 << " with " << df << " degrees of freedom";
}

// Logits log(1), log(2), log(3), log(4): at temperature 1, p = 0.1, 0.2, 0.3, 0.4.
std::vector<float> one_to_four() {
  return {0.0f, float(std::log(2.0)), float(std::log(3.0)), float(std::log(4.0))};
}

// ---- Greedy, summaries, the generator.

TEST(Sampling, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  EXPECT_EQ(sample_token({0.1f, 3.0f, -1.0f, 3.0f}, {}, 0), 1);
}

TEST(Sampling, SummaryHasTheArgmaxAndTheFirstNonFiniteLogit) {
  const std::vector<float> ties = {0.1f, 3.0f, -1.0f, 3.0f};
  LogitSummary s = summarize_logits(ties.data(), ties.size());
  EXPECT_EQ(s.token, 1);
  EXPECT_EQ(s.nonfinite, -1);
  const std::vector<float> zeros = {-1.0f, -0.0f, 0.0f};  // -0 and +0 are equal: the lower id
  EXPECT_EQ(summarize_logits(zeros.data(), zeros.size()).token, 1);
  const std::vector<float> bad = {1.0f, INFINITY, NAN, 2.0f};
  s = summarize_logits(bad.data(), bad.size());
  EXPECT_EQ(s.nonfinite, 1);
  EXPECT_EQ(s.nonfinite_value, INFINITY);
  expect_error([&] { check_finite(s); }, "sampling: logit 1 is not finite (inf)");
  EXPECT_EQ(sample_token(ties.data(), ties.size(), {}, 0), 1);
}

TEST(Sampling, UniformDrawIsInTheUnitInterval) {
  for (std::uint64_t i = 0; i < 1000; ++i) {
    double u = uniform_draw(42, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(Sampling, SameSeedAndStepSameTokenAndSeedsDiffer) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[std::size_t(i)] = float(std::sin(i * 0.7));
  const SamplingParams p = tempered(1.0f, 0, 1.0f, 0.0f, 1234);
  SamplingParams other = p;
  other.seed = 1235;
  int differ_by_step = 0, differ_by_seed = 0;
  for (std::uint64_t step = 0; step < 50; ++step) {
    const int token = sample_token(logits, p, step);
    for (int again = 0; again < 3; ++again) EXPECT_EQ(sample_token(logits, p, step), token);
    differ_by_step += token != sample_token(logits, p, step + 100);
    differ_by_seed += token != sample_token(logits, other, step);
  }
  EXPECT_GT(differ_by_step, 15);
  EXPECT_GT(differ_by_seed, 15);
}

// ---- Each option on hand-made rows.

TEST(Sampling, TopKOneTinyTopPAndMinPOneAreGreedy) {
  const std::vector<float> logits = {0.5f, 0.2f, 2.0f, 1.9f};
  for (std::uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(sample_token(logits, tempered(1.5f, 1, 1.0f, 0.0f, 7), step), 2);
    EXPECT_EQ(sample_token(logits, tempered(1.5f, 0, 1e-6f, 0.0f, 7), step), 2);
    EXPECT_EQ(sample_token(logits, tempered(1.5f, 0, 1.0f, 1.0f, 7), step), 2);
  }
  // min_p 1 keeps every token tied with the top one.
  const std::vector<float> tied = {2.0f, 0.2f, 2.0f, 1.9f};
  std::set<int> seen;
  for (std::uint64_t step = 0; step < 100; ++step) seen.insert(sample_token(tied, tempered(1.0f, 0, 1.0f, 1.0f, 3), step));
  EXPECT_EQ(seen, (std::set<int>{0, 2}));
}

TEST(Sampling, TemperatureTopKTopPAndMinPKeepTheRightTokensWithTheRightFrequencies) {
  const std::vector<float> x = one_to_four();
  const int n = 20000;
  struct Case {
    SamplingParams p;
    std::vector<double> prob;
  };
  const std::vector<Case> cases = {
      {tempered(1.0f, 0, 1.0f, 0.0f, 99), {0.1, 0.2, 0.3, 0.4}},
      {tempered(1.0f, 2, 1.0f, 0.0f, 5), {0, 0, 3.0 / 7, 4.0 / 7}},          // top-k 2
      {tempered(1.0f, 0, 0.65f, 0.0f, 6), {0, 0, 3.0 / 7, 4.0 / 7}},         // 0.4 < 0.65 <= 0.7
      {tempered(1.0f, 0, 0.75f, 0.0f, 6), {0, 2.0 / 9, 3.0 / 9, 4.0 / 9}},   // 0.7 < 0.75 <= 0.9
      {tempered(1.0f, 0, 1.0f, 0.55f, 8), {0, 0, 3.0 / 7, 4.0 / 7}},         // p >= 0.55 * 0.4 = 0.22
      {tempered(1.0f, 0, 1.0f, 0.45f, 8), {0, 2.0 / 9, 3.0 / 9, 4.0 / 9}},   // p >= 0.18
      // temperature 2: p ~ sqrt(1, 2, 3, 4)
      {tempered(2.0f, 0, 1.0f, 0.0f, 9),
       {1 / (1 + std::sqrt(2.0) + std::sqrt(3.0) + 2), std::sqrt(2.0) / (1 + std::sqrt(2.0) + std::sqrt(3.0) + 2),
        std::sqrt(3.0) / (1 + std::sqrt(2.0) + std::sqrt(3.0) + 2), 2 / (1 + std::sqrt(2.0) + std::sqrt(3.0) + 2)}},
  };
  for (std::size_t c = 0; c < cases.size(); ++c)
    expect_fits(draw_counts(x, cases[c].p, n), cases[c].prob, "case " + std::to_string(c));
}

// top-p applies to what top-k kept, and min-p to what top-p kept; the other orders keep
// different sets here.
TEST(Sampling, TopKThenTopPThenMinP) {
  // p = 0.4, 0.3, 0.2, 0.1 (ids 0..3).
  const std::vector<float> x = {float(std::log(4.0)), float(std::log(3.0)), float(std::log(2.0)), 0.0f};
  // top-k 3 keeps 0.9 of the mass; top-p 0.75 of that is 0.675: tokens 0 and 1. (top-p first
  // over the whole row would need 0.75: tokens 0, 1 and 2.)
  expect_fits(draw_counts(x, tempered(1.0f, 3, 0.75f, 0.0f, 11), 10000), {4.0 / 7, 3.0 / 7, 0, 0}, "top-k, top-p");
  // top-p 0.5 over the whole row keeps tokens 0 and 1; min-p 0.6 (p >= 0.24) keeps both. (min-p
  // first keeps 0 and 1, and top-p 0.5 of their 0.7 only token 0.)
  expect_fits(draw_counts(x, tempered(1.0f, 0, 0.5f, 0.6f, 12), 10000), {4.0 / 7, 3.0 / 7, 0, 0}, "top-p, min-p");
  // Everything at once: top-k 3, top-p 0.99 (of 0.9: all three), min-p 0.7 (p >= 0.28): 0 and 1.
  expect_fits(draw_counts(x, tempered(1.0f, 3, 0.99f, 0.7f, 13), 10000), {4.0 / 7, 3.0 / 7, 0, 0}, "all three");
}

// The distribution of many draws against the exact probabilities on a random 64-token row,
// for combinations of every option (penalties applied first, as a runner does).
TEST(Sampling, DrawsFollowTheExactDistribution) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> raw(64);
  for (float& v : raw) v = normal(rng);
  std::vector<PenaltyToken> history = {{3, 2, 0}, {10, 0, 1}, {20, 1, 1}, {40, 0, 1}};
  for (const PenaltyToken& t : history) raw[std::size_t(t.id)] = std::abs(raw[std::size_t(t.id)]) + 1.0f;  // likely ones
  const PenaltyContext context{history, 7, true};
  const std::vector<SamplingParams> cases = {
      tempered(1.0f, 0, 1.0f, 0.0f, 1),  tempered(0.7f, 20, 1.0f, 0.0f, 2), tempered(1.3f, 0, 0.8f, 0.0f, 3),
      tempered(1.0f, 0, 1.0f, 0.1f, 4),  tempered(0.8f, 30, 0.9f, 0.05f, 5), tempered(2.5f, 50, 0.95f, 0.02f, 6)};
  for (std::size_t c = 0; c < cases.size(); ++c)
    for (bool penalised : {false, true}) {
      SamplingParams p = cases[c];
      if (penalised) {
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.4f;
      }
      std::vector<float> x = raw;
      apply_penalties(x.data(), x.size(), p, context);
      expect_fits(draw_counts(x, p, 20000), exact_probabilities(x, p),
                  "case " + std::to_string(c) + (penalised ? " with penalties" : ""));
    }
}

// The sampler sorts only as much of the order as it needs, by buckets; the token must be the
// one of the plain definition (a full sort) exactly, ties included.
TEST(Sampling, MatchesTheFullSortDefinitionExactly) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int vocab : {3, 1000, 20011}) {
    for (bool ties : {false, true}) {
      std::vector<float> logits(static_cast<std::size_t>(vocab));
      for (float& x : logits) x = normal(rng);
      if (ties)  // coarse values: many equal logits, including at the cut
        for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;
      const std::vector<int> order = reference_sampling_order(logits);
      for (float temperature : {0.3f, 1.0f, 4.0f})
        for (int top_k : {0, 1, 7, 100})
          for (float top_p : {1.0f, 0.3f, 0.9f, 0.999f})
            for (float min_p : {0.0f, 0.05f, 0.5f}) {
              const SamplingParams p = tempered(temperature, top_k, top_p, min_p, 17);
              const auto kept = reference_kept(logits, order, p);
              for (std::uint64_t step = 0; step < 6; ++step)
                ASSERT_EQ(sample_token(logits, p, step), temperature == 0.0f ? reference_sample_token(logits, p, step)
                                                                            : reference_draw(kept, p, step))
                    << "vocab " << vocab << (ties ? " with ties" : "") << ", temperature " << temperature << ", top_k "
                    << top_k << ", top_p " << top_p << ", min_p " << min_p << ", step " << step;
            }
    }
  }
}

TEST(Sampling, TopPOnALargeVocabularyKeepsExactlyTheNucleus) {
  // 5000 tokens with repeated logits (ties) and a nucleus of a few hundred, over many buckets.
  const int vocab = 5000;
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[std::size_t(i)] = float((i * 7919) % 997) / 100.0f;
  const SamplingParams p = tempered(2.0f, 0, 0.3f, 0.0f, 3);
  std::set<int> nucleus;
  for (const auto& k : naive_kept(logits, p)) nucleus.insert(k.first);
  ASSERT_GT(nucleus.size(), 64u);
  std::set<int> seen;
  for (int step = 0; step < 4000; ++step) {
    const int token = sample_token(logits, p, std::uint64_t(step));
    ASSERT_TRUE(nucleus.count(token)) << "token " << token << " at step " << step << " is outside the nucleus";
    seen.insert(token);
  }
  EXPECT_GT(seen.size(), nucleus.size() / 2);
}

TEST(Sampling, ExtremeTemperaturesStayWellDefined) {
  std::vector<float> logits(3000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::cos(double(i))) * 5.0f;
  logits[17] = 6.0f;  // a single top token
  const int top = 17;
  for (float t : {1e-30f, FLT_TRUE_MIN})
    for (std::uint64_t step = 0; step < 20; ++step) EXPECT_EQ(sample_token(logits, tempered(t, 0, 0.9f), step), top);
  std::set<int> seen;  // a huge temperature: close to uniform
  for (std::uint64_t step = 0; step < 300; ++step) seen.insert(sample_token(logits, tempered(1e30f), step));
  EXPECT_GT(seen.size(), 250u);
}

// ---- Penalties.

PenaltyContext no_history(std::int32_t newest, bool generated) { return {{}, newest, generated}; }

TEST(Penalties, RepetitionDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  const std::vector<PenaltyToken> history = {{0, 0, 1}, {1, 1, 0}, {3, 0, 1}};
  std::vector<float> x = {3.0f, -3.0f, 5.0f, 0.0f, -1.0f};
  apply_penalties(x.data(), x.size(), p, {history, -1, false});
  EXPECT_EQ(x, (std::vector<float>{1.5f, -6.0f, 5.0f, 0.0f, -1.0f}));  // tokens 2 and 4 unseen
  p.repetition_penalty = 0.5f;  // below 1: encouraged
  x = {3.0f, -3.0f, 5.0f, 0.0f, -1.0f};
  apply_penalties(x.data(), x.size(), p, {history, -1, false});
  EXPECT_EQ(x, (std::vector<float>{6.0f, -1.5f, 5.0f, 0.0f, -1.0f}));
}

TEST(Penalties, PresenceAndFrequencyCountOnlyTheOutput) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  // token 0 in the prompt only, token 1 generated 3 times, token 2 in both (generated once).
  const std::vector<PenaltyToken> history = {{0, 0, 1}, {1, 3, 0}, {2, 1, 1}};
  std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
  apply_penalties(x.data(), x.size(), p, {history, -1, false});
  EXPECT_EQ(x, (std::vector<float>{1.0f, 1.0f - 0.75f - 0.5f, 1.0f - 0.25f - 0.5f, 1.0f}));
  p.presence_penalty = -2.0f;  // negative: encouraged
  p.frequency_penalty = -1.0f;
  x = {1.0f, 1.0f, 1.0f, 1.0f};
  apply_penalties(x.data(), x.size(), p, {history, -1, false});
  EXPECT_EQ(x, (std::vector<float>{1.0f, 6.0f, 4.0f, 1.0f}));
}

// Repetition first, then frequency, then presence, in float: 2 / 2 - 0.5 - 0.25 (the other
// order would give (2 - 0.5 - 0.25) / 2).
TEST(Penalties, RepetitionComesBeforeFrequencyAndPresence) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  std::vector<float> x = {2.0f, -2.0f};
  const std::vector<PenaltyToken> history = {{0, 1, 0}, {1, 1, 0}};
  apply_penalties(x.data(), x.size(), p, {history, -1, false});
  EXPECT_EQ(x, (std::vector<float>{0.25f, -4.75f}));
}

// The newest token (the row's input) counts once more: as output when generated, else as in
// the prompt; listed or not.
TEST(Penalties, TheNewestTokenCountsOnceMore) {
  SamplingParams p;
  p.frequency_penalty = 1.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<PenaltyToken> history = {{1, 1, 0}};
  std::vector<float> x = {4.0f, 4.0f, 4.0f};
  apply_penalties(x.data(), x.size(), p, {history, 1, true});  // token 1: twice in the output
  EXPECT_EQ(x, (std::vector<float>{4.0f, 0.0f, 4.0f}));
  x = {4.0f, 4.0f, 4.0f};
  apply_penalties(x.data(), x.size(), p, {history, 2, true});  // token 2: new, once
  EXPECT_EQ(x, (std::vector<float>{4.0f, 1.0f, 1.0f}));
  x = {4.0f, 4.0f, 4.0f};
  apply_penalties(x.data(), x.size(), p, no_history(0, false));  // token 0: the last of the prompt
  EXPECT_EQ(x, (std::vector<float>{2.0f, 4.0f, 4.0f}));
  x = {4.0f, 4.0f, 4.0f};
  apply_penalties(x.data(), x.size(), p, {history, 1, false});  // token 1 also in the prompt now
  EXPECT_EQ(x, (std::vector<float>{4.0f, 1.0f, 4.0f}));
}

TEST(Penalties, NeutralParametersChangeNothingAndResultsStayFinite) {
  std::vector<float> x = {1.0f, -1.0f};
  const std::vector<PenaltyToken> history = {{0, 4, 1}, {1, 4, 1}};
  apply_penalties(x.data(), x.size(), SamplingParams{}, {history, 1, true});
  EXPECT_EQ(x, (std::vector<float>{1.0f, -1.0f}));
  SamplingParams p;
  p.repetition_penalty = 1e30f;
  x = {1.0f, -FLT_MAX};
  apply_penalties(x.data(), x.size(), p, {history, -1, false});
  EXPECT_EQ(x[1], -FLT_MAX);  // -FLT_MAX * 1e30 clamps to the lowest float
  EXPECT_EQ(sample_token(x, tempered(1.0f), 0), 0);
}

// The penalties of a row from the engine's history of a sequence equal those counted from the
// whole sequence, on random sequences: PenaltyHistory + the newest token = every token.
TEST(Penalties, HistoryPlusNewestEqualsCountingTheSequence) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int vocab = 12;
    std::uniform_int_distribution<int> token(0, vocab - 1);
    std::vector<std::int32_t> seq(std::size_t(1 + trial % 17));
    for (auto& t : seq) t = token(rng);
    const std::size_t prompt = 1 + std::size_t(trial) % seq.size();
    const SamplingParams p{.repetition_penalty = 1.7f, .presence_penalty = 0.3f, .frequency_penalty = 0.45f};
    std::vector<float> raw(static_cast<std::size_t>(vocab));
    for (int i = 0; i < vocab; ++i) raw[std::size_t(i)] = float(i - 6) * 0.7f;
    // Counting directly.
    std::vector<float> expected = raw;
    for (int id = 0; id < vocab; ++id) {
      int output = 0;
      bool in_prompt = false;
      for (std::size_t i = 0; i < seq.size(); ++i) {
        if (seq[i] != id) continue;
        if (i < prompt)
          in_prompt = true;
        else
          ++output;
      }
      if (!in_prompt && output == 0) continue;
      float& x = expected[std::size_t(id)];
      x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
      x -= p.frequency_penalty * float(output);
      if (output > 0) x -= p.presence_penalty;
    }
    const PenaltyHistory history(seq, prompt);
    std::vector<float> got = raw;
    apply_penalties(got.data(), got.size(), p, {history.tokens(), seq.back(), seq.size() - 1 >= prompt});
    ASSERT_EQ(got, expected) << "trial " << trial;
  }
}

TEST(Penalties, BadContextsGiveClearErrors) {
  SamplingParams p;
  p.presence_penalty = 1.0f;
  std::vector<float> x = {1.0f, 2.0f};
  const std::vector<PenaltyToken> outside = {{2, 1, 0}};
  expect_error([&] { apply_penalties(x.data(), x.size(), p, {outside, -1, false}); },
               "penalties: token id 2 is outside the vocabulary [0, 2)");
  expect_error([&] { apply_penalties(x.data(), x.size(), p, no_history(5, true)); }, "token id 5 is outside");
  const std::vector<PenaltyToken> negative = {{1, -1, 0}};
  expect_error([&] { apply_penalties(x.data(), x.size(), p, {negative, -1, false}); }, "negative output count");
}

// ---- A row as a runner samples it.

TEST(SampleLogitRow, PenalisesACopyAndTakesLogprobsFromTheRawRow) {
  const std::vector<float> raw = {3.0f, 2.9f, 1.0f, -1.0f, 0.5f};
  RowSampling row;
  row.params.repetition_penalty = 2.0f;
  row.params.logprobs = 2;
  std::vector<TopLogprob> top;
  // Greedy: token 0 is penalised (3 / 2 < 2.9), so token 1 wins.
  const LogitSummary s = sample_logit_row(raw.data(), raw.size(), row, no_history(0, false), &top);
  EXPECT_EQ(s.token, 1);
  EXPECT_EQ(s.nonfinite, -1);
  double norm = 0.0;
  for (float v : raw) norm += std::exp(double(v));
  EXPECT_NEAR(s.logprob, 2.9 - std::log(norm), 1e-6);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 0);  // the raw row's top ones, penalties aside
  EXPECT_NEAR(top[0].logprob, 3.0 - std::log(norm), 1e-6);
  EXPECT_EQ(top[1].id, 1);
  // Drawn: the same token as sample_token on the penalised row.
  row.params.temperature = 0.9f;
  row.params.seed = 4;
  std::vector<float> penalised = raw;
  apply_penalties(penalised.data(), penalised.size(), row.params, no_history(0, false));
  for (row.step = 0; row.step < 50; ++row.step)
    EXPECT_EQ(sample_logit_row(raw.data(), raw.size(), row, no_history(0, false), &top).token,
              sample_token(penalised, row.params, row.step));
}

TEST(SampleLogitRow, ANonFiniteRawLogitIsReportedNotThrown) {
  const std::vector<float> raw = {1.0f, NAN, 2.0f};
  RowSampling row;
  row.params.temperature = 1.0f;
  row.params.logprobs = 1;
  std::vector<TopLogprob> top = {{1, 0.0f}};
  const LogitSummary s = sample_logit_row(raw.data(), raw.size(), row, {}, &top);
  EXPECT_EQ(s.nonfinite, 1);
  EXPECT_TRUE(top.empty());
}

// ---- Logprobs.

TEST(Logprobs, MatchANaiveLogSoftmaxAndRankTopOnesByLogitThenId) {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> x(3000);
  for (float& v : x) v = std::round(normal(rng) * 4.0f) / 4.0f;  // ties
  long double norm = 0.0L;
  const float max_logit = *std::max_element(x.begin(), x.end());
  for (float v : x) norm += std::exp((long double)v - max_logit);
  const auto naive = [&](int id) { return double((long double)x[std::size_t(id)] - max_logit - std::log(norm)); };
  const std::vector<int> order = reference_sampling_order(x);
  for (int n : {0, 1, 5, kMaxTopLogprobs}) {
    LogitSummary s;
    s.token = 1234;
    std::vector<TopLogprob> top;
    fill_logprobs(x.data(), x.size(), n, s, &top);
    EXPECT_NEAR(s.logprob, naive(1234), 1e-5);
    ASSERT_EQ(int(top.size()), n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(top[std::size_t(r)].id, order[std::size_t(r)]) << "rank " << r;
      EXPECT_NEAR(top[std::size_t(r)].logprob, naive(order[std::size_t(r)]), 1e-5) << "rank " << r;
    }
  }
  // More asked than the vocabulary holds: all of it.
  const std::vector<float> small = {0.0f, 1.0f};
  LogitSummary s;
  std::vector<TopLogprob> top;
  fill_logprobs(small.data(), small.size(), 20, s, &top);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_NEAR(std::exp(double(top[0].logprob)) + std::exp(double(top[1].logprob)), 1.0, 1e-6);
}

// ---- Parameters.

TEST(Sampling, BadParametersAndLogitsGiveClearErrors) {
  const auto rejects = [](auto&& change, const std::string& what) {
    SamplingParams p;
    p.temperature = 1.0f;
    change(p);
    expect_error([&] { validate_sampling(p); }, what);
    expect_error([&] { sample_token({1.0f}, p, 0); }, what);
  };
  rejects([](SamplingParams& p) { p.temperature = -1.0f; }, "temperature must be finite and >= 0, got -1");
  rejects([](SamplingParams& p) { p.temperature = NAN; }, "temperature must be finite and >= 0");
  rejects([](SamplingParams& p) { p.temperature = INFINITY; }, "temperature must be finite and >= 0");
  rejects([](SamplingParams& p) { p.top_k = -2; }, "top_k must be >= 0, got -2");
  rejects([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0");
  rejects([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1]");
  rejects([](SamplingParams& p) { p.top_p = NAN; }, "top_p must be in (0, 1]");
  rejects([](SamplingParams& p) { p.min_p = -0.1f; }, "min_p must be in [0, 1], got -0.1");
  rejects([](SamplingParams& p) { p.min_p = 1.01f; }, "min_p must be in [0, 1]");
  rejects([](SamplingParams& p) { p.min_p = NAN; }, "min_p must be in [0, 1]");
  rejects([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty must be finite and > 0, got 0");
  rejects([](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty must be finite and > 0");
  rejects([](SamplingParams& p) { p.repetition_penalty = INFINITY; }, "repetition_penalty must be finite and > 0");
  rejects([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty must be in [-2, 2], got 2.5");
  rejects([](SamplingParams& p) { p.presence_penalty = NAN; }, "presence_penalty must be in [-2, 2]");
  rejects([](SamplingParams& p) { p.frequency_penalty = -2.01f; }, "frequency_penalty must be in [-2, 2]");
  rejects([](SamplingParams& p) { p.frequency_penalty = NAN; }, "frequency_penalty must be in [-2, 2]");
  rejects([](SamplingParams& p) { p.logprobs = -2; }, "logprobs must be in -1..20 (-1: none), got -2");
  rejects([](SamplingParams& p) { p.logprobs = 21; }, "logprobs must be in -1..20");
  expect_error([] { sample_token({1.0f, NAN}, {}, 0); }, "logit 1 is not finite");
  expect_error([] { sample_token({}, {}, 0); }, "empty logits");
  SamplingParams edges{.temperature = 1.0f, .top_p = 1.0f, .min_p = 1.0f, .repetition_penalty = 1e-3f,
                       .presence_penalty = -2.0f, .frequency_penalty = 2.0f, .logprobs = 20};
  EXPECT_NO_THROW(validate_sampling(edges));
  EXPECT_TRUE(edges.has_penalties());
  EXPECT_FALSE(SamplingParams{}.has_penalties());
}

}  // namespace
}  // namespace asynct
