// The asynct command line: `generate` (the default job), `bench`, `calibrate`, `init-checkpoint`,
// `demo`, `perplexity`, `serve` and `tokenize`.
// It parses the arguments and calls the jobs (src/jobs/) and models/ (init-checkpoint).
//
// Exit codes: 0 done (or --help), 1 a bad command line (CLI11's parse errors, whose own codes
// are 100 and up), 2 an error the job reports (asynct::Error), 3 an internal error (any other
// exception: a bug).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>

#include <CLI/CLI.hpp>

#include "jobs/attention_demo.h"
#include "jobs/calibrate.h"
#include "jobs/generate.h"
#include "jobs/perplexity.h"
#include "cli/option_checks.h"
#include "cli/shared_options.h"
#include "core/error.h"
#include "core/sampling_params.h"
#include "models/weights.h"
#include "jobs/scenarios.h"
#include "jobs/serve.h"
#include "jobs/tokenize.h"
#ifdef ASYNCT_WITH_CUDA
#include "kernels/common/tuning.h"
#endif

int main(int argc, char** argv) {
  using asynct::cli::integer_in;
  using asynct::cli::number_in;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  constexpr std::uint64_t kSeedMax = std::numeric_limits<std::uint64_t>::max();
  CLI::App app{"asynct: inference for AsyncT and Qwen3 language models"};
  app.require_subcommand(0, 1);
  app.footer("Exit codes: 0 done, 1 a bad command line, 2 an error, 3 an internal error.");
  // --help shows each option's default (the subcommands inherit this).
  app.option_defaults()->always_capture_default();

  asynct::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "Run the reference attention (async and softmax gates) on a built-in batch");
  demo_cmd->add_option("--q-heads", demo.num_q_heads, "query heads")->check(integer_in(1, 256));
  demo_cmd->add_option("--kv-heads", demo.num_kv_heads, "KV heads (divides --q-heads)")
      ->check(integer_in(1, 256));
  demo_cmd->add_option("--head-dim", demo.head_dim, "head dimension")->check(integer_in(1, 1024));
  demo_cmd->add_option("--block-size", demo.block_size, "paged-cache block size")
      ->check(integer_in(1, 4096));
  demo_cmd->add_option("--window", demo.pool_window, "async gate pool window W")
      ->check(integer_in(1, 64));
  demo_cmd->add_option("--seed", demo.seed, "random seed")->check(integer_in(std::uint64_t(0), kSeedMax));

  asynct::GenerateOptions gen;
  CLI::App* gen_cmd = app.add_subcommand(
      "generate", "Generate text or tokens with a model (the built-in tiny model, token ids only, when --model is not given)");
  gen_cmd->add_option("--model", gen.model_dir, "HuggingFace checkpoint directory");
  gen_cmd->add_option("--builtin", gen.builtin, "built-in model when --model is absent")
      ->check(CLI::IsMember({"asynct", "qwen3"}));
  CLI::Option* prompt = gen_cmd->add_option(
      "--prompt", gen.prompts,
      "a text prompt, repeatable (needs --model DIR with a tokenizer.json); the output is text: one prompt streams, "
      "several print each text when done");
  CLI::Option* prompt_ids = gen_cmd->add_option(
      "--prompt-ids", gen.prompt_ids,
      "a prompt as token ids, comma-separated, repeatable; the output is token ids (neither option: built-in prompts)");
  prompt->excludes(prompt_ids);
  prompt_ids->excludes(prompt);
  CLI::Option* chat = gen_cmd->add_flag(
      "--chat", gen.chat, "each --prompt is a user message through the model's chat template (with the assistant's turn opened)")
      ->needs(prompt);
  gen_cmd->add_option("--system", gen.system, "with --chat: a system message first")->needs(chat);
  gen_cmd->add_flag("!--no-thinking", gen.thinking,
                    "with --chat: the template gets enable_thinking=false (Qwen3: an empty <think></think>, no reasoning)")
      ->needs(chat);
  gen_cmd->add_option("--max-tokens", gen.max_tokens, "tokens to generate per request")->check(integer_in(1, 1 << 20));
  gen_cmd->add_option("--temperature", gen.temperature, "0 is greedy")->check(number_in(0.0, 100.0));
  gen_cmd->add_option("--top-k", gen.top_k, "0 is off")->check(integer_in(0, kIntMax));
  gen_cmd->add_option("--top-p", gen.top_p, "nucleus mass in (0, 1]")->check(number_in(0.0, 1.0));
  gen_cmd->add_option("--min-p", gen.min_p, "keep tokens at least this times as likely as the most likely (0 is off)")
      ->check(number_in(0.0, 1.0));
  gen_cmd->add_option("--repetition-penalty", gen.repetition_penalty,
                      "> 0; a token in the prompt or output: positive logits divided by it, negative ones multiplied")
      ->check(number_in(0.0, 100.0));
  gen_cmd->add_option("--presence-penalty", gen.presence_penalty, "subtracted from the logit of a token in the output")
      ->check(number_in(-2.0, 2.0));
  gen_cmd->add_option("--frequency-penalty", gen.frequency_penalty,
                      "times a token's count in the output, subtracted from its logit")
      ->check(number_in(-2.0, 2.0));
  gen_cmd->add_option("--seed", gen.seed, "sampling seed: request i (in prompt order, from 0) draws with seed + i")
      ->check(integer_in(std::uint64_t(0), kSeedMax));
  gen_cmd->add_option("--logprobs", gen.logprobs,
                      "print each generated token's logprob (of the model's distribution) and the N most likely tokens "
                      "(none when not given)")
      ->check(integer_in(0, asynct::kMaxTopLogprobs))
      ->default_str("");
  gen_cmd->add_option("--stop", gen.stop,
                      "stop string, repeatable (text prompts): the text ends before the first one, and its request with it")
      ->needs(prompt);
  gen_cmd->add_option("--stop-token-id", gen.stop_token_ids,
                      "a token that ends its request (finish reason stop; the token is kept), repeatable")
      ->check(integer_in(0, kIntMax));
  gen_cmd->add_flag("--json", gen.json,
                    "print each request as one JSON line when it finishes (token ids, text, finish reason, logprobs)");
  gen_cmd->add_option("--block-size", gen.block_size, "KV cache block size")->check(integer_in(1, 4096));
  gen_cmd->add_option("--num-blocks", gen.num_blocks,
                      "KV cache blocks (0: enough for all the requests at once, up to --max-cache-mib; with fewer they take turns)")
      ->check(integer_in(0, kIntMax));
  gen_cmd->add_option("--max-cache-mib", gen.max_cache_mib,
                      "most memory the KV cache may take, in MiB (a larger --num-blocks is an error)")
      ->check(integer_in(std::int64_t(1), std::int64_t(1) << 30));
  gen_cmd->add_option("--max-batched-tokens", gen.max_batched_tokens, "chunked-prefill token budget per step")
      ->check(integer_in(1, 1 << 20));
  CLI::Option* eos = gen_cmd->add_option(
      "--eos", gen.eos_tokens,
      "end-of-sequence token id, repeatable (default: the checkpoint's generation_config.json or config.json "
      "eos_token_id; the built-in models have none)")
      ->check(integer_in(0, kIntMax));
  gen_cmd->add_flag("--ignore-eos", gen.ignore_eos, "run every request to --max-tokens, ignoring end-of-sequence tokens")
      ->excludes(eos);
  gen_cmd->add_flag("!--no-cuda-graphs", gen.cuda_graphs, "run decode steps eagerly, not as CUDA graphs");
  gen_cmd->add_flag("!--no-pipeline", gen.pipeline, "read each step's tokens before queuing the next step");
  gen_cmd->add_option("--device", gen.device, "auto (a GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  asynct::cli::add_precision_options(gen_cmd, gen.kv_cache_dtype, gen.quantization);
  asynct::cli::add_speculative_options(gen_cmd, gen.speculative);
  asynct::cli::add_cpu_reference_flag(gen_cmd, gen.cpu_reference);
  gen_cmd->add_option("--logits", gen.logits_path, "write the tokens and each request's first-token logits as JSON");

  std::string init_arch = "asynct", init_size = "tiny", init_out;
  std::uint64_t init_seed = 0;
  CLI::App* init_cmd = app.add_subcommand("init-checkpoint", "Write a checkpoint with random weights");
  init_cmd->add_option("--arch", init_arch, "asynct, qwen3 or llama (not with a config.json)")
      ->check(CLI::IsMember({"asynct", "qwen3", "llama"}));
  init_cmd->add_option("--config", init_size, "tiny, 1.7b, or a checkpoint's config.json (its architecture and shape)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v == "tiny" || v == "1.7b" || std::filesystem::is_regular_file(v)
                       ? std::string()
                       : "must be tiny, 1.7b or an existing config.json, got '" + v + "'";
          },
          "{tiny,1.7b,FILE}"));
  init_cmd->add_option("--seed", init_seed, "weights seed")->check(integer_in(std::uint64_t(0), kSeedMax));
  init_cmd->add_option("--out", init_out, "checkpoint directory to create")->required();

  asynct::ScenarioOptions bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "Run the four benchmark scenarios, AsyncT against Qwen3");
  bench_cmd->add_option("--config", bench.config, "model size (auto: 1.7b on the GPU, tiny on the CPU)")
      ->check(CLI::IsMember({"auto", "tiny", "1.7b"}));
  bench_cmd->add_option("--scale", bench.scale, "divide prompt and output lengths by this (0: 1 on the GPU, 64 on the CPU)")
      ->check(integer_in(0, 1 << 20));
  bench_cmd->add_option("--scenario", bench.only, "run only this scenario (decode_b1, single-stream decode; decode_heavy_b32_sampled, decode_heavy_b32 drawing with temperature, top-k, top-p and penalties; serve_load_c64, bench/bench_serve.py's load in process: these run only when named)")
      ->check(CLI::IsMember(asynct::scenario_names()));
  bench_cmd->add_option("--model", bench.model_dir,
                        "run the --scenario on this checkpoint directory instead of AsyncT and Qwen3's random weights")
      ->check(CLI::ExistingDirectory);
  bench_cmd->add_option("--json", bench.json_path, "write the results as JSON to this file (none when not given)");
  bench_cmd->add_option("--seed", bench.seed, "weights and prompts seed")->check(integer_in(std::uint64_t(0), kSeedMax));
  bench_cmd->add_flag("--profile", bench.profile,
                      "time the GPU phases of each step with CUDA events (slows decode steps by ~1%)");
  bench_cmd->add_flag("!--no-cuda-graphs", bench.cuda_graphs, "run decode steps eagerly, not as CUDA graphs");
  bench_cmd->add_flag("!--no-pipeline", bench.pipeline, "read each step's tokens before queuing the next step");
  bench_cmd->add_flag("!--no-warmup", bench.warmup, "skip the untimed warm-up and first run of each scenario");
  bench_cmd->add_option("--repeat", bench.repeat, "timed runs per scenario and model; the median is reported")
      ->check(integer_in(1, 100));
  bench_cmd->add_option("--device", bench.device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  asynct::cli::add_speculative_options(bench_cmd, bench.speculative, /*forced=*/true);
  asynct::cli::add_precision_options(bench_cmd, bench.kv_cache_dtype, bench.quantization);
  asynct::cli::add_cpu_reference_flag(bench_cmd, bench.cpu_reference);

  asynct::ServeOptions serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve", "Serve a checkpoint through the OpenAI API (/v1/completions, /v1/chat/completions) over HTTP");
  serve_cmd->add_option("--model", serve.model_dir, "checkpoint directory (tokenizer.json; a chat template for chat)")->required();
  serve_cmd->add_option("--host", serve.host, "address to listen on");
  serve_cmd->add_option("--port", serve.port, "port to listen on (0: any free port)")->check(integer_in(0, 65535));
  serve_cmd->add_option("--served-model-name", serve.served_model_name, "the model name clients ask for (default: the directory's name)");
  serve_cmd->add_option("--device", serve.device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  asynct::cli::add_speculative_options(serve_cmd, serve.speculative);
  asynct::cli::add_precision_options(serve_cmd, serve.kv_cache_dtype, serve.quantization);
  asynct::cli::add_cpu_reference_flag(serve_cmd, serve.cpu_reference);
  serve_cmd->add_option("--max-num-seqs", serve.max_num_seqs, "sequences in one step")->check(integer_in(1, 4096));
  serve_cmd->add_option("--max-waiting", serve.max_waiting, "requests accepted beyond --max-num-seqs (more get 429)")
      ->check(integer_in(0, 1 << 16));
  serve_cmd->add_option("--max-model-len", serve.max_model_len, "prompt + output tokens of a request (0: the model's context)")
      ->check(integer_in(0, 1 << 30));
  serve_cmd->add_option("--block-size", serve.block_size, "KV cache block size in tokens")->check(integer_in(1, 1 << 20));
  serve_cmd->add_option("--num-blocks", serve.num_blocks, "KV cache blocks (0: --max-num-seqs requests of the whole context)")
      ->check(integer_in(0, std::numeric_limits<int>::max()));
  serve_cmd->add_option("--max-cache-mib", serve.max_cache_mib, "the most memory the KV cache may take, in MiB")
      ->check(integer_in(std::int64_t(1), std::int64_t(1) << 30));
  serve_cmd->add_option("--max-batched-tokens", serve.max_batched_tokens,
                        "new tokens in one step (chunked prefill); 0: 2048 on the GPU, on the CPU what it prefills in ~0.25 s")
      ->check(integer_in(0, 1 << 20));
  serve_cmd->add_option("--max-body-mib", serve.max_body_mib, "larger request bodies get 413")->check(integer_in(std::int64_t(1), std::int64_t(1024)));
  serve_cmd->add_flag("!--no-cuda-graphs", serve.cuda_graphs, "run decode steps eagerly, not as CUDA graphs");
  serve_cmd->add_flag("!--no-prefix-caching", serve.prefix_caching,
                      "compute every prompt whole (default: reuse the cached K/V blocks of an earlier prompt's prefix)");
  serve_cmd->add_option("--warm-up", serve.warm_up,
                        "before listening, run a few untimed requests (one full prefill step, a few decode steps) so that "
                        "the first clients do not pay for loading kernels and capturing graphs: auto (on the GPU), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  serve_cmd->add_option("--api-key", serve.api_key,
                        "requests (but /health and /metrics) need 'Authorization: Bearer KEY' (default: the environment's "
                        "ASYNCT_API_KEY; neither: none)")
      ->check(CLI::Validator([](std::string& key) {
        const std::string problem = asynct::api_key_problem(key);
        return problem.empty() ? std::string() : "the key " + problem;
      }, "KEY"));
  serve_cmd->add_option("--allowed-origins", serve.allowed_origins,
                        "CORS: comma-separated origins (https://example.com) or *, that browsers may call from (default: none)")
      ->check(CLI::Validator([](std::string& list) {
        try {
          asynct::parse_allowed_origins(list);
        } catch (const asynct::Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }, "ORIGINS"));

  asynct::CalibrateOptions cal;
  CLI::App* cal_cmd = app.add_subcommand(
      "calibrate", "Copy a checkpoint with FP8 KV-cache scales measured on a text (for --kv-cache-dtype fp8)");
  cal_cmd->footer(
      "Each layer's and KV head's scale is --headroom x the largest key or value magnitude the text gives / 448, and "
      "never above the bound the weights give (what --kv-cache-dtype fp8 uses without scales). The copy holds the "
      "checkpoint's files, kv_cache_scales.safetensors (self_attn.k_scale / v_scale) and an index naming both.");
  cal_cmd->add_option("--model", cal.model_dir, "HuggingFace checkpoint directory with its tokenizer.json")->required();
  cal_cmd->add_option("--out", cal.out_dir, "where the calibrated copy goes (a new or empty directory)")->required();
  cal_cmd->add_option("--file", cal.file, "the calibration text (UTF-8), tokenized as a plain prompt is")->required();
  cal_cmd->add_option("--max-tokens", cal.max_tokens, "use the text's first N tokens")
      ->check(integer_in(std::int64_t(2), std::numeric_limits<std::int64_t>::max()));
  cal_cmd->add_option("--context", cal.context, "window length in tokens")->check(integer_in(2, 1 << 20));
  cal_cmd->add_option("--headroom", cal.headroom, "scale = headroom x the largest magnitude / 448 (at least 1)")
      ->check(CLI::Range(1.0, 1024.0));

  asynct::PerplexityOptions ppl;
  CLI::App* ppl_cmd = app.add_subcommand(
      "perplexity", "A model's perplexity over a text file (lm-eval's rolling log-likelihood)");
  ppl_cmd->footer(
      "Scoring: the file is tokenized as a plain prompt is and cut into windows of --context tokens that overlap by "
      "one (window k starts at token k * (context - 1)); in each window every token after the first is scored by its "
      "log-probability given the tokens before it in the window, so every token of the text but the first is scored "
      "exactly once, with 1 to context - 1 tokens of context (lm-eval's rolling log-likelihood; llama-perplexity "
      "scores only each window's second half and so reads lower). Perplexity = exp(mean negative log-likelihood).\n\n"
      "Exit codes: 0 done, 1 a bad command line, 2 an error (no tokenizer.json; a file missing, empty, not UTF-8 or "
      "of fewer than 2 tokens; --context under 2 or over the model's), 3 an internal error.");
  ppl_cmd->add_option("--model", ppl.model_dir, "HuggingFace checkpoint directory with its tokenizer.json")->required();
  ppl_cmd->add_option("--file", ppl.file, "the text to score (UTF-8), tokenized as a plain prompt is")->required();
  ppl_cmd->add_option("--context", ppl.context,
                      "window length in tokens, at least 2 and at most the model's context (0: 512, or the model's "
                      "context when smaller)");
  ppl_cmd->add_option("--max-tokens", ppl.max_tokens, "use only the file's first N tokens (0: all)")
      ->check(integer_in(std::int64_t(0), std::numeric_limits<std::int64_t>::max()));
  ppl_cmd->add_option("--max-batched-tokens", ppl.max_batched_tokens,
                      "tokens in one model step: a longer window runs in several steps (as chunked prefill does)")
      ->check(integer_in(1, 1 << 20));
  ppl_cmd->add_option("--device", ppl.device, "auto (a GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  asynct::cli::add_precision_options(ppl_cmd, ppl.kv_cache_dtype, ppl.quantization);
  asynct::cli::add_cpu_reference_flag(ppl_cmd, ppl.cpu_reference);
  ppl_cmd->add_option("--json", ppl.json_path, "write the results (with each window's) as JSON to this file too");

  asynct::TokenizeOptions tok;
  CLI::App* tok_cmd = app.add_subcommand(
      "tokenize", "Text on stdin to token ids (space-separated), or ids to text with --decode");
  auto* tok_file = tok_cmd->add_option("--tokenizer", tok.tokenizer_path, "a HuggingFace tokenizer.json");
  auto* tok_model = tok_cmd->add_option("--model", tok.model_dir, "a checkpoint directory: reads DIR/tokenizer.json");
  tok_file->excludes(tok_model);
  tok_model->excludes(tok_file);
  tok_cmd->add_flag("--decode", tok.decode, "read whitespace-separated ids and write their text");
  tok_cmd->add_flag("--skip-special", tok.skip_special, "with --decode, leave special tokens out");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // prints the help, or the error
  }
  try {
#ifdef ASYNCT_WITH_CUDA
    // The kernels' tuning switches (ASYNCT_GEMM, ASYNCT_PREFILL, ...; kernels/common/tuning.h)
    // come from the environment here, at the program's edge, and nowhere else.
    asynct::kernels::set_kernel_tuning(
        asynct::kernels::parse_kernel_tuning([](const char* name) { return std::getenv(name); }));
#endif
    if (*demo_cmd) return asynct::run_attention_demo(demo);
    if (*tok_cmd) return asynct::run_tokenize(tok, std::cin, std::cout);
    if (*ppl_cmd) return asynct::run_perplexity(ppl);
    if (*cal_cmd) return asynct::run_calibrate(cal);
    if (*serve_cmd) {
      // The API key from the environment is read here, at the program's edge, and nowhere else.
      const char* key = std::getenv("ASYNCT_API_KEY");
      if (serve.api_key.empty() && key && *key) {
        const std::string problem = asynct::api_key_problem(key);
        asynct::check(problem.empty(), "ASYNCT_API_KEY ", problem);
        serve.api_key = key;
      }
      return asynct::run_serve(serve);
    }
    if (*bench_cmd) return asynct::run_scenarios(bench);
    if (*init_cmd) {
      const bool from_file = init_size != "tiny" && init_size != "1.7b";
      asynct::check(!from_file || init_cmd->get_option("--arch")->count() == 0,
                    "init-checkpoint: --arch comes from the config.json given to --config; leave it out");
      const auto config = from_file ? asynct::load_config(init_size)
                                    : asynct::builtin_config(asynct::architecture_from_name(init_arch), init_size);
      std::printf("writing %s %s (%lld parameters, random, seed %llu) to %s\n", init_size.c_str(),
                  config.architecture_name().c_str(), static_cast<long long>(config.parameter_count()),
                  static_cast<unsigned long long>(init_seed), init_out.c_str());
      asynct::write_random_checkpoint(config, init_seed, init_out);
      return 0;
    }
    return asynct::run_generate(gen);  // also the default job
  } catch (const asynct::Error& e) {
    std::fprintf(stderr, "asynct: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asynct: internal error: %s\n", e.what());
    return 3;
  }
}
