#include "jobs/tokenize.h"

#include <cstdint>
#include <istream>
#include <ostream>
#include <sstream>
#include <vector>

#include "core/error.h"
#ifdef ASYNCT_WITH_TEXT
#include "text/tokenizer.h"
#endif

namespace asynct {

#ifndef ASYNCT_WITH_TEXT
int run_tokenize(const TokenizeOptions&, std::istream&, std::ostream&) {
  check(false, "tokenize: this build of asynct has no text support (PCRE2 and ICU were not found when it was "
        "configured; scripts/setup.sh installs them)");
  return 2;
}
#else

namespace {

std::vector<std::int32_t> parse_ids(const std::string& input) {
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (at < input.size()) {
    while (at < input.size() && is_space(input[at])) ++at;
    std::size_t end = at;
    while (end < input.size() && !is_space(input[end])) ++end;
    if (end == at) break;
    const std::string piece = input.substr(at, end - at);
    long long value = -1;
    std::size_t used = 0;
    try {
      value = std::stoll(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == piece.size() && piece[0] != '+' && value >= 0 && value <= 0x7fffffff, "--decode: '",
          piece.substr(0, 40), "' (at byte ", at, " of the input) is not a token id");
    ids.push_back(std::int32_t(value));
    at = end;
  }
  return ids;
}

}  // namespace

int run_tokenize(const TokenizeOptions& o, std::istream& in, std::ostream& out) {
  check(o.tokenizer_path.empty() != o.model_dir.empty(), "tokenize needs --tokenizer FILE or --model DIR (one of them)");
  const std::string path = o.tokenizer_path.empty() ? o.model_dir + "/tokenizer.json" : o.tokenizer_path;
  const text::Tokenizer tokenizer = text::Tokenizer::from_file(path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string input = buffer.str();
  if (o.decode) {
    out << tokenizer.decode(parse_ids(input), o.skip_special);
  } else {
    const std::vector<std::int32_t> ids = tokenizer.encode(input);
    std::string line;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(ids[i]);
    }
    out << line << '\n';
  }
  out.flush();
  return 0;
}

#endif  // ASYNCT_WITH_TEXT

}  // namespace asynct
