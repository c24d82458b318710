#include "engine/drafter.h"

#include <algorithm>

#include "core/error.h"

namespace asynct {

void validate_speculative(const SpeculativeOptions& o) {
  check(o.method == "none" || o.method == "ngram", "--speculative must be none or ngram, got '", o.method, "'");
  check(o.num_tokens >= 1 && o.num_tokens <= 64, "--speculative-tokens must be in 1..64, got ", o.num_tokens);
  check(o.ngram_min >= 1 && o.ngram_max <= 64 && o.ngram_min <= o.ngram_max,
        "the n-gram match lengths must satisfy 1 <= min <= max <= 64, got ", o.ngram_min, " and ", o.ngram_max);
}

std::vector<std::int32_t> ngram_draft(std::span<const std::int32_t> tokens, int min_n, int max_n, int max_tokens) {
  const std::size_t size = tokens.size();
  if (max_tokens <= 0) return {};
  const int longest = int(std::min<std::size_t>(std::size_t(max_n), size > 0 ? size - 1 : 0));
  for (int n = longest; n >= min_n; --n) {
    const std::span<const std::int32_t> pattern = tokens.subspan(size - std::size_t(n));
    // The most recent start before the pattern's own, so that at least one token follows it.
    for (std::size_t start = size - std::size_t(n); start-- > 0;) {
      if (!std::equal(pattern.begin(), pattern.end(), tokens.begin() + std::ptrdiff_t(start))) continue;
      const std::size_t from = start + std::size_t(n);
      const std::size_t count = std::min<std::size_t>(std::size_t(max_tokens), size - from);
      return {tokens.begin() + std::ptrdiff_t(from), tokens.begin() + std::ptrdiff_t(from + count)};
    }
  }
  return {};
}

}  // namespace asynct
