// The device sampler (kernels/sampling/sample_rows.h) against the host sampler:
//   - greedy rows (with and without penalties or a logit bias) and non-finite rows: exactly;
//   - seeded draws: the same token as the host for the same (seed, step), but for draws that
//     land within rounding of a boundary between two tokens (the host sums weights in double,
//     the device in 32-bit fixed point): at most 1 in 1000 may differ;
//   - the distribution of many draws: chi-square against the exact probabilities of the kept
//     tokens, computed here from a full sort (p > 1e-6 required);
//   - logprobs: the sampled token's and the top-n, against a log-softmax in double (1e-4);
//   - the small top-k path (1 <= top-k <= 64) against the histogram's: the same tokens;
//   - the paths: few candidates (top-k), the draw's bin (no cut), min-p, and more candidates
//     than the gather holds (top-p alone on a flat row, top-k 3000, a row of equal logits);
//     vocabularies of 151936 (in 8- and 7-block clusters), 49152 and odd sizes; the same launch
//     twice gives the same tokens.
// (Over 500 lines: every case shares the batch builders and the host's answers written here.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/sampling_params.h"
#include "engine/sampler.h"
#include "gpu/device_buffer.h"
#include "kernels/common/cuda_array.h"
#include "kernels/sampling/sample_rows.h"
#include "support/random.h"

namespace asynct {
namespace {

using kernels::DeviceArray;

template <typename T>
DeviceArray<T> to_device(const std::vector<T>& host) {
  DeviceArray<T> d{std::max<std::size_t>(host.size(), 1)};
  if (!host.empty()) ASYNCT_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> to_host(const DeviceArray<T>& d, std::size_t n) {
  std::vector<T> host(n);
  ASYNCT_CUDA_CHECK(cudaMemcpy(host.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// One launch's inputs: rows of logits, each row's sampling, penalty entries, logit bias and input token.
struct Batch {
  int vocab = 0;
  std::vector<float> logits;  // [rows * vocab]
  std::vector<RowSampling> sampling;
  std::vector<PenaltyToken> penalties;
  std::vector<LogitBias> bias;
  std::vector<std::int32_t> newest;  // each row's input token
  std::vector<std::uint32_t> masks;  // the rows' allowed-token bitmasks
  int rows() const { return int(sampling.size()); }
  void add(const float* row, const RowSampling& rs, std::int32_t input_token, const std::vector<PenaltyToken>& entries = {},
           const std::vector<LogitBias>& row_bias = {}, const std::vector<std::uint32_t>* allowed = nullptr) {
    logits.insert(logits.end(), row, row + vocab);
    RowSampling r = rs;
    r.mask_offset = allowed ? int(masks.size()) : -1;
    if (allowed) masks.insert(masks.end(), allowed->begin(), allowed->end());
    r.penalty_begin = std::int32_t(penalties.size());
    penalties.insert(penalties.end(), entries.begin(), entries.end());
    r.penalty_end = std::int32_t(penalties.size());
    r.bias_begin = std::int32_t(bias.size());
    bias.insert(bias.end(), row_bias.begin(), row_bias.end());
    r.bias_end = std::int32_t(bias.size());
    sampling.push_back(r);
    newest.push_back(input_token);
  }
};

struct Sampled {
  std::vector<LogitSummary> summaries;
  std::vector<TopLogprob> top;  // [rows * kMaxTopLogprobs]
};

Sampled sample_on_device(const Batch& b, int cluster_blocks = 0, bool small_top_k = true) {
  const int rows = b.rows();
  DeviceArray<float> logits = to_device(b.logits);
  DeviceArray<RowSampling> sampling = to_device(b.sampling);
  DeviceArray<PenaltyToken> penalties = to_device(b.penalties);
  DeviceArray<LogitBias> bias = to_device(b.bias);
  DeviceArray<std::uint32_t> masks = to_device(b.masks);
  // Input tokens at scattered positions, as a step's flattened tokens are.
  std::vector<std::int32_t> tokens(std::size_t(2 * rows), 7), logit_rows(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) logit_rows[std::size_t(r)] = 2 * r + 1, tokens[std::size_t(2 * r + 1)] = b.newest[std::size_t(r)];
  DeviceArray<std::int32_t> d_tokens = to_device(tokens), d_rows = to_device(logit_rows);
  DeviceArray<LogitSummary> summaries{std::size_t(rows)};
  DeviceArray<TopLogprob> top{std::size_t(rows) * kMaxTopLogprobs};
  ASYNCT_CUDA_CHECK(cudaMemset(summaries.get(), 0xFF, std::size_t(rows) * sizeof(LogitSummary)));
  ASYNCT_CUDA_CHECK(cudaMemset(top.get(), 0xFF, std::size_t(rows) * kMaxTopLogprobs * sizeof(TopLogprob)));
  kernels::SampleRowsArgs a;
  a.logits = logits.get();
  a.rows = rows;
  a.vocab = b.vocab;
  a.sampling = sampling.get();
  a.penalty_tokens = penalties.get();
  a.logit_bias = bias.get();
  a.token_masks = masks.get();
  a.tokens = d_tokens.get();
  a.logit_rows = d_rows.get();
  a.summaries = summaries.get();
  a.top_logprobs = top.get();
  a.cluster_blocks = cluster_blocks;
  a.small_top_k = small_top_k;
  kernels::launch_sample_rows(a, nullptr);
  testing::check_launch("sample_rows");
  return {to_host(summaries, std::size_t(rows)), to_host(top, std::size_t(rows) * kMaxTopLogprobs)};
}

// The host's answer for row r of the batch: the host sampler's bias, penalties and draw.
int host_token(const Batch& b, int r) {
  const RowSampling& rs = b.sampling[std::size_t(r)];
  std::vector<float> row(b.logits.begin() + std::ptrdiff_t(r) * b.vocab, b.logits.begin() + std::ptrdiff_t(r + 1) * b.vocab);
  apply_logit_bias(row.data(), row.size(),
                   std::span<const LogitBias>(b.bias).subspan(std::size_t(rs.bias_begin), std::size_t(rs.bias_end - rs.bias_begin)));
  if (rs.params.has_penalties()) {
    const PenaltyContext context{std::span<const PenaltyToken>(b.penalties).subspan(std::size_t(rs.penalty_begin),
                                                                                  std::size_t(rs.penalty_end - rs.penalty_begin)),
                                 b.newest[std::size_t(r)], rs.newest_is_output != 0};
    apply_penalties(row.data(), row.size(), rs.params, context);
  }
  const std::uint32_t* allowed = rs.mask_offset >= 0 ? b.masks.data() + rs.mask_offset : nullptr;
  if (allowed == nullptr) return sample_token(row.data(), row.size(), rs.params, rs.step);
  apply_token_mask(row.data(), row.size(), allowed);
  const int token = sample_token(row.data(), row.size(), rs.params, rs.step);
  // (as the host sampler does: a draw that rounds onto a token of weight 0 takes the best)
  return allowed[token / 32] >> (token % 32) & 1u ? token : summarize_logits(row.data(), row.size()).token;
}

// log_softmax of a raw row in double.
std::vector<double> log_softmax(const float* row, int vocab) {
  const double peak = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - peak);
  std::vector<double> out(static_cast<std::size_t>(vocab));
  for (int i = 0; i < vocab; ++i) out[std::size_t(i)] = double(row[i]) - peak - std::log(sum);
  return out;
}

// The exact probabilities of a penalty-free row under p, in the reference order: sort, top-k,
// top-p, min-p, renormalise.
std::vector<double> kept_probabilities(const float* row, int vocab, const SamplingParams& p) {
  std::vector<int> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  const double peak = row[order[0]];
  std::vector<double> w(static_cast<std::size_t>(vocab));
  for (int i = 0; i < vocab; ++i) w[std::size_t(i)] = std::exp((double(row[i]) - peak) / p.temperature);
  std::size_t keep = p.top_k > 0 ? std::min<std::size_t>(std::size_t(p.top_k), order.size()) : order.size();
  double kept = 0;
  for (std::size_t i = 0; i < keep; ++i) kept += w[std::size_t(order[i])];
  if (p.top_p < 1.0f) {
    double mass = 0;
    std::size_t n = 0;
    while (n < keep) {
      mass += w[std::size_t(order[n++])];
      if (mass >= p.top_p * kept) break;
    }
    keep = n;
  }
  if (p.min_p > 0.0f)
    while (keep > 1 && w[std::size_t(order[keep - 1])] < p.min_p) --keep;
  std::vector<double> prob(std::size_t(vocab), 0.0);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += w[std::size_t(order[i])];
  for (std::size_t i = 0; i < keep; ++i) prob[std::size_t(order[i])] = w[std::size_t(order[i])] / total;
  return prob;
}

RowSampling sampled(float temperature, int top_k, float top_p, float min_p, std::uint64_t seed, std::uint64_t step) {
  RowSampling rs;
  rs.params.temperature = temperature;
  rs.params.top_k = top_k;
  rs.params.top_p = top_p;
  rs.params.min_p = min_p;
  rs.params.seed = seed;
  rs.step = step;
  return rs;
}

struct Config {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float scale;  // the logits' standard deviation: small = flat rows, many candidates
};

// Each config: 256 draws of one row (steps 0..255) in one launch, compared token by token with
// the host; `launches` launches of different seeds for the chi-square.
void check_draws(int vocab, const Config& c, int launches, std::uint64_t seed_base, int cluster_blocks = 0) {
  testing::Random rng(seed_base);
  Tensor logits = rng.normal({1, vocab}, c.scale);
  const float* row = logits.data_as<float>();
  const std::vector<double> prob = kept_probabilities(row, vocab, sampled(c.temperature, c.top_k, c.top_p, c.min_p, 0, 0).params);
  std::vector<long> counts(std::size_t(vocab), 0);
  long draws = 0, differ = 0;
  for (int l = 0; l < launches; ++l) {
    Batch b;
    b.vocab = vocab;
    for (int s = 0; s < 256; ++s) b.add(row, sampled(c.temperature, c.top_k, c.top_p, c.min_p, seed_base + std::uint64_t(l), std::uint64_t(s)), 0);
    const Sampled got = sample_on_device(b, cluster_blocks);
    for (int s = 0; s < b.rows(); ++s) {
      const LogitSummary& g = got.summaries[std::size_t(s)];
      ASSERT_EQ(g.nonfinite, -1) << c.name << ", " << cluster_blocks << "-block clusters";
      ASSERT_TRUE(g.token >= 0 && g.token < vocab) << c.name << ": token " << g.token;
      ASSERT_GT(prob[std::size_t(g.token)], 0.0) << c.name << ": drew token " << g.token << ", which the cuts drop";
      ++counts[std::size_t(g.token)];
      ++draws;
      if (l == 0) differ += g.token != host_token(b, s) ? 1 : 0;
    }
  }
  EXPECT_LE(differ, 1) << c.name << ", " << cluster_blocks << "-block clusters" << ": tokens that differ from the host's for the same (seed, step), of 256";
  // Chi-square over the kept tokens, the rare ones (expected < 5) pooled.
  double chi2 = 0, pooled_expected = 0, pooled_observed = 0;
  int dof = -1;
  for (int i = 0; i < vocab; ++i) {
    const double e = prob[std::size_t(i)] * double(draws);
    if (e == 0.0) continue;
    if (e < 5.0) {
      pooled_expected += e, pooled_observed += double(counts[std::size_t(i)]);
      continue;
    }
    chi2 += (double(counts[std::size_t(i)]) - e) * (double(counts[std::size_t(i)]) - e) / e, ++dof;
  }
  if (pooled_expected > 0) chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected, ++dof;
  if (dof < 1) return;  // one token kept: every draw was checked above
  // Wilson-Hilferty: chi2/dof is about normal with mean 1 - 2/(9 dof) and sd sqrt(2/(9 dof));
  // z > 4.75 has probability 1e-6.
  const double k = dof, z = (std::cbrt(chi2 / k) - (1 - 2 / (9 * k))) / std::sqrt(2 / (9 * k));
  EXPECT_LT(z, 4.75) << c.name << ", " << cluster_blocks << "-block clusters" << ": chi-square " << chi2 << " on " << dof << " degrees of freedom, " << draws << " draws";
}

TEST(DeviceSampleRows, DrawsMatchTheHostAndTheDistribution) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  const Config configs[] = {
      {"top-k 50, top-p 0.9", 1.0f, 50, 0.9f, 0.0f, 2.0f},
      {"top-k 20", 0.7f, 20, 1.0f, 0.0f, 2.0f},
      {"top-p 0.8", 1.0f, 0, 0.8f, 0.0f, 3.0f},
      {"min-p 0.05", 1.0f, 0, 1.0f, 0.05f, 3.0f},
      {"temperature only", 1.3f, 0, 1.0f, 0.0f, 3.0f},
      {"top-p alone, flat row (bisection)", 1.0f, 0, 0.5f, 0.0f, 0.05f},
      {"top-k 3000 (bisection)", 1.0f, 3000, 0.95f, 0.0f, 1.0f},
      {"everything", 0.8f, 40, 0.9f, 0.02f, 2.5f},
      {"peaked row, top-k past 48 nats", 0.8f, 50, 0.9f, 0.0f, 45.0f},
      {"peaked row, top-k alone", 1.0f, 50, 1.0f, 0.0f, 45.0f},
  };
  // The bisection configurations take ~1 ms a row: fewer launches of them.
  const auto launches = [](const Config& c, int n) { return std::string(c.name).find("bisection") != std::string::npos ? 1 : n; };
  for (const Config& c : configs) check_draws(151936, c, launches(c, 8), 100, 8);
  for (const Config& c : configs) check_draws(151936, c, launches(c, 4), 600, 7);
  for (const Config& c : configs) check_draws(49152, c, launches(c, 4), 200);
  check_draws(1000, configs[0], 8, 300);
  check_draws(7, configs[4], 8, 400);
  check_draws(100003, configs[2], 4, 500);
}

TEST(DeviceSampleRows, GreedyWithPenaltiesIsExact) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  for (int vocab : {151936, 49152, 4099, 13}) {
    testing::Random rng{std::uint64_t(vocab)};
    Tensor logits = rng.normal({12, vocab}, 2.0f);
    Batch b;
    b.vocab = vocab;
    for (int r = 0; r < 12; ++r) {
      const float* row = logits.data_as<float>() + std::int64_t(r) * vocab;
      const int top = int(std::max_element(row, row + vocab) - row);
      RowSampling rs;
      rs.params.repetition_penalty = r % 3 == 0 ? 1.0f : 1.3f + 0.2f * float(r);
      rs.params.presence_penalty = r % 2 ? 0.5f : 0.0f;
      rs.params.frequency_penalty = r % 4 == 1 ? 0.7f : -0.2f;
      rs.newest_is_output = r % 2;
      // The argmax penalised (so the answer moves), negative logits, the newest token among the
      // entries and not.
      std::vector<PenaltyToken> entries = {{top, r % 3, 1}, {(top + 1) % vocab, 2, 0}, {(top + 7) % vocab, 0, 1}};
      const int newest = r % 4 == 0 ? top : (top + 11) % vocab;
      b.add(row, rs, newest, r == 5 ? std::vector<PenaltyToken>{} : entries);
    }
    const Sampled got = sample_on_device(b);
    for (int r = 0; r < b.rows(); ++r)
      EXPECT_EQ(got.summaries[std::size_t(r)].token, host_token(b, r)) << "vocab " << vocab << ", row " << r;
  }
}

// A logit bias comes before everything else, as on the host: -100 on the argmax moves a greedy
// row, +100 forces a token (drawn too), many moderate entries over every block's slice, with
// penalties and with logprobs (which stay the raw row's); a bias on a non-finite raw logit is
// reported as the host reports it.
TEST(DeviceSampleRows, BiasedRowsMatchTheHost) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  for (int vocab : {151936, 4099}) {
    testing::Random rng{std::uint64_t(vocab) + 1};
    Tensor logits = rng.normal({1, vocab}, 2.0f);
    const float* row = logits.data_as<float>();
    const int top = int(std::max_element(row, row + vocab) - row);
    std::vector<LogitBias> moderate;
    for (int id = 5; id < vocab && moderate.size() < 300; id += vocab / 300 + 1) moderate.push_back({id, float(id % 9) - 4.0f});
    const std::vector<std::vector<LogitBias>> biases = {{{top, -100.0f}}, {{(top + 3) % vocab, 100.0f}}, moderate};
    Batch b;
    b.vocab = vocab;
    for (int r = 0; r < 24; ++r) {
      RowSampling rs = r % 2 ? sampled(0.9f, r % 4 == 1 ? 40 : 0, 0.95f, 0.0f, 5, std::uint64_t(r)) : RowSampling{};
      rs.params.repetition_penalty = r % 3 == 2 ? 1.3f : 1.0f;
      rs.params.logprobs = r % 5 == 0 ? 3 : -1;
      b.add(row, rs, top, {{top, 1, 0}, {(top + 5) % vocab, 0, 1}}, biases[std::size_t(r % 3)]);
    }
    const Sampled got = sample_on_device(b);
    const std::vector<double> raw = log_softmax(row, vocab);
    for (int r = 0; r < b.rows(); ++r) {
      const LogitSummary& s = got.summaries[std::size_t(r)];
      EXPECT_EQ(s.token, host_token(b, r)) << "vocab " << vocab << ", row " << r;
      if (r % 3 == 0) EXPECT_NE(s.token, top) << "row " << r;
      if (r % 3 == 1) EXPECT_EQ(s.token, (top + 3) % vocab) << "row " << r;
      if (b.sampling[std::size_t(r)].params.logprobs >= 0) {
        EXPECT_NEAR(s.logprob, raw[std::size_t(s.token)], 1e-4) << "row " << r;
        EXPECT_EQ(got.top[std::size_t(r) * kMaxTopLogprobs].id, top) << "row " << r;
      }
    }
  }
  std::vector<float> bad(4099, 0.5f);
  bad[77] = INFINITY;
  Batch b;
  b.vocab = 4099;
  b.add(bad.data(), RowSampling{}, 0, {}, {{77, -100.0f}});
  EXPECT_EQ(sample_on_device(b).summaries[0].nonfinite, 77);
}

// An allowed-token mask (structured output) comes after the bias and penalties, as on the host:
// one allowed token, three, every other token, all but the raw best few; greedy and sampled
// through the small top-k path, top-p alone and a large top-k; with penalties, a bias and
// logprobs (which stay the raw row's). A masked-out non-finite raw logit is still reported.
TEST(DeviceSampleRows, MaskedRowsMatchTheHost) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  for (int vocab : {151936, 4099}) {
    testing::Random rng{std::uint64_t(vocab) + 5};
    Tensor logits = rng.normal({1, vocab}, 2.0f);
    const float* row = logits.data_as<float>();
    std::vector<int> order(static_cast<std::size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 8, order.end(), [&](int a, int c) { return row[a] > row[c]; });
    const std::size_t words = std::size_t(vocab + 31) / 32;
    auto mask_of = [&](auto allowed_fn) {
      std::vector<std::uint32_t> m(words, 0u);
      for (int t = 0; t < vocab; ++t)
        if (allowed_fn(t)) m[std::size_t(t) / 32] |= 1u << (t % 32);
      return m;
    };
    const std::vector<std::vector<std::uint32_t>> masks = {
        mask_of([&](int t) { return t == order[5]; }),
        mask_of([&](int t) { return t == 17 || t == vocab / 2 || t == vocab - 1; }),
        mask_of([](int t) { return t % 2 == 1; }),
        mask_of([&](int t) { return std::find(order.begin(), order.begin() + 5, t) == order.begin() + 5; }),
    };
    Batch b;
    b.vocab = vocab;
    for (int r = 0; r < 32; ++r) {
      const int path = r % 4;  // greedy, small top-k, top-p alone, a large top-k
      RowSampling rs = path == 0 ? RowSampling{}
                                 : sampled(0.8f, path == 1 ? 40 : path == 3 ? 3000 : 0, path == 2 ? 0.9f : 1.0f, 0.0f, 3,
                                           std::uint64_t(r));
      rs.params.repetition_penalty = r % 5 == 4 ? 1.3f : 1.0f;
      rs.params.logprobs = r % 7 == 3 ? 2 : -1;
      const std::vector<LogitBias> bias = r % 6 == 5 ? std::vector<LogitBias>{{order[0], 5.0f}} : std::vector<LogitBias>{};
      b.add(row, rs, order[1], {{order[0], 1, 0}}, bias, &masks[std::size_t(r / 4) % masks.size()]);
    }
    const Sampled got = sample_on_device(b);
    const std::vector<double> raw = log_softmax(row, vocab);
    for (int r = 0; r < b.rows(); ++r) {
      const LogitSummary& s = got.summaries[std::size_t(r)];
      const std::vector<std::uint32_t>& m = masks[std::size_t(r / 4) % masks.size()];
      EXPECT_EQ(s.token, host_token(b, r)) << "vocab " << vocab << ", row " << r;
      EXPECT_TRUE(s.token >= 0 && s.token < vocab && (m[std::size_t(s.token) / 32] >> (s.token % 32) & 1u))
          << "row " << r << " drew " << s.token << ", which its mask leaves out";
      if (b.sampling[std::size_t(r)].params.logprobs >= 0) EXPECT_NEAR(s.logprob, raw[std::size_t(s.token)], 1e-4) << "row " << r;
    }
  }
  std::vector<float> bad(4099, 0.5f);
  bad[77] = NAN;
  std::vector<std::uint32_t> only_one((4099 + 31) / 32, 0u);
  only_one[0] = 1u << 3;
  Batch b;
  b.vocab = 4099;
  b.add(bad.data(), RowSampling{}, 0, {}, {}, &only_one);
  EXPECT_EQ(sample_on_device(b).summaries[0].nonfinite, 77);
}

TEST(DeviceSampleRows, PenalisedDrawsMatchTheHost) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  const int vocab = 151936;
  testing::Random rng(9);
  Tensor logits = rng.normal({1, vocab}, 2.0f);
  const float* row = logits.data_as<float>();
  std::vector<PenaltyToken> entries;
  std::vector<int> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 64, order.end(), [&](int a, int c) { return row[a] > row[c]; });
  for (int i = 0; i < 64; i += 2) entries.push_back({order[std::size_t(i)], i % 5, i % 3 == 0});
  Batch b;
  b.vocab = vocab;
  for (int s = 0; s < 256; ++s) {
    RowSampling rs = sampled(0.9f, 30, 0.92f, 0.0f, 77, std::uint64_t(s));
    rs.params.repetition_penalty = 1.2f;
    rs.params.frequency_penalty = 0.3f;
    rs.params.presence_penalty = 0.4f;
    rs.newest_is_output = s % 2;
    b.add(row, rs, order[std::size_t(s % 8)], entries);
  }
  const Sampled got = sample_on_device(b);
  int differ = 0;
  for (int s = 0; s < b.rows(); ++s) differ += got.summaries[std::size_t(s)].token != host_token(b, s) ? 1 : 0;
  EXPECT_LE(differ, 1);
}

TEST(DeviceSampleRows, LogprobsMatchALogSoftmax) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  for (int vocab : {151936, 49152, 1000, 5}) {
    testing::Random rng(std::uint64_t(vocab) + 1);
    Tensor logits = rng.normal({4, vocab}, 3.0f);
    float* rows = logits.data_as<float>();
    std::fill(rows + 3 * std::int64_t(vocab), rows + 4 * std::int64_t(vocab), 1.5f);  // all equal: ties by id
    Batch b;
    b.vocab = vocab;
    for (int r = 0; r < 4; ++r) {
      RowSampling rs = sampled(r == 0 ? 0.0f : 1.0f, 50, 1.0f, 0.0f, 3, std::uint64_t(r));
      rs.params.logprobs = r == 1 ? 0 : kMaxTopLogprobs;
      rs.params.repetition_penalty = r == 2 ? 2.0f : 1.0f;  // logprobs stay those of the raw row
      b.add(rows + std::int64_t(r) * vocab, rs, 0, {{1, 1, 1}});
    }
    const Sampled got = sample_on_device(b);
    for (int r = 0; r < 4; ++r) {
      const float* row = rows + std::int64_t(r) * vocab;
      const std::vector<double> lp = log_softmax(row, vocab);
      const LogitSummary& s = got.summaries[std::size_t(r)];
      EXPECT_NEAR(s.logprob, lp[std::size_t(s.token)], 1e-4) << "vocab " << vocab << ", row " << r;
      const int n = b.sampling[std::size_t(r)].params.logprobs;
      std::vector<int> order(static_cast<std::size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return row[a] > row[c]; });
      for (int j = 0; j < std::min(n, vocab); ++j) {
        const TopLogprob& t = got.top[std::size_t(r) * kMaxTopLogprobs + std::size_t(j)];
        EXPECT_EQ(t.id, order[std::size_t(j)]) << "vocab " << vocab << ", row " << r << ", rank " << j;
        EXPECT_NEAR(t.logprob, lp[std::size_t(order[std::size_t(j)])], 1e-4);
      }
    }
  }
}

TEST(DeviceSampleRows, ReportsNonFiniteRowsAndIsDeterministic) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  const int vocab = 151936;
  testing::Random rng(12);
  Tensor logits = rng.normal({32, vocab}, 2.0f);
  float* rows = logits.data_as<float>();
  rows[3 * std::int64_t(vocab) + 1000] = NAN;
  rows[4 * std::int64_t(vocab) + vocab - 1] = -std::numeric_limits<float>::infinity();
  Batch b;
  b.vocab = vocab;
  for (int r = 0; r < 32; ++r) b.add(rows + std::int64_t(r) * vocab, sampled(1.0f, 0, 0.95f, 0.0f, 5, std::uint64_t(r)), 0);
  const Sampled first = sample_on_device(b), second = sample_on_device(b);
  EXPECT_EQ(first.summaries[3].nonfinite, 1000);
  EXPECT_TRUE(std::isnan(first.summaries[3].nonfinite_value));
  EXPECT_EQ(first.summaries[4].nonfinite, vocab - 1);
  for (int r = 0; r < 32; ++r) {
    if (r != 3 && r != 4) EXPECT_EQ(first.summaries[std::size_t(r)].nonfinite, -1);
    EXPECT_EQ(first.summaries[std::size_t(r)].token, second.summaries[std::size_t(r)].token) << "row " << r;
  }
}

// The penalties clamp what they touch to the finite floats: a non-finite raw logit among the
// penalised tokens (or the input token) is still reported, the lowest id first.
TEST(DeviceSampleRows, ReportsNonFiniteLogitsThePenaltiesTouch) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  const int vocab = 151936;
  testing::Random rng(13);
  Tensor logits = rng.normal({4, vocab}, 2.0f);
  float* rows = logits.data_as<float>();
  const float inf = std::numeric_limits<float>::infinity();
  rows[0 * std::int64_t(vocab) + 500] = NAN;            // a penalty entry
  rows[1 * std::int64_t(vocab) + 90000] = inf;          // the input token, not an entry
  rows[2 * std::int64_t(vocab) + 70000] = -inf;         // untouched ...
  rows[2 * std::int64_t(vocab) + 600] = NAN;            // ... and a lower penalised id
  const int expected[4] = {500, 90000, 600, -1};
  Batch b;
  b.vocab = vocab;
  for (int r = 0; r < 4; ++r) {
    RowSampling rs = sampled(r % 2 ? 0.0f : 0.9f, 40, 0.9f, 0.0f, 3, std::uint64_t(r));
    rs.params.repetition_penalty = 1.3f;
    rs.params.frequency_penalty = 0.2f;
    rs.newest_is_output = 1;
    b.add(rows + std::int64_t(r) * vocab, rs, r == 1 ? 90000 : 7, {{500, 1, 0}, {600, 0, 1}, {1234, 2, 0}});
  }
  for (int blocks : {8, 7}) {
    const Sampled got = sample_on_device(b, blocks);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(got.summaries[std::size_t(r)].nonfinite, expected[r]) << "row " << r << ", " << blocks << "-block clusters";
      if (expected[r] < 0) EXPECT_EQ(got.summaries[std::size_t(r)].token, host_token(b, r)) << "row " << r;
    }
  }
}

// Rows with 1 <= top-k <= 64 take the k best tokens without the histogram (and top-n logprobs the
// n best raw logits the same way); both paths weigh the head's tokens alike and walk it alike, so
// they draw the same token for every (seed, step), and give the same top-n logprobs. Rows
// of N(0, s^2) logits from flat to peaked (the k-th token past 48 nats), k from 1 to 64 with every
// other cut, penalties and logprobs, small vocabularies (most threads hold no token), and rows
// whose candidates overflow the gather (all logits equal; ties at the bound) and fall through.
TEST(DeviceSampleRows, SmallTopKPathDrawsTheHistogramsTokens) {
  testing::require_gpu();
  if (!kernels::device_sampling_supported(151936)) GTEST_SKIP() << "device sampling needs sm_90";
  struct Case {
    int vocab;
    float scale;
  };
  const Case cases[] = {{151936, 2.5f}, {151936, 0.3f}, {151936, 45.0f}, {49152, 2.0f}, {4099, 1.0f}, {1000, 3.0f}, {70, 1.0f}};
  const int ks[] = {1, 2, 20, 50, 63, 64};
  for (const Case& c : cases) {
    testing::Random rng(std::uint64_t(c.vocab) * 7 + std::uint64_t(c.scale * 10));
    Tensor logits = rng.normal({4, c.vocab}, c.scale);
    float* rows = logits.data_as<float>();
    std::fill(rows + 3 * std::int64_t(c.vocab), rows + 4 * std::int64_t(c.vocab), 0.25f);  // all equal
    for (int i = 0; i < c.vocab; i += 3) rows[2 * std::int64_t(c.vocab) + i] = std::round(rows[2 * std::int64_t(c.vocab) + i]);  // ties
    Batch b;
    b.vocab = c.vocab;
    for (int s = 0; s < 256; ++s) {
      const int k = ks[s % 6];
      if (k >= c.vocab) continue;
      RowSampling rs = sampled(s % 5 == 0 ? 0.7f : 1.0f, k, s % 3 == 0 ? 0.9f : 1.0f, s % 7 == 0 ? 0.05f : 0.0f, 40 + std::uint64_t(s), std::uint64_t(s));
      rs.params.logprobs = s % 11 == 0 ? (s % 2 ? 5 : kMaxTopLogprobs) : (s % 13 == 0 ? 0 : -1);
      std::vector<PenaltyToken> entries;
      if (s % 4 == 1) {
        rs.params.repetition_penalty = 1.2f;
        rs.params.presence_penalty = 0.4f;
        rs.newest_is_output = 1;
        entries = {{int(s) % c.vocab, 1, 0}, {(int(s) * 31 + 5) % c.vocab, 2, 1}};
      }
      b.add(rows + std::int64_t(s % 4) * c.vocab, rs, s % c.vocab, entries);
    }
    for (int blocks : {8, 7}) {
      const Sampled small = sample_on_device(b, blocks, true), histogram = sample_on_device(b, blocks, false);
      for (int s = 0; s < b.rows(); ++s) {
        ASSERT_EQ(small.summaries[std::size_t(s)].nonfinite, -1);
        EXPECT_EQ(small.summaries[std::size_t(s)].token, histogram.summaries[std::size_t(s)].token)
            << "vocab " << c.vocab << ", scale " << c.scale << ", draw " << s << ", top-k " << b.sampling[std::size_t(s)].params.top_k
            << ", " << blocks << "-block clusters";
        for (int j = 0; j < std::min(b.sampling[std::size_t(s)].params.logprobs, c.vocab); ++j) {
          const std::size_t at = std::size_t(s) * kMaxTopLogprobs + std::size_t(j);
          EXPECT_EQ(small.top[at].id, histogram.top[at].id) << "vocab " << c.vocab << ", draw " << s << ", rank " << j;
          EXPECT_EQ(small.top[at].logprob, histogram.top[at].logprob) << "vocab " << c.vocab << ", draw " << s << ", rank " << j;
        }
      }
      if (c.vocab == 151936 && blocks == 8) {  // and the host's, but for draws within rounding of a boundary
        int differ = 0;
        for (int s = 0; s < b.rows(); ++s) differ += small.summaries[std::size_t(s)].token != host_token(b, s) ? 1 : 0;
        EXPECT_LE(differ, 1) << "scale " << c.scale;
      }
    }
  }
}

}  // namespace
}  // namespace asynct
