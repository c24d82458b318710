#include "engine/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/error.h"

namespace asynct {

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
      s.token = std::int32_t(i);
    }
  }
  return s;
}

void check_finite(const LogitSummary& s) {
  check(s.nonfinite < 0, "sampling: logit ", s.nonfinite, " is not finite (", s.nonfinite_value, ")");
}

void apply_penalties(float* logits, std::size_t vocab, const SamplingParams& p, const PenaltyContext& context) {
  if (!p.has_penalties()) return;
  const auto penalise = [&](std::int32_t id, std::int32_t output_count, bool in_prompt) {
    check(id >= 0 && std::size_t(id) < vocab, "penalties: token id ", id, " is outside the vocabulary [0, ", vocab,
          ")");
    check(output_count >= 0, "penalties: token ", id, " has a negative output count (", output_count, ")");
    if (!in_prompt && output_count == 0) return;
    float x = logits[id];
    x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
    x -= p.frequency_penalty * float(output_count);
    if (output_count > 0) x -= p.presence_penalty;
    logits[id] = std::clamp(x, -FLT_MAX, FLT_MAX);
  };
  bool newest_listed = false;
  for (const PenaltyToken& t : context.tokens) {
    std::int32_t output_count = t.output_count;
    bool in_prompt = t.in_prompt != 0;
    if (t.id == context.newest) {  // the newest token counts once more
      newest_listed = true;
      if (context.newest_is_output)
        ++output_count;
      else
        in_prompt = true;
    }
    penalise(t.id, output_count, in_prompt);
  }
  if (context.newest >= 0 && !newest_listed)
    penalise(context.newest, context.newest_is_output ? 1 : 0, !context.newest_is_output);
}

void apply_logit_bias(float* logits, std::size_t vocab, std::span<const LogitBias> bias) {
  for (const LogitBias& b : bias) {
    check(b.id >= 0 && std::size_t(b.id) < vocab, "logit_bias: token id ", b.id, " is outside the vocabulary [0, ",
          vocab, ")");
    logits[b.id] = std::clamp(logits[b.id] + b.bias, -FLT_MAX, FLT_MAX);
  }
}

void apply_token_mask(float* logits, std::size_t vocab, const std::uint32_t* allowed) {
  for (std::size_t i = 0; i < vocab; ++i)
    if (!(allowed[i / 32] >> (i % 32) & 1u)) logits[i] = -FLT_MAX;
}

namespace {

struct Candidate {
  float logit;
  std::int32_t id;
};

// The sampling order: logit down, id up on ties.
bool comes_before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// A row's candidates in sampling order, with their weights w = exp((x - max) / temperature) and
// the masses of the order's prefixes. Sorting a 152K vocabulary costs ~10 ms, and a draw needs
// the order only where top-k, top-p, min-p and the draw cut it, so the candidates are grouped
// into buckets by how far below the maximum they lie (1/8 nat of weight each, everything beyond
// 64 nats in the last): every candidate of a bucket comes before every candidate of the next.
// A bucket is summed only when a prefix covers it, and sorted only as far as a walk goes into
// it. A prefix's mass is the sum of its whole buckets' masses (each summed in bucket order)
// and, in the bucket it ends inside, of its candidates in sampling order.
class SamplingOrder {
 public:
  // The candidates at(0) .. at(count - 1), in any order; max_logit the largest logit among them.
  // With sum_all, every bucket's mass is summed here, in the same pass.
  template <typename CandidateAt>
  SamplingOrder(std::size_t count, const CandidateAt& at, double max_logit, double temperature, bool sum_all)
      : max_logit_(max_logit), temperature_(temperature), candidates_(count), begin_(kBuckets + 1, 0),
        sorted_end_(kBuckets), mass_(kBuckets, sum_all ? 0.0 : -1.0) {
    // (bounded: a temperature near the smallest float would make it infinite, and 0 * inf NaN)
    const double buckets_per_unit = std::min(kPerNat / temperature, 1e300);
    std::vector<std::uint16_t> bucket(count);
    for (std::size_t i = 0; i < count; ++i) {
      const Candidate c = at(i);
      const double below = (max_logit - double(c.logit)) * buckets_per_unit;
      bucket[i] = std::uint16_t(below < kBuckets - 1 ? int(below) : kBuckets - 1);
      ++begin_[bucket[i] + 1u];
      if (sum_all) mass_[bucket[i]] += weight(c);
    }
    for (int b = 0; b < kBuckets; ++b) begin_[std::size_t(b) + 1] += begin_[std::size_t(b)];
    std::vector<std::size_t> fill(begin_.begin(), begin_.end() - 1);
    for (std::size_t i = 0; i < count; ++i) candidates_[fill[bucket[i]]++] = at(i);
    std::copy(begin_.begin(), begin_.end() - 1, sorted_end_.begin());
  }

  std::size_t size() const { return candidates_.size(); }
  const Candidate& operator[](std::size_t i) const { return candidates_[i]; }  // in bucket order

  std::int32_t id(std::size_t rank) {
    sort_through(bucket_of_rank(rank), rank);
    return candidates_[rank].id;
  }

  // The mass of ranks [0, n).
  double mass_before(std::size_t n) {
    double mass = 0.0;
    int b = 0;
    for (; b < kBuckets && begin_[std::size_t(b) + 1] <= n; ++b) mass += bucket_mass(b);
    if (b < kBuckets && begin_[std::size_t(b)] < n) {
      sort_through(b, n - 1);
      for (std::size_t r = begin_[std::size_t(b)]; r < n; ++r) mass += weight(candidates_[r]);
    }
    return mass;
  }

  // The first rank below `limit` at which the mass of ranks [0, rank] exceeds `threshold`
  // (reaches it, when !strictly); limit - 1 when none does (rounding). Whole buckets whose
  // mass leaves the sum short are stepped over unsorted.
  std::size_t first_reaching(double threshold, bool strictly, std::size_t limit) {
    const auto reaches = [&](double mass) { return strictly ? mass > threshold : mass >= threshold; };
    double mass = 0.0;
    for (int b = 0; b < kBuckets && begin_[std::size_t(b)] < limit; ++b) {
      const std::size_t begin = begin_[std::size_t(b)], end = std::min(begin_[std::size_t(b) + 1], limit);
      const bool whole = end == begin_[std::size_t(b) + 1];
      if (whole && !reaches(mass + bucket_mass(b))) {
        mass += bucket_mass(b);
        continue;
      }
      double running = mass;
      for (std::size_t r = begin; r < end; ++r) {
        sort_through(b, r);
        running += weight(candidates_[r]);
        if (reaches(running)) return r;
      }
      mass = whole ? mass + bucket_mass(b) : running;
    }
    return limit - 1;
  }

 private:
  static constexpr int kPerNat = 8, kNats = 64, kBuckets = kPerNat * kNats + 1;

  double weight(const Candidate& c) const { return std::exp((double(c.logit) - max_logit_) / temperature_); }

  int bucket_of_rank(std::size_t rank) const {
    return int(std::upper_bound(begin_.begin(), begin_.end(), rank) - begin_.begin()) - 1;
  }

  double bucket_mass(int b) {
    double& mass = mass_[std::size_t(b)];
    if (mass < 0.0) {
      mass = 0.0;
      for (std::size_t r = begin_[std::size_t(b)]; r < begin_[std::size_t(b) + 1]; ++r) mass += weight(candidates_[r]);
    }
    return mass;
  }

  // Sorts bucket b (which holds `rank`) at least through `rank`, in growing prefixes: a heap of
  // the next few (partial_sort) turns most candidates away with one comparison; a long head is
  // cheaper as one sort of the rest.
  void sort_through(int b, std::size_t rank) {
    std::size_t& sorted = sorted_end_[std::size_t(b)];
    if (rank < sorted) return;
    const std::size_t begin = begin_[std::size_t(b)], size = begin_[std::size_t(b) + 1] - begin;
    std::size_t want = std::max({rank + 1 - begin, 2 * (sorted - begin), std::size_t(64)});
    if (want >= size / 16) want = size;
    const auto first = candidates_.begin() + std::ptrdiff_t(sorted), middle = candidates_.begin() + std::ptrdiff_t(begin + want),
               last = candidates_.begin() + std::ptrdiff_t(begin + size);
    if (middle == last)
      std::sort(first, last, comes_before);
    else
      std::partial_sort(first, middle, last, comes_before);
    sorted = begin + want;
  }

  double max_logit_, temperature_;
  std::vector<Candidate> candidates_;   // grouped by bucket
  std::vector<std::size_t> begin_;      // [kBuckets + 1] each bucket's first rank, then the vocabulary size
  std::vector<std::size_t> sorted_end_;  // [kBuckets] ranks of each bucket in sampling order so far
  std::vector<double> mass_;            // [kBuckets] each bucket's mass; < 0 until summed
};

// The first k candidates in sampling order (in no order): one pass over the row, keeping a heap
// of the best so far whose front is the last of them (most candidates are turned away by one
// comparison with it).
std::vector<Candidate> first_candidates(const float* logits, std::size_t vocab, std::size_t k) {
  std::vector<Candidate> heap(k);
  for (std::size_t i = 0; i < k; ++i) heap[i] = {logits[i], std::int32_t(i)};
  std::make_heap(heap.begin(), heap.end(), comes_before);
  for (std::size_t i = k; i < vocab; ++i) {
    const Candidate c{logits[i], std::int32_t(i)};
    if (!comes_before(c, heap.front())) continue;
    std::pop_heap(heap.begin(), heap.end(), comes_before);
    heap.back() = c;
    std::push_heap(heap.begin(), heap.end(), comes_before);
  }
  return heap;
}

// Steps 3-5 of the order on finite processed logits whose argmax is `top`.
int draw_token(const float* logits, std::size_t vocab, const SamplingParams& p, std::uint64_t step, std::int32_t top) {
  const double max_logit = logits[top], temperature = p.temperature;
  // top-k: a short head is found in one pass and the rest of the row plays no further part.
  const std::size_t k = p.top_k > 0 ? std::min(vocab, std::size_t(p.top_k)) : vocab;
  std::vector<Candidate> head;
  if (k <= vocab / 16) head = first_candidates(logits, vocab, k);
  // Without top-k, top-p and the draw without cuts need the whole row's mass; min-p alone
  // only its head's.
  const bool sum_all = p.top_p < 1.0f || p.min_p == 0.0f;
  SamplingOrder order =
      head.empty()
          ? SamplingOrder(vocab, [&](std::size_t i) { return Candidate{logits[i], std::int32_t(i)}; }, max_logit,
                          temperature, sum_all)
          : SamplingOrder(k, [&](std::size_t i) { return head[i]; }, max_logit, temperature, false);
  std::size_t keep = k;
  if (p.top_p < 1.0f) keep = order.first_reaching(double(p.top_p) * order.mass_before(keep), false, keep) + 1;
  if (p.min_p > 0.0f) {
    // w >= min_p, i.e. x >= max + T ln(min_p): a prefix of the order, the top token in it.
    const double floor = max_logit + temperature * std::log(double(p.min_p));
    std::size_t at_least = 0;
    for (std::size_t i = 0; i < order.size(); ++i) at_least += double(order[i].logit) >= floor ? 1 : 0;
    keep = std::min(keep, at_least);
  }
  const double target = uniform_draw(p.seed, step) * order.mass_before(keep);
  return order.id(order.first_reaching(target, true, keep));
}

}  // namespace

int sample_token(const std::vector<float>& logits, const SamplingParams& params, std::uint64_t step) {
  return sample_token(logits.data(), logits.size(), params, step);
}

int sample_token(const float* logits, std::size_t vocab, const SamplingParams& params, std::uint64_t step) {
  validate_sampling(params);
  check(vocab > 0, "sampling: empty logits");
  const LogitSummary summary = summarize_logits(logits, vocab);
  check_finite(summary);
  if (params.temperature == 0.0f) return summary.token;
  return draw_token(logits, vocab, params, step, summary.token);
}

void fill_logprobs(const float* logits, std::size_t vocab, int n, LogitSummary& s, std::vector<TopLogprob>* top) {
  const double max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (std::size_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max_logit);
  const double log_norm = max_logit + std::log(sum);  // log_softmax(x)_i = x_i - log_norm
  s.logprob = float(double(logits[s.token]) - log_norm);
  if (top == nullptr) return;
  top->clear();
  // The n first in sampling order, by insertion into a short sorted list.
  const std::size_t wanted = std::min(vocab, std::size_t(std::max(n, 0)));
  std::vector<Candidate> best;
  best.reserve(wanted + 1);
  for (std::size_t i = 0; i < vocab && wanted > 0; ++i) {
    const Candidate c{logits[i], std::int32_t(i)};
    if (best.size() == wanted && !comes_before(c, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), c, comes_before), c);
    if (best.size() > wanted) best.pop_back();
  }
  for (const Candidate& c : best) top->push_back({c.id, float(double(c.logit) - log_norm)});
}

LogitSummary sample_logit_row(const float* logits, std::size_t vocab, const RowSampling& row,
                              const PenaltyContext& penalties, std::vector<TopLogprob>* top,
                              std::span<const LogitBias> bias, const std::uint32_t* allowed) {
  const SamplingParams& p = row.params;
  validate_sampling(p);
  check(vocab > 0, "sampling: empty logits");
  if (top) top->clear();
  LogitSummary s = summarize_logits(logits, vocab);
  if (s.nonfinite >= 0) return s;
  const float* processed = logits;
  std::vector<float> penalised;
  if (!bias.empty() || p.has_penalties() || allowed) {
    penalised.assign(logits, logits + vocab);
    apply_logit_bias(penalised.data(), vocab, bias);
    apply_penalties(penalised.data(), vocab, p, penalties);
    if (allowed) apply_token_mask(penalised.data(), vocab, allowed);
    processed = penalised.data();
    s.token = summarize_logits(processed, vocab).token;
  }
  if (p.temperature > 0.0f) {
    const std::int32_t best = s.token;
    s.token = draw_token(processed, vocab, p, row.step, best);
    // (a draw whose sums round past the allowed tokens' would land on a disallowed one of weight 0)
    if (allowed && !(allowed[std::size_t(s.token) / 32] >> (std::size_t(s.token) % 32) & 1u)) s.token = best;
  }
  if (p.logprobs >= 0) fill_logprobs(logits, vocab, p.logprobs, s, top);
  return s;
}

}  // namespace asynct
