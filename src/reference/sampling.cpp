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

int sample_token(const std::vector<float>& logits, const SamplingParams& params,
                 std::uint64_t step) {
  validate_sampling(params);
  check(!logits.empty(), "sampling: empty logits");
  for (std::size_t i = 0; i < logits.size(); ++i)
    check(std::isfinite(logits[i]), "sampling: logit ", i, " is not finite (", logits[i], ")");

  if (params.temperature == 0.0f)
    return int(std::max_element(logits.begin(), logits.end()) - logits.begin());

  // Tokens by decreasing logit (ties: lower id first), with their probabilities.
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return logits[std::size_t(a)] > logits[std::size_t(b)]; });
  const double max_logit = logits[std::size_t(order.front())];
  std::vector<double> prob(order.size());
  double total = 0.0;
  for (std::size_t r = 0; r < order.size(); ++r) {
    prob[r] = std::exp((double(logits[std::size_t(order[r])]) - max_logit) / params.temperature);
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
