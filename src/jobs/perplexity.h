// `asynct perplexity`: a checkpoint's perplexity over a text file, as llama.cpp's
// llama-perplexity and lm-eval's rolling log-likelihood measure it.
//
// The file is tokenized as a plain prompt is (text/model_text.h: the special tokens
// HuggingFace's tokenizer(text) adds, none for Qwen3 and SmolLM2), and its first max_tokens
// tokens are used (0: all). The tokens t_0 .. t_{n-1} are cut into windows of `context` tokens
// that overlap by one: window k holds t_s .. t_{s+C-1} with s = k (C - 1) (the last one holds
// what is left, at least 2 tokens). In each window every token after the first is scored, by
// its log-probability under the model given the tokens before it in its window, at positions
// from 0: so each of t_1 .. t_{n-1} is scored exactly once, with between 1 and C - 1 tokens of
// context, and a window runs C - 1 tokens through the model (its last token is only a target).
// This is lm-eval's loglikelihood_rolling with disjoint prediction windows (minus its scoring of
// t_0 after an end-of-text token); llama-perplexity scores only each window's second half,
// every token seeing at least C/2 of context, at twice the compute per scored token, and so
// reads lower. Perplexity = exp(the mean negative log-likelihood of the scored tokens).
//
// The model runner is driven directly: one sequence, a window a time, in steps of at most
// max_batched_tokens tokens (a window's later steps attend to the earlier ones' cache, as
// chunked prefill does), every token a logit row with its full logits asked for; the
// log-softmax is taken on the host in float64 from the runner's float32 logits. The KV cache
// holds one window.
#pragma once

#include <cstdint>
#include <string>

namespace asynct {

struct PerplexityOptions {
  std::string model_dir;
  std::string file;                // the text (UTF-8)
  int context = 0;                 // window length in tokens; 0: 512, or the model's context when smaller
  std::int64_t max_tokens = 0;     // use only the file's first N tokens; 0: all
  int max_batched_tokens = 512;    // tokens in one step (a window's rows are cut into steps of this many)
  int block_size = 16;             // KV cache block size
  std::string device = "auto";     // auto, cpu or cuda
  std::string kv_cache_dtype = "auto";  // auto, bf16 or fp8 (models/kv_cache_format.h)
  std::string quantization = "none";    // none or fp8 (RunnerOptions::quantization)
  bool cpu_reference = false;           // the CPU reference runner (RunnerOptions::cpu_reference)
  std::string json_path;           // write the results as JSON here too; empty: none
};

// Prints the result on stdout and a line per window on stderr; throws Error (before loading the
// weights) for: no tokenizer.json, a file that cannot be read, is empty or is not UTF-8, fewer
// than 2 tokens, a context under 2 or over the model's, tokens outside the model's vocabulary.
int run_perplexity(const PerplexityOptions& options);

}  // namespace asynct
