// Sampling on the device: every option of SamplingParams, a row's logit bias and its allowed-token
// mask (penalties, temperature, top-k, top-p, min-p, a seeded draw, logprobs) for each row of
// float32 logits, in the order the CPU reference sampler defines (engine/sampler.h), without
// moving a vocabulary-wide row to the host.
// Greedy rows without a bias, penalties or logprobs need only launch_summarize_logits (sampling.h).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/logit_summary.h"
#include "core/sampling_params.h"

namespace asynct::kernels {

// Where a row's time goes (benches): block 0's clock64() at the end of each phase, in order.
enum class SampleRowsPhase : int {
  kStart,          // the kernel began (after the previous kernel's results are visible)
  kLoaded,         // the row's slices are in shared memory
  kStatsPass,      // block 0's pass over its slice done (penalties applied; logprobs < 0)
  kStats,          // maxima reduced over the cluster
  kCandidates,     // the small top-k path: every block's candidates in block 0
  kSelected,       // ... and block 0 has the k best in order
  kHistogramPass,  // block 0's histogram of its slice done (sampled rows)
  kHistogramMet,   // ... and every block's (the cluster barrier after the pass)
  kHistogramScan,  // the blocks' ranges' totals scanned over the cluster
  kHistogram,      // the histogram merged into block 0
  kHeadChosen,     // every block knows the head's last bin
  kHeadGathered,   // the head's tokens are in block 0
  kHeadDrawn,      // block 0 has the token from the head
  kDrawn,          // the token is known (however it was found)
  kEnd,            // the cluster's last barrier passed
};
constexpr int kSampleRowsPhases = 15;

struct SampleRowsArgs {
  const float* logits = nullptr;  // [rows, vocab], device; read, never written
  int rows = 0;
  int vocab = 0;
  const RowSampling* sampling = nullptr;         // [rows], device
  const PenaltyToken* penalty_tokens = nullptr;  // device; indexed by the rows' penalty ranges
  const LogitBias* logit_bias = nullptr;         // device; indexed by the rows' bias ranges
  // device; row r's allowed-token bitmask ((vocab + 31) / 32 words, bit t % 32 of word t / 32)
  // starts at word sampling[r].mask_offset when that is >= 0
  const std::uint32_t* token_masks = nullptr;
  // Row r's own input token is tokens[logit_rows[r]] (device arrays): the token the step ran
  // for that row, which the penalties count although the host may not know it yet.
  const std::int32_t* tokens = nullptr;
  const std::int32_t* logit_rows = nullptr;
  LogitSummary* summaries = nullptr;      // [rows] out: token, non-finite check, logprob
  TopLogprob* top_logprobs = nullptr;     // [rows * kMaxTopLogprobs] out; null when no row asks
  // Blocks a row (7 or 8); 0: sample_rows_layout's choice for the rows. Tests and benches set it.
  int cluster_blocks = 0;
  // Rows with 1 <= top_k <= 64 take the k best tokens without the histogram (sample_rows.cu,
  // step 2: 32 rows of 151,936 with top-k 50 + top-p 0.9 + penalties 24.2 us against 33.8 on
  // the H200); false sends them through the histogram, for tests and benches to compare. The
  // two draw the same tokens.
  bool small_top_k = true;
  // [rows * kSampleRowsPhases] out, or null: each row's phase clocks (SampleRowsPhase); a phase
  // the row skips keeps what was there.
  long long* phase_clocks = nullptr;
};

// Whether rows of this vocabulary can be sampled on the current device: it needs thread-block
// clusters (sm_90) and a row that fits the shared memory of one cluster (vocab <= 376,832).
bool device_sampling_supported(int vocab);

// How a launch spreads its rows: a cluster of 8 blocks a row, or of 7 when that leaves fewer
// rows waiting for a cluster to finish, and how many such clusters fit the device at once.
struct SampleRowsLayout {
  int cluster_blocks = 8;
  int resident_clusters = 0;
};
SampleRowsLayout sample_rows_layout(int rows, int vocab);

// Throws Error for bad sizes or a device without support (device_sampling_supported).
void launch_sample_rows(const SampleRowsArgs& args, cudaStream_t stream);

}  // namespace asynct::kernels
