// The production CPU backend: the model's forward pass on the weights as loaded (bf16 mapped
// checkpoint views, no float32 copy; or the projections in FP8 with their block scales), a paged KV
// cache in bf16 or e4m3 (--kv-cache-dtype fp8: scales per layer and KV head, models/kv_cache_format.h), float32 arithmetic in vector
// kernels (kernels.h) on every thread of a persistent pool (ASYNCT_THREADS caps it). The CPU
// reference (models/cpu/cpu_model_runner.h) is its oracle: logits agree to the bf16 cache's and
// float32 sums' rounding, greedy tokens on the golden prompts are the same.
#pragma once

#include <memory>
#include <vector>

#include "core/gate.h"
#include "engine/model_runner.h"
#include "models/architecture.h"
#include "models/cpu_fast/kv_cache.h"
#include "models/cpu_fast/linear.h"
#include "core/thread_pool.h"
#include "models/host_step_queue.h"
#include "models/kv_cache_format.h"
#include "models/weights.h"

namespace asynct {

class CpuFastModelRunner : public ModelRunner {
 public:
  // Throws Error for a block size the CPU backend does not run, no blocks, or a cache type other
  // than bf16 and fp8. Projections held as float32 (a float32 or float16 checkpoint) are rounded
  // to bf16 once, here. int8_weights (--quantization int8): the projections and the LM head
  // quantized to 8-bit integers here (kernels.h: Int8Matrix), from bf16 weights (FP8 ones are an
  // Error).
  CpuFastModelRunner(ModelWeights weights, int num_blocks, int block_size, KvCacheDtype kv_dtype = KvCacheDtype::BF16,
                     bool int8_weights = false);

  // A step runs in submit(); collect() hands its output out. Steps pipeline as the
  // reference's do (the tokens a chained batch takes are the step before's).
  void submit(const StepBatch& batch) override;
  void supply_masks(const StepBatch& batch) override;  // runs the step that waited for them
  const StepOutput& collect() override { return steps_.collect(); }
  bool pipelines_steps() const override { return true; }
  void copy_blocks(const std::vector<BlockCopy>& copies) override;
  int num_blocks() const override { return num_blocks_; }
  int block_size() const override { return block_size_; }
  const ModelConfig& config() const { return weights_.config; }

 private:
  struct Layer {
    cpu_fast::Projection q, k, v, o, gate, up, down;
    std::vector<float> input_norm, post_attention_norm, q_norm, k_norm, attn_output_norm, mlp_output_norm;
    Gate attention_gate;
  };
  struct Result {
    std::vector<float> logits;  // [rows, vocab], which output points into
    StepOutput output;
  };
  Result run(const StepBatch& batch, const std::vector<std::int32_t>& tokens);
  void attention_block(int index, const StepBatch& batch);  // layer `index`: x_norm_ -> attn_
  void mlp_block(const Layer& layer);                           // x_norm_ -> mlp_
  void quantize_int8_weights();  // every projection and the LM head to int8 (int8_), on the pool
  // fn(first, last) over rows [0, rows), on the pool when there are enough rows to pay for it.
  template <typename Fn>
  void for_rows(std::int64_t rows, const Fn& fn);

  int num_blocks_, block_size_;
  ModelWeights weights_;  // keeps the mapped views the layers point into alive
  ArchitectureRecipe recipe_;
  cpu_fast::KvCache kv_cache_;
  float norm_clip_;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<cpu_fast::Int8Matrix>> int8_;  // int8 weights, which projections point into
  cpu_fast::Projection lm_head_;
  std::vector<float> final_norm_;
  std::vector<double> inv_freq_;  // RoPE's theta^(-2i/D)
  ThreadPool pool_;
  // Per-step work buffers, kept between steps.
  std::vector<float> x_, x_norm_, qkv_, q_, attn_, proj_, gate_up_, act_;
  std::vector<float> cos_, sin_;
  HostStepQueue<Result> steps_;
};

}  // namespace asynct
