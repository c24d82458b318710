// Sampling on the device: every option of SamplingParams (penalties, temperature, top-k, top-p,
// min-p, a seeded draw, logprobs) for each row of float32 logits, in the order the CPU reference
// sampler defines (reference/sampler.h), without moving a vocabulary-wide row to the host.
// Greedy rows without penalties or logprobs need only launch_summarize_logits (sampling.h).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/logit_summary.h"
#include "core/sampling_params.h"

namespace asynct::kernels {

struct SampleRowsArgs {
  const float* logits = nullptr;  // [rows, vocab], device; read, never written
  int rows = 0;
  int vocab = 0;
  const RowSampling* sampling = nullptr;         // [rows], device
  const PenaltyToken* penalty_tokens = nullptr;  // device; indexed by the rows' penalty ranges
  // Row r's own input token is tokens[logit_rows[r]] (device arrays): the token the step ran
  // for that row, which the penalties count although the host may not know it yet.
  const std::int32_t* tokens = nullptr;
  const std::int32_t* logit_rows = nullptr;
  LogitSummary* summaries = nullptr;      // [rows] out: token, non-finite check, logprob
  TopLogprob* top_logprobs = nullptr;     // [rows * kMaxTopLogprobs] out; null when no row asks
};

// Whether rows of this vocabulary can be sampled on the current device: it needs thread-block
// clusters (sm_90) and a row that fits the shared memory of one cluster (vocab <= 376,832).
bool device_sampling_supported(int vocab);

// How many rows' clusters fit on the device at once (cudaOccupancyMaxActiveClusters): rows
// beyond it wait for a cluster to finish.
int sample_rows_resident_clusters(int vocab);

// Throws Error for bad sizes or a device without support (device_sampling_supported).
void launch_sample_rows(const SampleRowsArgs& args, cudaStream_t stream);

}  // namespace asynct::kernels
