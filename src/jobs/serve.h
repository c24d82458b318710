// `asynct serve`: a checkpoint directory served through the OpenAI API over HTTP
// (serve/http_server.h), until SIGINT or SIGTERM: then new requests get 503, the requests in
// flight end (finish reason "abort", their streams closed properly) within 10 s, and it exits 0.
//
// The KV cache holds max_num_seqs requests of the whole context unless --num-blocks or
// --max-cache-mib say less (requests then take turns); requests beyond max_num_seqs +
// max_waiting at once are refused with 429. The API key comes from --api-key or, read at the
// command line's edge (cli/main.cpp), ASYNCT_API_KEY.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/drafter.h"

namespace asynct {

struct ServeOptions {
  std::string model_dir;            // a checkpoint with tokenizer.json (a chat template for chat)
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port (printed)
  std::string served_model_name;    // the name clients ask for; empty: the directory's name
  std::string device = "auto";      // auto, cpu or cuda
  std::string kv_cache_dtype = "auto";  // auto, bf16 or fp8 (models/kv_cache_format.h)
  std::string quantization = "none";    // none or fp8 (RunnerOptions::quantization)
  bool cpu_reference = false;            // the CPU reference runner (RunnerOptions::cpu_reference)
  int max_num_seqs = 64;            // sequences in one step
  int max_waiting = 64;             // requests accepted beyond those, waiting for a place
  int max_model_len = 0;            // prompt + output tokens of a request; 0: the model's context
  int block_size = 16;
  int num_blocks = 0;               // 0: max_num_seqs requests of max_model_len, up to max_cache_mib
  std::int64_t max_cache_mib = 8192;
  int max_batched_tokens = 0;  // 0: default_step_tokens (models/runner_factory.h)
  std::int64_t max_body_mib = 8;    // larger request bodies get 413
  bool cuda_graphs = true;
  bool prefix_caching = true;       // EngineOptions::prefix_caching (off there by default)
  // Untimed requests before listening (jobs/warm_up.h: server_warm_up): "auto" (on the CUDA
  // backend, whose first steps load kernels, plan products and capture graphs), "on" or "off".
  std::string warm_up = "auto";
  SpeculativeOptions speculative;   // drafts verified a step (engine/drafter.h); off by default
  std::string api_key;              // non-empty: requests need "Authorization: Bearer <api_key>"
  std::string allowed_origins;      // CORS: comma-separated origins or "*"; empty: off
};

int run_serve(const ServeOptions& options);

// What is wrong with an API key (empty: nothing): 1-256 printable characters without spaces.
std::string api_key_problem(const std::string& key);
// --allowed-origins split at commas; throws Error for an entry that is neither "*" nor an origin
// (http[s]://host[:port], no path).
std::vector<std::string> parse_allowed_origins(const std::string& list);

}  // namespace asynct
