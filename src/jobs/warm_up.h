// Untimed requests through a fresh engine before it serves or is timed. They pay the one-time
// costs of the shapes they run (lazy kernel loading, cuBLASLt plans, the first touch and growth
// of the runner's buffers, the first decode graphs: a decode shape runs eagerly the first time
// and is captured the second), which otherwise fall on the first real requests (history V35).
#pragma once

#include <functional>

#include "core/sampling_params.h"
#include "engine/engine.h"

namespace asynct {

struct WarmUp {
  int requests = 1;       // together, typically one prefill step of the token budget
  int prompt_tokens = 1;  // each; ids are a fixed pattern
  int output_tokens = 4;  // each, end tokens ignored: a few decode steps of `requests` sequences
  // Request i's sampling (default: greedy).
  std::function<SamplingParams(int)> sampling;
};

// Runs the warm-up's requests to completion, then zeroes the engine's statistics. The prompts
// stay in the prefix cache as any finished request's do (evicted first when blocks run out).
void warm_up_engine(Engine& engine, const WarmUp& warm_up, int vocab_size);

// A server's warm-up: prompts of up to 1024 tokens filling one step of `step_tokens`, at most
// `max_num_seqs` of them, within `context` tokens each and `cache_tokens` in all; every other
// one sampled (the device sampler's kernels), the rest greedy.
WarmUp server_warm_up(int step_tokens, int max_num_seqs, int context, long long cache_tokens);

}  // namespace asynct
