// Option groups several subcommands share (generate, serve, bench, perplexity), each added by
// one function so that their names, help and checks are written once.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/option_checks.h"
#include "engine/drafter.h"

namespace asynct::cli {

// --kv-cache-dtype and --quantization (models/kv_cache_format.h, RunnerOptions::quantization).
inline void add_precision_options(CLI::App* cmd, std::string& kv_cache_dtype, std::string& quantization) {
  cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "KV cache type: auto (the backend's: float32 on the CPU reference, bf16 otherwise), bf16 or fp8 (e4m3 with "
                  "a scale per layer and KV head: the checkpoint's k_scale / v_scale, else a bound from the weights; on CUDA at "
                  "head_dim 64 and 128)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  cmd->add_option("--quantization", quantization,
                  "none (the checkpoint's weights as they are), fp8 (the projections quantized to e4m3 as they load, a "
                  "scale per row and 128 inputs; every backend) or int8 (the projections and the LM head in 8-bit integers, a "
                  "scale per row and 32 inputs, as llama.cpp's Q8_0; the production CPU backend only)")
      ->check(CLI::IsMember({"none", "fp8", "int8"}));
}

// --cpu-reference: the CPU reference backend instead of the production one.
inline void add_cpu_reference_flag(CLI::App* cmd, bool& cpu_reference) {
  cmd->add_flag("--cpu-reference", cpu_reference,
                "run the CPU reference backend (float32 weights, float64 sums: the oracle the other backends are tested "
                "against) instead of the production CPU backend");
}

// --speculative and its settings (engine/drafter.h).
// `forced`: bench only (SpeculativeOptions::method).
inline void add_speculative_options(CLI::App* cmd, SpeculativeOptions& o, bool forced = false) {
  cmd->add_option("--speculative", o.method,
                  "speculative decoding: none, ngram (drafts from the request's own prompt and output by prompt lookup), "
                  "suffix (suffix decoding: drafts from a suffix index over the request's tokens and recent requests' "
                  "prompts and outputs, as long as the match is confident) or draft (a smaller model's greedy tokens: "
                  "--draft-model); drafts are verified in one step: the same "
                  "tokens, fewer steps where the output repeats its input or earlier requests" +
                      std::string(forced ? "; forced (bench only) drafts --speculative-tokens tokens a step and keeps them all, "
                                           "to time verification apart from the model's luck" : ""))
      ->check(forced ? CLI::IsMember({"none", "ngram", "suffix", "draft", "forced"})
                     : CLI::IsMember({"none", "ngram", "suffix", "draft"}));
  cmd->add_option("--draft-model", o.draft_model,
                  "--speculative draft's model: a smaller checkpoint directory with the model's tokenizer (it runs on "
                  "the same backend, with its own KV cache of as many blocks); none by default");
  cmd->add_option("--speculative-tokens", o.num_tokens, "tokens drafted a step at most")->check(integer_in(1, 64));
  cmd->add_option("--speculative-max-batch", o.max_batch,
                  "draft only while at most this many sequences run (0: any number); a sequence whose drafts keep "
                  "nothing also pauses drafting for a while")
      ->check(integer_in(0, 1 << 20));
  cmd->add_option("--ngram-min", o.ngram_min, "the shortest match prompt lookup drafts from")->check(integer_in(1, 64));
  cmd->add_option("--ngram-max", o.ngram_max, "the longest match prompt lookup tries first")->check(integer_in(1, 64));
  cmd->add_option("--suffix-depth", o.suffix_depth, "the longest window suffix decoding indexes (a match and the token after it)")
      ->check(integer_in(2, 64));
  cmd->add_option("--suffix-min-probability", o.suffix_min_probability,
                  "suffix decoding drafts a token while it followed its match at least this often")
      ->check(number_in(0, 1));
  cmd->add_option("--suffix-cache-tokens", o.suffix_cache_tokens,
                  "finished requests' tokens suffix decoding drafts from, the oldest evicted (0: none)")
      ->check(integer_in<std::int64_t>(0, std::int64_t(1) << 30));
  cmd->add_option("--suffix-request-tokens", o.suffix_request_tokens,
                  "a request's own newest tokens suffix decoding drafts from")
      ->check(integer_in<std::int64_t>(1, std::int64_t(1) << 30));
}

}  // namespace asynct::cli
