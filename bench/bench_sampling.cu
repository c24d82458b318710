// The device sampler's time per launch, at a decode step's shape: 32 rows of Qwen3's 151,936-token
// vocabulary (19.4 MB of float32 logits), against the greedy summary (launch_summarize_logits,
// what a greedy step runs) and against the time to read the logits once at the copy ceiling.
// Rows are N(0, sigma^2) logits (sigma 2.5 unless given: a trained model's spread; 0.3 a flat
// row; 45 a peaked one, like the random 1.7B model's); penalised rows carry 256 entries (a 256-token context).
// Prints one line per configuration: microseconds per launch, median of 7 timings of 50 launches
// replayed from a CUDA graph.
// Run: build/<dir>/bench/asynct_bench_sampling [rows] [vocab] [sigma]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/cuda_array.h"
#include "kernels/common/cuda_check.h"
#include "kernels/sampling/sample_rows.h"
#include "kernels/sampling/sampling.h"

using namespace asynct;

namespace {

template <typename Issue>
float median_us(cudaStream_t stream, Issue issue) {
  constexpr int kPerGraph = 50;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  issue();
  ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream));
  ASYNCT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kPerGraph; ++i) issue();
  ASYNCT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASYNCT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  ASYNCT_CUDA_CHECK(cudaEventCreate(&start));
  ASYNCT_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int run = 0; run < 7; ++run) {
    ASYNCT_CUDA_CHECK(cudaEventRecord(start, stream));
    ASYNCT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ASYNCT_CUDA_CHECK(cudaEventRecord(stop, stream));
    ASYNCT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    ASYNCT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0f / kPerGraph);
  }
  std::sort(times.begin(), times.end());
  ASYNCT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ASYNCT_CUDA_CHECK(cudaGraphDestroy(graph));
  return times[times.size() / 2];
}

// One more launch of `a` with the phase clocks on: the median over the rows of each phase's
// time (block 0's clock, at the peak clock rate), from the end of the one before it.
void print_phases(kernels::SampleRowsArgs a, cudaStream_t stream) {
  const std::size_t slots = std::size_t(a.rows) * kernels::kSampleRowsPhases;
  kernels::DeviceArray<long long> clocks(slots);
  ASYNCT_CUDA_CHECK(cudaMemsetAsync(clocks.get(), 0xFF, slots * sizeof(long long), stream));
  a.phase_clocks = clocks.get();
  kernels::launch_sample_rows(a, stream);
  std::vector<long long> host(slots);
  ASYNCT_CUDA_CHECK(cudaMemcpyAsync(host.data(), clocks.get(), slots * sizeof(long long), cudaMemcpyDeviceToHost, stream));
  ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream));
  int device = 0, khz = 0;
  ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
  ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  const char* names[kernels::kSampleRowsPhases] = {"start", "load", "stats pass", "stats reduced", "candidates gathered",
                                                    "candidates selected", "histogram pass", "histogram met",
                                                    "histogram scanned", "histogram merged", "head chosen",
                                                    "head gathered", "head drawn", "drawn", "end"};
  std::printf("    phases (median over rows, us):");
  for (int k = 1; k < kernels::kSampleRowsPhases; ++k) {
    std::vector<double> us;
    for (int r = 0; r < a.rows; ++r) {
      const long long* row = host.data() + std::size_t(r) * kernels::kSampleRowsPhases;
      int before = k - 1;
      while (before > 0 && row[before] < 0) --before;
      if (row[k] >= 0 && row[before] >= 0 && row[k] >= row[before]) us.push_back(double(row[k] - row[before]) * 1e3 / double(khz));
    }
    if (us.empty()) continue;
    std::sort(us.begin(), us.end());
    std::printf(" %s %.1f,", names[k], us[us.size() / 2]);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 32, vocab = argc > 2 ? std::atoi(argv[2]) : 151936;
  const float sigma = argc > 3 ? float(std::atof(argv[3])) : 2.5f;
  if (rows < 1 || vocab < 1 || !(sigma > 0.0f)) {
    std::fprintf(stderr, "usage: %s [rows >= 1] [vocab >= 1] [sigma > 0]\n", argv[0]);
    return 2;
  }
  if (!kernels::device_sampling_supported(vocab)) {
    std::fprintf(stderr, "device sampling is not supported here (needs sm_90)\n");
    return 1;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> host(std::size_t(rows) * std::size_t(vocab));
  for (float& v : host) v = normal(rng);
  kernels::DeviceArray<float> logits(host.size());
  ASYNCT_CUDA_CHECK(cudaMemcpy(logits.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<PenaltyToken> entries;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < 256; ++j) entries.push_back({int(rng() % unsigned(vocab)), int(j % 3), j % 2});
  kernels::DeviceArray<PenaltyToken> d_entries(entries.size());
  ASYNCT_CUDA_CHECK(cudaMemcpy(d_entries.get(), entries.data(), entries.size() * sizeof(PenaltyToken), cudaMemcpyHostToDevice));
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows)), logit_rows(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) tokens[std::size_t(r)] = r, logit_rows[std::size_t(r)] = r;
  kernels::DeviceArray<std::int32_t> d_tokens(tokens.size()), d_rows(logit_rows.size());
  ASYNCT_CUDA_CHECK(cudaMemcpy(d_tokens.get(), tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
  ASYNCT_CUDA_CHECK(cudaMemcpy(d_rows.get(), logit_rows.data(), logit_rows.size() * 4, cudaMemcpyHostToDevice));
  kernels::DeviceArray<RowSampling> d_sampling{std::size_t(rows)};
  kernels::DeviceArray<LogitSummary> summaries{std::size_t(rows)};
  kernels::DeviceArray<TopLogprob> top{std::size_t(rows) * kMaxTopLogprobs};
  kernels::DeviceArray<float> copy(host.size());
  cudaStream_t stream;
  ASYNCT_CUDA_CHECK(cudaStreamCreate(&stream));

  const float read_us = median_us(stream, [&] {
    ASYNCT_CUDA_CHECK(cudaMemcpyAsync(copy.get(), logits.get(), host.size() * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }) / 2.0f;  // a copy reads and writes
  const float greedy_us = median_us(stream, [&] { kernels::launch_summarize_logits(logits.get(), rows, vocab, summaries.get(), stream); });
  std::printf("device sampling, %d rows x %d vocabulary (%.1f MB float32), logits N(0, %.2g^2)\n", rows, vocab, double(host.size()) * 4 / 1e6, double(sigma));
  const kernels::SampleRowsLayout layout = kernels::sample_rows_layout(rows, vocab);
  std::printf("  %d-block clusters a row, %d resident at once (8-block: %d)\n", layout.cluster_blocks, layout.resident_clusters,
              kernels::sample_rows_layout(1, vocab).resident_clusters);
  std::printf("  %-44s %8.1f us\n", "read once at the copy ceiling (copy / 2)", double(read_us));
  std::printf("  %-44s %8.1f us\n", "greedy summary (launch_summarize_logits)", double(greedy_us));

  struct Config {
    const char* name;
    float temperature;
    int top_k;
    float top_p, min_p;
    bool penalties;
    int logprobs;
    bool histogram = false;  // top-k <= 64 through the histogram (SampleRowsArgs::small_top_k off)
    bool phases = false;     // print where a row's time goes
  };
  const Config configs[] = {
      {"greedy + penalties", 0.0f, 0, 1.0f, 0.0f, true, -1},
      {"temperature 1", 1.0f, 0, 1.0f, 0.0f, false, -1},
      {"top-k 50", 1.0f, 50, 1.0f, 0.0f, false, -1},
      {"top-p 0.9", 1.0f, 0, 0.9f, 0.0f, false, -1},
      {"min-p 0.1", 1.0f, 0, 1.0f, 0.1f, false, -1},
      {"top-k 50 + top-p 0.9 + penalties", 0.8f, 50, 0.9f, 0.0f, true, -1, false, true},
      {"top-k 50 + top-p 0.9 + penalties, histogram", 0.8f, 50, 0.9f, 0.0f, true, -1, true, true},
      {"top-k 50 + top-p 0.9 + penalties + logprobs 20", 0.8f, 50, 0.9f, 0.0f, true, 20},
  };
  // Each config in the launch's own layout; the one that prints its phases first also in the other cluster size.
  const int other_blocks = layout.cluster_blocks == 8 ? 7 : 8;
  for (std::size_t ci = 0; ci < std::size(configs) + 1; ++ci) {
    const Config& c = configs[ci < std::size(configs) ? ci : 5];
    std::vector<RowSampling> sampling(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      RowSampling& s = sampling[std::size_t(r)];
      s.params.temperature = c.temperature;
      s.params.top_k = c.top_k;
      s.params.top_p = c.top_p;
      s.params.min_p = c.min_p;
      s.params.seed = std::uint64_t(r);
      s.params.logprobs = c.logprobs;
      if (c.penalties) {
        s.params.repetition_penalty = 1.1f;
        s.params.presence_penalty = 0.3f;
        s.params.frequency_penalty = 0.2f;
        s.penalty_begin = r * 256;
        s.penalty_end = (r + 1) * 256;
        s.newest_is_output = 1;
      }
      s.step = 5;
    }
    ASYNCT_CUDA_CHECK(cudaMemcpy(d_sampling.get(), sampling.data(), sampling.size() * sizeof(RowSampling), cudaMemcpyHostToDevice));
    kernels::SampleRowsArgs a;
    a.logits = logits.get();
    a.rows = rows;
    a.vocab = vocab;
    a.sampling = d_sampling.get();
    a.penalty_tokens = d_entries.get();
    a.tokens = d_tokens.get();
    a.logit_rows = d_rows.get();
    a.summaries = summaries.get();
    a.top_logprobs = top.get();
    a.small_top_k = !c.histogram;
    if (ci == std::size(configs)) a.cluster_blocks = other_blocks;
    const float us = median_us(stream, [&] { kernels::launch_sample_rows(a, stream); });
    const std::string name = ci == std::size(configs) ? std::string(c.name) + ", " + std::to_string(other_blocks) + "-block clusters" : c.name;
    std::printf("  %-44s %8.1f us\n", name.c_str(), double(us));
    if (c.phases && ci < std::size(configs)) print_phases(a, stream);
  }
  return 0;
}
