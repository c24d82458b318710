// CompletionText on the tiny tokenizer (tiny_tokenizer.h): stop strings spanning tokens, at the
// very start, partial matches that do not complete, multi-byte characters split over tokens,
// several stop strings, special and unknown ids, and a randomized check against a plain
// reference (decode everything so far, look for the stop strings) on texts full of near misses.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "text/completion_text.h"
#include "text/tokenizer.h"
#include "tiny_tokenizer.h"

namespace {

using asynct::text::CompletionText;
using asynct::text::Tokenizer;

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::from_json(asynct::testing::tiny_spec());
  return t;
}

// Ids of "hello world": "hell" (258), 'o', " w" (261), 'o', 'r', 'l', 'd'.
const std::vector<std::int32_t> kHelloWorld = {258, 'o', 261, 'o', 'r', 'l', 'd'};

// What each push returned, then finish().
std::vector<std::string> pieces(CompletionText& text, const std::vector<std::int32_t>& ids) {
  std::vector<std::string> out;
  for (const std::int32_t id : ids) out.push_back(text.push(id));
  out.push_back(text.finish());
  return out;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += p;
  return s;
}

TEST(CompletionText, WithoutStopStringsItIsTheDecodedText) {
  CompletionText text(tiny(), {});
  EXPECT_EQ(pieces(text, kHelloWorld), (std::vector<std::string>{"hell", "o", " w", "o", "r", "l", "d", ""}));
  EXPECT_FALSE(text.stopped());
  EXPECT_EQ(text.stop_string(), "");
}

TEST(CompletionText, AStopStringSpanningTokensEndsTheTextBeforeIt) {
  CompletionText text(tiny(), {"lo wo"});
  // "hell" shows "hel" and holds "l" back: "lo wo" may start there.
  EXPECT_EQ(pieces(text, kHelloWorld), (std::vector<std::string>{"hel", "", "", "", "", "", "", ""}));
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.stop_string(), "lo wo");
  EXPECT_EQ(text.push('x'), "");  // nothing after the stop
}

TEST(CompletionText, AStopStringAtTheVeryStartLeavesNoText) {
  CompletionText text(tiny(), {"he"});
  EXPECT_EQ(text.push(258), "");
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.finish(), "");
  CompletionText exact(tiny(), {"hello world"});
  EXPECT_EQ(joined(pieces(exact, kHelloWorld)), "");
  EXPECT_TRUE(exact.stopped());
}

TEST(CompletionText, APartialMatchThatDoesNotCompleteIsShownWhenItFails) {
  CompletionText text(tiny(), {"low"});
  const std::vector<std::string> got = pieces(text, kHelloWorld);
  // "l", then "lo" wait; " w" ends the match; the next "l" waits for its next character.
  EXPECT_EQ(got, (std::vector<std::string>{"hel", "", "lo w", "o", "r", "", "ld", ""}));
  EXPECT_EQ(joined(got), "hello world");
  EXPECT_FALSE(text.stopped());
  // A beginning still open when the generation ends is shown at finish().
  CompletionText open(tiny(), {"ld!"});
  const std::vector<std::string> tail = pieces(open, kHelloWorld);
  EXPECT_EQ(tail.back(), "ld");
  EXPECT_EQ(joined(tail), "hello world");
  EXPECT_FALSE(open.stopped());
}

TEST(CompletionText, MultiByteCharactersSplitOverTokens) {
  // "café!" with é (C3 A9) as two byte tokens.
  const std::vector<std::int32_t> cafe = {'c', 'a', 'f', 0xC3, 0xA9, '!'};
  CompletionText plain(tiny(), {});
  EXPECT_EQ(pieces(plain, cafe), (std::vector<std::string>{"c", "a", "f", "", "\xC3\xA9", "!", ""}));
  CompletionText stop(tiny(), {"\xC3\xA9!"});
  EXPECT_EQ(joined(pieces(stop, cafe)), "caf");
  EXPECT_TRUE(stop.stopped());
  // è (C3 A8) shares é's first byte: no match, and no half character is ever shown.
  CompletionText near(tiny(), {"\xC3\xA8"});
  const std::vector<std::string> got = pieces(near, cafe);
  EXPECT_EQ(joined(got), "caf\xC3\xA9!");
  EXPECT_EQ(got[3], "");
  EXPECT_FALSE(near.stopped());
  // A character left unfinished by the generation becomes U+FFFD at the end, as decode() does.
  CompletionText cut(tiny(), {"x"});
  EXPECT_EQ(joined(pieces(cut, {'a', 0xE4, 0xBD})), "a\xEF\xBF\xBD");
}

TEST(CompletionText, SeveralStopStringsTheFirstToStartWins) {
  // "o w" completes with " w"; "world" would need more tokens.
  CompletionText text(tiny(), {"world", "o w"});
  EXPECT_EQ(joined(pieces(text, kHelloWorld)), "hell");
  EXPECT_EQ(text.stop_string(), "o w");
  // Both complete in the same token ("hell"): "el" starts first.
  CompletionText same(tiny(), {"ll", "el"});
  EXPECT_EQ(same.push(258), "h");
  EXPECT_EQ(same.stop_string(), "el");
  // The held-back text is the longest beginning of any of them.
  CompletionText longest(tiny(), {"lx", "llo!"});
  EXPECT_EQ(longest.push(258), "he");
  EXPECT_EQ(longest.push('o'), "");
  EXPECT_EQ(longest.push(' '), "llo ");
}

TEST(CompletionText, SpecialAndUnknownIdsAddNoText) {
  CompletionText text(tiny(), {"<|"});
  EXPECT_EQ(text.push('a'), "a");
  EXPECT_EQ(text.push(262), "");   // <|end|>, special
  EXPECT_EQ(text.push(5000), "");  // past the tokenizer's vocabulary
  EXPECT_EQ(text.push(-1), "");
  EXPECT_EQ(text.push('b'), "b");
  EXPECT_FALSE(text.stopped());
  CompletionText shown(tiny(), {"d<|"}, /*skip_special=*/false);
  EXPECT_EQ(joined(pieces(shown, {'a', 'd', 262})), "a");
  EXPECT_TRUE(shown.stopped());
}

TEST(CompletionText, BadStopStringsAreErrors) {
  for (const std::string& bad : {std::string(), std::string("ok\xFF"), std::string("\xC3")}) {
    try {
      CompletionText text(tiny(), {"fine", bad});
      ADD_FAILURE() << "no error for stop string '" << bad << "'";
    } catch (const asynct::Error& e) {
      EXPECT_NE(std::string(e.what()).find("stop string 1"), std::string::npos) << e.what();
    }
  }
}

// The reference: after each id, the complete text so far (what decode gives, without the
// bytes of an unfinished character); the first time a stop string is in it, the text ends at
// the earliest one. The pieces must add up to that, and every prefix shown must be a prefix of
// it (nothing shown is ever taken back).
TEST(CompletionText, RandomTextsMatchTheReference) {
  const std::vector<std::vector<std::int32_t>> alphabet = {{'a'}, {'b'}, {'a', 'b'}, {0xC3, 0xA9}, {0xE4, 0xBD, 0xA0},
                                                           {' '}, {256},      {0xC3}};
  const std::vector<std::string> stop_pool = {"ab", "ba", "aab", "\xC3\xA9" "a", " b", "bbb", "a a", "\xE4\xBD\xA0", "h"};
  std::mt19937 rng(7);
  int stopped = 0;
  for (int run = 0; run < 2000; ++run) {
    std::vector<std::int32_t> ids;
    const int pieces_count = 1 + int(rng() % 12);
    for (int p = 0; p < pieces_count; ++p) {
      const auto& piece = alphabet[rng() % alphabet.size()];
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
    std::vector<std::string> stops;
    for (int k = int(rng() % 3); k >= 0; --k) stops.push_back(stop_pool[rng() % stop_pool.size()]);

    std::string expected;
    bool expect_stop = false;
    asynct::text::StreamingDetokenizer detok(tiny());
    std::string complete;
    for (std::size_t i = 0; i <= ids.size() && !expect_stop; ++i) {
      if (i < ids.size()) complete += detok.push(ids[i]);
      else complete += detok.finish();
      std::size_t first = std::string::npos;
      for (const std::string& s : stops) first = std::min(first, complete.find(s));
      if (first != std::string::npos) expected = complete.substr(0, first), expect_stop = true;
    }
    if (!expect_stop) expected = complete;

    CompletionText text(tiny(), stops);
    std::string shown;
    for (const std::int32_t id : ids) {
      shown += text.push(id);
      ASSERT_EQ(expected.compare(0, shown.size(), shown), 0) << "run " << run << ": showed '" << shown << "'";
    }
    shown += text.finish();
    ASSERT_EQ(shown, expected) << "run " << run;
    ASSERT_EQ(text.stopped(), expect_stop) << "run " << run;
    stopped += expect_stop;
  }
  EXPECT_GT(stopped, 500);
  EXPECT_LT(stopped, 1900);
}

}  // namespace
