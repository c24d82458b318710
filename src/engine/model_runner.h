// What the engine hands a model for one step, and the interface of the backends that run it
// (the CPU reference backend; the CUDA backend).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "reference/sampling.h"  // LogitSummary

namespace asynct {

// One step's batch, all sequences' new tokens flattened in sequence order.
struct StepBatch {
  std::vector<std::int32_t> tokens;      // [T] token ids
  std::vector<std::int64_t> positions;   // [T] absolute positions
  std::vector<int> cu_seqlens_q;         // [S + 1]
  std::vector<int> kv_lens;              // [S] tokens in the cache after this step
  std::vector<std::vector<int>> block_tables;  // [S] physical blocks of each sequence
  std::vector<std::int64_t> slot_mapping;      // [T] cache slot of each new token
  std::vector<int> logit_rows;           // flattened rows whose next-token logits are wanted
  // [logit_rows.size()] non-zero where the engine reads that row's full logits (sampling with
  // a temperature, or recording them); every other row only needs its greedy token, which a
  // backend can find without moving the vocabulary-wide row anywhere.
  std::vector<std::uint8_t> full_logits;
  // Empty, or [T]: token i is the greedy token of row tokens_from_rows[i] of the step submitted
  // just before this one, found by the runner where that step ran (`tokens` then holds
  // placeholders). This is how a step is queued before the host has read the tokens it
  // continues from (ModelRunner::pipelines_steps).
  std::vector<int> tokens_from_rows;

  int num_seqs() const { return int(kv_lens.size()); }
  int num_tokens() const { return int(tokens.size()); }
  // Empties it for `seqs` sequences (one block table each), keeping every vector's capacity.
  void reset(std::size_t seqs) {
    tokens.clear();
    positions.clear();
    slot_mapping.clear();
    kv_lens.clear();
    logit_rows.clear();
    full_logits.clear();
    tokens_from_rows.clear();
    cu_seqlens_q.assign(1, 0);
    block_tables.resize(seqs);
  }
};

// What a step gives back for each row of StepBatch::logit_rows. It belongs to the runner and
// stays valid (logits included) until the next collect() (or forward()).
struct StepOutput {
  std::vector<LogitSummary> summaries;  // [rows] greedy token and first non-finite logit
  std::vector<const float*> logits;     // [rows] float32 [vocab] where full_logits asked, else null
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the model on the batch, writing the new tokens' K/V into the cache.
  const StepOutput& forward(const StepBatch& batch) {
    submit(batch);
    return collect();
  }
  // forward() in two halves: submit() queues a step, collect() waits for the oldest step queued
  // and returns its output. At most two steps are queued, and a second only when
  // pipelines_steps(): the GPU then runs the next step while the host reads this one's tokens.
  virtual void submit(const StepBatch& batch) = 0;
  virtual const StepOutput& collect() = 0;
  // Whether a second step may be submitted before the first is collected, and batches may take
  // their tokens from the step before (StepBatch::tokens_from_rows).
  virtual bool pipelines_steps() const { return false; }
  virtual int num_blocks() const = 0;
  virtual int block_size() const = 0;
  // Time spent so far per phase of a step, in milliseconds, when the backend measures it; empty
  // otherwise. GPU phases (e.g. "gemm", "attention") are device time between events; phases
  // named "host_*" are host wall-clock time inside submit() and collect().
  virtual std::map<std::string, double> phase_times_ms() const { return {}; }
  virtual void reset_phase_times() {}
};

}  // namespace asynct
