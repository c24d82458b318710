// What the engine hands a model for one step, and the interface of the backends that run it
// (the CPU reference backend; the CUDA backend).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

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

  int num_seqs() const { return int(kv_lens.size()); }
  int num_tokens() const { return int(tokens.size()); }
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the model on the batch, writing the new tokens' K/V into the cache; returns float32
  // logits [logit_rows.size(), vocab].
  virtual Tensor forward(const StepBatch& batch) = 0;
  virtual int num_blocks() const = 0;
  virtual int block_size() const = 0;
  // Time spent so far per phase of the forward pass (e.g. "gemm", "attention", "norms"), in
  // milliseconds, when the backend measures it; empty otherwise.
  virtual std::map<std::string, double> phase_times_ms() const { return {}; }
};

}  // namespace asynct
