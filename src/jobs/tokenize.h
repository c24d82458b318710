// `asynct tokenize`: text on stdin to token ids on stdout (space-separated, one line), or with
// --decode whitespace-separated ids on stdin to their text (written as is, no newline added,
// so `tokenize | tokenize --decode` gives the input back, NFC-normalized where the file says).
#pragma once

#include <iosfwd>
#include <string>

namespace asynct {

struct TokenizeOptions {
  std::string tokenizer_path;  // a tokenizer.json
  std::string model_dir;       // or a checkpoint directory holding tokenizer.json
  bool decode = false;
  bool skip_special = false;   // --decode: leave special tokens out
};

// Reads `in`, writes `out`; throws Error on a bad tokenizer file, text that is not UTF-8, or
// an id that is not a number in the vocabulary.
int run_tokenize(const TokenizeOptions& options, std::istream& in, std::ostream& out);

}  // namespace asynct
