// Suffix decoding's index (engine/suffix_index.h) on hand-made sequences: the longest match
// wins, then the most frequent continuation (ties: the lowest id) while it is likely enough;
// matches stay within the depth; eviction keeps the token budget and forgets exactly the evicted
// sequences, or one sequence's oldest tokens (the same as an index built from what it retains).
#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "engine/drafter.h"
#include "engine/suffix_index.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using Tokens = std::vector<std::int32_t>;

Tokens draft(const SuffixIndex& index, const Tokens& context, int max_tokens, double min_probability = 0.1) {
  return index.draft(context, max_tokens, min_probability).tokens;
}

TEST(SuffixIndex, LongestMatchWins) {
  SuffixIndex index(8);
  index.add(Tokens{1, 2, 3, 7});
  index.add(Tokens{5, 2, 3, 8});
  // "2 3" was followed by 7 and 8 alike; "5 2 3" only by 8.
  const SuffixIndex::Draft d = index.draft(Tokens{5, 2, 3}, 3, 0.1);
  EXPECT_EQ(d.tokens, (Tokens{8}));  // nothing followed 8
  EXPECT_EQ(d.match_length, 3);
  EXPECT_EQ(draft(index, {4, 2, 3}, 3), (Tokens{7}));  // a tie at "2 3": the lowest id
  EXPECT_TRUE(draft(index, {6}, 3).empty());
  EXPECT_EQ(index.draft(Tokens{6}, 3, 0.1).match_length, 0);
  EXPECT_TRUE(draft(index, {}, 3).empty());
  EXPECT_TRUE(draft(index, {5, 2, 3}, 0).empty());
}

TEST(SuffixIndex, MostFrequentContinuationWhileLikelyEnough) {
  SuffixIndex index(8);
  index.add(Tokens{1, 2, 3});
  index.add(Tokens{1, 2, 4, 9});
  index.add(Tokens{1, 2, 4, 9});
  EXPECT_EQ(draft(index, {1, 2}, 4), (Tokens{4, 9}));    // 4 followed "1 2" 2 times in 3
  EXPECT_TRUE(draft(index, {1, 2}, 4, 0.7).empty());       // 2/3 is under 0.7
  EXPECT_EQ(draft(index, {1, 2}, 4, 0.66), (Tokens{4, 9}));
  EXPECT_EQ(draft(index, {1, 2}, 1), (Tokens{4}));
  SuffixIndex tie(8);
  tie.add(Tokens{1, 2, 6});
  tie.add(Tokens{1, 2, 5});
  EXPECT_EQ(draft(tie, {1, 2}, 4), (Tokens{5}));
}

// A request's own tokens: the match is an earlier occurrence (the suffix's own, at the end, has
// no follower), and the draft runs on past it.
TEST(SuffixIndex, DraftsFromASequenceItself) {
  SuffixIndex index(24);
  const Tokens seq = {5, 6, 7, 8, 5, 6, 7};
  index.add(seq);
  const SuffixIndex::Draft d = index.draft(seq, 4, 0.1);
  EXPECT_EQ(d.tokens, (Tokens{8, 5, 6, 7}));
  EXPECT_EQ(d.match_length, 3);
  // Past the end of what followed, it matches again (a shorter suffix) and goes on periodically.
  EXPECT_EQ(draft(index, seq, 9), (Tokens{8, 5, 6, 7, 8, 5, 6, 7, 8}));
}

TEST(SuffixIndex, MatchesStayWithinTheDepth) {
  SuffixIndex deep(8), shallow(3);
  for (SuffixIndex* index : {&deep, &shallow}) {
    index->add(Tokens{7, 1, 2, 3});
    index->add(Tokens{8, 1, 2, 9});
    index->add(Tokens{8, 1, 2, 9});
  }
  EXPECT_EQ(draft(deep, {7, 1, 2}, 1), (Tokens{3}));  // "7 1 2"
  const SuffixIndex::Draft d = shallow.draft(Tokens{7, 1, 2}, 1, 0.1);
  EXPECT_EQ(d.tokens, (Tokens{9}));  // at most "1 2" (depth 3 = match + 1)
  EXPECT_EQ(d.match_length, 2);
  // Windows of up to 3 tokens: 1, 12, 123, 2, 23, 234, 3, 34, 345, 4, 45, 5.
  SuffixIndex three(3);
  three.add(Tokens{1, 2, 3, 4, 5});
  EXPECT_EQ(three.num_nodes(), 12u);
  EXPECT_EQ(draft(three, {1, 2}, 5), (Tokens{3, 4, 5}));  // matched again at each full window
}

TEST(SuffixIndex, ExtendIsAddInPieces) {
  const Tokens seq = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5};
  SuffixIndex whole(6), pieces(6);
  whole.add(Tokens{1, 1, 2});
  pieces.add(Tokens{1, 1, 2});
  whole.add(seq);
  pieces.add(std::span(seq).first(5));
  for (std::size_t i = 5; i < seq.size(); ++i) pieces.extend(seq[i]);
  EXPECT_EQ(pieces.num_nodes(), whole.num_nodes());
  EXPECT_EQ(pieces.num_tokens(), whole.num_tokens());
  for (std::size_t n = 1; n <= seq.size(); ++n)
    EXPECT_EQ(draft(pieces, Tokens(seq.begin(), seq.begin() + std::ptrdiff_t(n)), 5),
              draft(whole, Tokens(seq.begin(), seq.begin() + std::ptrdiff_t(n)), 5));
}

TEST(SuffixIndex, EvictionKeepsTheBudgetAndForgetsTheEvicted) {
  SuffixIndex index(4, 10);
  index.add(Tokens{1, 2, 3, 4, 5, 6});
  index.add(Tokens{7, 8, 9});
  EXPECT_EQ(draft(index, {4, 5}, 2), (Tokens{6}));
  index.add(Tokens{10, 11});  // 11 tokens: the first sequence goes
  EXPECT_EQ(index.num_tokens(), 5);
  EXPECT_EQ(index.num_sequences(), 2u);
  EXPECT_TRUE(draft(index, {4, 5}, 2).empty());
  EXPECT_TRUE(draft(index, {1}, 2).empty());
  EXPECT_EQ(draft(index, {7, 8}, 2), (Tokens{9}));
  SuffixIndex fresh(4, 10);
  fresh.add(Tokens{7, 8, 9});
  fresh.add(Tokens{10, 11});
  EXPECT_EQ(index.num_nodes(), fresh.num_nodes());
  // A sequence over the budget keeps its last tokens, alone.
  index.add(Tokens{20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31});
  EXPECT_EQ(index.num_tokens(), 10);
  EXPECT_EQ(index.num_sequences(), 1u);
  EXPECT_TRUE(draft(index, {20}, 2).empty());
  EXPECT_EQ(draft(index, {22}, 2), (Tokens{23, 24}));
}

// Random sequences over a few tokens (many shared windows): after every add, the index equals
// one built from the sequences it keeps (the newest that fit the budget).
TEST(SuffixIndex, EvictionEqualsRebuildingFromTheRetained) {
  std::mt19937 rng(11);
  const int depth = 5;
  const std::int64_t budget = 60;
  SuffixIndex index(depth, budget);
  std::deque<Tokens> kept;
  std::int64_t kept_tokens = 0;
  for (int round = 0; round < 40; ++round) {
    Tokens seq(std::size_t(1 + rng() % 20));
    for (auto& t : seq) t = std::int32_t(rng() % 4);
    index.add(seq);
    kept.push_back(seq);
    kept_tokens += std::int64_t(seq.size());
    while (kept_tokens > budget && kept.size() > 1) kept_tokens -= std::int64_t(kept.front().size()), kept.pop_front();
    SuffixIndex rebuilt(depth, budget);
    for (const Tokens& s : kept) rebuilt.add(s);
    ASSERT_EQ(index.num_tokens(), kept_tokens);
    ASSERT_LE(index.num_tokens(), budget);
    ASSERT_EQ(index.num_sequences(), kept.size());
    ASSERT_EQ(index.num_nodes(), rebuilt.num_nodes()) << "round " << round;
    for (int c = 0; c < 20; ++c) {
      Tokens context(std::size_t(1 + rng() % 6));
      for (auto& t : context) t = std::int32_t(rng() % 4);
      for (const double p : {0.0, 0.3, 0.6}) {
        const SuffixIndex::Draft a = index.draft(context, 6, p), b = rebuilt.draft(context, 6, p);
        ASSERT_EQ(a.tokens, b.tokens) << "round " << round;
        ASSERT_EQ(a.match_length, b.match_length) << "round " << round;
      }
    }
  }
}

// One long sequence over the budget: the index slides, the same as one built from its last
// budget tokens alone, after every token.
TEST(SuffixIndex, OneSequenceSlidesOverTheBudget) {
  std::mt19937 rng(5);
  const int depth = 4;
  const std::int64_t budget = 9;
  SuffixIndex index(depth, budget);
  Tokens seq;
  for (int i = 0; i < 60; ++i) {
    seq.push_back(std::int32_t(rng() % 3));
    index.extend(seq.back());
    const std::size_t kept = std::min<std::size_t>(seq.size(), std::size_t(budget));
    SuffixIndex rebuilt(depth, budget);
    rebuilt.add(std::span(seq).last(kept));
    ASSERT_EQ(index.num_tokens(), std::int64_t(kept));
    ASSERT_EQ(index.num_sequences(), 1u);
    ASSERT_EQ(index.num_nodes(), rebuilt.num_nodes()) << "token " << i;
    for (int c = 0; c < 10; ++c) {
      Tokens context(std::size_t(1 + rng() % 4));
      for (auto& t : context) t = std::int32_t(rng() % 3);
      const SuffixIndex::Draft a = index.draft(context, 5, 0.2), b = rebuilt.draft(context, 5, 0.2);
      ASSERT_EQ(a.tokens, b.tokens) << "token " << i;
      ASSERT_EQ(a.match_length, b.match_length) << "token " << i;
    }
  }
}

TEST(SuffixIndex, OptionsAreChecked) {
  using testing::expect_error;
  expect_error([] { SuffixIndex(1); }, "depth must be >= 2");
  expect_error([] { validate_speculative({.method = "suffix", .suffix_depth = 1}); }, "--suffix-depth must be in 2..64, got 1");
  expect_error([] { validate_speculative({.method = "suffix", .suffix_min_probability = 1.5}); },
               "--suffix-min-probability must be in [0, 1]");
  expect_error([] { validate_speculative({.method = "suffix", .suffix_cache_tokens = -1}); },
               "--suffix-cache-tokens must be in 0..2^30");
  expect_error([] { validate_speculative({.method = "suffix", .suffix_request_tokens = 0}); },
               "--suffix-request-tokens must be in 1..2^30");
  validate_speculative({.method = "suffix"});
}

}  // namespace
}  // namespace asynct
