// The asynct command line. Until the engine lands, its job is the reference attention demo.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "cli/attention_demo.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"asynct: inference for AsyncT and Qwen3 language models"};
  app.require_subcommand(0, 1);

  asynct::cli::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "Run the reference attention (async and softmax gates) on a built-in batch");
  demo_cmd->add_option("--q-heads", demo.num_q_heads, "query heads")->check(CLI::Range(1, 256));
  demo_cmd->add_option("--kv-heads", demo.num_kv_heads, "KV heads (divides --q-heads)")
      ->check(CLI::Range(1, 256));
  demo_cmd->add_option("--head-dim", demo.head_dim, "head dimension")->check(CLI::Range(1, 1024));
  demo_cmd->add_option("--block-size", demo.block_size, "paged-cache block size")
      ->check(CLI::Range(1, 4096));
  demo_cmd->add_option("--window", demo.pool_window, "async gate pool window W")
      ->check(CLI::Range(1, 64));
  demo_cmd->add_option("--seed", demo.seed, "random seed");

  CLI11_PARSE(app, argc, argv);
  try {
    // With no subcommand, the demo is the default job.
    return asynct::cli::run_attention_demo(demo);
  } catch (const asynct::Error& e) {
    std::fprintf(stderr, "asynct: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asynct: internal error: %s\n", e.what());
    return 3;
  }
}
