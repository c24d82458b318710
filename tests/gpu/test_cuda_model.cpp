// The CUDA model runner against the CPU runner on the same tiny models (AsyncT, Qwen3, Llama)
// and the same steps: a prefill step, an all-decode step (the decode kernel) and a mixed step
// (the prefill kernel with a cached prefix); and on SmolLM2-135M's shapes. bf16 weights and activations on the GPU against float on the CPU:
// relative Frobenius error of the logits within 3e-2 (measured values are printed). The greedy
// tokens the runner finds on the device are the host argmax of the logits it returns.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu/device_buffer.h"
#include "kernels/common/tuning.h"
#include "kernels/sampling/sample_rows.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/cuda/cuda_model_runner.h"
#include "models/weights.h"
#include "engine/sampler.h"
#include "support/compare.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::close_to;

constexpr double kLogitTolerance = 3e-2;
// With an e4m3 cache the two runners quantise K and V that differ in their last bits (bf16
// products on the GPU, float32 on the CPU): a value on either side of a rounding boundary moves
// by a whole e4m3 step (6-12%), and the async gate's threshold can turn such a key on or off.
// Measured 2.4-3.7% on the tiny models [C37H]; the kernels themselves are held to their own
// tolerances on identical cache bytes (test_decode.cu, test_prefill.cu).
constexpr double kFp8CacheLogitTolerance = 6e-2;

// Appends sequence `tokens[begin, end)` of a sequence with the given block table to a batch.
void add_sequence(StepBatch& b, const std::vector<std::int32_t>& tokens, int begin, int end,
                  const std::vector<int>& table, int block_size) {
  if (b.cu_seqlens_q.empty()) b.cu_seqlens_q.push_back(0);
  for (int pos = begin; pos < end; ++pos) {
    b.tokens.push_back(tokens[std::size_t(pos)]);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(std::int64_t(table[std::size_t(pos / block_size)]) * block_size + pos % block_size);
  }
  b.cu_seqlens_q.push_back(b.num_tokens());
  b.kv_lens.push_back(end);
  b.block_tables.push_back(table);
  b.logit_rows.push_back(b.num_tokens() - 1);
  b.full_logits.push_back(1);
  b.sampling.push_back({});  // greedy
}

// The full logits a step returned, as a [rows, vocab] tensor (all rows must have been asked for).
Tensor logits_of(const StepOutput& out, int vocab) {
  Tensor t = Tensor::empty(DType::F32, {std::int64_t(out.logits.size()), vocab});
  for (std::size_t r = 0; r < out.logits.size(); ++r) {
    check(out.logits[r] != nullptr, "row ", r, " has no logits");
    std::copy_n(out.logits[r], vocab, t.data_as<float>() + std::int64_t(r) * vocab);
  }
  return t;
}

// Every row's device summary against summarize_logits over the logits that came back.
void expect_summaries_match(const StepOutput& out, int vocab, const char* what) {
  ASSERT_EQ(out.summaries.size(), out.logits.size()) << what;
  for (std::size_t r = 0; r < out.logits.size(); ++r) {
    const LogitSummary host = summarize_logits(out.logits[r], std::size_t(vocab));
    EXPECT_EQ(host.nonfinite, -1) << what << ", row " << r;
    EXPECT_EQ(out.summaries[r].nonfinite, -1) << what << ", row " << r;
    EXPECT_EQ(out.summaries[r].token, host.token) << what << ", row " << r;
  }
}

// The CUDA runner's logits against the CPU runner's on a prefill step, an all-decode step and
// two mixed steps (chunk first; decodes first) of three sequences; both with a KV cache of
// `kv_dtype` (the CPU reference holds an e4m3 cache's values as float32).
void expect_steps_match_the_cpu_runner(const ModelWeights& w, KvCacheDtype kv_dtype = KvCacheDtype::BF16,
                                       double tolerance = kLogitTolerance) {
  const int block_size = 16, num_blocks = 40;
  CpuModelRunner cpu(w, num_blocks, block_size, kv_dtype == KvCacheDtype::BF16 ? KvCacheDtype::Float32 : kv_dtype);
  CudaModelRunner gpu(w, num_blocks, block_size, 64, kv_dtype);

  std::vector<std::vector<std::int32_t>> seqs(3);
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 120; ++t) seqs[std::size_t(s)].push_back((t * 37 + s * 11 + 5) % w.config.vocab_size);
  // Shuffled, disjoint block tables of 8 blocks (128 tokens) each.
  std::vector<std::vector<int>> tables = {{3, 17, 0, 22, 9, 31, 5, 12}, {1, 30, 4, 19, 26, 7, 14, 39},
                                          {2, 8, 35, 11, 24, 6, 33, 16}};
  const int vocab = w.config.vocab_size;
  auto compare_step = [&](const StepBatch& b, const char* what) {
    Tensor expected = logits_of(cpu.forward(b), vocab);
    const StepOutput& out = gpu.forward(b);
    auto result = close_to(logits_of(out, vocab), expected, tolerance);
    EXPECT_TRUE(result) << what;
    std::printf("  %s: %s\n", what, result.message());
    expect_summaries_match(out, vocab, what);
  };

  StepBatch prefill;  // lengths 37, 1 and 100: odd, single, crossing blocks
  add_sequence(prefill, seqs[0], 0, 37, tables[0], block_size);
  add_sequence(prefill, seqs[1], 0, 1, tables[1], block_size);
  add_sequence(prefill, seqs[2], 0, 100, tables[2], block_size);
  compare_step(prefill, "prefill");

  StepBatch decode;  // one token each, after the prefill
  add_sequence(decode, seqs[0], 37, 38, tables[0], block_size);
  add_sequence(decode, seqs[1], 1, 2, tables[1], block_size);
  add_sequence(decode, seqs[2], 100, 101, tables[2], block_size);
  compare_step(decode, "decode");

  StepBatch mixed;  // a chunk after a cached prefix, then decodes: all through prefill
  add_sequence(mixed, seqs[0], 38, 90, tables[0], block_size);
  add_sequence(mixed, seqs[1], 2, 3, tables[1], block_size);
  add_sequence(mixed, seqs[2], 101, 102, tables[2], block_size);
  compare_step(mixed, "mixed, chunk first");

  StepBatch split;  // decodes first, then a chunk: decode kernel and prefill kernel together
  add_sequence(split, seqs[1], 3, 4, tables[1], block_size);
  add_sequence(split, seqs[2], 102, 103, tables[2], block_size);
  add_sequence(split, seqs[0], 90, 117, tables[0], block_size);
  compare_step(split, "mixed, decodes first");
}

class CudaModel : public ::testing::TestWithParam<Architecture> {};

// Head dim 128 (the Hopper prefill kernel on Hopper) and a short chunk after a long cached prefix:
// the kernel's rule splits each query tile's keys over CTAs (4 query tiles of 4 heads), its
// workspace reserved by the runner; in the same step as decodes (the decode kernel's workspace
// is the same buffer), and alone.
void expect_a_chunk_after_a_long_prefix_matches(Architecture arch) {
  ModelConfig c = tiny_config(arch);
  c.head_dim = 128;
  const ModelWeights w = random_weights(c, 27);
  const int block_size = 16, num_blocks = 120;
  CpuModelRunner cpu(w, num_blocks, block_size);
  CudaModelRunner gpu(w, num_blocks, block_size, 2048);
  std::vector<std::vector<std::int32_t>> seqs(2);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 900; ++t) seqs[std::size_t(s)].push_back((t * 53 + s * 7 + 3) % c.vocab_size);
  std::vector<std::vector<int>> tables(2);
  for (int b = 0; b < 60; ++b) tables[0].push_back(2 * b), tables[1].push_back(2 * b + 1);
  const auto compare_step = [&](const StepBatch& b, const char* what) {
    Tensor expected = logits_of(cpu.forward(b), c.vocab_size);
    const StepOutput& out = gpu.forward(b);
    auto result = close_to(logits_of(out, c.vocab_size), expected, kLogitTolerance);
    EXPECT_TRUE(result) << what;
    std::printf("  %s: %s\n", what, result.message());
  };
  StepBatch prefix;  // the long prefixes, whole
  add_sequence(prefix, seqs[0], 0, 800, tables[0], block_size);
  add_sequence(prefix, seqs[1], 0, 700, tables[1], block_size);
  compare_step(prefix, "prefixes of 800 and 700");
  StepBatch chunk;  // a short chunk after 800 cached tokens
  add_sequence(chunk, seqs[0], 800, 840, tables[0], block_size);
  compare_step(chunk, "40 tokens after 800");
  StepBatch mixed;  // a decode, then a chunk after 700
  add_sequence(mixed, seqs[0], 840, 841, tables[0], block_size);
  add_sequence(mixed, seqs[1], 700, 733, tables[1], block_size);
  compare_step(mixed, "a decode, then 33 tokens after 700");
}

TEST_P(CudaModel, ChunkAfterALongPrefixAtHeadDim128) {
  testing::require_gpu();
  expect_a_chunk_after_a_long_prefix_matches(GetParam());
}

TEST_P(CudaModel, MatchesTheCpuRunnerOnPrefillDecodeAndMixedSteps) {
  testing::require_gpu();
  expect_steps_match_the_cpu_runner(random_weights(tiny_config(GetParam()), 21));
}

// FP8 weights (the seven projections e4m3 with block scales): the CPU runner dequantizes them,
// the CUDA runner's products read them as they are; in blocks of 1 x 128 (--quantization fp8),
// of 128 x 128 (as FP8 checkpoints are published: one scale row for many weight rows) and of
// 16 x 32 (several scales along a row).
TEST_P(CudaModel, Fp8WeightsMatchTheCpuRunner) {
  testing::require_gpu();
  for (auto [rows, cols] : {std::pair{1, 128}, std::pair{128, 128}, std::pair{16, 32}}) {
    SCOPED_TRACE("FP8 blocks of " + std::to_string(rows) + " x " + std::to_string(cols));
    expect_steps_match_the_cpu_runner(quantize_fp8(random_weights(tiny_config(GetParam()), 21), rows, cols));
  }
}

// An FP8 (e4m3) KV cache at the bound rule's scales (kv_cache_scales): written by the decode
// kernel, the q/k-norm kernel (Llama) and the prefill kernel, read by both attention kernels; at
// head_dim 64 (tiny) and 128 (the Hopper prefill kernel on Hopper). Both runners attend to the
// values the cache holds, a step's own new keys included.
TEST_P(CudaModel, Fp8CacheMatchesTheCpuRunner) {
  testing::require_gpu();
  for (int head_dim : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    ModelConfig c = tiny_config(GetParam());
    c.head_dim = head_dim;
    expect_steps_match_the_cpu_runner(random_weights(c, 23), KvCacheDtype::Fp8E4M3, kFp8CacheLogitTolerance);
  }
}

// SmolLM2-135M's shapes with random weights and 2 of its 30 layers: hidden 576, 9 query and 3
// KV heads of 64 (q 576, k and v 192 wide), intermediate 1536, a tied vocabulary of 49152, RoPE
// theta 1e5; every product, norm and attention kernel at those sizes.
TEST(CudaModelShapes, SmolLm2MatchesTheCpuRunner) {
  testing::require_gpu();
  ModelConfig c = tiny_config(Architecture::Llama);
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.vocab_size = 49152;
  c.tie_word_embeddings = true;
  c.rope_theta = 1e5;
  c.rms_norm_eps = 1e-5f;
  expect_steps_match_the_cpu_runner(random_weights(c, 26));
}

// Chunked prefill in a cache of 12 blocks (preemption), over a bf16 and an FP8 cache.
TEST_P(CudaModel, EngineRunsToCompletion) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 22);
  const int vocab = w.config.vocab_size;
  for (KvCacheDtype kv : {KvCacheDtype::BF16, KvCacheDtype::Fp8E4M3}) {
    SCOPED_TRACE(kv_cache_dtype_name(kv));
    EngineOptions o;
    o.max_num_batched_tokens = 24;  // chunked prefill
    Engine e(std::make_unique<CudaModelRunner>(w, 12, 16, 24, kv), vocab, o);
    for (int r = 0; r < 4; ++r) {
      Request req;
      for (int t = 0; t < 10 + 13 * r; ++t) req.prompt.push_back((t * 7 + r) % vocab);
      req.max_tokens = 20;
      e.add_request(req);
    }
    auto out = e.run_to_completion();
    ASSERT_EQ(out.size(), 4u);
    for (const RequestOutput& o2 : out) EXPECT_EQ(o2.tokens.size(), 20u);
  }
}

// A request's greedy choices (Engine::add_request_group) fork after the prompt, each with its
// own copy of the partial last block (CudaModelRunner::copy_blocks): identical rows in every
// product and the same K/V, so every choice generates the leader's tokens. A wrong or missing
// copy would give the forks other K/V for the prompt's last positions. Over a bf16 and an FP8
// cache (the copies are of bytes).
TEST_P(CudaModel, ForkedGreedyChoicesGenerateTheSameTokens) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 23);
  const int vocab = w.config.vocab_size;
  for (KvCacheDtype kv : {KvCacheDtype::BF16, KvCacheDtype::Fp8E4M3})
  for (int prompt_len : {21, 32}) {  // a partial last block, and none
    SCOPED_TRACE(::testing::Message() << "prompt " << prompt_len << ", " << kv_cache_dtype_name(kv) << " cache");
    Engine e(std::make_unique<CudaModelRunner>(w, 24, 16, 64, kv), vocab, {});
    Request r;
    for (int t = 0; t < prompt_len; ++t) r.prompt.push_back((t * 5 + 2) % vocab);
    r.max_tokens = 24;
    e.add_request_group(std::vector<Request>(3, r));
    const auto out = e.run_to_completion();
    ASSERT_EQ(out.size(), 3u);
    for (const RequestOutput& o : out) EXPECT_EQ(o.tokens, out[0].tokens);
    EXPECT_EQ(e.stats().prefill_tokens, prompt_len) << "the prompt computed once";
    EXPECT_EQ(e.kv_blocks_used(), 0);
  }
}

// Decode steps replayed from CUDA graphs give what eager steps give. The graphs size the
// decode kernel's splits from the block-table width, not the longest context, so the sums
// may be ordered differently: logits within 1e-3, and the greedy tokens the same.
TEST_P(CudaModel, CudaGraphsOnEqualsOff) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 23);
  const int vocab = w.config.vocab_size;
  auto generate = [&](bool graphs) {
    auto runner = std::make_unique<CudaModelRunner>(w, 40, 16, 64);
    runner->set_cuda_graphs(graphs);
    EngineOptions o;
    o.record_first_logits = true;
    Engine e(std::move(runner), vocab, o);
    for (int r = 0; r < 3; ++r) {
      Request req;
      for (int t = 0; t < 5 + 40 * r; ++t) req.prompt.push_back((t * 13 + r) % vocab);
      req.max_tokens = 40;  // contexts cross several block-table widths
      e.add_request(req);
    }
    return e.run_to_completion();
  };
  auto off = generate(false), on = generate(true);
  ASSERT_EQ(off.size(), on.size());
  for (std::size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(on[i].tokens, off[i].tokens) << "request " << i;
    EXPECT_TRUE(close_to(on[i].first_logits, off[i].first_logits, 1e-3)) << "request " << i;
  }
}

// Small steps (speculative verification: a few new tokens a sequence; short prompts) replayed
// from CUDA graphs give what eager steps give: greedy tokens the same and first logits within
// 1e-3 (the graphs size the key splits from the block-table width), at batch 1 and 3, with
// drafts from prompt lookup and with every step verifying 4 drafts (forced: then no step is
// all-decode, so a replayed graph is a verification step's).
TEST_P(CudaModel, SmallStepsReplayedFromGraphsEqualEager) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 27);
  const int vocab = w.config.vocab_size;
  for (const std::string method : {"ngram", "forced"})
    for (const int batch : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << method << ", batch " << batch);
      auto generate = [&](bool graphs, std::map<std::string, double>* phases) {
        auto runner = std::make_unique<CudaModelRunner>(w, 64, 16, 64);
        runner->set_cuda_graphs(graphs);
        runner->set_profiling(true);
        CudaModelRunner* timed = runner.get();
        EngineOptions o;
        o.record_first_logits = true;
        o.speculative.method = method;
        Engine e(std::move(runner), vocab, o);
        for (int r = 0; r < batch; ++r) {
          Request req;
          for (int t = 0; t < 6 + 5 * r; ++t) req.prompt.push_back(3 + (t % (3 + r)) + 7 * r);  // repeats: drafts
          req.max_tokens = 40 + 3 * r;  // contexts cross block-table widths
          e.add_request(req);
        }
        auto out = e.run_to_completion();
        *phases = timed->phase_times_ms();
        return out;
      };
      std::map<std::string, double> eager_phases, graph_phases;
      const auto off = generate(false, &eager_phases), on = generate(true, &graph_phases);
      ASSERT_EQ(off.size(), on.size());
      for (std::size_t i = 0; i < off.size(); ++i) {
        EXPECT_EQ(on[i].tokens, off[i].tokens) << "request " << i;
        EXPECT_TRUE(close_to(on[i].first_logits, off[i].first_logits, 1e-3)) << "request " << i;
      }
      EXPECT_GT(graph_phases["decode_graph"], 0.0);
      EXPECT_EQ(eager_phases.count("decode_graph"), 0u);
    }
}

// Questions of up to 64 tokens after a cached prefix (a system prompt), each its own one-token
// step, replayed from CUDA graphs (ASYNCT_GRAPH_PREFILL set to its default, 64): the same tokens
// as eager steps and first logits within 1e-2 (a replayed shape's KV length is its block-table
// width's, which changes the prefill kernel's key splits and so the order the cached keys are
// summed in: 3.3e-3 to 5.2e-3 measured on an H100), for prompts of one length asked three times
// (eager, captured, replayed) and of another; and the same with a graph cache of two shapes,
// which drops the least recently run as the lengths alternate.
TEST_P(CudaModel, PromptsAfterACachedPrefixReplayedFromGraphsEqualEager) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 31);
  const int vocab = w.config.vocab_size;
  const kernels::KernelTuning saved = kernels::kernel_tuning();
  kernels::KernelTuning forced = saved;
  forced.graph_prefill_len = 64;
  kernels::set_kernel_tuning(forced);
  auto generate = [&](bool graphs, std::map<std::string, double>* phases, int max_shapes = 512) {
    auto runner = std::make_unique<CudaModelRunner>(w, 64, 16, 256);
    runner->set_cuda_graphs(graphs);
    runner->set_max_graph_shapes(max_shapes);
    runner->set_profiling(true);
    CudaModelRunner* timed = runner.get();
    EngineOptions o;
    o.record_first_logits = true;
    o.prefix_caching = true;
    Engine e(std::move(runner), vocab, o);
    std::vector<RequestOutput> outputs;
    for (const int question : {64, 64, 64, 40, 64, 40, 40, 64}) {
      Request req;
      for (int t = 0; t < 96; ++t) req.prompt.push_back(5 + (t * 13) % 97);  // six full blocks, cached after the first
      for (int t = 0; t < question; ++t) req.prompt.push_back(100 + (t * 7 + int(outputs.size()) * 3) % 150);
      req.max_tokens = 1;  // one step a request: the prompt's
      e.add_request(req);
      for (RequestOutput& out : e.run_to_completion()) outputs.push_back(std::move(out));
    }
    *phases = timed->phase_times_ms();
    return outputs;
  };
  std::map<std::string, double> eager_phases, graph_phases, small_cache_phases;
  const auto off = generate(false, &eager_phases), on = generate(true, &graph_phases),
             small = generate(true, &small_cache_phases, 2);
  kernels::set_kernel_tuning(saved);
  ASSERT_EQ(off.size(), on.size());
  ASSERT_EQ(off.size(), small.size());
  for (std::size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(on[i].tokens, off[i].tokens) << "request " << i;
    EXPECT_EQ(small[i].tokens, off[i].tokens) << "request " << i;
    EXPECT_EQ(on[i].cached_tokens, i == 0 ? 0 : 96) << "request " << i;
    EXPECT_TRUE(close_to(on[i].first_logits, off[i].first_logits, 1e-2)) << "request " << i;
    EXPECT_TRUE(close_to(small[i].first_logits, off[i].first_logits, 1e-2)) << "request " << i;
  }
  EXPECT_GT(graph_phases["decode_graph"], 0.0);  // no step is all-decode: this is a prompt's replay
  EXPECT_GT(small_cache_phases["decode_graph"], 0.0);
  EXPECT_EQ(eager_phases.count("decode_graph"), 0u);
}

// A constraint allowing three tokens a step (a low, a middle and a high id of a 151936-token
// vocabulary, changing with the step), which checks that each token taken is one it allowed.
class ThreeTokens : public TokenConstraint {
 public:
  explicit ThreeTokens(int salt) : salt_(salt) {}
  void fill_allowed(std::uint32_t* words, int vocab) override {
    allowed_ = {(salt_ * 7 + step_) % 64, 70000 + (salt_ * 131 + step_ * 17) % 1000, vocab - 1 - (salt_ + step_) % 40};
    for (const int t : allowed_) words[t / 32] |= 1u << (t % 32);
  }
  bool accept(std::int32_t token) override {
    ++step_;
    return std::find(allowed_.begin(), allowed_.end(), token) != allowed_.end();
  }
  bool complete() const override { return false; }

 private:
  int salt_, step_ = 0;
  std::vector<int> allowed_;
};

// Constrained rows drawn on the device in decode steps of 34 rows (CUDA graphs on and off, after
// graphs were captured for unconstrained steps of the same shapes): every token one the mask
// allowed (the engine throws otherwise), greedy and sampled, at Qwen3's vocabulary size.
TEST_P(CudaModel, ConstrainedDecodeStepsTakeOnlyAllowedTokens) {
  testing::require_gpu();
  ModelConfig c = tiny_config(GetParam());
  c.vocab_size = 151936;
  ModelWeights w = random_weights(c, 29);
  auto generate = [&](bool graphs, bool constrained) {
    auto runner = std::make_unique<CudaModelRunner>(w, 64, 16, 64);
    runner->set_cuda_graphs(graphs);
    Engine e(std::move(runner), c.vocab_size, {});
    for (int round = 0; round < 2; ++round) {
      for (int r = 0; r < 34; ++r) {  // 34 rows a decode step: the sampler's cluster layouts of many rows
        Request req;
        for (int t = 0; t < 5 + r % 7; ++t) req.prompt.push_back((t * 13 + r) % c.vocab_size);
        req.max_tokens = 12;
        if (r % 2) req.sampling = {.temperature = 0.9f, .top_k = 40, .seed = std::uint64_t(r)};
        if (constrained || round == 1) req.constraint = [r] { return std::make_unique<ThreeTokens>(r); };
        e.add_request(req);
      }
      for (const RequestOutput& out : e.run_to_completion()) EXPECT_EQ(out.tokens.size(), 12u);
    }
  };
  for (const bool graphs : {false, true})
    for (const bool constrained : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "graphs " << graphs << ", constrained from the first round " << constrained);
      EXPECT_NO_THROW(generate(graphs, constrained));
    }
}

// Constrained decode steps queued before the host has the tokens their masks follow (the model
// runs from submit, the sampler once the masks are sent: StepBatch::masks_later), with CUDA
// graphs: the tokens of steps run one at a time, greedy and sampled.
TEST_P(CudaModel, ConstrainedPipelinedStepsEqualUnpipelined) {
  testing::require_gpu();
  ModelConfig c = tiny_config(GetParam());
  c.vocab_size = 151936;
  ModelWeights w = random_weights(c, 31);
  auto generate = [&](bool pipeline, EngineStats* stats) {
    EngineOptions o;
    o.pipeline_steps = pipeline;
    Engine e(std::make_unique<CudaModelRunner>(w, 64, 16, 64), c.vocab_size, o);
    for (int r = 0; r < 12; ++r) {
      Request req;
      for (int t = 0; t < 5 + r % 7; ++t) req.prompt.push_back((t * 13 + r) % c.vocab_size);
      req.max_tokens = 20;
      if (r % 2) req.sampling = {.temperature = 0.9f, .top_k = 40, .seed = std::uint64_t(r)};
      req.constraint = [r] { return std::make_unique<ThreeTokens>(r); };
      e.add_request(req);
    }
    auto out = e.run_to_completion();
    *stats = e.stats();
    return out;
  };
  EngineStats plain_stats, pipelined_stats;
  const auto plain = generate(false, &plain_stats), pipelined = generate(true, &pipelined_stats);
  ASSERT_EQ(plain.size(), pipelined.size());
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(pipelined[i].tokens, plain[i].tokens) << "request " << i;
  EXPECT_GT(pipelined_stats.pipelined_steps, 10);
  EXPECT_EQ(plain_stats.pipelined_steps, 0);
}

// Decode steps queued before the host reads the tokens they continue from (the runner takes
// them from the step before on the device) give the tokens of steps run one at a time, with
// CUDA graphs, across block-table widths, and when a sequence ends at an end-of-sequence token
// while the step after it is queued.
TEST_P(CudaModel, PipelinedStepsEqualUnpipelined) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 24);
  const int vocab = w.config.vocab_size;
  std::vector<Request> requests;
  for (int r = 0; r < 3; ++r) {
    Request req;
    for (int t = 0; t < 7 + 30 * r; ++t) req.prompt.push_back((t * 11 + r) % vocab);
    req.max_tokens = 36 + r;
    requests.push_back(req);
  }
  auto generate = [&](bool pipeline, EngineStats* stats) {
    EngineOptions o;
    o.pipeline_steps = pipeline;
    Engine e(std::make_unique<CudaModelRunner>(w, 40, 16, 64), vocab, o);
    for (const Request& r : requests) e.add_request(r);
    auto out = e.run_to_completion();
    *stats = e.stats();
    return out;
  };
  EngineStats plain_stats, pipelined_stats;
  const auto full = generate(false, &plain_stats);
  requests[1].eos_token_ids = {full[1].tokens[9]};  // request 1 ends early
  const auto plain = generate(false, &plain_stats), pipelined = generate(true, &pipelined_stats);
  ASSERT_EQ(plain.size(), pipelined.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(pipelined[i].tokens, plain[i].tokens) << "request " << i;
    EXPECT_EQ(pipelined[i].finish_reason, plain[i].finish_reason) << "request " << i;
  }
  EXPECT_EQ(plain[1].finish_reason, "eos");
  EXPECT_EQ(plain_stats.pipelined_steps, 0);
  EXPECT_GT(pipelined_stats.pipelined_steps, 20);
  EXPECT_EQ(pipelined_stats.decode_tokens, plain_stats.decode_tokens);
}

// Greedy rows stay on the device: a runner asked for no full logits gives the same greedy
// tokens as one asked for all of them (which match the host argmax of what came back), and
// hands out no logits. Prefill, eager decode, captured decode and replayed decode steps.
TEST_P(CudaModel, DeviceGreedyTokensAreTheHostArgmax) {
  testing::require_gpu();
  const int block_size = 16;
  ModelWeights w = random_weights(tiny_config(GetParam()), 24);
  const int vocab = w.config.vocab_size;
  CudaModelRunner full(w, 24, block_size, 64), greedy(w, 24, block_size, 64);
  std::vector<std::vector<std::int32_t>> seqs(3);
  std::vector<std::vector<int>> tables = {{5, 0, 17, 9, 2, 21}, {11, 3, 14, 7, 19, 1}, {4, 22, 8, 15, 6, 12}};
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 20 + 9 * s; ++t) seqs[std::size_t(s)].push_back((t * 29 + s * 5 + 3) % vocab);
  StepBatch b;
  for (int s = 0; s < 3; ++s) add_sequence(b, seqs[std::size_t(s)], 0, int(seqs[std::size_t(s)].size()), tables[std::size_t(s)], block_size);
  for (int step = 0; step < 6; ++step) {
    StepBatch none = b;
    std::fill(none.full_logits.begin(), none.full_logits.end(), std::uint8_t(0));
    const StepOutput& a = full.forward(b);
    const StepOutput& g = greedy.forward(none);
    const std::string what = "step " + std::to_string(step);
    expect_summaries_match(a, vocab, what.c_str());
    ASSERT_EQ(g.summaries.size(), a.summaries.size());
    for (std::size_t r = 0; r < a.summaries.size(); ++r) {
      EXPECT_EQ(g.summaries[r].token, a.summaries[r].token) << what << ", row " << r;
      EXPECT_EQ(g.summaries[r].nonfinite, -1) << what << ", row " << r;
      EXPECT_EQ(g.logits[r], nullptr) << what << ", row " << r;
    }
    // The next step decodes the greedy tokens, one per sequence.
    StepBatch next;
    for (int s = 0; s < 3; ++s) {
      auto& seq = seqs[std::size_t(s)];
      seq.push_back(a.summaries[std::size_t(s)].token);
      add_sequence(next, seq, int(seq.size()) - 1, int(seq.size()), tables[std::size_t(s)], block_size);
    }
    b = next;
  }
}

// Every row drawn by the runner follows the host sampler on the logits that came back:
// with the device sampler (sm_90) every row is drawn on the device, its token the reference's
// (but for a draw within rounding of a boundary, not met here), its logprobs within 1e-4 of the
// reference's double-precision ones (a logit bias and an allowed-token mask applied there too),
// and a step queued behind may take its tokens, so sampled
// decode steps pipeline and give the same tokens as unpipelined ones. Without it, only greedy
// rows without penalties are drawn on the device and the others on the host; a step queued
// behind may take tokens only from rows the device drew, and the engine queues none behind
// sampled rows.
TEST_P(CudaModel, RowsFollowTheReferenceSampler) {
  testing::require_gpu();
  const int block_size = 16;
  ModelWeights w = random_weights(tiny_config(GetParam()), 26);
  const int vocab = w.config.vocab_size;
  CudaModelRunner gpu(w, 24, block_size, 64);
  const bool device_sampler = kernels::device_sampling_supported(vocab);
  const std::vector<std::vector<std::int32_t>> seqs = {{1, 2, 3, 4, 2}, {9}, {7, 7, 8}, {5, 6}};
  StepBatch b;
  for (std::size_t s = 0; s < seqs.size(); ++s) add_sequence(b, seqs[s], 0, int(seqs[s].size()), {int(s)}, block_size);
  b.sampling[0].params = {.temperature = 0.8f, .top_k = 20, .repetition_penalty = 1.3f, .presence_penalty = 0.5f,
                          .seed = 5, .logprobs = 3};
  b.sampling[0].step = 4;
  b.penalty_tokens = {{1, 0, 1}, {2, 0, 1}, {3, 0, 1}, {4, 0, 1}};  // the prompt but its newest token
  b.sampling[0].penalty_end = 4;
  b.sampling[1].params = {.repetition_penalty = 1.5f, .logprobs = 0};  // greedy with penalties
  b.sampling[1].penalty_begin = b.sampling[1].penalty_end = 4;
  b.sampling[2].params = {.logprobs = 2};                               // greedy with logprobs and a bias
  b.logit_bias = {{11, 100.0f}, {12, -3.0f}};
  b.sampling[2].bias_end = 2;
  b.sampling[3].params = {.temperature = 1.2f, .min_p = 0.1f, .seed = 9};  // with an allowed-token mask
  b.token_masks.assign(std::size_t(token_mask_words(vocab)), 0u);
  for (int t : {3, 40, 41}) b.token_masks[std::size_t(t / 32)] |= 1u << (t % 32);
  b.sampling[3].mask_offset = 0;
  EXPECT_EQ(gpu.samples_on_device(b.sampling[0]), device_sampler);
  EXPECT_EQ(gpu.samples_on_device(b.sampling[1]), device_sampler);
  EXPECT_EQ(gpu.samples_on_device(b.sampling[2]), device_sampler);
  EXPECT_EQ(gpu.samples_on_device(b.sampling[3]), device_sampler);
  b.full_logits.assign(4, 1);  // to compare with the reference
  const StepOutput& out = gpu.forward(b);
  ASSERT_EQ(out.summaries.size(), 4u);
  for (std::size_t r = 0; r < 4; ++r) {
    const RowSampling& s = b.sampling[r];
    const PenaltyContext penalties{std::span<const PenaltyToken>(b.penalty_tokens)
                                       .subspan(std::size_t(s.penalty_begin), std::size_t(s.penalty_end - s.penalty_begin)),
                                   b.tokens[std::size_t(b.logit_rows[r])], false};
    std::vector<TopLogprob> top;
    const std::span<const LogitBias> bias = std::span<const LogitBias>(b.logit_bias)
                                                .subspan(std::size_t(s.bias_begin), std::size_t(s.bias_end - s.bias_begin));
    const LogitSummary want = sample_logit_row(out.logits[r], std::size_t(vocab), s, penalties, &top, bias,
                                               s.mask_offset >= 0 ? b.token_masks.data() + s.mask_offset : nullptr);
    EXPECT_EQ(out.summaries[r].token, want.token) << "row " << r;
    EXPECT_NEAR(out.summaries[r].logprob, want.logprob, 1e-4) << "row " << r;
    ASSERT_EQ(out.top_logprobs[r].size(), top.size()) << "row " << r;
    for (std::size_t k = 0; k < top.size(); ++k) {
      EXPECT_EQ(out.top_logprobs[r][k].id, top[k].id) << "row " << r;
      EXPECT_NEAR(out.top_logprobs[r][k].logprob, top[k].logprob, 1e-4) << "row " << r;
    }
  }
  EXPECT_EQ(out.summaries[2].token, 11);
  EXPECT_TRUE(out.summaries[3].token == 3 || out.summaries[3].token == 40 || out.summaries[3].token == 41);
  if (!device_sampler) {
    StepBatch chained;
    add_sequence(chained, {0, 0, 0, 0, 0, 0}, 5, 6, {0}, block_size);
    chained.tokens_from_rows = {0};
    testing::expect_error([&] { gpu.submit(chained); }, "whose token this runner draws on the host");
  }

  for (float temperature : {0.0f, 0.8f}) {
    std::vector<std::vector<std::int32_t>> tokens_by_pipelining[2];
    for (bool pipeline : {false, true}) {
      EngineOptions eo;
      eo.pipeline_steps = pipeline;
      Engine e(std::make_unique<CudaModelRunner>(w, 24, block_size, 64), vocab, eo);
      for (int r = 0; r < 3; ++r) {
        Request req;
        for (int t = 0; t < 6 + 5 * r; ++t) req.prompt.push_back((t * 17 + r) % vocab);
        req.max_tokens = 12;
        req.sampling = {.temperature = temperature, .top_p = 0.9f, .frequency_penalty = temperature > 0 ? 0.5f : 0.0f,
                        .seed = std::uint64_t(r), .logprobs = r};
        e.add_request(req);
      }
      for (const RequestOutput& o : e.run_to_completion()) {
        EXPECT_EQ(o.tokens.size(), 12u);
        EXPECT_EQ(o.logprobs.size(), 12u);
        tokens_by_pipelining[pipeline].push_back(o.tokens);
      }
      if (!pipeline) continue;
      if (temperature > 0.0f && !device_sampler)
        EXPECT_EQ(e.stats().pipelined_steps, 0);
      else
        EXPECT_GT(e.stats().pipelined_steps, 0);
    }
    EXPECT_EQ(tokens_by_pipelining[0], tokens_by_pipelining[1]) << "temperature " << temperature;
  }
}

// A NaN logit found on the device is the engine's usual sampling error, greedy or not, in a
// prefill-kernel step and in a decode-kernel step, with graphs on or off.
TEST_P(CudaModel, NonFiniteLogitsGiveTheSamplingError) {
  testing::require_gpu();
  for (bool graphs : {false, true})
    for (int prompt : {7, 1}) {  // a 1-token prompt makes the first step a decode-kernel step
      for (float temperature : {0.0f, 0.8f}) {
        ModelWeights w = random_weights(tiny_config(GetParam()), 25);
        const int vocab = w.config.vocab_size, hidden = w.config.hidden_size;
        w.lm_head.data_as<bf16_bits>()[5 * hidden].bits = float_to_bf16(NAN);  // token 5's logit is NaN
        auto runner = std::make_unique<CudaModelRunner>(w, 8, 16, 32);
        runner->set_cuda_graphs(graphs);
        Engine e(std::move(runner), vocab, {});
        Request r;
        for (int t = 0; t < prompt; ++t) r.prompt.push_back(10 + t);
        r.sampling.temperature = temperature;
        e.add_request(r);
        testing::expect_error([&] { e.run_to_completion(); }, "sampling: logit 5 is not finite");
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModel, ::testing::Values(Architecture::AsyncT, Architecture::Qwen3, Architecture::Llama));

}  // namespace
}  // namespace asynct
