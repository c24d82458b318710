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

  int num_seqs() const { return int(kv_lens.size()); }
  int num_tokens() const { return int(tokens.size()); }
};

// What a step gives back for each row of StepBatch::logit_rows. It belongs to the runner and
// stays valid (logits included) until the next forward().
struct StepOutput {
  std::vector<LogitSummary> summaries;  // [rows] greedy token and first non-finite logit
  std::vector<const float*> logits;     // [rows] float32 [vocab] where full_logits asked, else null
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the model on the batch, writing the new tokens' K/V into the cache.
  virtual const StepOutput& forward(const StepBatch& batch) = 0;
  virtual int num_blocks() const = 0;
  virtual int block_size() const = 0;
  // Time spent so far per phase of a step, in milliseconds, when the backend measures it; empty
  // otherwise. GPU phases (e.g. "gemm", "attention") are device time between events; phases
  // named "host_*" are host wall-clock time inside forward().
  virtual std::map<std::string, double> phase_times_ms() const { return {}; }
  virtual void reset_phase_times() {}
};

}  // namespace asynct
