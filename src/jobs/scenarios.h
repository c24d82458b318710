// The benchmark scenarios (`asynct bench`): the four end-to-end scenarios of docs/DESIGN.md §7 and
// single-stream decode, AsyncT against Qwen3 on the same engine, with a progress line, a table
// and a JSON file.
#pragma once

#include <cstdint>
#include <string>

#include "engine/drafter.h"
#include <vector>

namespace asynct {

struct ScenarioOptions {
  std::string config = "auto";  // tiny, 1.7b, or auto: 1.7b on the GPU, tiny on the CPU
  int scale = 0;                // divide every length by this; 0: 1 on the GPU, 64 on the CPU
  std::string only;             // run one scenario by name (scenario_names())
  std::string model_dir;        // a checkpoint to run `only` on, instead of both built-in models
  std::string json_path;        // where to write the results as JSON; empty: no file
  std::uint64_t seed = 0;
  int block_size = 16;
  int max_batched_tokens = 8192;
  std::string device = "auto";  // auto, cpu or cuda
  std::string kv_cache_dtype = "auto";  // auto, bf16 or fp8 (models/kv_cache_format.h)
  std::string quantization = "none";    // none or fp8 (RunnerOptions::quantization)
  bool cpu_reference = false;            // the CPU reference runner (RunnerOptions::cpu_reference)
  // Per-phase GPU times (CUDA events). Off by default: the events cost a decode step ~0.015-0.02
  // ms at 32 sequences on H200 (each waits for the work before it, so consecutive steps no
  // longer overlap; bench/RESULTS.md).
  bool profile = false;
  bool cuda_graphs = true;      // replay decode steps as CUDA graphs (timed as "decode_graph")
  bool pipeline = true;         // queue greedy decode steps ahead (EngineOptions::pipeline_steps)
  SpeculativeOptions speculative;  // drafts verified a step (engine/drafter.h); off by default
  bool warmup = true;           // an untimed short run on each engine before the timed one
  int repeat = 1;               // timed runs per scenario and model (median reported; the
                                // order of the two models alternates between runs)
};

// Every scenario's name, in the order they run.
std::vector<std::string> scenario_names();

// Runs the chosen scenarios on both models and prints the results; returns the exit code.
int run_scenarios(const ScenarioOptions& options);

}  // namespace asynct
