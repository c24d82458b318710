// The asynct command line as a user meets it, run as a child process: errors are readable and
// come before any work, exit codes say what happened (0 done, 1 a bad command line, 2 an
// error, 3 a bug), --help shows every default, bench writes files only where asked and writes
// plain lines to a pipe. Ends with random argument vectors, each of which must exit 0, 1 or 2
// within a time limit.
// (Over 500 lines: every subcommand's tests share the child-process runner and scratch folders here.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_asynct.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using asynct::testing::Outcome;
using asynct::testing::run_asynct;

// A temporary directory that can also list what a command left in it.
class Scratch : public asynct::testing::TempDir {
 public:
  Scratch() : TempDir("asynct_cli") {}
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path())) names.push_back(e.path().filename().string());
    return names;
  }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Cli, InitCheckpointOverAnExistingFileIsAnError) {
  Scratch s;
  { std::ofstream(s.file("taken")) << "x"; }
  const Outcome o = run_asynct({"init-checkpoint", "--out", s.file("taken")}, s.dir());
  EXPECT_EQ(o.code, 2) << o.describe();
  EXPECT_TRUE(contains(o.err, "is not a directory")) << o.describe();
  EXPECT_FALSE(contains(o.err, "internal error")) << o.describe();
}

TEST(Cli, AnUnknownScenarioListsTheNamesBeforeAnyOutput) {
  Scratch s;
  const Outcome o = run_asynct({"bench", "--scenario", "foo", "--scale", "4096"}, s.dir());
  EXPECT_TRUE(o.code == 1 || o.code == 2) << o.describe();
  for (const char* name : {"long_prefill_b4", "prefill_heavy_b16", "decode_heavy_b32", "long_decode_b32", "decode_b1"})
    EXPECT_TRUE(contains(o.err, name)) << name << "\n" << o.describe();
  EXPECT_FALSE(contains(o.out, "asynct s")) << "the table header came before the error\n" << o.describe();
}

TEST(Cli, BenchChecksTheDeviceBeforeMakingWeights) {
  Scratch s;
  const Outcome o = run_asynct({"bench", "--device", "cuda", "--config", "tiny", "--scale", "4096", "--scenario",
                                "decode_b1"},
                               s.dir());
  EXPECT_EQ(o.code, 2) << o.describe();
  EXPECT_FALSE(contains(o.err, "making random")) << o.describe();
  EXPECT_FALSE(contains(o.out, "asynct s")) << o.describe();
  EXPECT_TRUE(contains(o.err, "cuda") || contains(o.err, "CUDA") || contains(o.err, "GPU")) << o.describe();
}

TEST(Cli, OutOfRangeAndMalformedNumbersGiveReadableErrors) {
  Scratch s;
  const std::vector<std::vector<std::string>> cases = {
      {"generate", "--top-k", "-1"},       {"generate", "--num-blocks", "-1"},
      {"generate", "--max-tokens", "abc"}, {"generate", "--max-tokens", "0"},
      {"generate", "--temperature", "x"},  {"demo", "--q-heads", "1.5"},
      {"bench", "--repeat", "-3"},         {"generate", "--seed", "-1"},
      {"generate", "--seed", "18446744073709551616"}, {"generate", "--seed", "1e23"},
      {"bench", "--seed", "-1"},           {"init-checkpoint", "--seed", "-1"},
      {"generate", "--eos", "-1"},         {"generate", "--max-cache-mib", "0"},
      {"serve", "--port", "70000", "--model", "m"}, {"serve", "--max-num-seqs", "0", "--model", "m"},
      {"serve", "--max-body-mib", "0", "--model", "m"}};
  for (const auto& args : cases) {
    const Outcome o = run_asynct(args, s.dir());
    SCOPED_TRACE(args[1] + " " + args[2]);
    EXPECT_EQ(o.code, 1) << o.describe();
    EXPECT_TRUE(contains(o.err, args[1])) << o.describe();    // names the option
    EXPECT_TRUE(contains(o.err, "'" + args[2] + "'")) << o.describe();  // quotes the value
    EXPECT_FALSE(std::regex_search(o.err, std::regex("[0-9]{30}"))) << "a 300-digit bound\n" << o.describe();
    EXPECT_LT(o.err.size(), 600u) << o.describe();
  }
  const Outcome abc = run_asynct({"generate", "--max-tokens", "abc"}, s.dir());
  EXPECT_FALSE(contains(abc.err, "range")) << "'abc' is not a number, not a number out of range\n" << abc.describe();
  EXPECT_TRUE(contains(abc.err, "integer")) << abc.describe();
}

// serve's API key (--api-key, or ASYNCT_API_KEY read at the command line's edge) and CORS
// origins are checked before anything loads; the error names the option, never echoes a key.
TEST(Cli, ServeApiKeyAndAllowedOriginsAreChecked) {
  Scratch s;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"serve", "--model", "m", "--api-key", ""}, "--api-key"},
      {{"serve", "--model", "m", "--api-key", "two words"}, "--api-key"},
      {{"serve", "--model", "m", "--api-key", std::string(300, 'k')}, "--api-key"},
      {{"serve", "--model", "m", "--allowed-origins", "example.com"}, "--allowed-origins"},
      {{"serve", "--model", "m", "--allowed-origins", "https://a.example/"}, "--allowed-origins"},
      {{"serve", "--model", "m", "--allowed-origins", "https://a.example,,*"}, "--allowed-origins"}};
  for (const auto& [args, option] : cases) {
    const Outcome o = run_asynct(args, s.dir());
    SCOPED_TRACE(args[3] + " '" + args[4] + "'");
    EXPECT_EQ(o.code, 1) << o.describe();
    EXPECT_TRUE(contains(o.err, option)) << o.describe();
    EXPECT_LT(o.err.size(), 600u) << o.describe();
  }
  // Good values pass the checks: the run ends at the model, which does not exist.
  const Outcome good = run_asynct({"serve", "--model", "nowhere", "--api-key", "k-1", "--allowed-origins",
                                   "https://a.example,http://localhost:3000,*"}, s.dir());
  EXPECT_EQ(good.code, 2) << good.describe();
  EXPECT_TRUE(contains(good.err, "nowhere")) << good.describe();
  // The environment's key, checked the same way.
  setenv("ASYNCT_API_KEY", "has space", 1);
  const Outcome env = run_asynct({"serve", "--model", "nowhere"}, s.dir());
  unsetenv("ASYNCT_API_KEY");
  EXPECT_EQ(env.code, 2) << env.describe();
  EXPECT_TRUE(contains(env.err, "ASYNCT_API_KEY")) << env.describe();
  EXPECT_FALSE(contains(env.err, "has space")) << env.describe();
}

TEST(Cli, HelpShowsEveryDefault) {
  Scratch s;
  for (const char* command : {"generate", "bench", "demo", "init-checkpoint", "serve", "perplexity"}) {
    const Outcome o = run_asynct({command, "--help"}, s.dir());
    ASSERT_EQ(o.code, 0) << o.describe();
    std::istringstream lines(o.out);
    std::string line;
    int options = 0;
    while (std::getline(lines, line)) {
      // An option that takes a value: "  --name TYPE[:check][=default] ..." (flags have no TYPE).
      std::smatch m;
      if (!std::regex_search(line, m, std::regex("^\\s+(--[a-z-]+) ((INT|UINT|FLOAT|TEXT)\\S*)"))) continue;
      ++options;
      // Options whose absence is the default: their descriptions say what that means.
      static const std::set<std::string> unset = {"--model", "--prompt", "--prompt-ids", "--system", "--logprobs", "--stop",
                                                   "--stop-token-id", "--logits", "--out", "--scenario", "--json", "--eos",
                                                   "--served-model-name", "--api-key", "--allowed-origins", "--file", "--draft-model"};
      if (unset.count(m[1])) continue;
      EXPECT_NE(m[2].str().find('='), std::string::npos) << command << ": no default shown in\n" << line;
    }
    EXPECT_GT(options, 1) << command << "\n" << o.out;
  }
  const Outcome gen = run_asynct({"generate", "--help"}, s.dir());
  EXPECT_TRUE(std::regex_search(gen.out, std::regex("--max-tokens [^ \n]*=16\\s"))) << gen.out;
  EXPECT_TRUE(std::regex_search(gen.out, std::regex("--max-cache-mib [^ \n]*=8192\\s"))) << gen.out;
  const Outcome bench = run_asynct({"bench", "--help"}, s.dir());
  EXPECT_TRUE(std::regex_search(bench.out, std::regex("--device [^ \n]*=auto\\s"))) << bench.out;
  const Outcome ppl = run_asynct({"perplexity", "--help"}, s.dir());
  EXPECT_TRUE(std::regex_search(ppl.out, std::regex("--max-batched-tokens [^ \n]*=512\\s"))) << ppl.out;
  EXPECT_TRUE(contains(ppl.out, "every token of the text but the first is scored")) << ppl.out;
}

TEST(Cli, BenchWritesJsonOnlyWhereAskedAndPlainLinesToAPipe) {
  Scratch s;
  const Outcome o = run_asynct({"bench", "--scale", "4096", "--scenario", "decode_b1"}, s.dir());
  ASSERT_EQ(o.code, 0) << o.describe();
  EXPECT_TRUE(s.entries().empty()) << "bench wrote " << s.entries().front() << " in the working directory";
  EXPECT_FALSE(contains(o.err, "\r")) << "carriage returns in the progress written to a pipe\n" << o.describe();
  EXPECT_TRUE(contains(o.err, "decode_b1")) << o.describe();  // a progress line per run

  const Outcome with_json = run_asynct({"bench", "--scale", "4096", "--scenario", "decode_b1", "--json", "r.json"}, s.dir());
  ASSERT_EQ(with_json.code, 0) << with_json.describe();
  EXPECT_TRUE(fs::exists(s.file("r.json")));
}

// init-checkpoint --config takes a checkpoint's config.json: random weights of that shape.
TEST(Cli, InitCheckpointCopiesAConfigJsonsShape) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--out", "a"}, s.dir()).code, 0);
  const Outcome both = run_asynct({"init-checkpoint", "--config", "a/config.json", "--arch", "qwen3", "--out", "b"}, s.dir());
  EXPECT_EQ(both.code, 2) << both.describe();
  EXPECT_TRUE(contains(both.err, "--arch")) << both.describe();
  const Outcome o = run_asynct({"init-checkpoint", "--config", "a/config.json", "--seed", "3", "--out", "b"}, s.dir());
  ASSERT_EQ(o.code, 0) << o.describe();
  std::ifstream a_in(s.file("a/config.json")), b_in(s.file("b/config.json"));
  EXPECT_EQ(nlohmann::json::parse(a_in), nlohmann::json::parse(b_in));
  EXPECT_TRUE(fs::exists(s.file("b/model.safetensors")));
}

// bench --model runs one named scenario on a checkpoint, with the JSON naming the model.
TEST(Cli, BenchRunsANamedScenarioOnACheckpoint) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--out", "ckpt"}, s.dir()).code, 0);
  const Outcome unnamed = run_asynct({"bench", "--model", "ckpt", "--scale", "4096"}, s.dir());
  EXPECT_EQ(unnamed.code, 2) << unnamed.describe();
  EXPECT_TRUE(contains(unnamed.err, "--scenario")) << unnamed.describe();
  const Outcome o = run_asynct({"bench", "--model", "ckpt", "--scale", "4096", "--scenario", "decode_b1", "--json",
                                "r.json"},
                               s.dir());
  ASSERT_EQ(o.code, 0) << o.describe();
  EXPECT_TRUE(contains(o.out, "output tokens/s")) << o.describe();
  const nlohmann::json r = nlohmann::json::parse(std::ifstream(s.file("r.json")));
  EXPECT_EQ(r["architecture"], "LlamaForCausalLM");
  ASSERT_EQ(r["results"].size(), 1u);
  EXPECT_EQ(r["results"][0]["scenario"], "decode_b1");
  EXPECT_GT(r["results"][0]["output_tokens_per_second"].get<double>(), 0.0);
}

TEST(Cli, CommandLineErrorsExitWithOne) {
  Scratch s;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--nope"}, {"generate", "--device", "gpu"}, {"init-checkpoint"}, {"bench", "extra"},
        {"generate", "--max-tokens"}}) {
    const Outcome o = run_asynct(args, s.dir());
    EXPECT_EQ(o.code, 1) << args[0] << "\n" << o.describe();
    EXPECT_FALSE(o.err.empty()) << o.describe();
  }
}

// The tokens of each request that `asynct generate` printed, and how each ended.
struct Generated {
  std::vector<std::vector<int>> tokens;
  std::vector<std::string> reasons;
};

Generated generated(const std::string& out) {
  Generated g;
  std::istringstream lines(out);
  std::string line;
  const std::regex request("^request [0-9]+: prompt [0-9]+ tokens -> ([0-9,]*)  \\((\\w+)\\)$");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, request)) continue;
    std::vector<int> ids;
    std::istringstream list(m[1].str());
    std::string id;
    while (std::getline(list, id, ',')) ids.push_back(std::stoi(id));
    g.tokens.push_back(ids);
    g.reasons.push_back(m[2].str());
  }
  return g;
}

std::vector<std::string> repeated(const std::vector<std::string>& args, int times) {
  std::vector<std::string> all;
  for (int i = 0; i < times; ++i) all.insert(all.end(), args.begin(), args.end());
  return all;
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A request past the model's context is an error before the weights or the KV cache are made
// (it used to size the cache from --max-tokens first: 2.2 GB and 18 s per prompt).
TEST(CliLimits, TheContextIsCheckedBeforeAnythingIsAllocated) {
  Scratch s;
  for (const int prompts : {1, 12}) {
    const Outcome o = run_asynct(joined({"generate", "--max-tokens", "1048576"}, repeated({"--prompt-ids", "1"}, prompts)), s.dir());
    SCOPED_TRACE(std::to_string(prompts) + " prompts");
    EXPECT_EQ(o.code, 2) << o.describe();
    EXPECT_TRUE(contains(o.err, "1048577 tokens is over the model's context of 4096 tokens (max_position_embeddings)"))
        << o.describe();
    EXPECT_LT(o.max_rss_mb, 400) << o.describe();
    EXPECT_LT(o.seconds, 10.0) << o.describe();
  }
}

// The KV cache takes no more than --max-cache-mib: an automatic size is capped (the requests
// then take turns), a larger --num-blocks or a request that cannot fit is an error before the
// cache is made. (The tiny model on the CPU reference: 2 KiB per token, 32 blocks of 16 tokens
// per MiB; the production CPU backend's bf16 cache takes half.)
TEST(CliLimits, TheKvCacheIsBoundedByMaxCacheMib) {
  Scratch s;
  // Three requests of 200 + 2 tokens need 13 blocks each: 39 together, 32 under the cap; they
  // take turns (long prompts and short outputs: few steps). That taking turns changes no token
  // is Engine's PreemptionAndRecomputeChangeNothing.
  std::string prompt;
  for (int t = 0; t < 200; ++t) prompt += (t ? "," : "") + std::to_string((t * 37 + 11) % 256);
  const std::vector<std::string> three = repeated({"--prompt-ids", prompt}, 3);
  const Outcome capped =
      run_asynct(joined({"generate", "--cpu-reference", "--max-tokens", "2", "--max-cache-mib", "1"}, three), s.dir());
  ASSERT_EQ(capped.code, 0) << capped.describe();
  EXPECT_TRUE(contains(capped.out, "KV cache 32 blocks of 16 tokens (1.00 MiB) in float32")) << capped.describe();
  const Generated g = generated(capped.out);
  ASSERT_EQ(g.tokens.size(), 3u) << capped.describe();
  for (const auto& t : g.tokens) EXPECT_EQ(t.size(), 2u) << capped.describe();

  // Under the cap: enough for every request at once (20 + 1 tokens in 2 blocks, 1 + 1 in 1).
  const Outcome roomy = run_asynct({"generate", "--max-tokens", "1", "--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20",
                                    "--prompt-ids", "1"},
                                   s.dir());
  ASSERT_EQ(roomy.code, 0) << roomy.describe();
  EXPECT_TRUE(contains(roomy.out, "KV cache 3 blocks of 16 tokens")) << roomy.describe();

  const Outcome too_long =
      run_asynct({"generate", "--cpu-reference", "--prompt-ids", "1", "--max-tokens", "1000", "--max-cache-mib", "1"}, s.dir());
  EXPECT_EQ(too_long.code, 2) << too_long.describe();
  EXPECT_TRUE(contains(too_long.err, "needs 63 KV blocks of 16 tokens")) << too_long.describe();
  EXPECT_TRUE(contains(too_long.err, "the cache has 32 (the most --max-cache-mib 1 allows)")) << too_long.describe();

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"generate", "--num-blocks", "65", "--max-cache-mib", "1"},
        {"generate", "--num-blocks", "2000000000", "--block-size", "4096"}}) {
    const Outcome o = run_asynct(args, s.dir());
    EXPECT_EQ(o.code, 2) << o.describe();
    EXPECT_TRUE(contains(o.err, "MiB of KV cache on the cpu backend, over --max-cache-mib")) << o.describe();
    EXPECT_LT(o.max_rss_mb, 400) << o.describe();
  }
}

// Block counts in 64 bits: 2048 requests of a million tokens in one-token blocks are 2^31
// blocks (the count wrapped to a negative int: "need at least one block").
TEST(CliLimits, BlockCountsDoNotOverflow) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--out", "ckpt"}, s.dir()).code, 0);
  std::ifstream in(s.file("ckpt/config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["max_position_embeddings"] = 4 << 20;
  std::ofstream(s.file("ckpt/config.json")) << config.dump();
  const Outcome o = run_asynct(joined({"generate", "--cpu-reference", "--model", "ckpt", "--max-tokens", "1048576",
                                       "--block-size", "1", "--max-cache-mib", "64"},
                                      repeated({"--prompt-ids", "1"}, 2048)),
                               s.dir());
  EXPECT_EQ(o.code, 2) << o.describe();
  EXPECT_TRUE(contains(o.err, "needs 1048577 KV blocks of 1 tokens (2048.00 MiB) but the cache has 32768")) << o.describe();
  EXPECT_LT(o.max_rss_mb, 400) << o.describe();
}

// FP8 weights and an FP8 KV cache run on the CPU backend and say so; bad values are refused.
TEST(CliGenerate, Fp8WeightsAndKvCache) {
  Scratch s;
  const Outcome o = run_asynct({"generate", "--prompt-ids", "1,2,3", "--max-tokens", "4", "--kv-cache-dtype", "fp8",
                                "--quantization", "fp8", "--cpu-reference"},
                               s.dir());
  ASSERT_EQ(o.code, 0) << o.describe();
  EXPECT_TRUE(contains(o.out, "cpu-reference backend, FP8 weights, KV cache")) << o.describe();
  // The production CPU backend reads FP8 weights and holds an FP8 cache; int8 weights are its alone.
  const Outcome fast = run_asynct({"generate", "--prompt-ids", "1,2,3", "--max-tokens", "4", "--quantization", "fp8"}, s.dir());
  EXPECT_EQ(fast.code, 0) << fast.describe();
  EXPECT_TRUE(contains(fast.out, "cpu backend, FP8 weights")) << fast.describe();
  const Outcome fast_cache = run_asynct({"generate", "--prompt-ids", "1,2,3", "--kv-cache-dtype", "fp8"}, s.dir());
  EXPECT_EQ(fast_cache.code, 0) << fast_cache.describe();
  EXPECT_TRUE(contains(fast_cache.out, "MiB) in fp8")) << fast_cache.describe();
  EXPECT_TRUE(contains(o.out, "MiB) in fp8")) << o.describe();
  const Outcome int8 = run_asynct({"generate", "--prompt-ids", "1,2,3", "--max-tokens", "4", "--quantization", "int8"}, s.dir());
  EXPECT_EQ(int8.code, 0) << int8.describe();
  const Outcome int8_reference =
      run_asynct({"generate", "--prompt-ids", "1,2,3", "--quantization", "int8", "--cpu-reference"}, s.dir());
  EXPECT_EQ(int8_reference.code, 2) << int8_reference.describe();
  EXPECT_TRUE(contains(int8_reference.err, "--quantization int8 runs on the production CPU backend")) << int8_reference.describe();
  for (const std::vector<std::string>& args : {std::vector<std::string>{"generate", "--kv-cache-dtype", "int8"},
                                               {"generate", "--quantization", "int4"}, {"serve", "--model", ".", "--kv-cache-dtype", "fp4"},
                                               {"bench", "--quantization", "q8"}}) {
    const Outcome bad = run_asynct(args, s.dir());
    EXPECT_EQ(bad.code, 1) << bad.describe();
  }
}

// Speculative decoding from the command line: the same tokens, the drafts counted; bad values refused.
TEST(CliGenerate, SpeculativeDecoding) {
  Scratch s;
  const std::vector<std::string> base = {"generate", "--prompt-ids", "5,6,7,8,5,6,7,8,5,6,7", "--max-tokens", "24"};
  const Outcome plain = run_asynct(base, s.dir());
  const Outcome spec = run_asynct(joined(base, {"--speculative", "ngram", "--speculative-tokens", "3"}), s.dir());
  ASSERT_EQ(plain.code, 0) << plain.describe();
  ASSERT_EQ(spec.code, 0) << spec.describe();
  EXPECT_EQ(generated(spec.out).tokens, generated(plain.out).tokens);
  EXPECT_TRUE(contains(spec.out, "speculative: ")) << spec.describe();
  const Outcome suffix = run_asynct(joined(base, {"--speculative", "suffix", "--suffix-depth", "8", "--suffix-min-probability",
                                                  "0.2", "--suffix-cache-tokens", "4096", "--suffix-request-tokens", "64"}), s.dir());
  ASSERT_EQ(suffix.code, 0) << suffix.describe();
  EXPECT_EQ(generated(suffix.out).tokens, generated(plain.out).tokens);
  EXPECT_TRUE(contains(suffix.out, "speculative: ")) << suffix.describe();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"generate", "--speculative", "eagle"}, {"generate", "--speculative-tokens", "0"},
        {"bench", "--ngram-min", "0"}, {"serve", "--model", ".", "--ngram-max", "65"}, {"generate", "--suffix-depth", "1"},
        {"generate", "--suffix-min-probability", "1.5"}, {"bench", "--suffix-cache-tokens", "-1"},
        {"serve", "--model", ".", "--suffix-request-tokens", "0"}}) {
    const Outcome bad = run_asynct(args, s.dir());
    EXPECT_EQ(bad.code, 1) << bad.describe();
  }
  const Outcome reversed = run_asynct(joined(base, {"--speculative", "ngram", "--ngram-min", "3", "--ngram-max", "2"}), s.dir());
  EXPECT_EQ(reversed.code, 2) << reversed.describe();
  EXPECT_TRUE(contains(reversed.err, "1 <= min <= max <= 64")) << reversed.describe();
}

// --speculative draft: a checkpoint as its own draft model keeps every greedy draft, the same
// tokens, and another model's drafts leave them as they are; a draft model needs the method and
// the method a draft model.
TEST(CliGenerate, DraftModelSpeculation) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--out", "target"}, s.dir()).code, 0);
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--seed", "3", "--out", "other"}, s.dir()).code, 0);
  const std::vector<std::string> base = {"generate", "--model", "target", "--prompt-ids", "5,6,7,8,5,6", "--max-tokens", "21"};
  const Outcome plain = run_asynct(base, s.dir());
  const Outcome self = run_asynct(joined(base, {"--speculative", "draft", "--draft-model", "target"}), s.dir());
  const Outcome other = run_asynct(joined(base, {"--speculative", "draft", "--draft-model", "other"}), s.dir());
  for (const Outcome* o : {&plain, &self, &other}) ASSERT_EQ(o->code, 0) << o->describe();
  EXPECT_EQ(generated(self.out).tokens, generated(plain.out).tokens);
  EXPECT_EQ(generated(other.out).tokens, generated(plain.out).tokens);
  EXPECT_TRUE(contains(self.out, "speculative: 16 tokens drafted, 16 kept")) << self.describe();
  const Outcome no_model = run_asynct(joined(base, {"--speculative", "draft"}), s.dir());
  const Outcome no_method = run_asynct(joined(base, {"--draft-model", "other"}), s.dir());
  EXPECT_EQ(no_model.code, 2) << no_model.describe();
  EXPECT_TRUE(contains(no_model.err, "--speculative draft needs --draft-model DIR")) << no_model.describe();
  EXPECT_EQ(no_method.code, 2) << no_method.describe();
  EXPECT_TRUE(contains(no_method.err, "--draft-model is for --speculative draft")) << no_method.describe();
}

// A 1-token chunk of the prompt is prefill, not decode.
TEST(CliGenerate, CountsPrefillAndDecodeTokensByPosition) {
  Scratch s;
  for (const char* budget : {"1", "2048"}) {
    const Outcome o = run_asynct({"generate", "--prompt-ids", "1,2,3", "--max-tokens", "4", "--max-batched-tokens", budget}, s.dir());
    ASSERT_EQ(o.code, 0) << o.describe();
    EXPECT_TRUE(contains(o.out, " 3 prefill + 3 decode tokens")) << budget << "\n" << o.describe();
  }
}

// Every request draws from its own stream, seed + its index: identical prompts sample
// differently, and request 1 at seed 5 is request 0 at seed 6.
TEST(CliGenerate, EachRequestSamplesFromItsOwnStream) {
  Scratch s;
  const std::vector<std::string> sampled = {"generate", "--temperature", "1", "--max-tokens", "16"};
  const Outcome two = run_asynct(joined(sampled, {"--seed", "5", "--prompt-ids", "5,6", "--prompt-ids", "5,6"}), s.dir());
  const Outcome one = run_asynct(joined(sampled, {"--seed", "6", "--prompt-ids", "5,6"}), s.dir());
  ASSERT_EQ(two.code, 0) << two.describe();
  ASSERT_EQ(one.code, 0) << one.describe();
  const Generated a = generated(two.out), b = generated(one.out);
  ASSERT_EQ(a.tokens.size(), 2u) << two.describe();
  ASSERT_EQ(b.tokens.size(), 1u) << one.describe();
  EXPECT_NE(a.tokens[0], a.tokens[1]) << two.describe();
  EXPECT_EQ(a.tokens[1], b.tokens[0]);
  const Outcome help = run_asynct({"generate", "--help"}, s.dir());
  EXPECT_TRUE(contains(help.out, "seed + i")) << help.out;
}

// Token-id prompts with --logprobs (a table of ids), --json (one line per request, the header
// on stderr) and --stop-token-id (ends the request with "stop", the token kept).
TEST(CliGenerate, LogprobsJsonAndStopTokenIdsWithTokenIds) {
  Scratch s;
  const std::vector<std::string> base = {"generate", "--prompt-ids", "1,2,3", "--max-tokens", "6"};
  const Outcome plain = run_asynct(base, s.dir());
  ASSERT_EQ(plain.code, 0) << plain.describe();
  const std::vector<int> tokens = generated(plain.out).tokens.at(0);
  ASSERT_EQ(tokens.size(), 6u);

  const Outcome table = run_asynct(joined(base, {"--logprobs", "2"}), s.dir());
  ASSERT_EQ(table.code, 0) << table.describe();
  EXPECT_EQ(generated(table.out).tokens.at(0), tokens) << table.describe();
  const std::regex row("\n +[0-5]: ([0-9]+) -[0-9]+\\.[0-9]{4} \\| ([0-9]+) -[0-9.]+, [0-9]+ -[0-9.]+");
  int rows = 0;
  for (auto it = std::sregex_iterator(table.out.begin(), table.out.end(), row); it != std::sregex_iterator(); ++it, ++rows) {
    EXPECT_EQ(std::stoi((*it)[1]), tokens.at(std::size_t(rows))) << table.out;
    EXPECT_EQ((*it)[1], (*it)[2]) << "greedy: the token is the most likely one\n" << table.out;
  }
  EXPECT_EQ(rows, 6) << table.describe();

  const Outcome json = run_asynct(joined(base, {"--json", "--logprobs", "0", "--prompt-ids", "5,6"}), s.dir());
  ASSERT_EQ(json.code, 0) << json.describe();
  EXPECT_TRUE(contains(json.err, "asynct generate: ")) << json.describe();
  std::istringstream lines(json.out);
  std::string line;
  int requests = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json r = nlohmann::json::parse(line);
    ++requests;
    EXPECT_FALSE(r.contains("text")) << line;
    EXPECT_EQ(r["logprobs"].size(), r["token_ids"].size()) << line;
    EXPECT_EQ(r["logprobs"][0]["top_logprobs"].size(), 0u) << line;
    if (r["request"] == 0) {
      EXPECT_EQ(r["token_ids"].get<std::vector<int>>(), tokens) << line;
    }
  }
  EXPECT_EQ(requests, 2) << json.describe();

  const auto ends_at = std::size_t(std::find(tokens.begin(), tokens.end(), tokens[2]) - tokens.begin()) + 1;
  const Outcome stop = run_asynct(joined(base, {"--stop-token-id", std::to_string(tokens[2])}), s.dir());
  ASSERT_EQ(stop.code, 0) << stop.describe();
  const Generated g = generated(stop.out);
  EXPECT_EQ(g.reasons.at(0), "stop") << stop.describe();
  EXPECT_EQ(g.tokens.at(0), std::vector<int>(tokens.begin(), tokens.begin() + std::ptrdiff_t(ends_at)));
  const Outcome outside = run_asynct(joined(base, {"--stop-token-id", "256"}), s.dir());
  EXPECT_EQ(outside.code, 2) << outside.describe();
  EXPECT_TRUE(contains(outside.err, "--stop-token-id 256 is outside the vocabulary [0, 256)")) << outside.describe();
}

// Text prompts need a tokenizer: the built-in models have none, and a build without text
// support says so and how to get it; token ids work either way.
TEST(CliGenerate, TextPromptsNeedATokenizerAndTextSupport) {
  Scratch s;
  const Outcome text = run_asynct({"generate", "--prompt", "hello"}, s.dir());
  EXPECT_EQ(text.code, 2) << text.describe();
  const Outcome chat = run_asynct({"generate", "--chat", "--prompt", "hello"}, s.dir());
  EXPECT_EQ(chat.code, 2) << chat.describe();
#ifdef ASYNCT_WITH_TEXT
  EXPECT_TRUE(contains(text.err, "needs --model DIR with the model's tokenizer.json")) << text.describe();
#else
  for (const Outcome* o : {&text, &chat}) {
    EXPECT_TRUE(contains(o->err, "this build of asynct does not have")) << o->describe();
    EXPECT_TRUE(contains(o->err, "scripts/setup.sh")) << o->describe();
    EXPECT_TRUE(contains(o->err, "--prompt-ids takes token ids")) << o->describe();
  }
  EXPECT_TRUE(contains(chat.err, "--chat needs text support")) << chat.describe();
#endif
  EXPECT_TRUE(contains(text.err, "--prompt-ids")) << text.describe();
  const Outcome ids = run_asynct({"generate", "--prompt-ids", "1,2,3", "--max-tokens", "2"}, s.dir());
  EXPECT_EQ(ids.code, 0) << ids.describe();
  EXPECT_EQ(generated(ids.out).tokens.size(), 1u) << ids.describe();
}

// End-of-sequence tokens: none for the built-in models; --eos (repeatable) sets them, ids
// outside the vocabulary are errors, --ignore-eos and --eos together are a command-line error.
TEST(CliEos, EosOptions) {
  Scratch s;
  const std::vector<std::string> base = {"generate", "--prompt-ids", "1,2,3", "--max-tokens", "12"};
  const Outcome full = run_asynct(base, s.dir());
  ASSERT_EQ(full.code, 0) << full.describe();
  const Generated f = generated(full.out);
  ASSERT_EQ(f.tokens.size(), 1u);
  ASSERT_EQ(f.tokens[0].size(), 12u);
  EXPECT_EQ(f.reasons[0], "length");
  EXPECT_TRUE(contains(full.out, "no end-of-sequence token")) << full.describe();

  const int stop = f.tokens[0][4];
  const auto first = std::find(f.tokens[0].begin(), f.tokens[0].end(), stop) - f.tokens[0].begin();
  const Outcome eos = run_asynct(joined(base, {"--eos", std::to_string(stop), "--eos", "255"}), s.dir());
  ASSERT_EQ(eos.code, 0) << eos.describe();
  const Generated e = generated(eos.out);
  ASSERT_EQ(e.tokens.size(), 1u) << eos.describe();
  EXPECT_EQ(e.reasons[0], "eos") << eos.describe();
  EXPECT_EQ(std::ptrdiff_t(e.tokens[0].size()), first + 1) << eos.describe();

  const Outcome outside = run_asynct(joined(base, {"--eos", "256"}), s.dir());
  EXPECT_EQ(outside.code, 2) << outside.describe();
  EXPECT_TRUE(contains(outside.err, "--eos 256 is outside the vocabulary [0, 256)")) << outside.describe();
  const Outcome both = run_asynct(joined(base, {"--eos", "3", "--ignore-eos"}), s.dir());
  EXPECT_EQ(both.code, 1) << both.describe();
  EXPECT_TRUE(contains(both.err, "--ignore-eos")) << both.describe();
}

// A checkpoint's end-of-sequence tokens: generation_config.json's eos_token_id, else
// config.json's, as HuggingFace reads them; --ignore-eos turns them off, --eos overrides them.
TEST(CliEos, TheCheckpointSaysWhereToStop) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--out", "ckpt"}, s.dir()).code, 0);
  const std::vector<std::string> base = {"generate", "--model", "ckpt", "--prompt-ids", "1,2,3", "--max-tokens", "12"};
  const Outcome full = run_asynct(base, s.dir());
  ASSERT_EQ(full.code, 0) << full.describe();
  const std::vector<int> tokens = generated(full.out).tokens.at(0);
  ASSERT_EQ(tokens.size(), 12u);
  const auto ends_at = [&](int id) { return std::size_t(std::find(tokens.begin(), tokens.end(), id) - tokens.begin()) + 1; };
  const auto expect_run = [&](const std::vector<std::string>& extra, const std::string& reason, std::size_t length) {
    const Outcome o = run_asynct(joined(base, extra), s.dir());
    ASSERT_EQ(o.code, 0) << o.describe();
    const Generated g = generated(o.out);
    ASSERT_EQ(g.tokens.size(), 1u) << o.describe();
    EXPECT_EQ(g.reasons[0], reason) << o.describe();
    EXPECT_EQ(g.tokens[0].size(), length) << o.describe();
  };

  std::ofstream(s.file("ckpt/generation_config.json")) << "{\"eos_token_id\": [" << tokens[6] << ", " << tokens[3] << "]}";
  expect_run({}, "eos", std::min(ends_at(tokens[6]), ends_at(tokens[3])));
  expect_run({"--ignore-eos"}, "length", 12);
  expect_run({"--eos", std::to_string(tokens[8])}, "eos", ends_at(tokens[8]));

  std::filesystem::remove(s.file("ckpt/generation_config.json"));
  std::ifstream in(s.file("ckpt/config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["eos_token_id"] = tokens[5];
  std::ofstream(s.file("ckpt/config.json")) << config.dump();
  expect_run({}, "eos", ends_at(tokens[5]));

  std::ofstream(s.file("ckpt/generation_config.json")) << "{\"eos_token_id\": [1,";
  const Outcome bad = run_asynct(base, s.dir());
  EXPECT_EQ(bad.code, 2) << bad.describe();
  EXPECT_TRUE(contains(bad.err, "generation_config.json: not a JSON object")) << bad.describe();
}

// A decode step's time in bench is its own: at 1/256 of the lengths decode_heavy_b32 has one
// prefill step and one decode step of 32 tokens each, so the decode step takes about the mean
// step time (a pipelined decode step used to show ~0.015 ms: it had been run during the
// prefill step's call).
TEST(CliBench, DecodeStepTimesArePipelinedStepsOwn) {
  Scratch s;
  for (const bool pipeline : {true, false}) {
    // The CPU reference: its prefill and decode steps take times of the sizes the bounds assume.
    std::vector<std::string> args = {"bench",     "--cpu-reference", "--scale", "256", "--scenario", "decode_heavy_b32",
                                     "--no-warmup", "--json",         "r.json"};
    if (!pipeline) args.push_back("--no-pipeline");
    const Outcome o = run_asynct(args, s.dir(), 120);
    ASSERT_EQ(o.code, 0) << o.describe();
    std::ifstream in(s.file("r.json"));
    const nlohmann::json r = nlohmann::json::parse(in)["results"][0];
    SCOPED_TRACE(pipeline ? "pipelined" : "not pipelined");
    for (const char* model : {"asynct", "qwen3"}) {
      const std::string m = model;
      EXPECT_EQ(r[m + "_steps"].get<int>(), 2) << r.dump(1);
      EXPECT_EQ(r[m + "_decode_steps"].get<int>(), 1) << r.dump(1);
      EXPECT_EQ(r[m + "_pipelined_steps"].get<int>(), pipeline ? 1 : 0) << r.dump(1);
      const double decode = r[m + "_decode_step_ms"].get<double>(), step = r[m + "_step_ms"].get<double>();
      EXPECT_GT(decode, 0.3 * step) << r.dump(1);
      EXPECT_LT(decode, 1.7 * step) << r.dump(1);
    }
  }
}

// Random argument vectors: a subcommand, then options with values drawn from cheap valid values
// and broken ones. Each run must end by itself with 0, 1 or 2 (never a signal, a sanitizer
// report or an internal error). Options that would start long jobs (the 1.7B size, full-length
// scenarios, a million tokens) only get values that keep the job small; no GPU is visible to
// the child. Bounded: at most kRuns runs or kBudget seconds, whichever comes first.
// A byte-level BPE tokenizer.json whose ids are the 256 bytes (GPT-2's byte alphabet, no
// merges), for the built-in-sized random models (vocabulary 256): one token a byte.
std::string byte_tokenizer_json() {
  const auto utf8 = [](unsigned cp) {
    if (cp < 0x80) return std::string(1, char(cp));
    const char two[] = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};  // every code point here is below 0x800
    return std::string(two, 2);
  };
  nlohmann::json vocab = nlohmann::json::object();
  unsigned shifted = 0;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    vocab[utf8(printable ? b : 256 + shifted++)] = b;
  }
  const nlohmann::json spec = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return spec.dump();
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// perplexity's bad input: each an error (exit 2) that says what is wrong, before the weights
// are loaded; a bad command line exits 1.
TEST(CliPerplexity, BadInputIsAClearError) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--out", "ckpt"}, s.dir()).code, 0);
  write_file(s.path() / "text.txt", "hello world, hello perplexity");
  const auto ppl = [&](const std::vector<std::string>& more) {
    return run_asynct(joined({"perplexity", "--model", "ckpt", "--device", "cpu"}, more), s.dir());
  };
  const auto expect_error = [&](const std::vector<std::string>& more, const std::string& message) {
    const Outcome o = ppl(more);
    EXPECT_EQ(o.code, 2) << o.describe();
    EXPECT_TRUE(contains(o.err, message)) << "wanted: " << message << "\n" << o.describe();
    EXPECT_TRUE(o.out.empty()) << o.describe();
  };
#ifdef ASYNCT_WITH_TEXT
  expect_error({"--file", "text.txt"}, "tokenizer.json");  // the checkpoint has none
  write_file(s.path() / "ckpt" / "tokenizer.json", byte_tokenizer_json());
  write_file(s.path() / "empty.txt", "");
  write_file(s.path() / "binary.txt", "ok \xff\xfe");
  write_file(s.path() / "one.txt", "a");
  expect_error({"--file", "missing.txt"}, "--file missing.txt: no such file");
  expect_error({"--file", "."}, "is a directory");
  expect_error({"--file", "empty.txt"}, "--file empty.txt is empty");
  expect_error({"--file", "binary.txt"}, "--file binary.txt is not valid UTF-8 (byte 3)");
  expect_error({"--file", "one.txt"}, "--file one.txt has 1 token: perplexity needs at least 2");
  expect_error({"--file", "text.txt", "--max-tokens", "1"}, "has 1 token (--max-tokens): perplexity needs at least 2");
  expect_error({"--file", "text.txt", "--context", "1"}, "--context must be at least 2 tokens");
  expect_error({"--file", "text.txt", "--context", "-3"}, "--context must be at least 2 tokens");
  expect_error({"--file", "text.txt", "--context", "4097"},
               "--context 4097 is over the model's context of 4096 tokens (max_position_embeddings)");
  expect_error({"--file", "text.txt", "--json", "nodir/out.json"}, "--json: cannot write nodir/out.json");
  const Outcome cuda = run_asynct({"perplexity", "--model", "ckpt", "--file", "text.txt", "--device", "cuda"}, s.dir());
  EXPECT_EQ(cuda.code, 2) << cuda.describe();  // no GPU is visible to the tests
  EXPECT_TRUE(contains(cuda.err, "--device cuda")) << cuda.describe();
#else
  expect_error({"--file", "text.txt"}, "this build of asynct does not have");
#endif
  const Outcome nomodel = run_asynct({"perplexity", "--model", "nowhere", "--file", "text.txt"}, s.dir());
  EXPECT_EQ(nomodel.code, 2) << nomodel.describe();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--file"}, {"--file", "text.txt", "--context", "abc"},
        {"--file", "text.txt", "--max-tokens", "-1"}, {"--file", "text.txt", "--max-batched-tokens", "0"}}) {
    const Outcome o = ppl(args);
    EXPECT_EQ(o.code, 1) << o.describe();
  }
  const Outcome nofile = run_asynct({"perplexity", "--model", "ckpt"}, s.dir());
  EXPECT_EQ(nofile.code, 1) << nofile.describe();
  EXPECT_TRUE(contains(nofile.err, "--file is required")) << nofile.describe();
}

#ifdef ASYNCT_WITH_TEXT
// calibrate writes a copy whose KV-cache scales the FP8 cache then uses; bad input is an error
// before anything is written.
TEST(CliCalibrate, WritesACopyWithScalesThatLoadsAndRuns) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--out", "ckpt"}, s.dir()).code, 0);
  write_file(s.path() / "ckpt" / "tokenizer.json", byte_tokenizer_json());
  write_file(s.path() / "text.txt", "The quick brown fox jumps over the lazy dog; 0123456789.\n");
  const Outcome o = run_asynct({"calibrate", "--model", "ckpt", "--out", "cal", "--file", "text.txt", "--context", "20"}, s.dir());
  ASSERT_EQ(o.code, 0) << o.describe();
  EXPECT_TRUE(contains(o.out, "KV-cache scales for 2 layers x 2 KV heads from 57 tokens")) << o.describe();
  EXPECT_TRUE(contains(o.err, "window 3 of 3")) << o.describe();
  for (const char* file : {"config.json", "tokenizer.json", "model.safetensors", "kv_cache_scales.safetensors",
                           "model.safetensors.index.json"})
    EXPECT_TRUE(fs::exists(s.path() / "cal" / file)) << file;
  const Outcome run = run_asynct({"generate", "--model", "cal", "--prompt-ids", "1,2,3", "--max-tokens", "3",
                                  "--kv-cache-dtype", "fp8", "--cpu-reference"}, s.dir());
  EXPECT_EQ(run.code, 0) << run.describe();
  const Outcome again = run_asynct({"calibrate", "--model", "cal", "--out", "cal2", "--file", "text.txt"}, s.dir());
  EXPECT_EQ(again.code, 2) << again.describe();
  EXPECT_TRUE(contains(again.err, "has KV-cache scales already")) << again.describe();
  for (const auto& [args, message] :
       {std::pair{std::vector<std::string>{"--out", "cal"}, std::string("holds files already")},
        {{"--out", "ckpt"}, "is the checkpoint itself"},
        {{"--out", "new", "--context", "5000"}, "over the model's context"}}) {
    const Outcome bad = run_asynct(joined({"calibrate", "--model", "ckpt", "--file", "text.txt"}, args), s.dir());
    EXPECT_EQ(bad.code, 2) << bad.describe();
    EXPECT_TRUE(contains(bad.err, message)) << message << "\n" << bad.describe();
  }
  EXPECT_FALSE(fs::exists(s.path() / "new"));
  EXPECT_EQ(run_asynct({"calibrate", "--model", "ckpt", "--out", "x", "--file", "text.txt", "--headroom", "0.5"}, s.dir()).code, 1);
}
#endif

#ifdef ASYNCT_WITH_TEXT
// On a random tiny Llama, one token a byte: windows of --context tokens overlapping by one
// score every token but the first exactly once, the report and the JSON agree, and cutting a
// window into steps of any size gives the same log-likelihoods.
TEST(CliPerplexity, ScoresEveryTokenButTheFirstOnceWhateverTheStepSize) {
  Scratch s;
  ASSERT_EQ(run_asynct({"init-checkpoint", "--arch", "llama", "--out", "ckpt"}, s.dir()).code, 0);
  write_file(s.path() / "ckpt" / "tokenizer.json", byte_tokenizer_json());
  const std::string text = "The quick brown fox jumps over the lazy dog; 0123456789.\n";  // 57 bytes
  write_file(s.path() / "text.txt", text);
  std::vector<nlohmann::json> results;
  for (const char* step : {"512", "3"}) {
    const std::string json = std::string("out") + step + ".json";
    const Outcome o = run_asynct({"perplexity", "--model", "ckpt", "--file", "text.txt", "--context", "8",
                                  "--max-batched-tokens", step, "--device", "cpu", "--json", json},
                                 s.dir());
    ASSERT_EQ(o.code, 0) << o.describe();
    EXPECT_TRUE(contains(o.out, "56 tokens scored in 8 windows of up to 8 tokens (57 tokens of text.txt)"))
        << o.describe();
    EXPECT_TRUE(contains(o.err, "window 8 of 8: 7 tokens scored")) << o.describe();
    std::ifstream f(s.path() / json);
    results.push_back(nlohmann::json::parse(f));
  }
  const nlohmann::json& r = results[0];
  EXPECT_EQ(r["file_tokens"], 57);
  EXPECT_EQ(r["tokens"], 57);
  EXPECT_EQ(r["context"], 8);
  EXPECT_EQ(r["windows"], 8);
  EXPECT_EQ(r["scored_tokens"], 56);
  EXPECT_EQ(r["device"], "cpu");
  ASSERT_EQ(r["window_results"].size(), 8u);
  double sum = 0;
  for (std::size_t w = 0; w < 8; ++w) {
    EXPECT_EQ(r["window_results"][w]["start"], 7 * w);
    EXPECT_EQ(r["window_results"][w]["tokens"], 8);
    sum += r["window_results"][w]["nll_sum"].get<double>();
  }
  const double nll = r["nll_sum"].get<double>(), mean = r["mean_nll"].get<double>();
  EXPECT_NEAR(sum, nll, 1e-9 * nll);
  EXPECT_NEAR(mean, nll / 56, 1e-12 * mean);
  EXPECT_NEAR(r["perplexity"].get<double>(), std::exp(mean), 1e-9 * std::exp(mean));
  EXPECT_GT(r["perplexity"].get<double>(), 1.0);
  EXPECT_EQ(results[1]["max_batched_tokens"], 3);
  for (std::size_t w = 0; w < 8; ++w) {
    const double a = r["window_results"][w]["nll_sum"], b = results[1]["window_results"][w]["nll_sum"];
    EXPECT_NEAR(a, b, 1e-5 * a) << "window " << w;
  }
  // --max-tokens takes a prefix: 20 tokens in windows of 8 are 3 windows (7 + 7 + 5 scored).
  const Outcome prefix = run_asynct({"perplexity", "--model", "ckpt", "--file", "text.txt", "--context", "8",
                                     "--max-tokens", "20", "--device", "cpu"},
                                    s.dir());
  ASSERT_EQ(prefix.code, 0) << prefix.describe();
  EXPECT_TRUE(contains(prefix.out, "19 tokens scored in 3 windows of up to 8 tokens (20 tokens of text.txt, the first of 57)"))
      << prefix.describe();
}
#endif

TEST(CliFuzz, RandomArgumentsExitWithZeroOneOrTwo) {
  constexpr int kRuns = 150;
  constexpr double kBudget = 20.0, kPerRun = 20.0;
  Scratch s;
  const std::vector<std::string> junk = {"", "-", "--", "-x", "--=", "--max-tokens=3", "abc", "1", "-1", "\xff\xfe", "--help"};
  const std::vector<std::string> counts = {"0", "1", "2", "3", "-1", "abc", "", "1e3", "2.5", "99999999999999999999",
                                           "2147483648", "0x10", " 7"};
  const std::vector<std::string> reals = {"0", "0.5", "1", "-1", "nan", "inf", "-inf", "1e39", "abc", "", "101"};
  const std::vector<std::string> paths = {"out", "out.json", "", ".", "/dev/null", "nodir/x", "out/../out2"};
  struct Opt {
    std::string name;
    std::vector<std::string> values;  // empty: a flag
  };
  const std::vector<std::pair<std::string, std::vector<Opt>>> commands = {
      {"generate",
       {{"--model", {"", ".", "/dev/null", "nowhere"}},
        {"--builtin", {"asynct", "qwen3", "llama"}},
        {"--prompt-ids", {"1,2,3", "1,x", "", ",", "99999", "255", "-1", "0", "1,,2", "4294967296"}},
        {"--prompt", {"hello", "", "\xff", "1,2,3"}},
        {"--chat", {}},
        {"--system", {"be brief", ""}},
        {"--no-thinking", {}},
        {"--min-p", reals},
        {"--repetition-penalty", reals},
        {"--presence-penalty", reals},
        {"--frequency-penalty", reals},
        {"--logprobs", {"0", "3", "20", "21", "-1", "abc"}},
        {"--stop", {"a", "", "\xff"}},
        {"--stop-token-id", {"0", "255", "256", "-1", "abc"}},
        {"--json", {}},
        {"--max-tokens", {"1", "4", "0", "-1", "abc", "1048577"}},
        {"--temperature", reals},
        {"--top-k", {"0", "1", "5", "-1", "300", "abc"}},
        {"--top-p", reals},
        {"--seed", {"0", "7", "-1", "18446744073709551615", "18446744073709551616", "abc"}},
        {"--block-size", {"1", "16", "4096", "0", "-5", "abc"}},
        {"--num-blocks", {"0", "2", "64", "-1", "abc"}},
        {"--max-batched-tokens", {"1", "2", "64", "0", "abc"}},
        {"--eos", {"-1", "0", "3", "abc", "99999", "255", "256"}},
        {"--ignore-eos", {}},
        {"--max-cache-mib", {"1", "64", "0", "-1", "abc", "99999999999"}},
        {"--no-cuda-graphs", {}},
        {"--no-pipeline", {}},
        {"--device", {"auto", "cpu", "cuda", "gpu"}},
        {"--logits", paths}}},
      {"demo",
       {{"--q-heads", {"1", "8", "3", "0", "-1", "abc", "257"}},
        {"--kv-heads", {"1", "2", "3", "0"}},
        {"--head-dim", {"1", "2", "64", "7", "0", "1025"}},
        {"--block-size", {"1", "16", "0"}},
        {"--window", {"1", "3", "64", "0", "65"}},
        {"--seed", {"0", "5", "-1"}}}},
      {"serve",  // never a loadable model: every run ends before it would listen
       {{"--model", {"", ".", "/dev/null", "nowhere"}},
        {"--host", {"127.0.0.1", "::1", "not a host", ""}},
        {"--port", {"0", "8000", "-1", "70000", "abc"}},
        {"--served-model-name", {"m", ""}},
        {"--max-num-seqs", counts},
        {"--max-waiting", counts},
        {"--max-model-len", counts},
        {"--max-body-mib", counts},
        {"--device", {"auto", "cpu", "cuda", "gpu"}}}},
      {"perplexity",  // never a loadable model: every run ends before the weights
       {{"--model", {"", ".", "/dev/null", "nowhere"}},
        {"--file", paths},
        {"--context", counts},
        {"--max-tokens", counts},
        {"--max-batched-tokens", counts},
        {"--json", paths},
        {"--device", {"auto", "cpu", "cuda", "gpu"}}}},
      {"init-checkpoint",
       {{"--arch", {"asynct", "qwen3", "llama"}},
        {"--config", {"tiny", "huge", ""}},
        {"--seed", {"0", "3", "abc"}},
        {"--out", paths}}},
      {"bench",
       {{"--config", {"auto", "tiny", "huge"}},
        {"--scale", {"4096", "abc", "-1", "99999999999"}},
        {"--scenario", {"decode_b1", "foo", ""}},
        {"--json", paths},
        {"--seed", {"0", "1", "abc"}},
        {"--profile", {}},
        {"--no-cuda-graphs", {}},
        {"--no-pipeline", {}},
        {"--no-warmup", {}},
        {"--repeat", {"1", "2", "0", "101", "x"}},
        {"--device", {"auto", "cpu", "cuda", "tpu"}}}},
      {"", {}},
      {"nope", {}}};
  std::mt19937 rng(2024);
  auto pick = [&](std::size_t n) { return std::size_t(std::uniform_int_distribution<std::size_t>(0, n - 1)(rng)); };
  const auto start = std::chrono::steady_clock::now();
  int runs = 0, by_code[3] = {0, 0, 0};
  for (; runs < kRuns; ++runs) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kBudget) break;
    const auto& [command, options] = commands[pick(commands.size())];
    std::vector<std::string> args;
    if (!command.empty()) args.push_back(command);
    const std::size_t n = pick(5);
    for (std::size_t i = 0; i < n; ++i) {
      if (options.empty() || pick(8) == 0) {
        args.push_back(junk[pick(junk.size())]);
        continue;
      }
      const Opt& opt = options[pick(options.size())];
      args.push_back(opt.name);
      if (!opt.values.empty() && pick(10) != 0) args.push_back(opt.values[pick(opt.values.size())]);
      else if (opt.values.empty() && pick(10) == 0) args.push_back(counts[pick(counts.size())]);
    }
    // Scenarios at full length run for minutes on the CPU, and even at 1/4096 of the lengths
    // the default set takes ~25 s in the sanitizer build: bench gets a small scale and the
    // one-request scenario (0.5 s there) unless the vector names its own (then its value is
    // one of the cheap or broken ones above).
    for (const char* option : {"--scale", "--scenario"})
      if (command == "bench" && std::find(args.begin(), args.end(), option) == args.end()) {
        args.push_back(option);
        args.push_back(option == std::string("--scale") ? "4096" : "decode_b1");
      }
    std::string shown;
    for (const std::string& a : args) shown += " '" + a + "'";
    const Outcome o = run_asynct(args, s.dir(), kPerRun);
    EXPECT_TRUE(!o.timed_out && o.signal == 0 && o.code >= 0 && o.code <= 2)
        << "asynct" << shown << "\n" << o.describe();
    EXPECT_FALSE(contains(o.err, "internal error")) << "asynct" << shown << "\n" << o.describe();
    if (o.code >= 0 && o.code <= 2) ++by_code[o.code];
  }
  std::printf("%d runs: %d exited 0, %d exited 1 (command line), %d exited 2 (error)\n", runs, by_code[0], by_code[1],
              by_code[2]);
  EXPECT_GE(runs, 10) << "fewer runs than planned fit in the time budget";
}

}  // namespace
