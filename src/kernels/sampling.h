// Greedy sampling on the device: for each row of float32 logits, the argmax (lowest id on ties)
// and the lowest id whose logit is not finite — what summarize_logits computes on the host.
// With it a greedy step sends back a few bytes per sequence instead of the vocabulary-wide row.
#pragma once

#include <cuda_runtime_api.h>

#include "reference/sampling.h"  // LogitSummary

namespace asynct::kernels {

// logits [rows, vocab] contiguous, device; out [rows], device.
void launch_summarize_logits(const float* logits, int rows, int vocab, LogitSummary* out, cudaStream_t stream);

}  // namespace asynct::kernels
