// The CPU backend: the model's forward pass written with the reference operations, over a
// float32 paged KV cache. Slow and plain; the oracle for the GPU backend and the engine tests.
// A bf16 or FP8 cache (models/kv_cache_format.h) is held in float32 too, each value rounded as
// that type stores it when it is written: what a cache of that type reads back.
#pragma once

#include <vector>

#include "core/gate.h"
#include "engine/model_runner.h"
#include "models/architecture.h"
#include "models/host_step_queue.h"
#include "models/kv_cache_format.h"
#include "models/weights.h"
#include "reference/norms.h"

namespace asynct {

class CpuModelRunner : public ModelRunner {
 public:
  CpuModelRunner(ModelWeights weights, int num_blocks, int block_size, KvCacheDtype kv_dtype = KvCacheDtype::Float32);

  // Throws Error for a block size the CPU backend does not run (check_block_size) or no blocks.
  // A step runs in submit() (in supply_masks() when its masks come later), sampling every row
  // with the host sampler; collect() hands its output out. Steps can be pipelined (the tokens a chained batch takes from the step before
  // are that step's tokens, greedy or drawn), which lets the engine's pipelined path run, and
  // be tested, without a GPU.
  void submit(const StepBatch& batch) override;
  void supply_masks(const StepBatch& batch) override;  // runs the step that waited for them
  const StepOutput& collect() override { return steps_.collect(); }
  bool pipelines_steps() const override { return true; }
  void copy_blocks(const std::vector<BlockCopy>& copies) override;  // at once: submit() has run its steps
  int num_blocks() const override { return num_blocks_; }
  int block_size() const override { return block_size_; }
  const ModelConfig& config() const { return weights_.config; }
  // A layer's cache, float32 [num_blocks, block_size, Hkv, D], as the attention reads it.
  const Tensor& key_cache(int layer) const { return key_cache_[std::size_t(layer)]; }
  const Tensor& value_cache(int layer) const { return value_cache_[std::size_t(layer)]; }

 private:
  Tensor attention_block(int layer, const Tensor& x, const StepBatch& batch, const Tensor& table);
  Tensor mlp_block(int layer, const Tensor& x);
  // Rounds the K and V rows just written at these slots of a layer's cache as the cache type stores them.
  void round_written_rows(int layer, const std::vector<std::int64_t>& slots);
  struct Result {
    Tensor logits;  // [rows, vocab], which output points into
    StepOutput output;
  };
  Result run(const StepBatch& batch, const std::vector<std::int32_t>& tokens);

  int num_blocks_, block_size_;  // checked before the weights are converted
  KvCacheDtype kv_dtype_;
  KvCacheScales kv_scales_;      // from the weights as given (a checkpoint's scales, or their bound)
  ModelWeights weights_;
  ArchitectureRecipe recipe_;
  NormConfig norm_;
  std::vector<Gate> gates_;  // per layer
  std::vector<Tensor> key_cache_, value_cache_;  // per layer [blocks, block_size, Hkv, D]
  HostStepQueue<Result> steps_;
};

}  // namespace asynct
