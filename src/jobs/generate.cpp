#include "jobs/generate.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/step_batch.h"
#include "models/runner_factory.h"

namespace asynct {

std::vector<std::int32_t> parse_token_list(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string piece = text.substr(start, comma - start);
    const auto first = piece.find_first_not_of(" \t"), last = piece.find_last_not_of(" \t");
    piece = first == std::string::npos ? "" : piece.substr(first, last - first + 1);
    check(!piece.empty(), "prompt '", text, "': empty token id at character ", start);
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == piece.size() && value >= 0 && value <= 0x7fffffff, "prompt '", text, "': '", piece,
          "' is not a token id");
    ids.push_back(std::int32_t(value));
    start = comma + 1;
  }
  return ids;
}

namespace {

std::string joined(const std::vector<std::int32_t>& ids) {
  std::string s;
  for (const std::int32_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s;
}

}  // namespace

int run_generate(const GenerateOptions& o) {
  // Every limit is checked here, before the weights are loaded or the KV cache is allocated.
  const Architecture builtin_arch = o.builtin == "qwen3" ? Architecture::Qwen3 : Architecture::AsyncT;
  const ModelConfig config = o.model_dir.empty() ? tiny_config(builtin_arch) : load_checkpoint_config(o.model_dir);
  std::vector<std::vector<std::int32_t>> prompts;
  for (const std::string& p : o.prompts) prompts.push_back(parse_token_list(p));
  if (prompts.empty()) prompts = {{1, 17, 42, 99, 7, 3}, {5, 6, 7}};
  check(o.max_tokens >= 1, "--max-tokens must be >= 1, got ", o.max_tokens);
  check(o.num_blocks >= 0, "--num-blocks must be >= 0, got ", o.num_blocks);
  check(o.max_cache_mib >= 1, "--max-cache-mib must be >= 1, got ", o.max_cache_mib);
  const std::string device = resolve_device(o.device);
  require_device(device);
  check_block_size(o.block_size, device == "cuda" ? Backend::Cuda : Backend::Cpu);  // the runner's own rule

  // Each request within the model's context; 64-bit counts throughout (2048 requests of a
  // million tokens in one-token blocks are 2^31 blocks).
  const std::int64_t context = config.max_position_embeddings;
  std::int64_t needed_blocks = 0, largest_blocks = 0;
  std::size_t largest = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    for (std::size_t t = 0; t < prompts[i].size(); ++t)
      check(prompts[i][t] < config.vocab_size, "request ", i, ": token id ", prompts[i][t], " at prompt position ", t,
            " is outside the vocabulary [0, ", config.vocab_size, ")");
    const std::int64_t tokens = std::int64_t(prompts[i].size()) + o.max_tokens;
    check(tokens <= context, "request ", i, ": prompt (", prompts[i].size(), " tokens) + --max-tokens (", o.max_tokens,
          ") = ", tokens, " tokens is over the model's context of ", context, " tokens (max_position_embeddings)");
    const std::int64_t blocks = (tokens + o.block_size - 1) / o.block_size;
    needed_blocks += blocks;
    if (blocks > largest_blocks) largest_blocks = blocks, largest = i;
  }

  std::vector<std::int32_t> eos = config.eos_token_ids;
  if (!o.eos_tokens.empty()) eos.assign(o.eos_tokens.begin(), o.eos_tokens.end());
  if (o.ignore_eos) eos.clear();
  for (const std::int32_t id : eos)
    check(id >= 0 && id < config.vocab_size, "--eos ", id, " is outside the vocabulary [0, ", config.vocab_size, ")");

  // The KV cache: --num-blocks, or enough blocks for every request at once; either way no more
  // than --max-cache-mib. A smaller cache than the requests need together is fine (they take
  // turns: the engine preempts and recomputes), one smaller than a single request is not.
  const std::int64_t block_bytes = kv_cache_bytes_per_token(config, device) * o.block_size;
  const std::int64_t cap_blocks =
      std::min<std::int64_t>(o.max_cache_mib * (std::int64_t(1) << 20) / block_bytes, std::numeric_limits<int>::max());
  const auto mib = [&](std::int64_t blocks) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", double(blocks) * double(block_bytes) / double(1 << 20));
    return std::string(text);
  };
  check(cap_blocks >= 1, "--max-cache-mib ", o.max_cache_mib, " is less than one KV block of ", o.block_size,
        " tokens (", block_bytes, " bytes on the ", device, " backend)");
  check(o.num_blocks <= cap_blocks, "--num-blocks ", o.num_blocks, " of ", o.block_size, " tokens is ",
        mib(o.num_blocks), " MiB of KV cache on the ", device, " backend, over --max-cache-mib ", o.max_cache_mib,
        " (", cap_blocks, " blocks)");
  const int num_blocks = int(o.num_blocks > 0 ? o.num_blocks : std::min(needed_blocks, cap_blocks));
  const std::string limit = o.num_blocks > 0 ? "--num-blocks" : "the most --max-cache-mib " + std::to_string(o.max_cache_mib) + " allows";
  check(largest_blocks <= num_blocks, "request ", largest, ": prompt (", prompts[largest].size(),
        " tokens) + --max-tokens (", o.max_tokens, ") needs ", largest_blocks, " KV blocks of ", o.block_size,
        " tokens (", mib(largest_blocks), " MiB) but the cache has ", num_blocks, " (", limit, ")");

  ModelWeights weights = o.model_dir.empty() ? random_weights(config, 0) : load_weights(o.model_dir);
  EngineOptions engine_options;
  engine_options.max_num_batched_tokens = o.max_batched_tokens;
  engine_options.max_model_len = config.max_position_embeddings;
  engine_options.record_first_logits = !o.logits_path.empty();
  engine_options.pipeline_steps = o.pipeline;
  std::string backend;
  RunnerOptions ro;
  ro.device = device;
  ro.num_blocks = num_blocks;
  ro.block_size = o.block_size;
  ro.max_tokens_per_step = o.max_batched_tokens;
  ro.cuda_graphs = o.cuda_graphs;
  Engine engine(make_runner(std::move(weights), ro, &backend), config.vocab_size, engine_options);

  std::printf("asynct generate: %s (%s), %lld parameters, %s backend, KV cache %d blocks of %d tokens (%s MiB), %s\n",
              config.architecture_name().c_str(), o.model_dir.empty() ? ("built-in tiny " + o.builtin).c_str() : o.model_dir.c_str(),
              static_cast<long long>(config.parameter_count()), backend.c_str(), num_blocks, o.block_size,
              mib(num_blocks).c_str(), eos.empty() ? "no end-of-sequence token" : ("end of sequence at " + joined(eos)).c_str());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = o.max_tokens;
    // Each request its own stream: identical prompts draw different samples.
    r.sampling = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .seed = o.seed + std::uint64_t(i)};
    r.eos_token_ids = eos;
    engine.add_request(r);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RequestOutput> outputs = engine.run_to_completion();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  for (std::size_t i = 0; i < outputs.size(); ++i) {
    std::printf("request %zu: prompt %zu tokens -> ", i, prompts[i].size());
    for (std::size_t t = 0; t < outputs[i].tokens.size(); ++t)
      std::printf("%s%d", t ? "," : "", outputs[i].tokens[t]);
    std::printf("  (%s)\n", outputs[i].finish_reason.c_str());
  }
  if (!o.logits_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const RequestOutput& out : outputs) j.push_back({{"tokens", out.tokens}, {"first_logits", out.first_logits}});
    std::ofstream f(o.logits_path);
    check(bool(f), "cannot write ", o.logits_path);
    f << j.dump() << "\n";
  }
  const EngineStats& s = engine.stats();
  std::printf("%lld steps, %lld prefill + %lld decode tokens in %.3f s (%.1f tokens/s), %lld preemptions\n",
              static_cast<long long>(s.steps), static_cast<long long>(s.prefill_tokens),
              static_cast<long long>(s.decode_tokens), seconds,
              double(s.prefill_tokens + s.decode_tokens) / seconds, static_cast<long long>(s.preemptions));
  return 0;
}

}  // namespace asynct
