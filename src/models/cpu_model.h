// The CPU backend: the model's forward pass written with the reference operations, over a
// float32 paged KV cache. Slow and plain; the oracle for the GPU backend and the engine tests.
#pragma once

#include <vector>

#include "engine/model_runner.h"
#include "models/weights.h"
#include "reference/gate.h"
#include "reference/norms.h"

namespace asynct {

class CpuModelRunner : public ModelRunner {
 public:
  CpuModelRunner(ModelWeights weights, int num_blocks, int block_size);

  const StepOutput& forward(const StepBatch& batch) override;
  int num_blocks() const override { return num_blocks_; }
  int block_size() const override { return block_size_; }
  const ModelConfig& config() const { return weights_.config; }

 private:
  Tensor attention_block(int layer, const Tensor& x, const StepBatch& batch, const Tensor& table);
  Tensor mlp_block(int layer, const Tensor& x);

  ModelWeights weights_;
  int num_blocks_, block_size_;
  NormConfig norm_;
  std::vector<Gate> gates_;  // per layer
  std::vector<Tensor> key_cache_, value_cache_;  // per layer [blocks, block_size, Hkv, D]
  Tensor logits_;       // the last step's [rows, vocab], which output_ points into
  StepOutput output_;
};

}  // namespace asynct
