// `asynct generate`: token ids in, token ids and timing out, on the CPU backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace asynct {

struct GenerateOptions {
  std::string model_dir;                 // empty: the built-in tiny model
  std::string builtin = "asynct";        // which built-in model: asynct or qwen3
  std::vector<std::string> prompts;      // each "1,2,3"; empty: a built-in prompt
  int max_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  std::uint64_t seed = 0;               // request i draws from the stream seed + i (mod 2^64)
  int block_size = 16;
  int num_blocks = 0;                    // 0: enough for the requests, up to max_cache_mib
  // The most memory the KV cache may take, in MiB (2^20 bytes): an automatic size is capped
  // at it (the requests then take turns in the cache), a larger --num-blocks is an error.
  std::int64_t max_cache_mib = 8192;
  int max_batched_tokens = 2048;
  // End-of-sequence tokens: eos_tokens when given, else the checkpoint's (ModelConfig::
  // eos_token_ids); none with ignore_eos.
  std::vector<int> eos_tokens;
  bool ignore_eos = false;
  std::string device = "auto";           // auto, cpu or cuda
  bool cuda_graphs = true;               // replay decode steps as CUDA graphs (CUDA backend)
  bool pipeline = true;                  // queue greedy decode steps ahead (EngineOptions::pipeline_steps)
  std::string logits_path;               // write each request's first-token logits (JSON)
};

int run_generate(const GenerateOptions& options);

// "1, 2,3" -> {1, 2, 3}; throws Error naming the bad piece.
std::vector<std::int32_t> parse_token_list(const std::string& text);

}  // namespace asynct
