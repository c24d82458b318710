// A request's output text while it is generated: token ids go in one at a time, and out comes
// the text that is safe to show now, ending before the first stop string.
//
// Safe to show: complete UTF-8 (a token can end inside a multi-byte character; those bytes
// wait for the next token), and no part of it can still turn out to be the start of a stop
// string. Text that could (a suffix that is a beginning of one of the stop strings) is held
// back until the next tokens decide; finish() gives it at the end. Stop strings are matched
// on the decoded text, so they are found across token boundaries.
//
// When a stop string completes, push() returns the text up to its first byte and stopped()
// turns true; the stop string and anything after it are never shown (OpenAI's API ends its
// text the same way), and ids pushed after that add nothing. When several stop strings
// complete in the same push, the text ends at the one that starts first.
//
// As HuggingFace's decode does, ids the tokenizer has no token for (a model's vocabulary is
// often padded past its tokenizer's) add no text, and special tokens add none when
// skip_special (the default, as vLLM's output text: an end-of-sequence token is not shown).
//
//   CompletionText text(tokenizer, {"\n\n"});
//   for (id : generated) { out << text.push(id); if (text.stopped()) break; }
//   out << text.finish();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace asynct::text {

class CompletionText {
 public:
  // Throws Error for an empty stop string or one that is not valid UTF-8 (naming it). The
  // tokenizer must outlive this object.
  CompletionText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings, bool skip_special = true);

  // Adds the next generated id; returns the text this id makes safe to show (often empty).
  std::string push(std::int32_t id);
  // The end of the generation: the text still held back (none once stopped).
  std::string finish();

  bool stopped() const { return stop_index_ >= 0; }
  // The stop string that ended the text; empty when none did.
  const std::string& stop_string() const;

 private:
  // Shows what of pending_ is safe, stopping at a stop string when one is in it.
  std::string release();

  StreamingDetokenizer detokenizer_;
  const Tokenizer* tokenizer_;
  std::vector<std::string> stop_strings_;
  std::string pending_;  // decoded, not yet shown: at most the longest stop string's length - 1 between pushes
  int stop_index_ = -1;
  bool finished_ = false;
};

}  // namespace asynct::text
