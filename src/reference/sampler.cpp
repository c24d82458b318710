#include "reference/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/uniform_draw.h"

namespace asynct {

std::vector<int> reference_sampling_order(const std::vector<float>& x) {
  std::vector<int> order(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[std::size_t(a)] > x[std::size_t(b)]; });
  return order;
}

std::vector<std::pair<int, double>> reference_kept(const std::vector<float>& x, const std::vector<int>& order,
                                                   const SamplingParams& p) {
  const double max_logit = x[std::size_t(order[0])];
  std::vector<std::pair<int, double>> kept;
  for (int id : order) kept.push_back({id, std::exp((double(x[std::size_t(id)]) - max_logit) / p.temperature)});
  if (p.top_k > 0 && std::size_t(p.top_k) < kept.size()) kept.resize(std::size_t(p.top_k));
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (const auto& k : kept) mass += k.second;
    const double needed = double(p.top_p) * mass;
    double cumulative = 0.0;
    std::size_t n = 0;
    while (n < kept.size()) {
      cumulative += kept[n++].second;
      if (cumulative >= needed) break;
    }
    kept.resize(n);
  }
  if (p.min_p > 0.0f) {
    const double floor = max_logit + double(p.temperature) * std::log(double(p.min_p));
    std::size_t n = 0;
    while (n < kept.size() && double(x[std::size_t(kept[n].first)]) >= floor) ++n;
    kept.resize(n);
  }
  return kept;
}

int reference_draw(const std::vector<std::pair<int, double>>& kept, const SamplingParams& p, std::uint64_t step) {
  check(!kept.empty(), "sampling: nothing kept");
  double mass = 0.0;
  for (const auto& k : kept) mass += k.second;
  const double target = uniform_draw(p.seed, step) * mass;
  double cumulative = 0.0;
  for (const auto& k : kept)
    if (target < (cumulative += k.second)) return k.first;
  return kept.back().first;
}

int reference_sample_token(const std::vector<float>& logits, const SamplingParams& p, std::uint64_t step) {
  validate_sampling(p);
  check(!logits.empty(), "sampling: empty logits");
  for (std::size_t i = 0; i < logits.size(); ++i) check(std::isfinite(logits[i]), "sampling: logit ", i, " is not finite");
  const std::vector<int> order = reference_sampling_order(logits);
  if (p.temperature == 0.0f) return order[0];
  return reference_draw(reference_kept(logits, order, p), p, step);
}

}  // namespace asynct
