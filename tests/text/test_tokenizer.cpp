// The tokenizer on small tokenizer.json files built here: BPE merges (short and long words), the
// Digits pre-tokenizer, the streaming detokenizer, lossy UTF-8 decoding in any chunks, and the
// errors: invalid UTF-8 to encode, unknown ids to decode, and every unsupported tokenizer.json
// feature named.
// (Agreement with HuggingFace tokenizers on real files: tokenizer_golden.py.)
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "tiny_tokenizer.h"

namespace {

using asynct::text::StreamingDetokenizer;
using asynct::text::Tokenizer;
using nlohmann::json;
using asynct::testing::byte_char;
using asynct::testing::tiny_spec;

std::string load_error(const json& spec) {
  try {
    Tokenizer::from_json(spec);
  } catch (const asynct::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tokenizer, MergesByRank) {
  const Tokenizer t = Tokenizer::from_json(tiny_spec());
  EXPECT_EQ(t.encode("hello"), (std::vector<std::int32_t>{258, 'o'}));
  EXPECT_EQ(t.encode("hello world<|end|>"),
            (std::vector<std::int32_t>{258, 'o', 261, 'o', 'r', 'l', 'd', 262}));
  EXPECT_EQ(t.encode("aaaaaaa"), (std::vector<std::int32_t>{260, 259, 'a'}));
  EXPECT_TRUE(t.encode("").empty());
}

TEST(Tokenizer, LongWordsMergeLikeShortOnes) {
  // Over 64 symbols the priority-queue path runs; it must agree with the scan.
  const Tokenizer t = Tokenizer::from_json(tiny_spec());
  for (const int n : {63, 64, 65, 200, 1001}) {
    const auto ids = t.encode(std::string(std::size_t(n), 'a'));
    std::vector<std::int32_t> expected(std::size_t(n / 4), 260);
    if (n % 4 >= 2) expected.push_back(259);
    if (n % 2) expected.push_back('a');
    EXPECT_EQ(ids, expected) << n << " a's";
  }
}

TEST(Tokenizer, DecodeAndSpecialTokens) {
  const Tokenizer t = Tokenizer::from_json(tiny_spec());
  const auto ids = t.encode("hello<|end|> wé");
  EXPECT_EQ(t.decode(ids), "hello<|end|> wé");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "hello wé");
  EXPECT_TRUE(t.is_special(262));
  EXPECT_FALSE(t.is_special(258));
  EXPECT_EQ(t.token_to_id("<|end|>"), 262);
  EXPECT_EQ(t.vocab_size(), 263);
}

TEST(Tokenizer, AddedTokenIdsFollowTheReference) {
  // The reference ignores a file's added-token ids: a token in the vocabulary keeps its id, a
  // new one comes after the vocabulary.
  json spec = tiny_spec();
  spec["added_tokens"][0]["id"] = 300;
  spec["added_tokens"].push_back({{"id", 5}, {"content", "he"}, {"special", false}, {"normalized", false}});
  spec["added_tokens"].push_back({{"id", 7}, {"content", "<x>"}, {"special", false}, {"normalized", false}});
  const Tokenizer t = Tokenizer::from_json(spec);
  EXPECT_EQ(t.token_to_id("<|end|>"), 262);
  EXPECT_EQ(t.token_to_id("he"), 256);
  EXPECT_EQ(t.token_to_id("<x>"), 263);
  EXPECT_EQ(t.encode("hello<x>"), (std::vector<std::int32_t>{256, 257, 'o', 263}));
}

TEST(Tokenizer, DigitsPreTokenizerSplitsNumbers) {
  // A merge 1+2 (id 262): GPT-2's split keeps "12" in one word, the Digits step (SmolLM2's
  // tokenizer runs it before ByteLevel) cuts every digit apart, any script's (\u2460 is No).
  json spec = tiny_spec();
  spec["added_tokens"] = json::array();
  spec["model"]["vocab"]["12"] = 262;
  spec["model"]["merges"].push_back({"1", "2"});
  const json byte_level = spec["pre_tokenizer"];
  const std::vector<std::int32_t> bytes_x1_circled1{'x', '1', 0xE2, 0x91, 0xA0};
  EXPECT_EQ(Tokenizer::from_json(spec).encode("x12"), (std::vector<std::int32_t>{'x', 262}));
  for (const bool individual : {true, false}) {
    spec["pre_tokenizer"] = {{"type", "Sequence"},
                             {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", individual}}, byte_level}}};
    const Tokenizer t = Tokenizer::from_json(spec);
    if (individual) {
      EXPECT_EQ(t.encode("x12"), (std::vector<std::int32_t>{'x', '1', '2'}));
    } else {
      EXPECT_EQ(t.encode("x12"), (std::vector<std::int32_t>{'x', 262}));
    }
    EXPECT_EQ(t.encode("x1\u2460"), bytes_x1_circled1) << individual;
    EXPECT_EQ(t.decode(t.encode("a 12 \u2460\u2461 3x")), "a 12 \u2460\u2461 3x");
  }
}

TEST(Tokenizer, StreamingWaitsForWholeCharacters) {
  const Tokenizer t = Tokenizer::from_json(tiny_spec());
  const auto ids = t.encode("你");  // three byte tokens
  ASSERT_EQ(ids.size(), 3u);
  StreamingDetokenizer d(t);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "你");
  EXPECT_EQ(d.finish(), "");
  // An unfinished character at the end becomes U+FFFD, as decode() makes it.
  StreamingDetokenizer cut(t);
  EXPECT_EQ(cut.push(ids[0]) + cut.push(ids[1]) + cut.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(std::vector<std::int32_t>{ids[0], ids[1]}), "\xEF\xBF\xBD");
}

TEST(Tokenizer, RejectsInvalidUtf8AndUnknownIds) {
  const Tokenizer t = Tokenizer::from_json(tiny_spec());
  for (const std::string bad : {"\xFF", "ok\xC0\xAF", "\xED\xA0\x80", "x\xE4\xBD", "\xF4\x90\x80\x80", "\x80"}) {
    try {
      t.encode(bad);
      ADD_FAILURE() << "no error for invalid UTF-8";
    } catch (const asynct::Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(t.decode(std::vector<std::int32_t>{5, 263}), asynct::Error);  // 263: no such id
  EXPECT_THROW(t.decode(std::vector<std::int32_t>{-1}), asynct::Error);
  StreamingDetokenizer d(t);
  EXPECT_THROW(d.push(100000), asynct::Error);
}

TEST(Tokenizer, NamesEveryUnsupportedFeature) {
  struct Case {
    std::string pointer;
    json value;
    std::string named;
  };
  const std::vector<Case> cases = {
      {"/model/type", "WordPiece", "WordPiece"},
      {"/model/dropout", 0.1, "dropout"},
      {"/model/byte_fallback", true, "byte_fallback"},
      {"/model/continuing_subword_prefix", "##", "continuing_subword_prefix"},
      {"/model/end_of_word_suffix", "</w>", "end_of_word_suffix"},
      {"/normalizer", {{"type", "Lowercase"}}, "Lowercase"},
      {"/normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}}, "NFKC"},
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "Whitespace"},
      {"/pre_tokenizer", {{"type", "Digits"}, {"individual_digits", "yes"}}, "individual_digits"},
      {"/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "MergedWithNext"}}, "MergedWithNext"},
      {"/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"invert", true}}, "invert"},
      {"/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}}, "does not compile"},
      {"/post_processor", {{"type", "TemplateProcessing"}}, "TemplateProcessing"},
      {"/decoder", {{"type", "WordPiece"}}, "WordPiece"},
      {"/decoder", nullptr, "decoder"},
      {"/truncation", {{"max_length", 10}}, "truncation"},
      {"/padding", {{"length", 10}}, "padding"},
  };
  for (const Case& c : cases) {
    json spec = tiny_spec();
    spec[json::json_pointer(c.pointer)] = c.value;
    const std::string error = load_error(spec);
    EXPECT_NE(error.find(c.named), std::string::npos) << c.pointer << ": " << error;
  }
  json spec = tiny_spec();
  spec["model"]["merges"].push_back({"x", "zz"});
  EXPECT_NE(load_error(spec).find("not in the vocabulary"), std::string::npos) << load_error(spec);
}

TEST(Utf8, LossyDecodingDoesNotDependOnChunks) {
  std::mt19937 rng(7);
  const std::string pieces[] = {"a", "é", "你", "😀", "\xFF", "\xE4\xBD", "\xED\xA0\x80", "\xF0\x9F", "\x80", "\xC3"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes;
    const int n = int(rng() % 12);
    for (int i = 0; i < n; ++i) bytes += pieces[rng() % std::size(pieces)];
    const std::string whole = asynct::text::lossy_utf8(bytes);
    EXPECT_FALSE(asynct::text::find_invalid_utf8(whole).has_value());
    asynct::text::LossyUtf8Decoder d;
    std::string chunked;
    for (std::size_t at = 0; at < bytes.size();) {
      const std::size_t len = std::min<std::size_t>(bytes.size() - at, rng() % 4);
      d.feed(std::string_view(bytes).substr(at, len), chunked);
      at += len;
    }
    d.finish(chunked);
    ASSERT_EQ(chunked, whole) << "trial " << trial;
  }
  // One U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy.
  EXPECT_EQ(asynct::text::lossy_utf8("a\xF0\x9F\x98z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(asynct::text::lossy_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(asynct::text::lossy_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
