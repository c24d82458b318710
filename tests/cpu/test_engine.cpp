// The engine on the CPU backend with the tiny AsyncT and Qwen3 models: batching, chunked
// prefill, preemption and pipelining must not change what a request generates; penalties,
// stop tokens, the token callback and logprobs do what they say; bad requests get errors.
// (Over 500 lines: the tests share one set of engine setups, requests and runs, kept here.)
#include <algorithm>
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "models/cpu/cpu_model_runner.h"
#include "engine/sampler.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

struct EngineSetup {
  Architecture arch;
  int num_blocks = 64, block_size = 16, budget = 2048, max_seqs = 64;
  bool pipeline = true;
  bool prefix_caching = false;
};

EngineOptions engine_options(const EngineSetup& s) {
  EngineOptions o;
  o.max_num_batched_tokens = s.budget;
  o.max_num_seqs = s.max_seqs;
  o.max_model_len = 1024;
  o.pipeline_steps = s.pipeline;
  o.prefix_caching = s.prefix_caching;
  return o;
}

Engine make_engine(const EngineSetup& s) {
  ModelWeights w = random_weights(tiny_config(s.arch), 7);
  const int vocab = w.config.vocab_size;
  return Engine(std::make_unique<CpuModelRunner>(std::move(w), s.num_blocks, s.block_size), vocab, engine_options(s));
}

std::vector<Request> requests(float temperature) {
  std::vector<Request> rs;
  const std::vector<std::vector<std::int32_t>> prompts = {
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, {42}, {7, 7, 7, 250, 0}, {100, 3}};
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = 12 + int(i);
    r.sampling = {.temperature = temperature,
                  .top_k = temperature > 0 ? 50 : 0,
                  .top_p = temperature > 0 ? 0.9f : 1.0f,
                  .seed = 1000 + i};
    rs.push_back(r);
  }
  return rs;
}

std::vector<std::vector<std::int32_t>> generate(const EngineSetup& setup, const std::vector<Request>& rs,
                                                EngineStats* stats = nullptr) {
  Engine e = make_engine(setup);
  for (const Request& r : rs) e.add_request(r);
  std::vector<std::vector<std::int32_t>> out;
  for (const RequestOutput& o : e.run_to_completion()) out.push_back(o.tokens);
  if (stats) *stats = e.stats();
  return out;
}

class EngineTest : public ::testing::TestWithParam<std::tuple<Architecture, float>> {};

TEST_P(EngineTest, BatchedEqualsOneAtATime) {
  const auto [arch, temperature] = GetParam();
  std::vector<Request> rs = requests(temperature);
  auto batched = generate({arch}, rs);
  ASSERT_EQ(batched.size(), rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(int(batched[i].size()), rs[i].max_tokens);
    EXPECT_EQ(generate({arch}, {rs[i]})[0], batched[i]) << "request " << i;
  }
}

TEST_P(EngineTest, ChunkedPrefillEqualsUnchunked) {
  const auto [arch, temperature] = GetParam();
  std::vector<Request> rs = requests(temperature);
  EngineStats stats;
  auto chunked = generate({arch, 64, 16, /*budget=*/5}, rs, &stats);
  EXPECT_EQ(chunked, generate({arch}, rs));
  EXPECT_GT(stats.steps, 10);
}

TEST_P(EngineTest, PreemptionAndRecomputeChangeNothing) {
  const auto [arch, temperature] = GetParam();
  std::vector<Request> rs = requests(temperature);
  EngineStats stats;
  // 4 blocks of 8 tokens: too few for all four requests at once.
  auto tight = generate({arch, 5, 8}, rs, &stats);
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_EQ(tight, generate({arch}, rs));
}

TEST_P(EngineTest, BlockSizeDoesNotMatter) {
  const auto [arch, temperature] = GetParam();
  std::vector<Request> rs = requests(temperature);
  EXPECT_EQ(generate({arch, 8, 256}, rs), generate({arch, 200, 1}, rs));
}

INSTANTIATE_TEST_SUITE_P(Models, EngineTest,
                         ::testing::Combine(::testing::Values(Architecture::AsyncT, Architecture::Qwen3),
                                            ::testing::Values(0.0f, 0.8f)));

std::vector<RequestOutput> run(const EngineSetup& setup, const std::vector<Request>& rs, EngineStats* stats = nullptr) {
  Engine e = make_engine(setup);
  for (const Request& r : rs) e.add_request(r);
  std::vector<RequestOutput> out = e.run_to_completion();
  if (stats) *stats = e.stats();
  return out;
}

void expect_same_outputs(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].finish_reason, b[i].finish_reason) << "request " << i;
  }
}

// Decode steps queued before the host has read the tokens they continue from give the same
// tokens, also when sequences stop at an end-of-sequence token while the next step is queued
// (one request: every sequence of the queued step has ended).
TEST(Engine, PipelinedStepsEqualUnpipelined) {
  for (Architecture arch : {Architecture::AsyncT, Architecture::Qwen3}) {
    std::vector<Request> rs = requests(0.0f);
    const auto full = generate({arch}, rs);
    for (std::size_t i = 0; i < rs.size(); i += 2) rs[i].eos_token_ids = {full[i][3 + i]};  // requests 0 and 2 stop early
    for (const std::vector<Request>& batch : {rs, std::vector<Request>{rs[0]}}) {
      EngineStats pipelined, plain;
      const auto a = run({arch}, batch, &pipelined);
      const auto b = run({arch, 64, 16, 2048, 64, /*pipeline=*/false}, batch, &plain);
      expect_same_outputs(a, b);
      EXPECT_EQ(a[0].finish_reason, "eos");
      EXPECT_GT(pipelined.pipelined_steps, 0);
      EXPECT_EQ(plain.pipelined_steps, 0);
      EXPECT_EQ(pipelined.decode_tokens, plain.decode_tokens);  // a dropped row is not counted
    }
  }
}

// Requests with every option: a temperature, top-k, top-p, min-p, the three penalties and
// logprobs, with different seeds.
std::vector<Request> sampled_requests() {
  std::vector<Request> rs = requests(0.8f);
  for (std::size_t i = 0; i < rs.size(); ++i) {
    SamplingParams& p = rs[i].sampling;
    p.min_p = 0.02f;
    p.repetition_penalty = 1.2f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.3f;
    p.logprobs = int(i % 3);
  }
  return rs;
}

void expect_same_logprobs(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << "request " << i;
    ASSERT_EQ(a[i].top_logprobs.size(), b[i].top_logprobs.size()) << "request " << i;
    for (std::size_t t = 0; t < a[i].top_logprobs.size(); ++t) {
      ASSERT_EQ(a[i].top_logprobs[t].size(), b[i].top_logprobs[t].size());
      for (std::size_t k = 0; k < a[i].top_logprobs[t].size(); ++k) {
        EXPECT_EQ(a[i].top_logprobs[t][k].id, b[i].top_logprobs[t][k].id);
        EXPECT_EQ(a[i].top_logprobs[t][k].logprob, b[i].top_logprobs[t][k].logprob);
      }
    }
  }
}

// The CPU runner draws every row where the step runs: sampled decode steps are queued ahead as
// greedy ones are (the chained row's input token is the token drawn for the row before, and
// its penalties count it), with the same tokens as steps run one at a time, also when a
// request ends at an end-of-sequence token with a step queued behind it.
TEST(Engine, PipelinedSampledStepsEqualUnpipelined) {
  for (Architecture arch : {Architecture::AsyncT, Architecture::Qwen3}) {
    std::vector<Request> rs = sampled_requests();
    const auto full = generate({arch}, rs);
    rs[1].eos_token_ids = {full[1][4]};
    EngineStats pipelined, plain;
    const auto a = run({arch}, rs, &pipelined);
    const auto b = run({arch, 64, 16, 2048, 64, /*pipeline=*/false}, rs, &plain);
    expect_same_outputs(a, b);
    expect_same_logprobs(a, b);
    EXPECT_EQ(a[1].finish_reason, "eos");
    EXPECT_GT(pipelined.pipelined_steps, 0);
    EXPECT_EQ(plain.pipelined_steps, 0);
    EXPECT_EQ(pipelined.decode_tokens, plain.decode_tokens);
  }
}

// The CPU runner as a runner that draws only greedy rows without penalties where the step runs
// (what the CUDA runner does for now): the engine queues no step behind a step with other rows.
class DeviceGreedyOnlyRunner : public CpuModelRunner {
 public:
  using CpuModelRunner::CpuModelRunner;
  bool samples_on_device(const RowSampling& row) const override {
    return row.params.temperature == 0.0f && !row.params.has_penalties();
  }
};

TEST(Engine, StepsWithRowsTheRunnerDrawsOnTheHostAreNotChained) {
  for (float temperature : {0.0f, 0.8f}) {
    ModelWeights w = random_weights(tiny_config(Architecture::AsyncT), 7);
    const int vocab = w.config.vocab_size;
    Engine e(std::make_unique<DeviceGreedyOnlyRunner>(std::move(w), 64, 16), vocab, engine_options({Architecture::AsyncT}));
    const std::vector<Request> rs = requests(temperature);
    for (const Request& r : rs) e.add_request(r);
    expect_same_outputs(e.run_to_completion(), run({Architecture::AsyncT}, rs));
    if (temperature > 0.0f)
      EXPECT_EQ(e.stats().pipelined_steps, 0);
    else
      EXPECT_GT(e.stats().pipelined_steps, 0);
  }
}

// The definition, without the engine: one request alone, stepped through the runner by hand
// (the prompt, then one token a step), each step's raw logits penalised by counting the
// sequence (prompt and output) and sampled with the host sampler at the request's step.
std::vector<std::int32_t> generate_by_definition(CpuModelRunner& runner, const Request& r) {
  const int vocab = runner.config().vocab_size, block_size = runner.block_size();
  std::vector<std::int32_t> seq = r.prompt, out;
  int computed = 0;  // tokens in the cache: the sequence's in blocks 0, 1, ...
  for (int step = 0; step < r.max_tokens; ++step) {
    const int n = int(seq.size());
    StepBatch b;
    b.tokens.assign(seq.begin() + computed, seq.end());
    b.cu_seqlens_q = {0, n - computed};
    b.kv_lens = {n};
    b.block_tables.resize(1);
    for (int block = 0; block * block_size < n; ++block) b.block_tables[0].push_back(block);
    for (int pos = computed; pos < n; ++pos) {
      b.positions.push_back(pos);
      b.slot_mapping.push_back(pos);
    }
    b.logit_rows = {n - computed - 1};
    b.full_logits = {1};
    b.sampling = {RowSampling{}};
    const StepOutput& o = runner.forward(b);
    computed = n;
    std::vector<float> x(o.logits[0], o.logits[0] + vocab);
    const SamplingParams& p = r.sampling;
    for (int id = 0; id < vocab; ++id) {
      int output = 0;
      bool in_prompt = false;
      for (std::size_t i = 0; i < seq.size(); ++i) {
        if (seq[i] != id) continue;
        if (i < r.prompt.size())
          in_prompt = true;
        else
          ++output;
      }
      if (!in_prompt && output == 0) continue;
      float& v = x[std::size_t(id)];
      v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
      v -= p.frequency_penalty * float(output);
      if (output > 0) v -= p.presence_penalty;
    }
    const std::int32_t token = sample_token(x, p, std::uint64_t(step));
    seq.push_back(token);
    out.push_back(token);
  }
  return out;
}

// Greedy and sampled, with and without penalties (encouraging ones too), the engine's tokens
// are the definition's: the greedy output is the argmax chain, and the penalties apply to the
// right tokens with the right counts, the newest included, batched, chunked and pipelined.
TEST(Engine, PenaltiesAndSamplingFollowTheDefinition) {
  const std::vector<SamplingParams> cases = {
      {},                                                             // greedy
      {.repetition_penalty = 1.8f},                                   //
      {.presence_penalty = 1.5f, .frequency_penalty = 0.8f},          //
      {.repetition_penalty = 0.7f, .frequency_penalty = -1.0f},       // encouraging repetition
      {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .min_p = 0.01f, .repetition_penalty = 1.3f,
       .presence_penalty = 0.5f, .frequency_penalty = 0.5f, .seed = 77},
  };
  // Every case for two prompts in one engine (batched and pipelined); the definition runs a
  // prefill per token, so 8 tokens each.
  const std::vector<Request> prompts = {requests(0.0f)[0], requests(0.0f)[1]};
  for (Architecture arch : {Architecture::AsyncT, Architecture::Qwen3}) {
    std::vector<Request> rs;
    for (const SamplingParams& p : cases)
      for (Request r : prompts) {
        r.sampling = p;
        r.max_tokens = 8;
        rs.push_back(r);
      }
    const auto got = generate({arch}, rs);
    CpuModelRunner runner(random_weights(tiny_config(arch), 7), 64, 16);  // make_engine's weights
    for (std::size_t i = 0; i < rs.size(); ++i)
      EXPECT_EQ(got[i], generate_by_definition(runner, rs[i])) << "case " << i / 2 << ", prompt " << i % 2;
    // The penalties change what the model generates.
    for (std::size_t c = 1; c < 4; ++c)
      EXPECT_TRUE(got[2 * c] != got[0] || got[2 * c + 1] != got[1]) << "case " << c;
    if (arch == Architecture::Qwen3) {
      EXPECT_EQ(generate({arch, 64, 16, /*budget=*/5}, rs), got) << "chunked";
    }
  }
}

// The runner's half of pipelining: a chained batch's token ids are the tokens (greedy or drawn)
// of the step submitted before it; misuse is a clear error.
TEST(CpuModelRunner, ChainedStepsTakeTheTokensOfTheStepBefore) {
  ModelWeights w = random_weights(tiny_config(Architecture::AsyncT), 7);
  CpuModelRunner runner(w, 8, 16), plain(w, 8, 16);
  auto batch = [](std::vector<std::int32_t> tokens, int position) {
    StepBatch b;
    b.cu_seqlens_q = {0};
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      b.tokens.push_back(tokens[i]);
      b.positions.push_back(position);
      b.slot_mapping.push_back(std::int64_t(i) * 16 + position);  // sequence i in block i
      b.cu_seqlens_q.push_back(int(i) + 1);
      b.kv_lens.push_back(position + 1);
      b.block_tables.push_back({int(i)});
      b.logit_rows.push_back(int(i));
      b.full_logits.push_back(0);
      RowSampling sampled;  // row 0 greedy, row 1 drawn
      if (i == 1) sampled.params = {.temperature = 1.5f, .seed = 3};
      b.sampling.push_back(sampled);
    }
    return b;
  };
  const StepBatch first = batch({3, 9}, 0);
  StepBatch chained = batch({0, 0}, 1);
  chained.tokens_from_rows = {1, 0};  // the sequences' rows swapped: sequence 0 continues from row 1
  runner.submit(first);
  runner.submit(chained);
  const std::vector<LogitSummary> a = runner.collect().summaries;
  const std::vector<LogitSummary> b = runner.collect().summaries;
  plain.forward(first);
  const StepOutput& expected = plain.forward(batch({a[1].token, a[0].token}, 1));
  ASSERT_EQ(b.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(b[i].token, expected.summaries[i].token) << "row " << i;

  expect_error([&] { runner.collect(); }, "collect: no step was submitted");
  StepBatch bad = chained;
  bad.tokens_from_rows = {0, 2};
  expect_error([&] { runner.submit(bad); }, "submit: token 1 takes row 2 of a step that sampled 2 rows");
  bad.tokens_from_rows = {0};
  expect_error([&] { runner.submit(bad); }, "tokens_from_rows needs one row per token");
  runner.submit(first);
  runner.submit(first);
  expect_error([&] { runner.submit(first); }, "two steps are queued already");
}

TEST(Engine, SeededSamplingIsDeterministicAndSeedsDiffer) {
  std::vector<Request> rs = requests(1.0f);
  EXPECT_EQ(generate({Architecture::AsyncT}, rs), generate({Architecture::AsyncT}, rs));
  std::vector<Request> other = rs;
  for (Request& r : other) r.sampling.seed += 1;
  EXPECT_NE(generate({Architecture::AsyncT}, rs), generate({Architecture::AsyncT}, other));
}

// A request ends at the first of its end-of-sequence tokens it generates; with none it runs to
// max_tokens.
TEST(Engine, StopsAtAnyOfItsEosTokens) {
  std::vector<Request> rs = requests(0.0f);
  auto full = generate({Architecture::Qwen3}, {rs[0]})[0];
  ASSERT_EQ(int(full.size()), rs[0].max_tokens);
  const auto first_of = [&](std::int32_t id) { return std::find(full.begin(), full.end(), id) - full.begin(); };
  // Two ids, neither of them the last token: the request ends at whichever comes first.
  Request r = rs[0];
  r.eos_token_ids = {full[5], full[3]};
  Engine e = make_engine({Architecture::Qwen3});
  e.add_request(r);
  auto out = e.run_to_completion();
  EXPECT_EQ(out[0].finish_reason, "eos");
  EXPECT_EQ(std::int64_t(out[0].tokens.size()), std::min(first_of(full[5]), first_of(full[3])) + 1);
  EXPECT_EQ(std::vector<std::int32_t>(full.begin(), full.begin() + std::ptrdiff_t(out[0].tokens.size())), out[0].tokens);

  r.eos_token_ids = {};
  Engine plain = make_engine({Architecture::Qwen3});
  plain.add_request(r);
  out = plain.run_to_completion();
  EXPECT_EQ(out[0].finish_reason, "length");
  EXPECT_EQ(out[0].tokens, full);
}

// Prefill tokens are the prompt's, decode tokens the generated ones fed back, however the
// prompt is chunked: a 1-token chunk of the prompt is not a decode token.
TEST(Engine, CountsPrefillAndDecodeTokensByPosition) {
  for (const int budget : {1, 2, 2048}) {
    for (const bool pipeline : {true, false}) {
      Request r;
      r.prompt = {1, 2, 3};
      r.max_tokens = 4;
      EngineStats stats;
      generate({Architecture::AsyncT, 64, 16, budget, 64, pipeline}, {r}, &stats);
      SCOPED_TRACE("budget " + std::to_string(budget) + (pipeline ? ", pipelined" : ""));
      EXPECT_EQ(stats.prefill_tokens, 3);
      EXPECT_EQ(stats.decode_tokens, 3);  // the 4th token is sampled, never fed back
    }
  }
}

// Greedy rows come back from the runner as their argmax only; rows that record their logits
// come back whole, and their greedy token is the argmax of what was recorded.
TEST(Engine, RecordedFirstLogitsGiveTheFirstGreedyToken) {
  for (Architecture arch : {Architecture::AsyncT, Architecture::Qwen3}) {
    ModelWeights w = random_weights(tiny_config(arch), 7);
    const int vocab = w.config.vocab_size;
    EngineOptions o;
    o.record_first_logits = true;
    Engine e(std::make_unique<CpuModelRunner>(std::move(w), 64, 16), vocab, o);
    std::vector<Request> rs = requests(0.0f);
    for (const Request& r : rs) e.add_request(r);
    const auto out = e.run_to_completion();
    const auto plain = generate({arch}, rs);
    ASSERT_EQ(out.size(), rs.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].tokens, plain[i]) << "request " << i;  // recording changes nothing
      ASSERT_EQ(int(out[i].first_logits.size()), vocab);
      const auto& l = out[i].first_logits;
      EXPECT_EQ(std::max_element(l.begin(), l.end()) - l.begin(), out[i].tokens[0]) << "request " << i;
    }
  }
}

// A stop token ends the request with "stop" and stays in the output; an end-of-sequence token
// that is also a stop token says "eos".
TEST(Engine, StopTokensEndWithStop) {
  std::vector<Request> rs = requests(0.0f);
  const auto full = generate({Architecture::Qwen3}, {rs[0]})[0];
  const auto first_of = [&](std::int32_t id) { return std::find(full.begin(), full.end(), id) - full.begin(); };
  Request r = rs[0];
  r.stop_token_ids = {full[6], full[4]};
  for (bool also_eos : {false, true}) {
    if (also_eos) r.eos_token_ids = {full[4]};
    Engine e = make_engine({Architecture::Qwen3});
    e.add_request(r);
    const auto out = e.run_to_completion();
    const std::int64_t length = std::min(first_of(full[6]), first_of(full[4])) + 1;
    EXPECT_EQ(std::int64_t(out[0].tokens.size()), length);
    EXPECT_EQ(std::vector<std::int32_t>(full.begin(), full.begin() + std::ptrdiff_t(length)), out[0].tokens);
    EXPECT_EQ(out[0].finish_reason, also_eos && out[0].tokens.back() == full[4] ? "eos" : "stop");
  }
}

// on_token sees every generated token of every request, in order, with its logprobs when the
// request asks for them; pipelined or not.
TEST(Engine, OnTokenSeesEveryTokenInOrder) {
  for (bool pipeline : {true, false}) {
    for (float temperature : {0.0f, 0.8f}) {
      Engine e = make_engine({Architecture::AsyncT, 64, 16, 2048, 64, pipeline});
      std::map<std::int64_t, std::vector<GeneratedToken>> seen;
      std::vector<Request> rs = temperature > 0 ? sampled_requests() : requests(0.0f);
      std::vector<std::int64_t> ids;
      for (Request& r : rs) {
        r.on_token = [&seen](const GeneratedToken& g) {
          seen[g.request_id].push_back(g);
          return true;
        };
        ids.push_back(e.add_request(r));
      }
      const auto out = e.run_to_completion();
      ASSERT_EQ(out.size(), rs.size());
      for (std::size_t i = 0; i < out.size(); ++i) {
        const std::vector<GeneratedToken>& g = seen[ids[i]];
        ASSERT_EQ(g.size(), out[i].tokens.size()) << "request " << i;
        for (std::size_t t = 0; t < g.size(); ++t) {
          EXPECT_EQ(g[t].token, out[i].tokens[t]) << "request " << i << ", token " << t;
          if (!out[i].logprobs.empty()) {
            EXPECT_EQ(g[t].logprob, out[i].logprobs[t]);
          }
          EXPECT_EQ(g[t].top_logprobs.size(), out[i].top_logprobs.empty() ? 0 : out[i].top_logprobs[t].size());
        }
      }
    }
  }
}

// on_token returning false ends the request at once with "stop" (its token kept); the others
// run on unchanged, and a step queued behind drops the request's row.
TEST(Engine, OnTokenReturningFalseStopsTheRequestAtOnce) {
  const std::vector<Request> rs = requests(0.0f);
  const auto full = generate({Architecture::AsyncT}, rs);
  std::vector<RequestOutput> by_pipelining[2];
  EngineStats stats[2];
  for (bool pipeline : {true, false}) {
    std::vector<Request> stopped = rs;
    int calls = 0;
    stopped[0].on_token = [&calls](const GeneratedToken&) { return ++calls < 3; };
    const auto out = run({Architecture::AsyncT, 64, 16, 2048, 64, pipeline}, stopped, &stats[pipeline]);
    EXPECT_EQ(calls, 3);
    EXPECT_EQ(out[0].finish_reason, "stop");
    EXPECT_EQ(out[0].tokens, std::vector<std::int32_t>(full[0].begin(), full[0].begin() + 3));
    for (std::size_t i = 1; i < rs.size(); ++i) {
      EXPECT_EQ(out[i].tokens, full[i]) << "request " << i;
      EXPECT_EQ(out[i].finish_reason, "length") << "request " << i;
    }
    by_pipelining[pipeline] = out;
  }
  EXPECT_GT(stats[1].pipelined_steps, 0);
  EXPECT_EQ(stats[1].decode_tokens, stats[0].decode_tokens);  // the dropped row is not counted
}

// A request waiting for a place ends at once with "abort" and no tokens (no prefill, no
// blocks); a running one is not aborted this way; the others run as they would have.
TEST(Engine, AbortWaitingEndsOnlyAWaitingRequest) {
  const std::vector<Request> rs = requests(0.0f);
  const auto full = generate({Architecture::AsyncT}, rs);
  for (bool pipeline : {true, false}) {
    Engine e = make_engine({Architecture::AsyncT, 64, 16, 2048, /*max_seqs=*/2, pipeline});
    std::vector<std::int64_t> ids;
    for (const Request& r : rs) ids.push_back(e.add_request(r));
    EXPECT_FALSE(e.abort_waiting(12345));
    std::map<std::int64_t, RequestOutput> out;
    for (RequestOutput& o : e.step()) out[o.id] = std::move(o);  // requests 0 and 1 run; 2 and 3 wait
    EXPECT_FALSE(e.abort_waiting(ids[0])) << "running";
    EXPECT_TRUE(e.abort_waiting(ids[2]));
    EXPECT_FALSE(e.abort_waiting(ids[2])) << "already ended";
    while (e.has_unfinished())
      for (RequestOutput& o : e.step()) out[o.id] = std::move(o);
    ASSERT_EQ(out.size(), rs.size());
    EXPECT_EQ(out[ids[2]].finish_reason, "abort");
    EXPECT_TRUE(out[ids[2]].tokens.empty());
    for (int i : {0, 1, 3}) {
      EXPECT_EQ(out[ids[std::size_t(i)]].tokens, full[std::size_t(i)]) << "request " << i;
      EXPECT_EQ(out[ids[std::size_t(i)]].finish_reason, "length") << "request " << i;
    }
    EXPECT_EQ(e.kv_blocks_used(), 0);
    EXPECT_EQ(e.num_running() + e.num_waiting(), 0);
  }
}

// A request cancelled during its prompt (Request::cancelled, asked after each chunk) ends after
// the chunk being computed, with no token and finish_reason "abort", its choices not yet forked
// with it; the others run on unchanged, and no block stays used. A prompt of 21 tokens in
// chunks of 4 (the step budget), cancelled after its second chunk.
TEST(Engine, ARequestCancelledDuringItsPromptEndsAfterTheChunk) {
  const std::vector<Request> rs = requests(0.0f);
  const auto full = generate({Architecture::AsyncT}, rs);
  for (bool pipeline : {true, false}) {
    Engine e = make_engine({Architecture::AsyncT, 64, 16, /*budget=*/4, 64, pipeline});
    int asked = 0;
    Request cancelled = rs[0];
    cancelled.cancelled = [&asked] { return ++asked == 2; };
    const std::vector<std::int64_t> group = e.add_request_group({cancelled, cancelled});
    std::vector<std::int64_t> ids = {group[0]};
    for (std::size_t i = 1; i < rs.size(); ++i) ids.push_back(e.add_request(rs[i]));
    std::map<std::int64_t, RequestOutput> out;
    while (e.has_unfinished())
      for (RequestOutput& o : e.step()) out[o.id] = std::move(o);
    EXPECT_EQ(asked, 2) << "asked after each chunk until it said yes";
    for (std::int64_t id : group) {
      EXPECT_EQ(out[id].finish_reason, "abort") << "choice " << id;
      EXPECT_TRUE(out[id].tokens.empty());
    }
    for (std::size_t i = 1; i < rs.size(); ++i) {
      EXPECT_EQ(out[ids[i]].tokens, full[i]) << "request " << i;
      EXPECT_EQ(out[ids[i]].finish_reason, "length") << "request " << i;
    }
    EXPECT_EQ(e.kv_blocks_used(), 0);
    EXPECT_EQ(e.num_running() + e.num_waiting(), 0);
  }
}

// An exception from on_token ends its request and reaches the caller of step() once the step
// is applied; that step's finished requests come from the next step(), and the rest run on.
TEST(Engine, AnExceptionFromOnTokenReachesTheCallerAfterTheStep) {
  const std::vector<Request> rs = requests(0.0f);
  const auto full = generate({Architecture::AsyncT}, rs);
  std::vector<Request> throwing = rs;
  throwing[1].max_tokens = 2;  // finishes in the step whose callback throws
  int calls = 0;
  throwing[0].on_token = [&calls](const GeneratedToken&) -> bool {
    if (++calls == 2) throw Error("client went away");
    return true;
  };
  Engine e = make_engine({Architecture::AsyncT});
  for (const Request& r : throwing) e.add_request(r);
  std::map<std::int64_t, RequestOutput> out;
  int errors = 0;
  while (e.has_unfinished()) {
    try {
      for (RequestOutput& o : e.step()) out[o.id] = std::move(o);
    } catch (const Error& err) {
      EXPECT_STREQ(err.what(), "client went away");
      ++errors;
    }
  }
  EXPECT_EQ(errors, 1);
  ASSERT_EQ(out.size(), rs.size());
  EXPECT_EQ(out[0].finish_reason, "stop");
  EXPECT_EQ(out[0].tokens, std::vector<std::int32_t>(full[0].begin(), full[0].begin() + 2));
  EXPECT_EQ(out[1].tokens, std::vector<std::int32_t>(full[1].begin(), full[1].begin() + 2));
  for (std::size_t i = 2; i < rs.size(); ++i) EXPECT_EQ(out[std::int64_t(i)].tokens, full[i]) << "request " << i;
}

// Logprobs come back when asked: one per token, and the n top ones when n > 0; the first
// token's against a naive log_softmax of the recorded raw logits (penalties and temperature
// aside: the model's distribution).
TEST(Engine, LogprobsComeBackWhenAsked) {
  ModelWeights w = random_weights(tiny_config(Architecture::Qwen3), 7);
  const int vocab = w.config.vocab_size;
  EngineOptions o;
  o.record_first_logits = true;
  Engine e(std::make_unique<CpuModelRunner>(std::move(w), 64, 16), vocab, o);
  std::vector<Request> rs = sampled_requests();  // logprobs 0, 1, 2, 0
  rs[3].sampling.logprobs = -1;
  rs[2].sampling.logprobs = kMaxTopLogprobs;
  for (const Request& r : rs) e.add_request(r);
  const auto out = e.run_to_completion();
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int n = rs[i].sampling.logprobs;
    SCOPED_TRACE("request " + std::to_string(i));
    if (n < 0) {
      EXPECT_TRUE(out[i].logprobs.empty());
      EXPECT_TRUE(out[i].top_logprobs.empty());
      continue;
    }
    ASSERT_EQ(out[i].logprobs.size(), out[i].tokens.size());
    ASSERT_EQ(out[i].top_logprobs.size(), n > 0 ? out[i].tokens.size() : 0u);
    for (float lp : out[i].logprobs) EXPECT_LE(lp, 0.0f);
    const std::vector<float>& x = out[i].first_logits;
    const float max_logit = *std::max_element(x.begin(), x.end());
    double norm = 0.0;
    for (float v : x) norm += std::exp(double(v) - max_logit);
    const auto naive = [&](int id) { return double(x[std::size_t(id)]) - max_logit - std::log(norm); };
    EXPECT_NEAR(out[i].logprobs[0], naive(out[i].tokens[0]), 1e-5);
    if (n == 0) continue;
    const std::vector<TopLogprob>& top = out[i].top_logprobs[0];
    ASSERT_EQ(int(top.size()), n);
    for (std::size_t k = 0; k < top.size(); ++k) {
      EXPECT_NEAR(top[k].logprob, naive(top[k].id), 1e-5);
      if (k == 0) continue;
      const float before = x[std::size_t(top[k - 1].id)], here = x[std::size_t(top[k].id)];
      EXPECT_TRUE(before > here || (before == here && top[k - 1].id < top[k].id)) << "rank " << k;
    }
    EXPECT_EQ(top[0].id, std::max_element(x.begin(), x.end()) - x.begin());
  }
}

TEST(Engine, NonFiniteLogitsGiveAClearError) {
  for (float temperature : {0.0f, 0.8f}) {
    ModelWeights w = random_weights(tiny_config(Architecture::Qwen3), 7);
    const int vocab = w.config.vocab_size, hidden = w.config.hidden_size;
    w.lm_head.data_as<bf16_bits>()[5 * hidden].bits = float_to_bf16(NAN);  // token 5's logit is NaN, the others finite
    Engine e(std::make_unique<CpuModelRunner>(std::move(w), 64, 16), vocab, {});
    Request r = requests(temperature)[0];
    e.add_request(r);
    expect_error([&] { e.run_to_completion(); }, "sampling: logit 5 is not finite (nan)");
  }
}

TEST(Engine, BadRequestsGiveClearErrors) {
  Engine e = make_engine({Architecture::AsyncT, 4, 16});
  Request r;
  expect_error([&] { e.add_request(r); }, "prompt is empty");
  r.prompt = {1, 256};
  expect_error([&] { e.add_request(r); }, "token id 256 at prompt position 1 is outside the vocabulary [0, 256)");
  r.prompt = {1};
  r.max_tokens = 0;
  expect_error([&] { e.add_request(r); }, "max_tokens must be >= 1");
  r.max_tokens = 1024;
  expect_error([&] { e.add_request(r); }, "over max_model_len 1024");
  r.max_tokens = 100;  // 101 tokens > 4 blocks x 16
  expect_error([&] { e.add_request(r); }, "need 7 KV blocks but the cache has 4");
  r.max_tokens = 4;
  r.eos_token_ids = {3, 256};
  expect_error([&] { e.add_request(r); }, "end-of-sequence token 256 is outside the vocabulary [0, 256)");
  r.eos_token_ids = {-1};
  expect_error([&] { e.add_request(r); }, "end-of-sequence token -1 is outside the vocabulary [0, 256)");
  r.eos_token_ids = {};
  r.stop_token_ids = {256};
  expect_error([&] { e.add_request(r); }, "stop token 256 is outside the vocabulary [0, 256)");
  r.stop_token_ids = {};
  r.sampling.top_p = 2.0f;
  expect_error([&] { e.add_request(r); }, "top_p must be in (0, 1]");
  r.sampling.top_p = 1.0f;
  r.sampling.logprobs = 21;
  expect_error([&] { e.add_request(r); }, "logprobs must be in -1..20");
  EXPECT_FALSE(e.has_unfinished());
}

TEST(BlockManager, GrowsReleasesAndRefuses) {
  BlockManager m(3, 16);
  std::vector<int> a, b;
  m.grow(a, 17);
  EXPECT_EQ(a.size(), 2u);
  EXPECT_TRUE(m.can_grow(b, 16));
  EXPECT_FALSE(m.can_grow(b, 17));
  expect_error([&] { m.grow(b, 40); }, "out of KV blocks");
  m.release(a);
  EXPECT_EQ(m.num_free_blocks(), 3);
  m.grow(b, 48);
  EXPECT_EQ(b.size(), 3u);
}

// Filed full blocks are found again by their tokens and the blocks before them, shared, kept
// when released and taken back (least recently released first) when no free block is left.
TEST(BlockManager, FilesMatchesSharesAndEvictsFullBlocks) {
  BlockManager m(4, 2);
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5};
  std::vector<int> a;
  m.grow(a, 5);  // 3 blocks
  const std::uint64_t h0 = m.cache_block(a[0], 0, tokens.data());
  const std::uint64_t h1 = m.cache_block(a[1], h0, tokens.data() + 2);
  EXPECT_EQ(m.cache_block(a[1], h0, tokens.data() + 2), h1);  // filing again changes nothing
  std::vector<int> b, c, d, e, f;
  std::uint64_t last = 0;
  EXPECT_EQ(m.match_prefix(tokens, 2, b, &last), 2);
  EXPECT_EQ(b, (std::vector<int>{a[0], a[1]}));
  EXPECT_EQ(last, h1);
  EXPECT_EQ(m.num_used_blocks(), 3);  // shared blocks count once
  EXPECT_EQ(m.match_prefix({1, 2, 9, 9, 5}, 2, c, &last), 1);  // the second block differs
  EXPECT_EQ(last, h0);
  EXPECT_EQ(m.match_prefix({7, 2, 3, 4}, 2, d, &last), 0);  // so does the first: nothing after it counts
  EXPECT_EQ(m.match_prefix(tokens, 1, e, &last), 1);        // at most max_blocks
  m.release(a), m.release(b), m.release(c), m.release(e);
  EXPECT_EQ(m.num_free_blocks(), 4);  // filed and held by none: free to take
  EXPECT_EQ(m.num_used_blocks(), 0);
  EXPECT_EQ(m.match_prefix(tokens, 2, f, &last), 2);  // still there
  m.release(f);
  std::vector<int> all;
  m.grow(all, 8);  // takes the free blocks, then the filed ones: forgotten
  EXPECT_EQ(m.match_prefix(tokens, 2, f, &last), 0);
  m.release(all);
  expect_error([&] { m.release(all = {0}); }, "released but not held");
}

// With prefix caching, requests after one with the same prefix take its filed blocks instead of
// computing them, and every request generates the same tokens as without; also when the cache
// is small enough that requests are preempted and filed blocks evicted.
TEST(Engine, PrefixCachingSkipsTheSharedPrefixAndKeepsTheTokens) {
  std::vector<Request> rs;
  for (int i = 0; i < 4; ++i) {
    Request r;
    for (int t = 0; t < 40; ++t) r.prompt.push_back((t * 7 + 3) % 250);  // 2 full blocks of 16, and 8 more
    for (int t = 0; t <= i; ++t) r.prompt.push_back(100 + i * 10 + t);
    r.max_tokens = 12;
    r.sampling = {.temperature = i % 2 ? 0.8f : 0.0f, .top_k = 20, .seed = std::uint64_t(i)};
    rs.push_back(r);
  }
  for (int num_blocks : {64, 7}) {
    for (bool pipeline : {true, false}) {
      std::vector<RequestOutput> outs[2];
      EngineStats stats[2];
      for (bool caching : {false, true}) {
        Engine e = make_engine({Architecture::AsyncT, num_blocks, 16, 2048, 64, pipeline, caching});
        e.add_request(rs[0]);
        outs[caching] = e.run_to_completion();  // the first files the shared blocks ...
        for (std::size_t i = 1; i < rs.size(); ++i) e.add_request(rs[i]);
        for (RequestOutput& o : e.run_to_completion()) outs[caching].push_back(std::move(o));  // ... the rest take them
        stats[caching] = e.stats();
        EXPECT_EQ(e.kv_blocks_used(), 0);
      }
      SCOPED_TRACE(std::to_string(num_blocks) + " blocks, pipeline " + std::to_string(pipeline));
      expect_same_outputs(outs[1], outs[0]);
      EXPECT_EQ(stats[0].prefix_cache_hits, 0);
      for (const RequestOutput& o : outs[0]) EXPECT_EQ(o.cached_tokens, 0);
      if (num_blocks == 64) {
        for (std::size_t i = 1; i < outs[1].size(); ++i) EXPECT_EQ(outs[1][i].cached_tokens, 32) << "request " << i;
        EXPECT_EQ(stats[1].prefix_cache_hits, 3 * 32) << "two blocks of 16 for each later request";
        EXPECT_EQ(stats[1].prefill_tokens, stats[0].prefill_tokens - 3 * 32);
      }
    }
  }
}

// A request's choices (add_request_group) fork after the prompt: the same tokens as separate
// requests with the same sampling, the prompt computed once when the cache has room (its full
// blocks shared, the partial one copied), and with too few blocks the choices compute their
// own prompts or are preempted; no block left held at the end.
TEST(Engine, ForkedChoicesEqualSeparateRequests) {
  for (int prompt_len : {21, 32, 5}) {
    std::vector<Request> choices;
    for (int i = 0; i < 3; ++i) {
      Request r;
      for (int t = 0; t < prompt_len; ++t) r.prompt.push_back((t * 11 + 5) % 250);
      r.max_tokens = 10 + i;
      r.sampling = {.temperature = 0.8f, .top_k = 20, .repetition_penalty = 1.2f, .seed = std::uint64_t(40 + i),
                    .logprobs = 2};
      choices.push_back(r);
    }
    for (Architecture arch : {Architecture::AsyncT, Architecture::Qwen3})
      for (int num_blocks : {64, 5})
        for (bool pipeline : {true, false})
          for (bool caching : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "prompt " << prompt_len << ", " << num_blocks << " blocks, pipeline "
                                              << pipeline << ", prefix caching " << caching);
            const EngineSetup setup{arch, num_blocks, 16, 2048, 64, pipeline, caching};
            EngineStats separate_stats, group_stats;
            const std::vector<RequestOutput> separate = run(setup, choices, &separate_stats);
            Engine e = make_engine(setup);
            const std::vector<std::int64_t> ids = e.add_request_group(choices);
            ASSERT_EQ(ids.size(), 3u);
            std::vector<RequestOutput> grouped = e.run_to_completion();
            group_stats = e.stats();
            expect_same_outputs(grouped, separate);
            expect_same_logprobs(grouped, separate);
            EXPECT_EQ(e.kv_blocks_used(), 0);
            if (num_blocks == 64) {
              EXPECT_EQ(group_stats.prefill_tokens, prompt_len) << "the prompt computed once";
              EXPECT_EQ(grouped[0].cached_tokens, 0);
              for (std::size_t i = 1; i < grouped.size(); ++i) EXPECT_EQ(grouped[i].cached_tokens, prompt_len);
            }
          }
  }
}

TEST(Engine, AbortingAChoiceOfAGroupLeavesTheOthers) {
  Request r;
  r.prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  r.max_tokens = 6;
  std::vector<Request> choices(4, r);
  for (int i = 0; i < 4; ++i) choices[std::size_t(i)].sampling = {.temperature = 1.0f, .seed = std::uint64_t(i)};
  const std::vector<RequestOutput> separate = run({Architecture::AsyncT}, choices);
  for (int aborted : {0, 2}) {  // the choice that leads, one that waits to fork
    Engine e = make_engine({Architecture::AsyncT});
    const std::vector<std::int64_t> ids = e.add_request_group(choices);
    EXPECT_EQ(e.num_waiting(), 4) << "the choice that leads and the three waiting to fork";
    EXPECT_TRUE(e.abort_waiting(ids[std::size_t(aborted)]));
    EXPECT_FALSE(e.abort_waiting(ids[std::size_t(aborted)])) << "already ended";
    EXPECT_EQ(e.num_waiting(), 3);
    std::map<std::int64_t, RequestOutput> out;
    while (e.has_unfinished())
      for (RequestOutput& o : e.step()) out[o.id] = std::move(o);
    ASSERT_EQ(out.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      const RequestOutput& o = out[ids[std::size_t(i)]];
      if (i == aborted) {
        EXPECT_EQ(o.finish_reason, "abort");
        EXPECT_TRUE(o.tokens.empty());
      } else {
        EXPECT_EQ(o.tokens, separate[std::size_t(i)].tokens) << "choice " << i;
      }
    }
    EXPECT_EQ(e.kv_blocks_used(), 0);
  }
  Engine e = make_engine({Architecture::AsyncT});
  std::vector<Request> mixed = choices;
  mixed[1].prompt.push_back(7);
  expect_error([&] { e.add_request_group(mixed); }, "same prompt");
  EXPECT_FALSE(e.has_unfinished()) << "a refused group queues nothing";
}

// The one block-size rule per backend, checked by the runner before it allocates anything.
TEST(StepBatch, BlockSizeRulePerBackend) {
  for (int ok : {1, 8, 16, 24, 256, 4096}) EXPECT_NO_THROW(check_block_size(ok, Backend::Cpu)) << ok;
  for (int bad : {0, -16, 4097}) expect_error([&] { check_block_size(bad, Backend::Cpu); }, "1..4096");
  for (int ok : {16, 32, 64, 128, 256}) EXPECT_NO_THROW(check_block_size(ok, Backend::Cuda)) << ok;
  for (int bad : {0, 8, 24, 512}) expect_error([&] { check_block_size(bad, Backend::Cuda); }, "powers of two in 16..256");
  ModelWeights w = random_weights(tiny_config(Architecture::Qwen3), 7);
  expect_error([&] { CpuModelRunner(w, 8, 0); }, "block size 0: the CPU backend");
  expect_error([&] { CpuModelRunner(w, 0, 16); }, "need at least one block");
}

// check_step_batch names the first thing wrong with a batch, the same for both runners.
TEST(StepBatch, CheckNamesTheFirstProblem) {
  StepBatch good;  // one sequence of 3 tokens in blocks {2, 0}, block size 2
  good.tokens = {5, 6, 7};
  good.positions = {0, 1, 2};
  good.slot_mapping = {4, 5, 0};
  good.cu_seqlens_q = {0, 3};
  good.kv_lens = {3};
  good.block_tables = {{2, 0}};
  good.logit_rows = {2};
  good.full_logits = {0};
  good.sampling = {RowSampling{}};
  good.sampling[0].params.presence_penalty = 1.0f;
  good.sampling[0].penalty_end = 2;
  good.penalty_tokens = {{5, 1, 0}, {99, 0, 1}};
  const StepBounds bounds{4, 2, 100, 50, 1};
  EXPECT_NO_THROW(check_step_batch(good, bounds));
  auto expect_rejected = [&](const char* what, auto&& change) {
    StepBatch b = good;
    change(b);
    expect_error([&] { check_step_batch(b, bounds); }, what);
  };
  expect_rejected("forward: empty batch", [](StepBatch& b) { b.tokens.clear(); });
  expect_rejected("positions and slot_mapping need one entry per token", [](StepBatch& b) { b.positions.pop_back(); });
  expect_rejected("one block table per sequence", [](StepBatch& b) { b.block_tables.clear(); });
  expect_rejected("full_logits needs one flag per logit row", [](StepBatch& b) { b.full_logits.clear(); });
  expect_rejected("tokens_from_rows needs one row per token", [](StepBatch& b) { b.tokens_from_rows = {0}; });
  expect_rejected("token 2 takes row 1 of a step that sampled 1 rows", [](StepBatch& b) { b.tokens_from_rows = {0, 0, 1}; });
  expect_rejected("cu_seqlens_q must run from 0 to 3", [](StepBatch& b) { b.cu_seqlens_q = {0, 2}; });
  expect_rejected("sequence 0 has q_len 3 and kv_len 2", [](StepBatch& b) { b.kv_lens = {2}; });
  expect_rejected("sequence 0 has more tokens than its blocks hold", [](StepBatch& b) { b.block_tables = {{2}}; });
  expect_rejected("forward: block 4 is not in the cache", [](StepBatch& b) { b.block_tables = {{2, 4}}; });
  expect_rejected("forward: token id 100 outside the vocabulary", [](StepBatch& b) { b.tokens[1] = 100; });
  expect_rejected("forward: position 50 outside 0..49", [](StepBatch& b) { b.positions[2] = 50; });
  expect_rejected("forward: slot 8 outside the cache", [](StepBatch& b) { b.slot_mapping[0] = 8; });
  expect_rejected("forward: logit row 3 out of range", [](StepBatch& b) { b.logit_rows = {3}; });
  expect_rejected("sampling needs one entry per logit row", [](StepBatch& b) { b.sampling.clear(); });
  expect_rejected("sampling: top_p must be in (0, 1]", [](StepBatch& b) { b.sampling[0].params.top_p = 0.0f; });
  expect_rejected("logit row 0's penalty tokens [0, 3) are not within penalty_tokens (2)",
                  [](StepBatch& b) { b.sampling[0].penalty_end = 3; });
  expect_rejected("logit row 0's penalty tokens [2, 1)", [](StepBatch& b) { b.sampling[0].penalty_begin = 2; b.sampling[0].penalty_end = 1; });
  expect_rejected("forward: penalty token id 100 outside the vocabulary", [](StepBatch& b) { b.penalty_tokens[1].id = 100; });
  expect_rejected("penalty token 5 has a negative output count (-1)", [](StepBatch& b) { b.penalty_tokens[0].output_count = -1; });
  expect_rejected("logit row 0's logit bias [0, 1) is not within logit_bias (0)", [](StepBatch& b) { b.sampling[0].bias_end = 1; });
  expect_rejected("logit_bias: token id 100 is outside the vocabulary [0, 100)",
                  [](StepBatch& b) { b.logit_bias = {{100, 1.0f}}; b.sampling[0].bias_end = 1; });
}

}  // namespace
}  // namespace asynct
