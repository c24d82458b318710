// The CUDA backend: the same forward pass as the CPU runner on the GPU, with bf16 (or FP8)
// weights and a bf16 or FP8 (e4m3) paged KV cache (device_kv_cache.h): cuBLASLt for the projections, asynct's kernels for the norms,
// qk-norm + RoPE + cache write, attention (the decode kernel for a step's leading one-token
// sequences, the prefill kernel for the rest) and SwiGLU. The logits stay on the GPU: a kernel finds each row's greedy token and
// checks it is finite, and only the rows the engine asks for, or that the host samples, are
// copied back (float32).
// The parts, one job a file beside this one: device_weights (upload), device_kv_cache, step_metadata, forward
// (the layer loop), graph_cache (decode steps as CUDA graphs), phase_timer.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "engine/model_runner.h"
#include "models/kv_cache_format.h"
#include "models/weights.h"

namespace asynct {

// Whether a CUDA device can be used (the library is built with CUDA and a GPU is visible).
bool cuda_device_available();

class CudaModelRunner : public ModelRunner {
 public:
  // max_tokens_per_step sizes the activation buffers (they grow if a step needs more). kv_dtype:
  // bf16 or fp8 (scales by kv_cache_scales). Throws Error for a block size the CUDA backend does
  // not run (check_block_size), no blocks, or an FP8 cache at a head size its kernels do not
  // read, before anything is allocated, and when no CUDA device is visible.
  CudaModelRunner(const ModelWeights& weights, int num_blocks, int block_size, int max_tokens_per_step,
                  KvCacheDtype kv_dtype = KvCacheDtype::BF16);
  ~CudaModelRunner() override;

  // Steps are queued on one stream; a chained step's tokens are taken on the device from the
  // summaries of the step before (StepBatch::tokens_from_rows), so the engine can queue it
  // before reading them. The device draws the greedy rows without penalties; the other rows,
  // and the logprobs any row asks for, are drawn in collect() from their logits copied back,
  // with the host sampler, and such rows are not chained (samples_on_device).
  void submit(const StepBatch& batch) override;
  // A step whose masks come later runs its model on submit(); its sampler is queued here, behind
  // the masks' upload, so the host fills them while the GPU computes.
  void supply_masks(const StepBatch& batch) override;
  const StepOutput& collect() override;
  bool pipelines_steps() const override { return true; }
  bool samples_on_device(const RowSampling& row) const override;
  void copy_blocks(const std::vector<BlockCopy>& copies) override;  // queued on the steps' stream
  int num_blocks() const override;
  int block_size() const override;
  // With profiling on, each phase of every eager step is timed with CUDA events (no extra
  // syncs); a step replayed from a CUDA graph is timed as one phase, "decode_graph". The host
  // phases (host_prepare, host_launch, host_wait, host_finish) are timed either way.
  // With pipelined steps the GPU phases of consecutive steps follow each other back to back.
  void set_profiling(bool on);
  // Decode steps (every sequence one token) captured once per shape and replayed as CUDA
  // graphs: one launch instead of hundreds. On by default.
  void set_cuda_graphs(bool on);
  // How many step shapes the graph cache keeps, at least 2 (default kMaxCapturedShapes,
  // graph_cache.h); the least recently run beyond that are dropped (tests force a small cache).
  void set_max_graph_shapes(int shapes);
  std::map<std::string, double> phase_times_ms() const override;
  void reset_phase_times() override;

  struct Impl;  // the device state (cuda_model_runner.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace asynct
