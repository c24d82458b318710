#include "jobs/generate.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
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

int run_generate(const GenerateOptions& o) {
  ModelWeights weights = o.model_dir.empty()
                             ? random_weights(tiny_config(o.builtin == "qwen3" ? Architecture::Qwen3 : Architecture::AsyncT), 0)
                             : load_weights(o.model_dir);
  const ModelConfig config = weights.config;
  std::vector<std::vector<std::int32_t>> prompts;
  for (const std::string& p : o.prompts) prompts.push_back(parse_token_list(p));
  if (prompts.empty()) prompts = {{1, 17, 42, 99, 7, 3}, {5, 6, 7}};

  int needed_blocks = 0;
  for (const auto& p : prompts) needed_blocks += int((p.size() + std::size_t(o.max_tokens) + std::size_t(o.block_size) - 1) / std::size_t(o.block_size));
  const int num_blocks = o.num_blocks > 0 ? o.num_blocks : needed_blocks;
  EngineOptions engine_options;
  engine_options.max_num_batched_tokens = o.max_batched_tokens;
  engine_options.max_model_len = config.max_position_embeddings;
  engine_options.record_first_logits = !o.logits_path.empty();
  engine_options.pipeline_steps = o.pipeline;
  std::string backend;
  RunnerOptions ro;
  ro.device = o.device;
  ro.num_blocks = num_blocks;
  ro.block_size = o.block_size;
  ro.max_tokens_per_step = o.max_batched_tokens;
  ro.cuda_graphs = o.cuda_graphs;
  Engine engine(make_runner(std::move(weights), ro, &backend), config.vocab_size, engine_options);

  std::printf("asynct generate: %s (%s), %lld parameters, %s backend\n",
              config.architecture_name().c_str(), o.model_dir.empty() ? ("built-in tiny " + o.builtin).c_str() : o.model_dir.c_str(),
              static_cast<long long>(config.parameter_count()), backend.c_str());
  for (const auto& p : prompts) {
    Request r;
    r.prompt = p;
    r.max_tokens = o.max_tokens;
    r.sampling = {o.temperature, o.top_k, o.top_p, o.seed};
    r.ignore_eos = o.ignore_eos;
    r.eos_token = o.eos_token;
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
