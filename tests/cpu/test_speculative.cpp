// Speculative decoding on the CPU backend: prompt lookup's drafts, and an engine that verifies
// them (or suffix decoding's, engine/suffix_index.h) gives every request the same tokens and
// logprobs as one that decodes a token a step, greedy and seeded sampling alike (each kept token
// is drawn with its own draw index from the same logits), with prefix caching, forks,
// preemption, end-of-sequence and stop tokens, and on_token ending a request inside a run of
// kept drafts; suffix decoding drafts a repeated request from the one before.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/drafter.h"
#include "engine/engine.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/cpu_fast/cpu_fast_runner.h"
#include "models/cpu_fast/kernels.h"
#include "models/weights.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

TEST(NgramDraft, TakesWhatFollowedTheMostRecentLongestMatch) {
  const std::vector<std::int32_t> t = {1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3};
  // "2 3" last occurred at 5..6, followed by 5 6 7 (the later match wins over 1..2's 4).
  EXPECT_EQ(ngram_draft(t, 1, 4, 3), (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_EQ(ngram_draft(t, 1, 4, 2), (std::vector<std::int32_t>{5, 6}));
  // A longer match is preferred: "9 2 3" ... only "2 3" and "3" occur before; with min 3 nothing.
  EXPECT_TRUE(ngram_draft(t, 3, 4, 3).empty());
  // The draft stops where the sequence does.
  EXPECT_EQ(ngram_draft(std::vector<std::int32_t>{4, 4, 4}, 1, 2, 5), (std::vector<std::int32_t>{4}));
  EXPECT_TRUE(ngram_draft(std::vector<std::int32_t>{4}, 1, 2, 5).empty());
  EXPECT_TRUE(ngram_draft(std::vector<std::int32_t>{}, 1, 2, 5).empty());
  EXPECT_TRUE(ngram_draft(t, 1, 4, 0).empty());
}

TEST(NgramDraft, OptionsAreChecked) {
  expect_error([] { validate_speculative({.method = "medusa"}); }, "--speculative must be none, ngram, suffix or draft, got 'medusa'");
  expect_error([] { validate_speculative({.method = "ngram", .num_tokens = 0}); }, "--speculative-tokens must be in 1..64");
  expect_error([] { validate_speculative({.method = "ngram", .ngram_min = 3, .ngram_max = 2}); }, "1 <= min <= max <= 64");
}

struct Setup {
  Architecture arch = Architecture::AsyncT;
  int num_blocks = 64;
  bool prefix_caching = false;
  bool speculative = false;
  int num_tokens = 4;
  std::string method = "ngram";
  std::int64_t suffix_cache_tokens = std::int64_t(1) << 16;
  bool production = false;  // the production CPU backend (models/cpu_fast), not the reference
  bool int8 = false;        // with it, int8 weights (--quantization int8)
  std::uint64_t draft_seed = 7;  // --speculative draft: the draft model's weights (7: the target's own)
};

Engine make_engine(const Setup& s) {
  ModelWeights w = random_weights(tiny_config(s.arch), 7);
  const int vocab = w.config.vocab_size;
  EngineOptions o;
  o.max_model_len = 1024;
  o.prefix_caching = s.prefix_caching;
  if (s.speculative)
    o.speculative = {.method = s.method, .num_tokens = s.num_tokens, .ngram_min = 1, .ngram_max = 3,
                     .suffix_cache_tokens = s.suffix_cache_tokens};
  std::unique_ptr<DraftModel> draft;
  if (s.speculative && s.method == "draft") {
    ModelWeights dw = random_weights(tiny_config(s.arch), s.draft_seed);
    const int positions = dw.config.max_position_embeddings;
    draft = std::make_unique<DraftModel>(std::make_unique<CpuModelRunner>(std::move(dw), s.num_blocks, 16), vocab, positions);
  }
  if (s.production)
    return Engine(std::make_unique<CpuFastModelRunner>(std::move(w), s.num_blocks, 16, KvCacheDtype::BF16, s.int8), vocab, o,
                  std::move(draft));
  return Engine(std::make_unique<CpuModelRunner>(std::move(w), s.num_blocks, 16), vocab, o, std::move(draft));
}

// Prompts that repeat themselves (prompt lookup finds them), greedy and sampled.
std::vector<Request> requests() {
  std::vector<Request> rs;
  const std::vector<std::vector<std::int32_t>> prompts = {{5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7}, {42, 43, 42, 43, 42}};
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    for (const float temperature : {0.0f, 0.9f}) {
      Request r;
      r.prompt = prompts[i];
      r.max_tokens = 16 + int(i);
      r.sampling = {.temperature = temperature, .top_k = temperature > 0 ? 8 : 0, .seed = 500 + i, .logprobs = int(i % 3)};
      rs.push_back(r);
    }
  }
  return rs;
}

struct Outcome {
  std::vector<RequestOutput> outputs;
  EngineStats stats;
  int blocks_left = 0;
};

Outcome run(const Setup& s, const std::vector<Request>& rs, bool grouped = false) {
  Engine e = make_engine(s);
  if (grouped)
    e.add_request_group(rs);
  else
    for (const Request& r : rs) e.add_request(r);
  Outcome out;
  out.outputs = e.run_to_completion();
  out.stats = e.stats();
  out.blocks_left = e.kv_blocks_used();
  return out;
}

void expect_same(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].finish_reason, b[i].finish_reason) << "request " << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << "request " << i;
    ASSERT_EQ(a[i].top_logprobs.size(), b[i].top_logprobs.size()) << "request " << i;
    for (std::size_t t = 0; t < a[i].top_logprobs.size(); ++t)
      for (std::size_t k = 0; k < a[i].top_logprobs[t].size(); ++k)
        EXPECT_EQ(a[i].top_logprobs[t][k].id, b[i].top_logprobs[t][k].id) << "request " << i;
  }
}

TEST(Speculative, SameTokensAsOneTokenAStep) {
  for (const char* method : {"ngram", "suffix", "draft"})
  for (const Architecture arch : {Architecture::AsyncT, Architecture::Llama})
    for (const auto& [num_blocks, caching] : {std::pair{64, false}, {5, true}}) {  // 5 blocks: preemption
        SCOPED_TRACE(::testing::Message() << method << ", " << tiny_config(arch).architecture_name() << ", "
                                          << num_blocks << " blocks, prefix caching " << caching);
        const std::vector<Request> rs = requests();
        const Outcome plain = run({arch, num_blocks, caching, false}, rs);
        const Outcome spec = run({arch, num_blocks, caching, true, 4, method}, rs);
        expect_same(spec.outputs, plain.outputs);
        EXPECT_GT(spec.stats.drafted_tokens, 0);
        EXPECT_GT(spec.stats.accepted_tokens, 0);
        EXPECT_LE(spec.stats.accepted_tokens, spec.stats.drafted_tokens);
        EXPECT_LE(spec.stats.steps, plain.stats.steps);
        if (num_blocks == 64) {  // (with preemption the two runs recompute different tokens)
          EXPECT_EQ(spec.stats.decode_tokens, plain.stats.decode_tokens);
        }
        EXPECT_EQ(plain.stats.drafted_tokens, 0);
        EXPECT_EQ(spec.blocks_left, 0);
      }
}

// The production backend gives a row the same sums beside up to kBatchInvariantRows - 1 others
// (models/cpu_fast/kernels.h), so a request alone or beside one other, verifying 4 drafts each,
// gets the tokens and logprobs it gets a token a step: bf16 and int8 weights, both gates.
TEST(Speculative, ProductionBackendSameTokensAtSmallBatches) {
  static_assert(2 * (1 + 4) <= cpu_fast::kBatchInvariantRows);
  const std::vector<Request> rs = requests();
  for (const char* method : {"ngram", "suffix"})
    for (const Architecture arch : {Architecture::AsyncT, Architecture::Llama})
      for (const bool int8 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << method << ", " << tiny_config(arch).architecture_name() << ", int8 " << int8);
        std::int64_t accepted = 0;
        for (std::size_t i = 0; i + 1 < rs.size(); i += 2) {  // two at a time: a greedy and a sampled request
          const std::vector<Request> pair = {rs[i], rs[i + 1]};
          const Outcome plain = run({.arch = arch, .production = true, .int8 = int8}, pair);
          const Outcome spec = run({.arch = arch, .speculative = true, .method = method, .production = true, .int8 = int8}, pair);
          expect_same(spec.outputs, plain.outputs);
          accepted += spec.stats.accepted_tokens;
        }
        EXPECT_GT(accepted, 0);
      }
}

// SmolLM2-135M-Instruct (when in the cache) on the production backend: a prompt that repeats
// itself, greedy, the same tokens with drafts as without. Skipped without the model.
TEST(Speculative, ProductionBackendSmolLm2SameTokens) {
  const std::string dir = std::string(ASYNCT_TEST_CACHE) + "/smollm2-135m-instruct";
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << "no model at " << dir;
  std::ifstream golden_file(std::string(ASYNCT_SOURCE_DIR) + "/tests/model/data/smollm2_golden.json");
  const nlohmann::json golden = nlohmann::json::parse(golden_file);
  const ModelWeights weights = load_weights(dir);
  Request r;
  const std::vector<std::int32_t> once = golden["prompts"][0]["prompt_ids"];
  for (int copy = 0; copy < 3; ++copy) r.prompt.insert(r.prompt.end(), once.begin(), once.end());
  r.max_tokens = 24;
  std::vector<std::int32_t> tokens[2];
  std::int64_t accepted = 0;
  for (const bool speculative : {false, true}) {
    EngineOptions o;
    o.max_model_len = 1024;
    if (speculative) o.speculative = {.method = "ngram", .num_tokens = 4};
    Engine e(std::make_unique<CpuFastModelRunner>(weights, 16, 16), weights.config.vocab_size, o);
    e.add_request(r);
    tokens[speculative] = e.run_to_completion()[0].tokens;
    accepted = e.stats().accepted_tokens;
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_GT(accepted, 0);
}

// The switch-off rule: over max_batch running sequences no step drafts; a sequence whose drafts
// keep nothing skips rounds (1, 2, 4, ... up to max_pause); the tokens never change.
TEST(Speculative, DraftingStopsOverMaxBatchAndPausesWhenFruitless) {
  std::vector<Request> two(2, requests()[0]);  // greedy, the same length: they run side by side
  two[1].prompt = requests()[2].prompt;
  two[1].max_tokens = two[0].max_tokens;
  const Outcome plain = run({}, two);
  const auto with = [&](int max_batch, int max_pause, const std::vector<Request>& rs) {
    ModelWeights w = random_weights(tiny_config(Architecture::AsyncT), 7);
    const int vocab = w.config.vocab_size;
    EngineOptions eo;
    eo.max_model_len = 1024;
    eo.speculative = {.method = "ngram", .num_tokens = 4, .ngram_min = 1, .ngram_max = 3, .max_batch = max_batch,
                      .max_pause = max_pause};
    Engine e(std::make_unique<CpuModelRunner>(std::move(w), 64, 16), vocab, eo);
    for (const Request& r : rs) e.add_request(r);
    Outcome out;
    out.outputs = e.run_to_completion();
    out.stats = e.stats();
    return out;
  };
  const Outcome over = with(1, 16, two), within = with(2, 16, two);
  expect_same(over.outputs, plain.outputs);
  expect_same(within.outputs, plain.outputs);
  EXPECT_EQ(over.stats.drafted_tokens, 0);
  EXPECT_GT(over.stats.drafts_skipped_batch, 0);
  EXPECT_GT(within.stats.drafted_tokens, 0);
  EXPECT_EQ(within.stats.drafts_skipped_batch, 0);
  // Over the rule's batch size steps are queued behind each other as without speculation.
  EXPECT_GT(over.stats.pipelined_steps, 0);
  EXPECT_EQ(over.stats.pipelined_steps, plain.stats.pipelined_steps);
  EXPECT_EQ(within.stats.pipelined_steps, 0);

  // A prompt lookup that keeps little: the random model does not repeat this prompt's pattern.
  Request r;
  for (int i = 0; i < 40; ++i) r.prompt.push_back(std::int32_t(3 + (i * 7) % 11));
  r.max_tokens = 60;
  const Outcome always = with(0, 0, {r}), paused = with(0, 16, {r});
  expect_same(paused.outputs, always.outputs);
  EXPECT_EQ(always.stats.drafts_skipped_paused, 0);
  EXPECT_GT(paused.stats.drafts_skipped_paused, 0);
  EXPECT_LT(paused.stats.draft_rounds, always.stats.draft_rounds);
  std::printf("fruitless drafts: %lld rounds keeping %lld without pauses, %lld keeping %lld with them (%lld skipped)\n",
              static_cast<long long>(always.stats.draft_rounds), static_cast<long long>(always.stats.accepted_tokens),
              static_cast<long long>(paused.stats.draft_rounds), static_cast<long long>(paused.stats.accepted_tokens),
              static_cast<long long>(paused.stats.drafts_skipped_paused));
}

// A draft model: its greedy tokens are guesses the target verifies, so the tokens are the
// target's whatever the draft model (another model of the vocabulary; the target itself, whose
// greedy drafts a greedy request keeps every one of), with preemption, forks and prefix caching;
// its cache's blocks are all back at the end.
TEST(Speculative, DraftModelProposalsAreVerified) {
  const std::vector<Request> rs = requests();
  for (const std::uint64_t draft_seed : {std::uint64_t(7), std::uint64_t(11)})
    for (const auto& [num_blocks, caching] : {std::pair{64, false}, {6, true}}) {
      SCOPED_TRACE(::testing::Message() << "draft seed " << draft_seed << ", " << num_blocks << " blocks");
      const Outcome plain = run({.num_blocks = num_blocks, .prefix_caching = caching}, rs);
      const Outcome spec = run({.num_blocks = num_blocks, .prefix_caching = caching, .speculative = true,
                                .method = "draft", .draft_seed = draft_seed},
                               rs);
      expect_same(spec.outputs, plain.outputs);
      EXPECT_GT(spec.stats.drafted_tokens, 0);
      EXPECT_EQ(spec.blocks_left, 0);
      const Outcome grouped_plain = run({.num_blocks = num_blocks}, {rs[1], rs[1], rs[1]}, /*grouped=*/true);
      const Outcome grouped = run({.num_blocks = num_blocks, .speculative = true, .method = "draft", .draft_seed = draft_seed},
                                  {rs[1], rs[1], rs[1]}, /*grouped=*/true);
      expect_same(grouped.outputs, grouped_plain.outputs);
    }
  // The target as its own draft model, one greedy request alone: every draft kept.
  Request greedy = rs[0];
  greedy.max_tokens = 26;
  const Outcome self = run({.speculative = true, .method = "draft"}, {greedy});
  EXPECT_GT(self.stats.drafted_tokens, 0);
  EXPECT_EQ(self.stats.accepted_tokens, self.stats.drafted_tokens);
  EXPECT_EQ(self.stats.steps, 1 + 5);  // the prompt's step, then 5 steps of 5 tokens
  EngineOptions o;
  o.speculative.method = "draft";
  expect_error([&] { Engine(std::make_unique<CpuModelRunner>(random_weights(tiny_config(Architecture::AsyncT), 7), 8, 16), 64, o); },
               "engine: --speculative draft needs a draft model");
}

// The bench's forced mode keeps every draft whatever the model draws: each step after the
// prompt's gives num_tokens + 1 tokens (the outputs are not the model's: timing only).
TEST(Speculative, ForcedDraftsAreAllKept) {
  Request r = requests()[0];
  r.max_tokens = 21;
  Engine e = make_engine({.speculative = true, .method = "forced"});
  e.add_request(r);
  EXPECT_EQ(e.run_to_completion()[0].tokens.size(), 21u);
  EXPECT_EQ(e.stats().accepted_tokens, e.stats().drafted_tokens);
  EXPECT_EQ(e.stats().steps, 1 + 4);  // the prompt's step (1 token), then 4 steps of 5
  expect_error([] { validate_speculative({.method = "forced"}); }, "--speculative must be none, ngram, suffix or draft, got 'forced'");
}

// Alone, a request takes a step fewer for every draft kept.
TEST(Speculative, KeptDraftsSaveSteps) {
  for (const char* method : {"ngram", "suffix"}) {
    SCOPED_TRACE(method);
    std::int64_t accepted = 0;
    for (const Request& r : requests()) {
      const Outcome plain = run({}, {r}), spec = run({.speculative = true, .method = method}, {r});
      expect_same(spec.outputs, plain.outputs);
      EXPECT_EQ(spec.stats.steps + spec.stats.accepted_tokens, plain.stats.steps);
      accepted += spec.stats.accepted_tokens;
    }
    EXPECT_GT(accepted, 0);
  }
}

// Suffix decoding: a request that repeats a finished one drafts its whole output from the
// engine's index of finished requests (without it, only from its own tokens), same tokens.
TEST(Speculative, SuffixDraftsARepeatedRequestFromTheOneBefore) {
  Request r;
  r.prompt = {3, 17, 29, 11, 40, 2, 31};  // no repeats of its own
  r.max_tokens = 16;
  const std::vector<std::int32_t> expected = run({}, {r}).outputs[0].tokens;
  std::int64_t first_accepted = 0;
  for (const std::int64_t cache : {std::int64_t(1) << 16, std::int64_t(0)}) {
    SCOPED_TRACE(cache);
    Engine e = make_engine({.speculative = true, .method = "suffix", .suffix_cache_tokens = cache});
    e.add_request(r);
    EXPECT_EQ(e.run_to_completion()[0].tokens, expected);
    first_accepted = e.stats().accepted_tokens;
    e.reset_stats();
    e.add_request(r);
    EXPECT_EQ(e.run_to_completion()[0].tokens, expected);
    const EngineStats& second = e.stats();
    if (cache > 0) {
      // After its first token (the prompt's step) each step takes 4 drafts and the model's token.
      EXPECT_EQ(second.accepted_tokens, 12);
      EXPECT_EQ(second.drafted_tokens, 12);
      EXPECT_EQ(second.steps, 4);
      EXPECT_LT(first_accepted, second.accepted_tokens);
    } else {
      EXPECT_EQ(second.accepted_tokens, first_accepted);
    }
  }
}

// A request's choices fork after the prompt and draft on their own.
TEST(Speculative, ForkedChoicesDraftOnTheirOwn) {
  std::vector<Request> choices(3, requests()[1]);
  for (int i = 0; i < 3; ++i) choices[std::size_t(i)].sampling.seed = std::uint64_t(70 + i);
  const Outcome plain = run({}, choices, true), spec = run({.speculative = true}, choices, true);
  expect_same(spec.outputs, plain.outputs);
  EXPECT_GT(spec.stats.accepted_tokens, 0);
  EXPECT_EQ(spec.blocks_left, 0);
}

// Ends inside a run of kept drafts: at an end-of-sequence token, a stop token, max_tokens, and
// on_token returning false; every token after the end is dropped.
TEST(Speculative, RequestsEndInsideKeptDrafts) {
  Request base = requests()[0];  // greedy, repeats 5 6 7 8
  const std::vector<std::int32_t> full = run({}, {base}).outputs[0].tokens;
  ASSERT_GE(full.size(), 12u);
  for (int cut : {3, 8}) {
    SCOPED_TRACE(cut);
    Request eos = base, stop = base, length = base, callback = base;
    eos.eos_token_ids = {full[std::size_t(cut)]};
    stop.stop_token_ids = {full[std::size_t(cut)]};
    length.max_tokens = cut + 1;
    int seen = 0;
    callback.on_token = [&seen, cut](const GeneratedToken&) { return ++seen <= cut; };
    for (const Request& r : {eos, stop, length}) {
      expect_same(run({.speculative = true}, {r}).outputs, run({}, {r}).outputs);
      expect_same(run({.speculative = true, .method = "suffix"}, {r}).outputs, run({}, {r}).outputs);
    }
    const Outcome spec = run({.speculative = true}, {callback});
    seen = 0;
    const Outcome plain = run({}, {callback});
    expect_same(spec.outputs, plain.outputs);
    EXPECT_EQ(spec.outputs[0].tokens.size(), std::size_t(cut + 1));
    EXPECT_EQ(spec.blocks_left, 0);
  }
}

// Requests with penalties decode a token a step (and still the same tokens).
TEST(Speculative, PenalisedRequestsAreNotDrafted) {
  Request r = requests()[0];
  r.sampling.repetition_penalty = 1.3f;
  const Outcome spec = run({.speculative = true}, {r});
  EXPECT_EQ(spec.stats.drafted_tokens, 0);
  expect_same(spec.outputs, run({}, {r}).outputs);
}

}  // namespace
}  // namespace asynct
