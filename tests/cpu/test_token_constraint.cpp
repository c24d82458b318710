// Token constraints (structured output's hook, engine/token_constraint.h): the host sampler
// draws only allowed tokens, greedy or sampled, after the bias and penalties, with logprobs of
// the raw row; the engine asks a request's constraint for a mask before each of its rows, tells
// it every token taken, keeps each choice's constraint apart, and ends the request with "stop"
// once the constraint is complete.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "models/cpu/cpu_model_runner.h"
#include "engine/sampler.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

std::vector<std::uint32_t> mask_of(int vocab, const std::set<int>& allowed) {
  std::vector<std::uint32_t> words(std::size_t(token_mask_words(vocab)), 0u);
  for (int t : allowed) words[std::size_t(t / 32)] |= 1u << (t % 32);
  return words;
}

TEST(TokenMask, SamplerDrawsOnlyAllowedTokens) {
  std::vector<float> raw(70);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = float((i * 37) % 11) - 5.0f;
  const std::set<int> allowed = {3, 33, 64, 69};
  const std::vector<std::uint32_t> mask = mask_of(70, allowed);
  std::vector<float> x = raw;
  apply_token_mask(x.data(), x.size(), mask.data());
  for (int i = 0; i < 70; ++i) EXPECT_EQ(x[std::size_t(i)] == -FLT_MAX, allowed.count(i) == 0) << i;
  RowSampling row;  // greedy: the best allowed token
  int best = 3;
  for (int t : allowed) best = raw[std::size_t(t)] > raw[std::size_t(best)] ? t : best;
  EXPECT_EQ(sample_logit_row(raw.data(), raw.size(), row, {}, nullptr, {}, mask.data()).token, best);
  // +100 on a disallowed token does not get it past the mask.
  const std::vector<LogitBias> bias = {{0, 100.0f}};
  EXPECT_EQ(sample_logit_row(raw.data(), raw.size(), row, {}, nullptr, bias, mask.data()).token, best);
  row.params = {.temperature = 2.0f, .seed = 1, .logprobs = 0};
  std::set<int> seen;
  for (row.step = 0; row.step < 400; ++row.step) {
    const LogitSummary s = sample_logit_row(raw.data(), raw.size(), row, {}, nullptr, {}, mask.data());
    EXPECT_EQ(allowed.count(s.token), 1u) << s.token;
    seen.insert(s.token);
    double norm = 0.0;
    for (float v : raw) norm += std::exp(double(v) - 5.0);
    EXPECT_NEAR(s.logprob, double(raw[std::size_t(s.token)]) - 5.0 - std::log(norm), 1e-5);  // the raw row's
  }
  EXPECT_EQ(seen, allowed);
}

// Allows only tokens congruent to `residue` mod `modulus`, then the next residue (a pattern
// each token must follow); complete after `length` tokens.
class PatternConstraint : public TokenConstraint {
 public:
  PatternConstraint(int modulus, int length, int* made) : modulus_(modulus), length_(length) { ++*made; }
  void fill_allowed(std::uint32_t* words, int vocab) override {
    for (int t = residue(); t < vocab; t += modulus_) words[t / 32] |= 1u << (t % 32);
  }
  bool accept(std::int32_t token) override {
    if (token % modulus_ != residue()) return false;
    ++taken_;
    return true;
  }
  bool complete() const override { return taken_ >= length_; }

 private:
  int residue() const { return taken_ % modulus_; }
  int modulus_, length_, taken_ = 0;
};

Engine make_engine(bool pipeline, bool speculative) {
  ModelWeights w = random_weights(tiny_config(Architecture::Qwen3), 7);
  const int vocab = w.config.vocab_size;
  EngineOptions o;
  o.max_model_len = 1024;
  o.pipeline_steps = pipeline;
  if (speculative) o.speculative = {.method = "ngram", .num_tokens = 3};
  return Engine(std::make_unique<CpuModelRunner>(std::move(w), 64, 16), vocab, o);
}

// Constrained and unconstrained requests in one batch, pipelined or not, speculative or not,
// greedy, sampled and as forked choices: every constrained token follows its pattern, the
// request ends with "stop" when complete, and the unconstrained ones are unchanged.
TEST(TokenConstraint, EngineMasksEveryRowAndStopsWhenComplete) {
  for (const bool pipeline : {true, false})
    for (const bool speculative : {false, true}) {
      SCOPED_TRACE("pipeline " + std::to_string(pipeline) + ", speculative " + std::to_string(speculative));
      int made = 0;
      const auto pattern = [&made](int modulus, int length) {
        return [&made, modulus, length] { return std::make_unique<PatternConstraint>(modulus, length, &made); };
      };
      Request plain;
      plain.prompt = {1, 2, 3, 1, 2, 3, 1, 2};
      plain.max_tokens = 12;
      Engine alone = make_engine(pipeline, speculative);
      alone.add_request(plain);
      const std::vector<std::int32_t> want_plain = alone.run_to_completion()[0].tokens;

      Engine e = make_engine(pipeline, speculative);
      e.add_request(plain);
      Request greedy = plain;
      greedy.constraint = pattern(3, 5);
      e.add_request(greedy);
      Request sampled = plain;
      sampled.sampling = {.temperature = 1.0f, .seed = 4};
      sampled.constraint = pattern(4, 100);  // ends by length
      e.add_request(sampled);
      Request choices = sampled;
      choices.constraint = pattern(2, 7);
      e.add_request_group({choices, choices, choices});
      const auto out = e.run_to_completion();
      ASSERT_EQ(out.size(), 6u);
      EXPECT_EQ(made, 5);
      EXPECT_EQ(out[0].tokens, want_plain);
      const auto follows = [](const std::vector<std::int32_t>& tokens, int modulus) {
        for (std::size_t i = 0; i < tokens.size(); ++i)
          if (tokens[i] % modulus != int(i) % modulus) return false;
        return true;
      };
      EXPECT_EQ(out[1].tokens.size(), 5u);
      EXPECT_EQ(out[1].finish_reason, "stop");
      EXPECT_TRUE(follows(out[1].tokens, 3));
      EXPECT_EQ(out[2].tokens.size(), 12u);
      EXPECT_EQ(out[2].finish_reason, "length");
      EXPECT_TRUE(follows(out[2].tokens, 4));
      for (std::size_t i = 3; i < 6; ++i) {
        EXPECT_EQ(out[i].tokens.size(), 7u);
        EXPECT_EQ(out[i].finish_reason, "stop");
        EXPECT_TRUE(follows(out[i].tokens, 2));
      }
    }
}

// Constrained decode steps are queued before the host has the tokens their masks follow: each
// mask is filled once the step before is applied and handed to the runner afterwards
// (StepBatch::masks_later), with the same tokens as steps run one at a time, also when a
// constrained request completes while the step behind it is queued.
TEST(TokenConstraint, ConstrainedStepsArePipelinedWithTheSameTokens) {
  std::vector<std::vector<RequestOutput>> outs;
  std::vector<EngineStats> stats;
  for (const bool pipeline : {true, false}) {
    int made = 0;
    Engine e = make_engine(pipeline, false);
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.prompt = {1, 2, 3, 1, 2, 3, 1, 2};
      r.max_tokens = 16;
      if (i % 2) r.sampling = {.temperature = 1.0f, .seed = std::uint64_t(i)};
      const int modulus = 2 + i, length = i == 1 ? 5 : 100;  // request 1 completes after 5 tokens
      r.constraint = [&made, modulus, length] { return std::make_unique<PatternConstraint>(modulus, length, &made); };
      e.add_request(r);
    }
    outs.push_back(e.run_to_completion());
    stats.push_back(e.stats());
  }
  ASSERT_EQ(outs[0].size(), 4u);
  ASSERT_EQ(outs[1].size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(outs[0][i].tokens, outs[1][i].tokens) << "request " << i;
    EXPECT_EQ(outs[0][i].finish_reason, outs[1][i].finish_reason) << "request " << i;
    for (std::size_t t = 0; t < outs[0][i].tokens.size(); ++t)
      EXPECT_EQ(outs[0][i].tokens[t] % int(2 + i), int(t) % int(2 + i)) << "request " << i << " token " << t;
  }
  EXPECT_EQ(outs[0][1].finish_reason, "stop");
  EXPECT_EQ(outs[0][1].tokens.size(), 5u);
  EXPECT_GT(stats[0].pipelined_steps, 8);
  EXPECT_EQ(stats[1].pipelined_steps, 0);
}

// A step of one token at position 0 whose row has a mask at word 0 (token_masks left to the test).
StepBatch one_masked_token() {
  StepBatch b;
  b.tokens = {1};
  b.positions = {0};
  b.cu_seqlens_q = {0, 1};
  b.kv_lens = {1};
  b.block_tables = {{0}};
  b.slot_mapping = {0};
  b.logit_rows = {0};
  b.full_logits = {0};
  b.sampling = {RowSampling{}};
  b.sampling[0].mask_offset = 0;
  return b;
}

// A runner refuses a step that waits for its masks to be overtaken: another submit, or its
// collect, before supply_masks.
TEST(TokenConstraint, AStepWaitingForItsMasksIsNotOvertaken) {
  ModelWeights w = random_weights(tiny_config(Architecture::Qwen3), 7);
  const int vocab = w.config.vocab_size;
  CpuModelRunner runner(std::move(w), 8, 16);
  StepBatch b = one_masked_token();
  b.token_masks.assign(std::size_t(token_mask_words(vocab)), 0u);
  b.masks_later = true;
  testing::expect_error([&] { runner.supply_masks(b); }, "supply_masks: no step waits for its token masks");
  runner.submit(b);
  testing::expect_error([&] { runner.submit(b); }, "submit: the step before waits for its token masks");
  testing::expect_error([&] { runner.collect(); }, "collect: the step waits for its token masks");
  b.token_masks[0] = 1u << 5;  // token 5 alone
  runner.supply_masks(b);
  EXPECT_EQ(runner.collect().summaries[0].token, 5);
}

TEST(TokenConstraint, BadMasksAreRefused) {
  StepBatch b = one_masked_token();
  b.token_masks.assign(3, ~0u);
  const StepBounds bounds{.num_blocks = 4, .block_size = 16, .vocab_size = 100, .max_position_embeddings = 64};
  testing::expect_error([&] { check_step_batch(b, bounds); },
                        "logit row 0's token mask at word 0 is not within token_masks (3 words)");
  b.token_masks.assign(4, ~0u);
  check_step_batch(b, bounds);
}

}  // namespace
}  // namespace asynct
