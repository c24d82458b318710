// Greedy sampling on the device: for each row of float32 logits, the argmax (lowest id on ties)
// and the lowest id whose logit is not finite — what summarize_logits (engine/sampler.h)
// computes on the host.
// With it a greedy step sends back a few bytes per sequence instead of the vocabulary-wide row.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/logit_summary.h"

namespace asynct::kernels {

// logits [rows, vocab] contiguous, device; out [rows], device.
void launch_summarize_logits(const float* logits, int rows, int vocab, LogitSummary* out, cudaStream_t stream);

// tokens[i] = summaries[rows[i]].token, i < count: a step's token ids taken from the step
// before it without a trip through the host (pipelined decode steps). rows and tokens are
// device arrays; every rows[i] must be below `summary_rows` (checked on the device: an id
// outside it, or a token id outside [0, vocab), becomes 0, never an out-of-bounds read; the
// engine rejects the step before through its summary).
void launch_greedy_tokens(const LogitSummary* summaries, int summary_rows, const std::int32_t* rows, int count,
                          int vocab, std::int32_t* tokens, cudaStream_t stream);

}  // namespace asynct::kernels
