#include "jobs/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/step_batch.h"
#include "text/model_text.h"
#include "models/config.h"
#include "models/runner_factory.h"
#include "models/weights.h"

namespace asynct {

namespace {

constexpr int kDefaultContext = 512;
constexpr int kBlockSize = 16;  // runs on both backends (the CUDA runner takes powers of two in 16..256)

// A window: tokens [start, start + length) of the text; tokens start + 1 .. start + length - 1
// are scored.
struct Window {
  std::int64_t start = 0;
  int length = 0;
  double nll_sum = 0;  // of its length - 1 scored tokens
};

std::vector<Window> cut_windows(std::int64_t tokens, int context) {
  std::vector<Window> windows;
  for (std::int64_t start = 0; start + 1 < tokens; start += context - 1)
    windows.push_back({start, int(std::min<std::int64_t>(context, tokens - start)), 0.0});
  return windows;
}

// -log p(target) under the row's logits, in float64. Throws Error for a non-finite logit.
double negative_log_likelihood(const float* logits, int vocab, std::int32_t target, std::int64_t where) {
  double top = -INFINITY;
  for (int v = 0; v < vocab; ++v) {
    check(std::isfinite(logits[v]), "the model gave a non-finite logit (token id ", v, ") predicting text token ", where);
    top = std::max(top, double(logits[v]));
  }
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(double(logits[v]) - top);
  return top + std::log(sum) - double(logits[target]);
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace

int run_perplexity(const PerplexityOptions& o) {
  // Every check comes before the weights are loaded.
  check(have_text_support(), no_text_support_message("perplexity (a text file)"));
  check(!o.model_dir.empty(), "perplexity needs --model DIR (a checkpoint with its tokenizer.json)");
  const ModelConfig config = load_checkpoint_config(o.model_dir);
  const int model_context = config.max_position_embeddings;
  check(o.context == 0 || o.context >= 2, "--context must be at least 2 tokens (a token of context and one to score), got ",
        o.context);
  check(o.context <= model_context, "--context ", o.context, " is over the model's context of ", model_context,
        " tokens (max_position_embeddings)");
  const int context = o.context > 0 ? o.context : std::min(kDefaultContext, model_context);
  check(context >= 2, "the model's context of ", model_context, " tokens is too short to score anything");
  check(o.max_tokens >= 0, "--max-tokens must be >= 0 (0: the whole file), got ", o.max_tokens);
  check(o.max_batched_tokens >= 1, "--max-batched-tokens must be >= 1, got ", o.max_batched_tokens);
  const std::string device = resolve_device(o.device, o.cpu_reference);
  require_device(device);
  check_block_size(kBlockSize, device == "cuda" ? Backend::Cuda : Backend::Cpu);
  RunnerOptions ro{.device = device, .block_size = kBlockSize, .cuda_graphs = false, .kv_cache_dtype = o.kv_cache_dtype,
                   .quantization = o.quantization, .cpu_reference = o.cpu_reference};
  const KvCacheDtype kv_dtype = check_runner_options(ro, device);

  const std::string text = read_text_file(o.file, "--file", "score");
  const std::unique_ptr<ModelText> tokenizer = ModelText::open(o.model_dir, ChatFormat{});
  std::vector<std::int32_t> ids = tokenizer->prompt_ids(text, "--file " + o.file);
  const std::int64_t file_tokens = std::int64_t(ids.size());
  if (o.max_tokens > 0 && file_tokens > o.max_tokens) ids.resize(std::size_t(o.max_tokens));
  const std::int64_t n = std::int64_t(ids.size());
  check(n >= 2, "--file ", o.file, " has ", n, " token", n == 1 ? "" : "s", o.max_tokens > 0 ? " (--max-tokens)" : "",
        ": perplexity needs at least 2 (one of context, one to score)");
  for (std::int64_t i = 0; i < n; ++i)
    check(ids[std::size_t(i)] < config.vocab_size, "--file ", o.file, ": the tokenizer gave token id ", ids[std::size_t(i)],
          " at token ", i, ", outside the model's vocabulary [0, ", config.vocab_size, "): is ", o.model_dir,
          "/tokenizer.json this model's tokenizer?");

  std::ofstream json_file;  // opened now, so that a path that cannot be written fails before the run
  if (!o.json_path.empty()) {
    json_file.open(o.json_path);
    check(bool(json_file), "--json: cannot write ", o.json_path);
  }

  std::vector<Window> windows = cut_windows(n, context);
  // A window runs its tokens but the last (a target only): positions 0 .. context - 2.
  const int longest_run = windows.front().length - 1;
  const int num_blocks = (longest_run + kBlockSize - 1) / kBlockSize;
  const int step_tokens = std::min(o.max_batched_tokens, longest_run);

  ModelWeights weights = load_weights(o.model_dir);
  std::string backend;
  ro.num_blocks = num_blocks;
  ro.max_tokens_per_step = step_tokens;
  const std::unique_ptr<ModelRunner> runner = make_runner(std::move(weights), ro, &backend);
  std::fprintf(stderr, "asynct perplexity: %s (%s), %lld parameters, %s backend%s, KV cache in %s, %s\n",
               config.architecture_name().c_str(), o.model_dir.c_str(), static_cast<long long>(config.parameter_count()),
               backend.c_str(), weights_label(o.quantization, config).c_str(),
               kv_cache_dtype_name(kv_dtype), tokenizer->summary().c_str());
  std::fprintf(stderr, "%s: %lld tokens%s, %zu windows of up to %d tokens, steps of up to %d tokens\n", o.file.c_str(),
               static_cast<long long>(n),
               n < file_tokens ? (" (the first of " + std::to_string(file_tokens) + ")").c_str() : "", windows.size(),
               context, step_tokens);
  std::fflush(stderr);

  StepBatch batch;
  double nll_sum = 0, seconds = 0;
  std::int64_t scored = 0;
  for (std::size_t w = 0; w < windows.size(); ++w) {
    Window& window = windows[w];
    const auto t0 = std::chrono::steady_clock::now();
    const int run = window.length - 1;  // tokens through the model; token i predicts token i + 1
    for (int begin = 0; begin < run; begin += step_tokens) {
      const int end = std::min(run, begin + step_tokens);
      batch.reset(1);
      for (int i = begin; i < end; ++i) {
        batch.tokens.push_back(ids[std::size_t(window.start + i)]);
        batch.positions.push_back(i);
        batch.slot_mapping.push_back(i);  // block b of the table is cache block b
        batch.logit_rows.push_back(i - begin);
      }
      batch.cu_seqlens_q.push_back(end - begin);
      batch.kv_lens.push_back(end);
      batch.block_tables[0].clear();
      for (int b = 0; b * kBlockSize < end; ++b) batch.block_tables[0].push_back(b);
      batch.sampling.assign(std::size_t(end - begin), RowSampling{});  // greedy: the runner's cheapest row
      batch.full_logits.assign(std::size_t(end - begin), 1);
      const StepOutput& out = runner->forward(batch);
      for (int i = begin; i < end; ++i) {
        const float* logits = out.logits[std::size_t(i - begin)];
        check(logits != nullptr, "the ", backend, " runner returned no logits for a row that asked for them");
        const std::int64_t target = window.start + i + 1;
        window.nll_sum += negative_log_likelihood(logits, config.vocab_size, ids[std::size_t(target)], target);
      }
    }
    const double window_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds += window_seconds;
    nll_sum += window.nll_sum;
    scored += run;
    std::fprintf(stderr, "window %zu of %zu: %d tokens scored in %.2f s, perplexity so far %.4f\n", w + 1,
                 windows.size(), run, window_seconds, std::exp(nll_sum / double(scored)));
    std::fflush(stderr);
  }

  const double mean_nll = nll_sum / double(scored), perplexity = std::exp(mean_nll);
  const double tokens_per_second = seconds > 0 ? double(scored) / seconds : 0.0;
  std::printf("perplexity %s (mean negative log-likelihood %s nats a token)\n", fixed(perplexity, 4).c_str(),
              fixed(mean_nll, 6).c_str());
  std::printf("%lld tokens scored in %zu windows of up to %d tokens (%lld tokens of %s%s); %.2f s, %.1f tokens/s\n",
              static_cast<long long>(scored), windows.size(), context, static_cast<long long>(n), o.file.c_str(),
              n < file_tokens ? (", the first of " + std::to_string(file_tokens)).c_str() : "", seconds,
              tokens_per_second);
  std::fflush(stdout);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", o.model_dir},
                        {"file", o.file},
                        {"device", backend},
                        {"kv_cache_dtype", kv_cache_dtype_name(kv_dtype)},
                        {"weights", o.quantization == "fp8" || config.fp8_weights() ? "fp8" : "as loaded"},
                        {"file_tokens", file_tokens},
                        {"tokens", n},
                        {"context", context},
                        {"max_batched_tokens", step_tokens},
                        {"windows", windows.size()},
                        {"scored_tokens", scored},
                        {"nll_sum", nll_sum},
                        {"mean_nll", mean_nll},
                        {"perplexity", perplexity},
                        {"seconds", seconds},
                        {"tokens_per_second", tokens_per_second}};
    nlohmann::json per_window = nlohmann::json::array();
    for (const Window& w : windows)
      per_window.push_back({{"start", w.start}, {"tokens", w.length}, {"scored", w.length - 1}, {"nll_sum", w.nll_sum}});
    j["window_results"] = per_window;
    json_file << j.dump(2) << "\n";
    json_file.flush();
    check(bool(json_file), "--json: cannot write ", o.json_path);
  }
  return 0;
}

}  // namespace asynct
