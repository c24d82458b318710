// Logit bias (OpenAI's logit_bias): the host sampler adds it to the raw logits before
// everything else, greedy included; the engine carries a request's bias to every row it
// samples (batched, pipelined, speculative), logprobs stay the model's own, and bad biases get
// clear errors.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "models/cpu/cpu_model_runner.h"
#include "engine/sampler.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

LogitSummary sample_biased(const std::vector<float>& raw, const RowSampling& row, const std::vector<LogitBias>& bias,
                           std::vector<TopLogprob>* top = nullptr) {
  return sample_logit_row(raw.data(), raw.size(), row, PenaltyContext{}, top, bias);
}

TEST(LogitBias, MinusOneHundredRemovesATokenAndPlusOneHundredForcesOne) {
  const std::vector<float> raw = {1.0f, 4.0f, 2.0f, -3.0f, 3.5f};
  RowSampling row;  // greedy
  EXPECT_EQ(sample_biased(raw, row, {}).token, 1);
  EXPECT_EQ(sample_biased(raw, row, {{1, -100.0f}}).token, 4);
  EXPECT_EQ(sample_biased(raw, row, {{1, -100.0f}, {4, -100.0f}}).token, 2);
  EXPECT_EQ(sample_biased(raw, row, {{3, 100.0f}}).token, 3);
  EXPECT_EQ(sample_biased(raw, row, {{0, 2.5f}}).token, 1);   // 3.5 < 4
  EXPECT_EQ(sample_biased(raw, row, {{0, 3.5f}}).token, 0);   // 4.5 > 4
  // Drawn at any temperature: a +100 token always, a -100 token never.
  row.params = {.temperature = 1.5f, .top_k = 3, .top_p = 0.95f, .seed = 9};
  for (row.step = 0; row.step < 200; ++row.step) {
    EXPECT_EQ(sample_biased(raw, row, {{3, 100.0f}}).token, 3);
    EXPECT_NE(sample_biased(raw, row, {{1, -100.0f}}).token, 1);
  }
}

TEST(LogitBias, ComesBeforePenaltiesAndLeavesLogprobsRaw) {
  const std::vector<float> raw = {3.0f, 2.9f, 1.0f};
  RowSampling row;
  row.params.repetition_penalty = 2.0f;
  row.params.logprobs = 1;
  // Token 0 biased to -1, then penalised (its logit < 0: times 2): -2, below token 1's 2.9.
  // Penalty first would give 1.5 - 4 = -2.5: the same token, so check the value itself too.
  std::vector<float> x = raw;
  apply_logit_bias(x.data(), x.size(), std::vector<LogitBias>{{0, -4.0f}});
  EXPECT_EQ(x[0], -1.0f);
  apply_penalties(x.data(), x.size(), row.params, {{}, 0, false});
  EXPECT_EQ(x[0], -2.0f);
  std::vector<TopLogprob> top;
  const LogitSummary s = sample_biased(raw, row, {{2, 10.0f}}, &top);
  EXPECT_EQ(s.token, 2);
  double norm = 0.0;
  for (float v : raw) norm += std::exp(double(v));
  EXPECT_NEAR(s.logprob, 1.0 - std::log(norm), 1e-6);  // the raw row's, the bias aside
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].id, 0);
  // Sums stay finite.
  std::vector<float> big = {3e38f, -3e38f};
  apply_logit_bias(big.data(), big.size(), std::vector<LogitBias>{{0, 100.0f}, {1, -100.0f}});
  EXPECT_TRUE(std::isfinite(big[0]) && std::isfinite(big[1]));
}

TEST(LogitBias, BadBiasesGiveClearErrors) {
  const std::vector<LogitBias> outside = {{5, 1.0f}};
  expect_error([&] { validate_logit_bias(outside.data(), outside.size(), 5); },
               "logit_bias: token id 5 is outside the vocabulary [0, 5)");
  const std::vector<LogitBias> too_big = {{1, 100.5f}};
  expect_error([&] { validate_logit_bias(too_big.data(), too_big.size(), 5); }, "must be in [-100, 100], got 100.5");
  const std::vector<LogitBias> nan = {{1, NAN}};
  expect_error([&] { validate_logit_bias(nan.data(), nan.size(), 5); }, "must be in [-100, 100]");
  const std::vector<LogitBias> twice = {{1, 1.0f}, {2, 1.0f}, {1, -1.0f}};
  expect_error([&] { validate_logit_bias(twice.data(), twice.size(), 5); }, "token id 1 is listed twice");
  std::vector<LogitBias> many;
  for (int i = 0; i < 301; ++i) many.push_back({i, 1.0f});
  expect_error([&] { validate_logit_bias(many.data(), many.size(), 1000); }, "at most 300 tokens, got 301");
  many.pop_back();
  validate_logit_bias(many.data(), many.size(), 1000);
  float x[2] = {0.0f, 0.0f};
  expect_error([&] { apply_logit_bias(x, 2, outside); }, "token id 5 is outside the vocabulary [0, 2)");
}

// ---- The engine.

Engine make_engine(EngineOptions o = {}) {
  ModelWeights w = random_weights(tiny_config(Architecture::Qwen3), 7);
  const int vocab = w.config.vocab_size;
  o.max_model_len = 1024;
  return Engine(std::make_unique<CpuModelRunner>(std::move(w), 64, 16), vocab, o);
}

std::vector<RequestOutput> run(std::vector<Request> rs, EngineOptions o = {}) {
  Engine e = make_engine(o);
  for (const Request& r : rs) e.add_request(r);
  return e.run_to_completion();
}

Request request(std::vector<std::int32_t> prompt, SamplingParams p = {}, std::vector<LogitBias> bias = {}) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = 10;
  r.sampling = p;
  r.logit_bias = std::move(bias);
  return r;
}

// The greedy tokens by definition: one prefill per token, argmax of the raw logits plus the bias.
std::vector<std::int32_t> greedy_by_definition(const Request& r) {
  EngineOptions recording;
  recording.record_first_logits = true;
  Engine e = make_engine(recording);
  std::vector<std::int32_t> seq = r.prompt, out;
  for (int i = 0; i < r.max_tokens; ++i) {
    Request one = request(seq);
    one.max_tokens = 1;
    e.add_request(one);
    std::vector<float> x = e.run_to_completion()[0].first_logits;
    for (const LogitBias& b : r.logit_bias) x[std::size_t(b.id)] += b.bias;
    const auto token = std::int32_t(std::max_element(x.begin(), x.end()) - x.begin());
    seq.push_back(token);
    out.push_back(token);
  }
  return out;
}

// Biased and unbiased requests in one batch, pipelined and not, with speculative decoding:
// each gets its own bias at every token; -100 on the greedy first token changes it, +100
// forces a token at every step (sampled too), moderate biases follow the definition.
TEST(LogitBias, EngineAppliesEachRequestsBiasAtEveryToken) {
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5};
  const std::vector<std::int32_t> plain = run({request(prompt)})[0].tokens;
  std::vector<LogitBias> moderate;
  for (int id = 0; id < 256; id += 3) moderate.push_back({id, 0.05f * float(id % 7)});
  const std::vector<Request> rs = {
      request(prompt),
      request(prompt, {}, {{plain[0], -100.0f}}),
      request(prompt, {}, {{17, 100.0f}}),
      request(prompt, {.temperature = 1.0f, .seed = 3}, {{42, 100.0f}, {plain[0], -100.0f}}),
      request(prompt, {}, moderate),
  };
  for (const bool pipeline : {true, false})
    for (const int drafts : {0, 3}) {
      EngineOptions o;
      o.pipeline_steps = pipeline;
      if (drafts > 0) o.speculative = {.method = "ngram", .num_tokens = drafts};
      SCOPED_TRACE("pipeline " + std::to_string(pipeline) + ", drafts " + std::to_string(drafts));
      const auto out = run(rs, o);
      EXPECT_EQ(out[0].tokens, plain);
      EXPECT_NE(out[1].tokens[0], plain[0]);
      EXPECT_EQ(std::count(out[1].tokens.begin(), out[1].tokens.end(), plain[0]), 0);
      EXPECT_EQ(out[1].tokens, greedy_by_definition(rs[1]));
      EXPECT_EQ(out[2].tokens, std::vector<std::int32_t>(10, 17));
      EXPECT_EQ(out[3].tokens, std::vector<std::int32_t>(10, 42));
      EXPECT_EQ(out[4].tokens, greedy_by_definition(rs[4]));
    }
}

TEST(LogitBias, EngineLogprobsStayTheModelsOwn) {
  Request r = request({1, 2, 3}, {.logprobs = 0}, {{9, 100.0f}});
  EngineOptions recording;
  recording.record_first_logits = true;
  const auto out = run({r}, recording);
  ASSERT_EQ(out[0].tokens[0], 9);
  const std::vector<float>& x = out[0].first_logits;
  const float max_logit = *std::max_element(x.begin(), x.end());
  double norm = 0.0;
  for (float v : x) norm += std::exp(double(v) - max_logit);
  EXPECT_NEAR(out[0].logprobs[0], double(x[9]) - max_logit - std::log(norm), 1e-5);
}

TEST(LogitBias, EngineRefusesBadBiases) {
  Engine e = make_engine();
  expect_error([&] { e.add_request(request({1}, {}, {{256, 1.0f}})); },
               "logit_bias: token id 256 is outside the vocabulary [0, 256)");
  expect_error([&] { e.add_request(request({1}, {}, {{3, -101.0f}})); }, "must be in [-100, 100]");
  EXPECT_FALSE(e.has_unfinished());
}

}  // namespace
}  // namespace asynct
