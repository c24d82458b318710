#include "jobs/generate.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/step_batch.h"
#include "jobs/generate_output.h"
#include "text/model_text.h"
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

// The text prompts' tokenizer, or null for token-id prompts.
std::unique_ptr<ModelText> open_text(const GenerateOptions& o) {
  if (o.prompts.empty()) return nullptr;
  check(!o.model_dir.empty(), "a text prompt (--prompt) needs --model DIR with the model's tokenizer.json; the built-in ",
        o.builtin, " model has no tokenizer (--prompt-ids takes token ids)");
  ChatFormat chat;
  chat.enabled = o.chat;
  chat.system = o.system;
  chat.thinking = o.thinking;
  return ModelText::open(o.model_dir, chat);
}

std::vector<std::vector<std::int32_t>> prompt_tokens(const GenerateOptions& o, const ModelText* text,
                                                     const ModelConfig& config) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (const std::string& p : o.prompt_ids) prompts.push_back(parse_token_list(p));
  for (std::size_t i = 0; i < o.prompts.size(); ++i) {
    const std::string what = "--prompt " + std::to_string(i);
    prompts.push_back(text->prompt_ids(o.prompts[i], what));
    check(!prompts.back().empty(), what, " is empty: it has no tokens");
    for (const std::int32_t id : prompts.back())
      check(id < config.vocab_size, what, ": the tokenizer gave token id ", id, ", outside the model's vocabulary [0, ",
            config.vocab_size, "): is ", o.model_dir, "/tokenizer.json this model's tokenizer?");
  }
  if (prompts.empty()) prompts = {{1, 17, 42, 99, 7, 3}, {5, 6, 7}};
  return prompts;
}

SamplingParams sampling_for(const GenerateOptions& o, std::size_t request) {
  SamplingParams p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.repetition_penalty = o.repetition_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = o.seed + std::uint64_t(request);  // each request its own stream: identical prompts draw differently
  p.logprobs = o.logprobs;
  return p;
}

void write(std::FILE* to, const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), to);
  std::fflush(to);
}

}  // namespace

int run_generate(const GenerateOptions& o) {
  // Every limit is checked here, before the weights are loaded or the KV cache is allocated.
  const Architecture builtin_arch = o.builtin == "qwen3" ? Architecture::Qwen3 : Architecture::AsyncT;
  check(o.prompts.empty() || o.prompt_ids.empty(), "--prompt (text) and --prompt-ids (token ids) cannot be mixed");
  check(o.stop.empty() || !o.prompts.empty(), "--stop needs text prompts (--prompt): stop strings are matched on the text");
  check(!o.chat || !o.prompts.empty(), "--chat needs text prompts (--prompt)");
  check(have_text_support() || o.prompts.empty(), no_text_support_message(o.chat ? "--chat" : "a text prompt (--prompt)"));
  const ModelConfig config = o.model_dir.empty() ? tiny_config(builtin_arch) : load_checkpoint_config(o.model_dir);
  const std::unique_ptr<ModelText> text = open_text(o);
  const std::vector<std::vector<std::int32_t>> prompts = prompt_tokens(o, text.get(), config);
  check(o.max_tokens >= 1, "--max-tokens must be >= 1, got ", o.max_tokens);
  check(o.num_blocks >= 0, "--num-blocks must be >= 0, got ", o.num_blocks);
  check(o.max_cache_mib >= 1, "--max-cache-mib must be >= 1, got ", o.max_cache_mib);
  check(o.repetition_penalty > 0.0f, "--repetition-penalty must be > 0, got ", o.repetition_penalty);
  const std::string device = resolve_device(o.device, o.cpu_reference);
  require_device(device);
  check_block_size(o.block_size, device == "cuda" ? Backend::Cuda : Backend::Cpu);  // the runner's own rule
  RunnerOptions ro{.device = device, .block_size = o.block_size, .max_tokens_per_step = o.max_batched_tokens,
                   .cuda_graphs = o.cuda_graphs, .kv_cache_dtype = o.kv_cache_dtype, .quantization = o.quantization,
                   .cpu_reference = o.cpu_reference};
  const KvCacheDtype kv_dtype = check_runner_options(ro, device);
  validate_speculative(o.speculative);

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
  const std::vector<std::int32_t> stop_ids(o.stop_token_ids.begin(), o.stop_token_ids.end());
  for (const std::int32_t id : stop_ids)
    check(id >= 0 && id < config.vocab_size, "--stop-token-id ", id, " is outside the vocabulary [0, ", config.vocab_size,
          ")");
  // Each request's output text; the stop strings are checked here, before anything is loaded.
  std::vector<std::unique_ptr<OutputText>> texts(prompts.size());
  if (text)
    for (auto& t : texts) t = text->output(o.stop);

  // The KV cache: --num-blocks, or enough blocks for every request at once; either way no more
  // than --max-cache-mib. A smaller cache than the requests need together is fine (they take
  // turns: the engine preempts and recomputes), one smaller than a single request is not.
  const std::int64_t block_bytes = kv_cache_bytes_per_token(config, kv_dtype, backend_name(device, o.cpu_reference)) * o.block_size;
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
  engine_options.speculative = o.speculative;
  std::string backend;
  ro.num_blocks = num_blocks;
  std::unique_ptr<DraftModel> draft = make_draft_model(o.speculative, config, ro);
  Engine engine(make_runner(std::move(weights), ro, &backend), config.vocab_size, engine_options, std::move(draft));

  // With text or JSON, stdout holds only the output; the header and statistics go to stderr.
  std::FILE* info = text || o.json ? stderr : stdout;
  const bool stream = text && prompts.size() == 1 && !o.json;
  std::fprintf(info, "asynct generate: %s (%s), %lld parameters, %s backend%s, KV cache %d blocks of %d tokens (%s MiB) in %s, %s%s\n",
               config.architecture_name().c_str(), o.model_dir.empty() ? ("built-in tiny " + o.builtin).c_str() : o.model_dir.c_str(),
               static_cast<long long>(config.parameter_count()), backend.c_str(),
               weights_label(o.quantization, config).c_str(), num_blocks, o.block_size,
               mib(num_blocks).c_str(), kv_cache_dtype_name(kv_dtype), eos.empty() ? "no end-of-sequence token" : ("end of sequence at " + joined(eos)).c_str(),
               text ? (", " + text->summary()).c_str() : "");
  std::fflush(info);
  std::vector<std::string> shown(prompts.size());  // each text prompt's output text so far
  std::map<std::int64_t, std::size_t> index_of;    // engine request id -> prompt index
  std::vector<double> first_token_s(prompts.size(), -1);  // since t0, once its first token came
  const auto t0 = std::chrono::steady_clock::now();
  const auto since_t0 = [t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = o.max_tokens;
    r.sampling = sampling_for(o, i);
    r.eos_token_ids = eos;
    r.stop_token_ids = stop_ids;
    double* first = &first_token_s[i];
    r.on_token = [first, since_t0](const GeneratedToken&) {
      if (*first < 0) *first = since_t0();
      return true;
    };
    if (text) {
      // Text safe to show as each token comes; returning false ends the request at a stop string.
      OutputText* out = texts[i].get();
      std::string* so_far = &shown[i];
      r.on_token = [out, so_far, stream, first, since_t0](const GeneratedToken& g) {
        if (*first < 0) *first = since_t0();
        const std::string piece = out->push(g.token);
        if (stream) write(stdout, piece);
        *so_far += piece;
        return !out->stopped();
      };
    }
    index_of[engine.add_request(r)] = i;
  }

  const TokenBytes token_bytes = text ? TokenBytes([&](std::int32_t id) { return text->token_bytes(id); }) : TokenBytes();
  std::vector<RequestOutput> outputs(prompts.size());
  const auto finish = [&](RequestOutput& output) {
    const std::size_t i = index_of.at(output.id);
    outputs[i] = std::move(output);
    if (!text && !o.json) return;  // token ids: printed in request order at the end
    FinishedRequest r{i, prompts[i].size(), &outputs[i], bool(text), "", "", first_token_s[i], since_t0()};
    if (text) {
      const std::string tail = texts[i]->finish();
      if (stream) write(stdout, tail);
      r.text = shown[i] + tail;
      r.stop_string = texts[i]->stop_string();
    }
    if (o.json) return write(stdout, json_line(request_json(r, token_bytes)) + "\n");
    std::string report = stream ? "\n" : text_label(r) + "\n" + r.text + "\n";
    if (o.logprobs >= 0) report += logprob_table(r, token_bytes);
    write(stdout, report);
    if (stream) write(info, summary_line(r) + "\n");
  };
  while (engine.has_unfinished())
    for (RequestOutput& output : engine.step()) finish(output);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!text && !o.json) {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const FinishedRequest r{i, prompts[i].size(), &outputs[i], false, "", ""};
      std::string report = token_line(r) + "\n";
      if (o.logprobs >= 0) report += logprob_table(r, token_bytes);
      std::fputs(report.c_str(), stdout);
    }
  }
  if (!o.logits_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const RequestOutput& out : outputs) j.push_back({{"tokens", out.tokens}, {"first_logits", out.first_logits}});
    std::ofstream f(o.logits_path);
    check(bool(f), "cannot write ", o.logits_path);
    f << j.dump() << "\n";
  }
  const EngineStats& s = engine.stats();
  std::fprintf(info, "%lld steps, %lld prefill + %lld decode tokens in %.3f s (%.1f tokens/s), %lld preemptions\n",
               static_cast<long long>(s.steps), static_cast<long long>(s.prefill_tokens),
               static_cast<long long>(s.decode_tokens), seconds,
               double(s.prefill_tokens + s.decode_tokens) / seconds, static_cast<long long>(s.preemptions));
  if (s.draft_rounds > 0)
    std::fprintf(info, "speculative: %lld tokens drafted, %lld kept (%.1f%%), %.2f kept a round of drafts; steps without "
                 "drafts: %lld over the batch limit, %lld paused after rounds that kept none\n",
                 static_cast<long long>(s.drafted_tokens), static_cast<long long>(s.accepted_tokens),
                 100.0 * double(s.accepted_tokens) / double(s.drafted_tokens), double(s.accepted_tokens) / double(s.draft_rounds),
                 static_cast<long long>(s.drafts_skipped_batch), static_cast<long long>(s.drafts_skipped_paused));
  return 0;
}

}  // namespace asynct
