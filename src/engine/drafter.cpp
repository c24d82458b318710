#include "engine/drafter.h"

#include <algorithm>

#include "core/error.h"

namespace asynct {

void validate_speculative(const SpeculativeOptions& o, bool allow_forced) {
  check(o.method == "none" || o.method == "ngram" || o.method == "suffix" || o.method == "draft" ||
            (allow_forced && o.method == "forced"),
        "--speculative must be none, ngram, suffix or draft", allow_forced ? " (or forced, to time verification)" : "", ", got '",
        o.method, "'");
  check(o.num_tokens >= 1 && o.num_tokens <= 64, "--speculative-tokens must be in 1..64, got ", o.num_tokens);
  check(o.ngram_min >= 1 && o.ngram_max <= 64 && o.ngram_min <= o.ngram_max,
        "the n-gram match lengths must satisfy 1 <= min <= max <= 64, got ", o.ngram_min, " and ", o.ngram_max);
  check(o.suffix_depth >= 2 && o.suffix_depth <= 64, "--suffix-depth must be in 2..64, got ", o.suffix_depth);
  check(o.suffix_min_probability >= 0 && o.suffix_min_probability <= 1,  // (false for NaN too)
        "--suffix-min-probability must be in [0, 1], got ", o.suffix_min_probability);
  check(o.suffix_cache_tokens >= 0 && o.suffix_cache_tokens <= (std::int64_t(1) << 30),
        "--suffix-cache-tokens must be in 0..2^30, got ", o.suffix_cache_tokens);
  check(o.suffix_request_tokens >= 1 && o.suffix_request_tokens <= (std::int64_t(1) << 30),
        "--suffix-request-tokens must be in 1..2^30, got ", o.suffix_request_tokens);
  check(o.max_batch >= 0 && o.max_batch <= (1 << 20), "--speculative-max-batch must be in 0..2^20, got ", o.max_batch);
  check(o.max_pause >= 0 && o.max_pause <= (1 << 20), "the longest drafting pause must be in 0..2^20 steps, got ", o.max_pause);
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
