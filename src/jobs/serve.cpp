#include "jobs/serve.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include <regex>

#include <pthread.h>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/step_batch.h"
#include "jobs/warm_up.h"
#include "text/model_text.h"
#include "models/config.h"
#include "models/runner_factory.h"
#include "models/step_budget.h"
#include "models/weights.h"
#ifdef ASYNCT_WITH_SERVER
#include "serve/engine_worker.h"
#include "serve/http_server.h"
#include "serve/structured_output.h"
#endif

namespace asynct {

std::string api_key_problem(const std::string& key) {
  if (key.empty()) return "is empty";
  if (key.size() > 256) return "is over 256 characters";
  for (const char c : key)
    if (c <= 0x20 || c >= 0x7f) return "holds a space or a character that is not printable ASCII";
  return "";
}

std::vector<std::string> parse_allowed_origins(const std::string& list) {
  std::vector<std::string> origins;
  if (list.empty()) return origins;
  static const std::regex origin(R"((https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?)");
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = list.find(',', begin);
    const std::string entry = list.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    check(entry == "*" || std::regex_match(entry, origin), "'", entry.substr(0, 100),
          "' is neither * nor an origin such as https://example.com or http://localhost:3000 (no path, no trailing /)");
    origins.push_back(entry);
    if (end == std::string::npos) return origins;
    begin = end + 1;
  }
}

#ifndef ASYNCT_WITH_SERVER

int run_serve(const ServeOptions&) {
  throw Error("this build of asynct has no server: it needs cpp-httplib (Debian's libcpp-httplib-dev; scripts/setup.sh "
              "installs it) and text support when it is configured");
}

#else

// How long a signal lets the requests in flight end before the server closes.
constexpr int kDrainSeconds = 10;

// SIGINT and SIGTERM go to one thread of ours. They are blocked before any other thread starts:
// every thread inherits the mask, and a process-directed signal reaching a thread that does not
// block it (the CUDA runtime's start with the engine) would end the process on the spot. Until
// serve() the server is starting and a signal ends the process; after it, it calls on_signal.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    thread_ = std::thread([this] { run(); });
  }
  ~SignalWatcher() { close(); }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  void serve(std::function<void(int)> on_signal) {
    const std::lock_guard<std::mutex> lock(mutex_);
    on_signal_ = std::move(on_signal);
  }
  // Stops watching (after a signal's on_signal has returned, if one came).
  void close() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait when no signal came
    thread_.join();
  }

 private:
  void run() {
    int signal = 0;
    sigwait(&signals_, &signal);
    std::function<void(int)> on_signal;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return;
      on_signal = on_signal_;
    }
    if (!on_signal) {
      std::fprintf(stderr, "asynct serve: %s while starting: exiting\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
      std::_Exit(0);
    }
    on_signal(signal);
  }

  sigset_t signals_;
  std::mutex mutex_;
  std::function<void(int)> on_signal_;
  bool closing_ = false;
  std::thread thread_;
};

int run_serve(const ServeOptions& o) {
  // First: finding the device starts the CUDA driver's threads (and a profiler's, when one is
  // injected), and they must inherit the blocked signals.
  SignalWatcher watcher;
  // Everything is checked before the weights are loaded or the cache is allocated.
  check(!o.model_dir.empty(), "--model is required: a checkpoint directory with tokenizer.json");
  check(o.port >= 0 && o.port <= 65535, "--port must be in [0, 65535], got ", o.port);
  check(o.max_num_seqs >= 1, "--max-num-seqs must be >= 1, got ", o.max_num_seqs);
  check(o.max_waiting >= 0, "--max-waiting must be >= 0, got ", o.max_waiting);
  check(o.max_body_mib >= 1 && o.max_body_mib <= 1024, "--max-body-mib must be in [1, 1024], got ", o.max_body_mib);
  check(o.num_blocks >= 0, "--num-blocks must be >= 0, got ", o.num_blocks);
  check(o.max_cache_mib >= 1, "--max-cache-mib must be >= 1, got ", o.max_cache_mib);
  check(o.api_key.empty() || api_key_problem(o.api_key).empty(), "the API key ", api_key_problem(o.api_key));
  std::vector<std::string> allowed_origins;
  try {
    allowed_origins = parse_allowed_origins(o.allowed_origins);
  } catch (const Error& e) {
    throw Error(std::string("--allowed-origins: ") + e.what());
  }
  const ModelConfig config = load_checkpoint_config(o.model_dir);
  ChatFormat chat;
  chat.load_if_present = true;
  const std::unique_ptr<ModelText> text = ModelText::open(o.model_dir, chat);
  const std::int64_t context = o.max_model_len > 0 ? o.max_model_len : config.max_position_embeddings;
  check(context <= config.max_position_embeddings, "--max-model-len ", o.max_model_len, " is over the model's context of ",
        config.max_position_embeddings, " tokens (max_position_embeddings)");
  const std::string device = resolve_device(o.device, o.cpu_reference);
  require_device(device);
  check_block_size(o.block_size, device == "cuda" ? Backend::Cuda : Backend::Cpu);
  // A step's new tokens bound how soon a disconnect or SIGTERM takes effect.
  const int step_tokens =
      o.max_batched_tokens > 0 ? o.max_batched_tokens : default_step_tokens(config, backend_name(device, o.cpu_reference));
  RunnerOptions ro{.device = device, .block_size = o.block_size, .max_tokens_per_step = step_tokens,
                   .cuda_graphs = o.cuda_graphs, .kv_cache_dtype = o.kv_cache_dtype, .quantization = o.quantization,
                   .cpu_reference = o.cpu_reference};
  const KvCacheDtype kv_dtype = check_runner_options(ro, device);
  validate_speculative(o.speculative);

  const std::int64_t block_bytes = kv_cache_bytes_per_token(config, kv_dtype, backend_name(device, o.cpu_reference)) * o.block_size;
  const std::int64_t per_request = (context + o.block_size - 1) / o.block_size;
  const std::int64_t cap = std::min<std::int64_t>(o.max_cache_mib * (std::int64_t(1) << 20) / block_bytes,
                                                  std::numeric_limits<int>::max());
  check(o.num_blocks <= cap, "--num-blocks ", o.num_blocks, " is over --max-cache-mib ", o.max_cache_mib, " (", cap, " blocks)");
  const int num_blocks = int(o.num_blocks > 0 ? o.num_blocks : std::min(cap, per_request * o.max_num_seqs));
  check(num_blocks >= per_request, "the KV cache (", num_blocks, " blocks of ", o.block_size,
        " tokens) cannot hold one request of the whole context (", context,
        " tokens): raise --max-cache-mib or --num-blocks, or lower --max-model-len");

  std::fprintf(stderr, "asynct serve: loading %s\n", o.model_dir.c_str());
  ModelWeights weights = load_weights(o.model_dir);
  EngineOptions engine_options;
  engine_options.max_num_seqs = o.max_num_seqs;
  engine_options.max_num_batched_tokens = step_tokens;
  engine_options.max_model_len = int(context);
  engine_options.prefix_caching = o.prefix_caching;
  engine_options.speculative = o.speculative;
  ro.num_blocks = num_blocks;
  std::string backend;
  std::unique_ptr<DraftModel> draft = make_draft_model(o.speculative, config, ro);
  auto engine = std::make_unique<Engine>(make_runner(std::move(weights), ro, &backend), config.vocab_size, engine_options,
                                         std::move(draft));
  if (o.warm_up == "on" || (o.warm_up == "auto" && device == "cuda")) {
    const WarmUp w = server_warm_up(step_tokens, o.max_num_seqs, int(context), (long long)num_blocks * o.block_size);
    std::fprintf(stderr, "asynct serve: warming up: %d request%s of %d prompt and %d output tokens\n", w.requests,
                 w.requests == 1 ? "" : "s", w.prompt_tokens, w.output_tokens);
    const auto start = std::chrono::steady_clock::now();
    warm_up_engine(*engine, w, config.vocab_size);
    std::fprintf(stderr, "asynct serve: warmed up in %.0f ms\n",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }

  const int in_flight = o.max_num_seqs + o.max_waiting;
  serve::ServerMetrics metrics;
  serve::EngineWorker worker(std::move(engine), in_flight, metrics);
  serve::HttpOptions http;
  http.host = o.host;
  http.port = o.port;
  http.threads = in_flight + 8;  // every request in flight may hold a streaming connection
  http.max_body_bytes = std::size_t(o.max_body_mib) << 20;
  http.model_name = o.served_model_name.empty() ? std::filesystem::path(o.model_dir).lexically_normal().filename().string()
                                                : o.served_model_name;
  if (http.model_name.empty()) http.model_name = std::filesystem::path(o.model_dir).lexically_normal().parent_path().filename().string();
  http.context = context;
  http.eos_token_ids = config.eos_token_ids;
  http.vocab_size = config.vocab_size;
  http.api_key = o.api_key;
  http.allowed_origins = allowed_origins;
  http.system_fingerprint = "fp_asynct_" + device;  // the backend: what changes answers to the same seed
  // Structured output over the tokenizer's vocabulary, when built with xgrammar.
  std::unique_ptr<serve::StructuredOutput> structured;
  if (serve::StructuredOutput::available()) {
    structured = std::make_unique<serve::StructuredOutput>((std::filesystem::path(o.model_dir) / "tokenizer.json").string(),
                                                           config.vocab_size, config.eos_token_ids);
    http.structured_output = structured.get();
  }
  serve::HttpServer server(worker, *text, metrics, http);
  const int port = server.bind();

  watcher.serve([&](int signal) {
    std::fprintf(stderr, "asynct serve: %s: ending %d requests in flight\n", signal == SIGINT ? "SIGINT" : "SIGTERM",
                 worker.in_flight());
    // Every request ends at its next token or prompt chunk and its stream gets its last chunk,
    // within the deadline; then the server closes.
    worker.drain();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kDrainSeconds);
    while ((worker.in_flight() > 0 || server.open_streams() > 0) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    server.stop();
  });
  std::fprintf(stderr,
               "asynct serve: %s (%s), %s backend%s, KV cache %d blocks of %d tokens (%s, %.1f MiB: %lld tokens), context %lld, "
               "up to %d sequences and %d new tokens a step, %d waiting, prefix caching %s; %s, chat %s; API key %s, CORS %s\n"
               "asynct serve: listening on http://%s:%d/v1 (model '%s')\n",
               config.architecture_name().c_str(), o.model_dir.c_str(), backend.c_str(),
               weights_label(o.quantization, config).c_str(), num_blocks, o.block_size,
               kv_cache_dtype_name(kv_dtype), double(num_blocks) * double(block_bytes) / double(1 << 20),
               static_cast<long long>(std::int64_t(num_blocks) * o.block_size), static_cast<long long>(context),
               o.max_num_seqs, step_tokens, o.max_waiting, o.prefix_caching ? "on" : "off", text->summary().c_str(),
               text->has_chat_template() ? "on" : "off (no chat template)", o.api_key.empty() ? "off" : "on",
               o.allowed_origins.empty() ? "off" : o.allowed_origins.c_str(), o.host.c_str(), port, http.model_name.c_str());
  std::fflush(stderr);
  try {
    server.listen();
  } catch (...) {
    watcher.close();  // its on_signal uses the server and the worker
    throw;
  }
  watcher.close();
  worker.stop();
  std::fprintf(stderr, "asynct serve: stopped\n");
  return 0;
}

#endif  // ASYNCT_WITH_SERVER

}  // namespace asynct
