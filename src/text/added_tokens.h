// tokenizer.json's "added_tokens" (special and not), found in the text before pre-tokenization.
// Matching is leftmost-longest over all tokens, as the reference's Aho-Corasick automaton does;
// a token with single_word matches only between non-word characters, lstrip / rstrip take the
// whitespace beside it into the match. Tokens with normalized = false are matched in the raw
// text, those with normalized = true in each normalized segment.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace asynct::text {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// A piece of the text: either plain text (id < 0) or one added token.
struct Segment {
  std::size_t begin, end;
  std::int32_t id;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // The tokens to look for (their contents already normalized when they match normalized text).
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  // Cuts `text` (valid UTF-8) into segments covering it, in order (empty text: none).
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::vector<std::uint32_t>> by_first_byte_;  // token indices, longest first
  bool first_byte_[256] = {};
};

}  // namespace asynct::text
