// Picks the model backend for the CLI: the CUDA runner when built with CUDA and a GPU is
// visible (or when asked for), the CPU reference runner otherwise.
#pragma once

#include <memory>
#include <string>

#include "engine/model_runner.h"
#include "models/weights.h"

namespace asynct::cli {

// "auto" -> "cuda" when this build has CUDA and a GPU is visible, else "cpu"; "cpu" and "cuda"
// stay (a "cuda" that cannot be had is an Error when the runner is made).
std::string resolve_device(const std::string& device);

// device: "auto", "cpu" or "cuda". Throws Error when "cuda" is asked for and not available.
// profile: time the phases of each step (CUDA backend; see ModelRunner::phase_times_ms).
std::unique_ptr<ModelRunner> make_runner(ModelWeights weights, const std::string& device, int num_blocks,
                                         int block_size, int max_tokens_per_step, std::string* chosen,
                                         bool profile = false);

}  // namespace asynct::cli
