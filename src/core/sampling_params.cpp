#include "core/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace asynct {

void validate_sampling(const SamplingParams& p) {
  check(std::isfinite(p.temperature) && p.temperature >= 0.0f,
        "sampling: temperature must be finite and >= 0, got ", p.temperature);
  check(p.top_k >= 0, "sampling: top_k must be >= 0, got ", p.top_k);
  check(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p must be in (0, 1], got ", p.top_p);
  check(p.min_p >= 0.0f && p.min_p <= 1.0f, "sampling: min_p must be in [0, 1], got ", p.min_p);
  check(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
        "sampling: repetition_penalty must be finite and > 0, got ", p.repetition_penalty);
  check(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f,
        "sampling: presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  check(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f,
        "sampling: frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  check(p.logprobs >= -1 && p.logprobs <= kMaxTopLogprobs, "sampling: logprobs must be in -1..", kMaxTopLogprobs,
        " (-1: none), got ", p.logprobs);
}

void validate_logit_bias(const LogitBias* bias, std::size_t count, int vocab) {
  check(count <= std::size_t(kMaxLogitBiasTokens), "logit_bias: at most ", kMaxLogitBiasTokens,
        " tokens, got ", count);
  std::vector<std::int32_t> ids;
  ids.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const LogitBias& b = bias[i];
    check(b.id >= 0 && b.id < vocab, "logit_bias: token id ", b.id, " is outside the vocabulary [0, ", vocab, ")");
    check(std::isfinite(b.bias) && b.bias >= -kMaxLogitBias && b.bias <= kMaxLogitBias, "logit_bias: the bias of token ",
          b.id, " must be in [", -kMaxLogitBias, ", ", kMaxLogitBias, "], got ", b.bias);
    ids.push_back(b.id);
  }
  std::sort(ids.begin(), ids.end());
  const auto twice = std::adjacent_find(ids.begin(), ids.end());
  check(twice == ids.end(), "logit_bias: token id ", twice == ids.end() ? 0 : *twice, " is listed twice");
}

}  // namespace asynct
