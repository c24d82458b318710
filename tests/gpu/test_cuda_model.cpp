// The CUDA model runner against the CPU runner on the same tiny models and the same steps:
// a prefill step, an all-decode step (the decode kernel) and a mixed step (the prefill kernel
// with a cached prefix). bf16 weights and activations on the GPU against float on the CPU:
// relative Frobenius error of the logits within 3e-2 (measured values are printed).
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gpu/device_buffer.h"
#include "models/cpu_model.h"
#include "models/cuda_model.h"
#include "support/compare.h"

namespace asynct {
namespace {

using testing::close_to;

constexpr double kLogitTolerance = 3e-2;

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
}

class CudaModel : public ::testing::TestWithParam<Architecture> {};

TEST_P(CudaModel, MatchesTheCpuRunnerOnPrefillDecodeAndMixedSteps) {
  testing::require_gpu();
  const int block_size = 16, num_blocks = 40;
  ModelWeights w = random_weights(tiny_config(GetParam()), 21);
  CpuModelRunner cpu(w, num_blocks, block_size);
  CudaModelRunner gpu(w, num_blocks, block_size, 64);

  std::vector<std::vector<std::int32_t>> seqs(3);
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 120; ++t) seqs[std::size_t(s)].push_back((t * 37 + s * 11 + 5) % 256);
  // Shuffled, disjoint block tables of 8 blocks (128 tokens) each.
  std::vector<std::vector<int>> tables = {{3, 17, 0, 22, 9, 31, 5, 12}, {1, 30, 4, 19, 26, 7, 14, 39},
                                          {2, 8, 35, 11, 24, 6, 33, 16}};
  auto compare_step = [&](const StepBatch& b, const char* what) {
    Tensor expected = cpu.forward(b), got = gpu.forward(b);
    auto result = close_to(got, expected, kLogitTolerance);
    EXPECT_TRUE(result) << what;
    std::printf("  %s: %s\n", what, result.message());
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

TEST_P(CudaModel, EngineRunsToCompletion) {
  testing::require_gpu();
  ModelWeights w = random_weights(tiny_config(GetParam()), 22);
  const int vocab = w.config.vocab_size;
  EngineOptions o;
  o.max_num_batched_tokens = 24;  // chunked prefill
  Engine e(std::make_unique<CudaModelRunner>(w, 12, 16, 24), vocab, o);
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

INSTANTIATE_TEST_SUITE_P(Models, CudaModel, ::testing::Values(Architecture::AsyncT, Architecture::Qwen3));

}  // namespace
}  // namespace asynct
