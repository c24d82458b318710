// `asynct demo`: the reference attention on a built-in example batch, with a readable summary.
#pragma once

#include <cstdint>
#include <string>

namespace asynct {

struct DemoOptions {
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int block_size = 16;
  int pool_window = 3;
  std::uint64_t seed = 0;
};

// Runs the demo and prints the summary; returns the process exit code.
int run_attention_demo(const DemoOptions& options);

}  // namespace asynct
