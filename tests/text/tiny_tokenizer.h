// A small byte-level BPE tokenizer.json for the text tests: the 256 bytes as ids 0..255, then
// merges h+e, l+l, he+ll, a+a, aa+aa, Ġ+w (ids 256..261), and the special token <|end|> (262).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace asynct::testing {

// Byte b as the byte-level alphabet spells it in a vocabulary.
inline std::string byte_char(int b) {
  std::string s;
  asynct::text::append_utf8(s, asynct::text::byte_to_char()[std::size_t(b)]);
  return s;
}

// The tokenizer.json itself.
inline nlohmann::json tiny_spec() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"a", "a"}, {"aa", "aa"}, {byte_char(' '), "w"}};
  nlohmann::json merge_list = nlohmann::json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back({a, b});
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", nlohmann::json::array({{{"id", 262}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}}})},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merge_list}}}};
}

}  // namespace asynct::testing
