// tokenizer.json's "pre_tokenizer": how normalized text is cut into words before BPE.
// Implemented: Split (a Regex or String pattern, behaviour Isolated or Removed, invert false),
// Digits (individual_digits or runs of digits), ByteLevel (add_prefix_space; use_regex with the
// GPT-2 pattern), and a Sequence of those.
// ByteLevel's byte-to-character mapping itself is implicit: BpeModel works on raw bytes.
// Any other type or option is an Error naming it.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/regex.h"

namespace asynct::text {

class PreTokenizer {
 public:
  PreTokenizer() = default;  // no pre-tokenizer: the whole text is one word
  static PreTokenizer from_json(const nlohmann::json& spec);

  // Cuts `text` (valid UTF-8) into words, appended to `words`. A word either points into
  // `text` or into `scratch` (text the steps built, such as a prefixed space), which must
  // outlive the words.
  void split(std::string_view text, std::vector<std::string_view>& words, std::deque<std::string>& scratch) const;

 private:
  struct Step {
    enum Kind { kSplitIsolated, kSplitRemoved, kByteLevel } kind;
    const Regex* regex = nullptr;  // Split, or ByteLevel with use_regex
    bool add_prefix_space = false;  // ByteLevel
  };
  std::vector<Step> steps_;
  std::deque<Regex> regexes_;  // stable addresses for Step::regex

  void read(const nlohmann::json& spec);
};

// The pattern ByteLevel splits with when use_regex is true (GPT-2's).
extern const char* const kGpt2Pattern;

}  // namespace asynct::text
