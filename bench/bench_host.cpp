// The host's hot spots, one thread against all of the machine's threads:
//  * sampling at a 152K vocabulary (Qwen3's), 32 rows as in a decode step at 32 sequences, ms
//    per row for common parameter sets (the CPU runner samples the rows of a step in parallel).
//    Logits are N(0, 3^2), flatter than a trained model's, so top-p heads are long: a worst
//    case rather than a typical one;
//  * the CPU backend's linear (float64 sums) at a 1.7B MLP shape, 8 rows.
//
// Usage: build/<dir>/bench/asynct_bench_host
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "reference/layers.h"
#include "engine/sampler.h"

int main() {
  using namespace asynct;
  constexpr std::size_t kVocab = 151936, kRows = 32;
  std::vector<std::vector<float>> rows(kRows, std::vector<float>(kVocab));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& row : rows)
    for (float& x : row) x = normal(rng);
  // Each case as a runner samples a row (engine/sampler.h: sample_logit_row), the penalised
  // ones with a history of 512 distinct tokens (a long prompt and output).
  std::vector<PenaltyToken> history;
  for (int i = 0; i < 512; ++i) history.push_back({(i * 7919) % int(kVocab), i % 3, i % 2});
  const SamplingParams penalties{.repetition_penalty = 1.1f, .presence_penalty = 0.5f, .frequency_penalty = 0.5f};
  const auto with = [](SamplingParams p, const SamplingParams& more) {
    p.repetition_penalty = more.repetition_penalty;
    p.presence_penalty = more.presence_penalty;
    p.frequency_penalty = more.frequency_penalty;
    p.logprobs = more.logprobs;
    return p;
  };
  const SamplingParams cases[] = {
      {.temperature = 0.0f},
      {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .seed = 1},
      with({.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .seed = 1}, penalties),
      {.temperature = 0.7f, .top_p = 0.9f, .seed = 1},
      with({.temperature = 0.7f, .top_p = 0.9f, .seed = 1}, penalties),
      {.temperature = 1.0f, .top_p = 0.95f, .seed = 1},
      {.temperature = 0.7f, .top_p = 0.999f, .seed = 1},
      {.temperature = 1.0f, .seed = 1},
      {.temperature = 1.0f, .min_p = 0.05f, .seed = 1},
      with({.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = 1}, {.logprobs = 5}),
  };
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  std::printf("host sampling, vocabulary %zu, %zu rows; ms per row (median of 5)\n", kVocab, kRows);
  std::printf("%11s %6s %6s %6s %9s %8s %10s %12s\n", "temperature", "top_k", "top_p", "min_p", "penalties", "logprobs",
              "1 thread", "threads");
  for (const SamplingParams& p : cases) {
    double ms[2];
    for (int t = 0; t < 2; ++t) {
      std::vector<double> runs;
      for (int rep = 0; rep < 5; ++rep) {
        const auto start = std::chrono::steady_clock::now();
        parallel_for(
            kRows,
            [&](std::size_t i) {
              const RowSampling row{p, i, 0, 0, 1};
              std::vector<TopLogprob> top;
              sample_logit_row(rows[i].data(), kVocab, row, {history, std::int32_t(i), true}, &top);
            },
            t == 0 ? 1 : hardware);
        runs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
      std::sort(runs.begin(), runs.end());
      ms[t] = runs[2] / kRows;
    }
    std::printf("%11.2f %6d %6.3f %6.3f %9s %8d %10.3f %8.3f (%u)\n", p.temperature, p.top_k, p.top_p, p.min_p,
                p.has_penalties() ? "yes" : "no", p.logprobs, ms[0], ms[1], hardware);
  }

  // linear picks its own thread count; ASYNCT_THREADS=1 pins it to one.
  Tensor x = Tensor::empty(DType::F32, {8, 2048}), w = Tensor::empty(DType::F32, {6144, 2048});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = normal(rng);
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = normal(rng) * 0.02f;
  const auto median_ms = [](const std::function<void()>& f) {
    std::vector<double> runs;
    for (int rep = 0; rep < 5; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      f();
      runs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(runs.begin(), runs.end());
    return runs[2];
  };
  const double threaded = median_ms([&] { linear(x, w); });
  setenv("ASYNCT_THREADS", "1", 1);
  const double single = median_ms([&] { linear(x, w); });
  unsetenv("ASYNCT_THREADS");
  std::printf("\nCPU linear, [8 x 2048] by [6144 x 2048]^T: %.1f ms on 1 thread, %.1f ms on %u\n", single, threaded,
              hardware);
}
