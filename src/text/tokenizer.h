// A HuggingFace tokenizer.json for byte-level BPE (Qwen2/Qwen3, GPT-2 and their kind): text to
// token ids and back, matching HuggingFace `tokenizers` id for id.
//
// encode: the added tokens with normalized = false are found in the raw text first; each piece
// between them is normalized (NFC or nothing), searched for the added tokens with normalized =
// true, cut into words by the pre-tokenizer, and each word's bytes are merged by BPE. The
// post-processor adds nothing (ByteLevel only offsets), so encode's ids are the model's.
//
// Supported, and checked at load (anything else is an Error naming the feature): model BPE
// (see bpe.h for its options); normalizer null / NFC / Sequence; pre_tokenizer Split / ByteLevel
// / Sequence (pre_tokenizer.h); post_processor null / ByteLevel; decoder ByteLevel; truncation
// and padding null.
//
// Errors: encode throws asynct::Error when the text is not valid UTF-8 (naming the byte offset);
// decode throws when an id is not in the vocabulary. Encoding and decoding are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"
#include "text/utf8.h"

namespace asynct::text {

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json; the Error names the file and what was wrong.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(const nlohmann::json& spec);

  std::vector<std::int32_t> encode(std::string_view text) const;
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;

  // The bytes the ids stand for (not necessarily valid UTF-8: a token can end inside a
  // character). Special tokens give their text unless skip_special.
  std::string decode_bytes(std::span<const std::int32_t> ids, bool skip_special = false) const;
  // decode_bytes as text: invalid UTF-8 becomes U+FFFD, as the reference's decode does.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // One id's bytes; throws Error for an id outside the vocabulary.
  std::string_view token_bytes(std::int32_t id) const;
  bool is_special(std::int32_t id) const;
  // Whether the id stands for a token (a model's vocabulary can be larger than its tokenizer's).
  bool has_token(std::int32_t id) const;
  // The id of a token by its tokenizer.json spelling (byte-level for the model's tokens).
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // One more than the largest id (the model's and the added tokens').
  std::int32_t vocab_size() const { return std::int32_t(id_bytes_.size()); }

 private:
  explicit Tokenizer(BpeModel model) : model_(std::move(model)) {}
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode_words(std::string_view text, std::vector<std::int32_t>& out) const;

  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  AddedTokenMatcher raw_added_, normalized_added_;
  std::vector<AddedToken> added_;
  std::vector<std::string> id_bytes_;    // by id
  std::vector<std::uint8_t> id_kind_;    // 0 no such id, 1 a token, 2 a special token
};

// Decodes ids one at a time for streaming output: push() returns the text that is complete
// after this id (a token can end inside a multi-byte character; those bytes wait for the
// next), finish() what is left. The pieces concatenated equal Tokenizer::decode of all the ids.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  std::string push(std::int32_t id);
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  LossyUtf8Decoder utf8_;
};

}  // namespace asynct::text
