// The interface of the backends that run the engine's steps (the CPU reference backend; the
// CUDA backend) and what a step gives back. The batch a step runs is in engine/step_batch.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/logit_summary.h"
#include "core/tensor.h"
#include "engine/step_batch.h"

namespace asynct {

// What a step gives back for each row of StepBatch::logit_rows. It belongs to the runner and
// stays valid (logits included) until the next collect() (or forward()).
struct StepOutput {
  std::vector<LogitSummary> summaries;  // [rows] the row's token (sampled by the runner), first non-finite logit, logprob
  std::vector<const float*> logits;     // [rows] float32 [vocab] where full_logits asked, else null
  std::vector<std::vector<TopLogprob>> top_logprobs;  // [rows] filled for rows with params.logprobs > 0
};

// A KV-cache block's contents copied to another block, in every layer (a fork's own copy of
// the partial block it shares with its parent).
struct BlockCopy {
  int from = 0, to = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the model on the batch, writing the new tokens' K/V into the cache.
  const StepOutput& forward(const StepBatch& batch) {
    submit(batch);
    if (batch.masks_later) supply_masks(batch);
    return collect();
  }
  // forward() in two halves: submit() queues a step, collect() waits for the oldest step queued
  // and returns its output. At most two steps are queued, and a second only when
  // pipelines_steps(): the GPU then runs the next step while the host reads this one's tokens.
  virtual void submit(const StepBatch& batch) = 0;
  virtual const StepOutput& collect() = 0;
  // A batch with masks_later is submitted before its constrained rows' masks are known (they
  // follow the tokens of the step before, or take host time the step's computation can hide):
  // the runner computes the step meanwhile and samples it once supply_masks() hands it the same
  // batch with token_masks filled. That comes before the next submit() and before collect()
  // reaches the step.
  virtual void supply_masks(const StepBatch& batch) = 0;
  // Whether a second step may be submitted before the first is collected, and batches may take
  // their tokens from the step before (StepBatch::tokens_from_rows).
  virtual bool pipelines_steps() const { return false; }
  // Whether the runner draws the token of a row sampled this way where the step runs, so that
  // a step queued behind may take it from there (tokens_from_rows). The engine queues a step
  // ahead only when every row of the step before is. The runner samples every row either way.
  virtual bool samples_on_device(const RowSampling& row) const {
    (void)row;
    return true;
  }
  // Copies blocks in the cache, after the steps submitted so far and before any submitted later.
  virtual void copy_blocks(const std::vector<BlockCopy>& copies) = 0;
  virtual int num_blocks() const = 0;
  virtual int block_size() const = 0;
  // Time spent so far per phase of a step, in milliseconds, when the backend measures it; empty
  // otherwise. GPU phases (e.g. "gemm", "attention") are device time between events; phases
  // named "host_*" are host wall-clock time inside submit() and collect().
  virtual std::map<std::string, double> phase_times_ms() const { return {}; }
  virtual void reset_phase_times() {}
};

}  // namespace asynct
