// `asynct generate`: text or token ids in, text or token ids out (with logprobs, as JSON when
// asked), and timing.
//
// Text prompts (--prompt) are tokenized with the checkpoint's tokenizer (text/model_text.h),
// through its chat template with --chat; their output is text that ends before the first stop
// string (text/completion_text.h). One text prompt streams its text to stdout as tokens come;
// several print each text when its request finishes, labelled. Token-id prompts
// (--prompt-ids, or the built-in prompts) print token ids, in request order. With --json each
// request is one JSON line, printed when it finishes. The run's header and statistics go to
// stdout with token ids, to stderr with text or --json, so that stdout holds only the output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/drafter.h"

namespace asynct {

struct GenerateOptions {
  std::string model_dir;                 // empty: the built-in tiny model
  std::string builtin = "asynct";        // which built-in model: asynct or qwen3
  std::vector<std::string> prompts;      // text prompts (need model_dir's tokenizer)
  std::vector<std::string> prompt_ids;   // or token-id prompts, each "1,2,3"; neither: built-in prompts
  bool chat = false;                     // text prompts through the chat template
  std::string system;                    // the chat's system message; empty: none
  bool thinking = true;                  // false: the chat template gets enable_thinking = false
  int max_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::uint64_t seed = 0;               // request i draws from the stream seed + i (mod 2^64)
  int logprobs = -1;                     // -1: none; n: each token's logprob and the n most likely
  std::vector<std::string> stop;         // stop strings (text prompts)
  std::vector<int> stop_token_ids;       // tokens that end a request ("stop"), kept in its output
  bool json = false;                     // one JSON line per request on stdout
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
  std::string kv_cache_dtype = "auto";   // auto, bf16 or fp8 (models/kv_cache_format.h)
  std::string quantization = "none";     // none or fp8 (RunnerOptions::quantization)
  bool cpu_reference = false;            // the CPU reference runner (RunnerOptions::cpu_reference)
  bool cuda_graphs = true;               // replay decode steps as CUDA graphs (CUDA backend)
  bool pipeline = true;                  // queue greedy decode steps ahead (EngineOptions::pipeline_steps)
  SpeculativeOptions speculative;        // drafts verified a step (engine/drafter.h); off by default
  std::string logits_path;               // write each request's first-token logits (JSON)
};

int run_generate(const GenerateOptions& options);

// "1, 2,3" -> {1, 2, 3}; throws Error naming the bad piece.
std::vector<std::int32_t> parse_token_list(const std::string& text);

}  // namespace asynct
