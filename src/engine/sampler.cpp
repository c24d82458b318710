#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace asynct {

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

  // Weights proportional to the tempered probabilities; normalising is not needed, since every
  // test below compares a mass with a fraction of another mass.
  const double max_logit = logits[summary.greedy];
  const auto tempered = [&](int id) { return std::exp((double(logits[id]) - max_logit) / params.temperature); };
  std::vector<double> weights;  // of the whole vocabulary, when its mass is needed
  if (params.top_k == 0) {
    weights.resize(vocab);
    for (std::size_t i = 0; i < vocab; ++i) weights[i] = tempered(int(i));
  }
  const auto weight = [&](int id) { return weights.empty() ? tempered(id) : weights[std::size_t(id)]; };
  const double target_unit = uniform_draw(params.seed, step);

  if (params.top_k == 0 && params.top_p >= 1.0f) {
    // Nothing is cut: draw from the whole vocabulary in id order (no sort needed).
    double total = 0.0;
    for (std::size_t i = 0; i < vocab; ++i) total += weight(int(i));
    const double target = target_unit * total;
    double cumulative = 0.0;
    for (std::size_t i = 0; i < vocab; ++i) {
      cumulative += weight(int(i));
      if (target < cumulative) return int(i);
    }
    return int(vocab - 1);
  }

  // The candidates by decreasing logit (ties: lower id first). Only the head of that order is
  // ever needed, so it is sorted in growing prefixes rather than all of it (a 152K vocabulary
  // sorted per token costs milliseconds).
  struct Candidate {
    float logit;
    int id;
  };
  const auto before = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  std::vector<Candidate> order(vocab);
  for (std::size_t i = 0; i < vocab; ++i) order[i] = {logits[i], int(i)};
  // order[0, sorted) is the head of the order, and nothing after it comes before any of it.
  std::size_t sorted = 0;
  const auto sort_prefix = [&](std::size_t n) {
    n = n > vocab / 16 ? vocab : n;  // a long head: one full sort is cheaper than more rounds
    if (n <= sorted) return;
    // A heap of the n best (partial_sort) turns most tokens away with one comparison: faster
    // for a short head than nth_element (measured 0.39 against 1.3 ms per 152K row, top-k 50).
    if (n == vocab)
      std::sort(order.begin() + std::ptrdiff_t(sorted), order.end(), before);
    else
      std::partial_sort(order.begin() + std::ptrdiff_t(sorted), order.begin() + std::ptrdiff_t(n), order.end(), before);
    sorted = n;
  };

  // Without top-k, top-p's head can be thousands of tokens long, and finding it by growing
  // sorted prefixes cost up to 15 ms per row at a 152K vocabulary. Instead: bucket the tokens
  // by how far their logit lies below the maximum (in 1/8 nats of tempered weight), add up
  // each bucket's mass, and sort only the buckets down to the one where the mass reaches
  // `needed`, plus one more for rounding (the walk below sums in sorted order, the buckets
  // did not). Every token of a later bucket has a lower logit than every token sorted, so the
  // head is exact; should the walk still run past it, sort_prefix takes over.
  const auto sort_nucleus_candidates = [&](double needed) {
    constexpr int kPerNat = 8, kNats = 64, kBuckets = kPerNat * kNats + 1;  // beyond 64 nats: the last
    const auto bucket = [&](float logit) {
      const double below = (max_logit - double(logit)) / params.temperature;
      return below >= kNats ? kBuckets - 1 : int(below * kPerNat);
    };
    std::vector<double> mass(kBuckets, 0.0);
    for (std::size_t i = 0; i < vocab; ++i) mass[std::size_t(bucket(logits[i]))] += weights[i];
    int last = 0;  // the first bucket whose cumulative mass reaches `needed`
    double cumulative = mass[0];
    while (last < kBuckets - 1 && cumulative < needed * (1.0 + 1e-9)) cumulative += mass[std::size_t(++last)];
    last = std::min(last + 1, kBuckets - 1);  // one more for rounding
    const auto head_end = std::partition(order.begin(), order.end(), [&](const Candidate& c) { return bucket(c.logit) <= last; });
    std::sort(order.begin(), head_end, before);
    sorted = std::size_t(head_end - order.begin());
  };

  std::size_t keep = params.top_k > 0 ? std::min(vocab, std::size_t(params.top_k)) : vocab;
  double kept_mass = 0.0;  // the mass of the first `keep` candidates
  if (params.top_k > 0) {
    sort_prefix(keep);
    for (std::size_t r = 0; r < keep; ++r) kept_mass += weight(order[r].id);
  } else {
    for (std::size_t i = 0; i < vocab; ++i) kept_mass += weight(int(i));
  }
  if (params.top_p < 1.0f) {
    // top-p applies to the distribution renormalised over what top-k kept: the smallest head
    // whose mass reaches top_p of the kept mass.
    const double needed = double(params.top_p) * kept_mass;
    if (params.top_k == 0) sort_nucleus_candidates(needed);
    double mass = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      if (n == sorted) sort_prefix(std::max<std::size_t>(64, 4 * sorted));
      mass += weight(order[n++].id);
      if (mass >= needed) break;
    }
    keep = n;
    kept_mass = mass;
  }

  const double target = target_unit * kept_mass;
  double cumulative = 0.0;
  for (std::size_t r = 0; r < keep; ++r) {
    cumulative += weight(order[r].id);
    if (target < cumulative) return order[r].id;
  }
  return order[keep - 1].id;
}

}  // namespace asynct
