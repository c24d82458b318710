// Picks the model backend: the CUDA runner when built with CUDA and a GPU is visible (or when
// asked for), the production CPU runner otherwise, the CPU reference runner when asked for
// (--cpu-reference).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/draft_model.h"
#include "engine/drafter.h"
#include "engine/model_runner.h"
#include "models/kv_cache_format.h"
#include "models/weights.h"

namespace asynct {

// "auto" -> "cuda" when this build has CUDA and a GPU is visible, else "cpu"; "cpu" and "cuda"
// stay (a "cuda" that cannot be had is an Error when the runner is made).
std::string resolve_device(const std::string& device);

// Throws an Error when the device ("cpu" or "cuda", as resolve_device returns) cannot run here:
// "cuda" in a build without CUDA or with no GPU visible. Cheap: call it before making weights.
void require_device(const std::string& device);

// The backend's name as models/kv_cache_format.h takes it: "cpu-reference" for the CPU with
// cpu_reference, else the device ("cpu" or "cuda").
std::string backend_name(const std::string& device, bool cpu_reference);

// resolve_device, where --cpu-reference asks for the CPU: "auto" is then "cpu", and "cuda" an Error.
std::string resolve_device(const std::string& device, bool cpu_reference);

struct RunnerOptions {
  std::string device = "auto";   // auto, cpu or cuda
  int num_blocks = 0;            // KV cache blocks
  int block_size = 16;
  int max_tokens_per_step = 2048;
  bool profile = false;          // time the phases of each step (CUDA backend)
  bool cuda_graphs = true;       // replay decode steps as CUDA graphs (CUDA backend)
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype: auto, bf16 or fp8 (resolve_kv_cache_dtype)
  // --quantization: "none" (the weights as loaded: bf16, or a checkpoint's FP8), "fp8"
  // (quantize_fp8 as they load) or "int8" (the production CPU backend's 8-bit integers:
  // CpuFastModelRunner quantizes bf16 weights as it starts).
  std::string quantization = "none";
  // --cpu-reference: on the CPU, the reference runner (float32 weights, float64 sums: the oracle
  // every backend is tested against) instead of the production one.
  bool cpu_reference = false;
};

// Checks the options a model runs with on `device` (as resolve_device gives it), before
// anything is loaded: the KV-cache type and the quantization (every backend reads FP8 weights; int8 only the production CPU backend). Throws
// Error naming the option. Returns the KV-cache type.
KvCacheDtype check_runner_options(const RunnerOptions& options, const std::string& device);

// What a run's header line says of its weights' format: ", FP8 weights", ", int8 weights" or "".
std::string weights_label(const std::string& quantization, const ModelConfig& config);

// Throws Error when "cuda" is asked for and not available; *chosen says which backend runs.
std::unique_ptr<ModelRunner> make_runner(ModelWeights weights, const RunnerOptions& options, std::string* chosen);

// --speculative draft's model (null for the other methods): the checkpoint at
// speculative.draft_model, on the target's backend with its options (as many KV blocks, each of
// the draft model's own size). Throws Error naming the option for --draft-model without
// --speculative draft or the reverse, a checkpoint that cannot be loaded, or a vocabulary other
// than the target's.
std::unique_ptr<DraftModel> make_draft_model(const SpeculativeOptions& speculative, const ModelConfig& target,
                                             const RunnerOptions& options);

}  // namespace asynct
