#include "reference/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace asynct {

void validate_sampling(const SamplingParams& p) {
  check(std::isfinite(p.temperature) && p.temperature >= 0.0f,
        "sampling: temperature must be finite and >= 0, got ", p.temperature);
  check(p.top_k >= 0, "sampling: top_k must be >= 0, got ", p.top_k);
  check(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p must be in (0, 1], got ", p.top_p);
}

double uniform_draw(std::uint64_t seed, std::uint64_t step) {
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const std::uint64_t bits = mix(mix(seed) ^ step);
  return double(bits >> 11) * 0x1.0p-53;  // 53 random bits
}

LogitSummary summarize_logits(const float* logits, std::size_t vocab) {
  LogitSummary s;
  float best = 0.0f;
  for (std::size_t i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (!std::isfinite(v)) {
      s.nonfinite = std::int32_t(i);
      s.nonfinite_value = v;
      return s;
    }
    if (i == 0 || v > best) {  // strictly greater: the lowest id wins ties (as std::max_element)
      best = v;
      s.greedy = std::int32_t(i);
    }
  }
  return s;
}

void check_finite(const LogitSummary& s) {
  check(s.nonfinite < 0, "sampling: logit ", s.nonfinite, " is not finite (", s.nonfinite_value, ")");
}

int sample_token(const std::vector<float>& logits, const SamplingParams& params, std::uint64_t step) {
  return sample_token(logits.data(), logits.size(), params, step);
}

int sample_token(const float* logits, std::size_t vocab, const SamplingParams& params, std::uint64_t step) {
  validate_sampling(params);
  check(vocab > 0, "sampling: empty logits");
  const LogitSummary summary = summarize_logits(logits, vocab);
  check_finite(summary);
  if (params.temperature == 0.0f) return summary.greedy;

  // Tokens by decreasing logit (ties: lower id first), with their probabilities.
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const double max_logit = logits[order.front()];
  std::vector<double> prob(order.size());
  double total = 0.0;
  for (std::size_t r = 0; r < order.size(); ++r) {
    prob[r] = std::exp((double(logits[order[r]]) - max_logit) / params.temperature);
    total += prob[r];
  }
  for (double& p : prob) p /= total;

  std::size_t keep = order.size();
  if (params.top_k > 0) keep = std::min(keep, std::size_t(params.top_k));
  if (params.top_p < 1.0f) {
    // top-p applies to the distribution renormalised over what top-k kept.
    const double kept_mass = std::accumulate(prob.begin(), prob.begin() + std::ptrdiff_t(keep), 0.0);
    double mass = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      mass += prob[n++];
      if (mass >= double(params.top_p) * kept_mass) break;
    }
    keep = n;
  }

  const double kept = std::accumulate(prob.begin(), prob.begin() + std::ptrdiff_t(keep), 0.0);
  const double target = uniform_draw(params.seed, step) * kept;
  double cumulative = 0.0;
  for (std::size_t r = 0; r < keep; ++r) {
    cumulative += prob[r];
    if (target < cumulative) return order[r];
  }
  return order[keep - 1];
}

}  // namespace asynct
