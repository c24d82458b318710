// A compiled PCRE2 pattern (UTF + UCP, JIT-compiled) that lists the matches in a string.
// tokenizer.json's split patterns are written for Oniguruma (\p{L}, (?i:...), lookahead);
// PCRE2 reads that syntax, RE2 and std::regex do not.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace asynct::text {

struct Span {
  std::size_t begin, end;  // byte offsets, end exclusive
};

class Regex {
 public:
  // Throws Error naming the pattern and PCRE2's message when it does not compile. `literal`
  // matches `pattern` as plain text.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Appends the non-overlapping matches in `text`, left to right, to `out` (empty matches are
  // skipped). `text` must be valid UTF-8 (the caller checked it; PCRE2 does not re-check).
  void find_all(std::string_view text, std::vector<Span>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace asynct::text
