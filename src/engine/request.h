// What goes into the engine and comes out of it: a request (prompt, limits, sampling, callbacks),
// each generated token as its stream sees it, and a finished request's output.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/logit_summary.h"
#include "core/sampling_params.h"
#include "engine/token_constraint.h"

namespace asynct {

// What a request's stream sees, one per generated token.
struct GeneratedToken {
  std::int64_t request_id = 0;
  std::int32_t token = 0;
  float logprob = 0.0f;                    // when the request asks for logprobs (>= 0); else 0
  std::vector<TopLogprob> top_logprobs;    // when it asks for logprobs > 0; else empty
};

struct Request {
  std::vector<std::int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  // Added to these tokens' logits before anything else at every draw (SamplingParams' step 0);
  // checked with validate_logit_bias. Logprobs stay the model's own.
  std::vector<LogitBias> logit_bias;
  // Structured output: makes the sequence's constraint (one per sequence, each choice of a group
  // its own). Its mask applies at every token, after the bias and penalties; a constrained
  // request decodes a token a step, never chained ahead or drafted (each mask needs the token
  // before), and ends with "stop" once the constraint is complete. Empty: unconstrained.
  TokenConstraintFactory constraint;
  // The request ends when it generates any of these (each in the vocabulary); empty: it runs
  // to max_tokens.
  std::vector<std::int32_t> eos_token_ids;
  // The request ends with finish_reason "stop" when it generates any of these (each in the
  // vocabulary); the token is kept in the output, as an end-of-sequence token is.
  std::vector<std::int32_t> stop_token_ids;
  // Called for every generated token, in order, from inside Engine::step(). Returning false
  // ends the request now with finish_reason "stop" (a stop string matched; a client left).
  // An exception from it ends the request the same way, and is rethrown from step() once the
  // step is fully applied; the requests that finished in that step come from the next step().
  std::function<bool(const GeneratedToken&)> on_token;
  // Asked after each chunk of the prompt (chunked prefill) that yields no token yet: true ends
  // the request there with finish_reason "abort", with its choices not yet forked (a client
  // that left, a server shutting down), instead of at its first token, after the whole prompt.
  std::function<bool()> cancelled;
};

struct RequestOutput {
  std::int64_t id = 0;
  std::vector<std::int32_t> tokens;  // generated tokens
  // "eos" (an end-of-sequence token; before the others), "stop" (a stop token, or on_token
  // ended it), "length" (max_tokens), "abort" (Engine::abort_waiting, Request::cancelled).
  std::string finish_reason;
  int preemptions = 0;
  // Prompt tokens it did not compute when it first ran: found in the prefix cache, or (a forked
  // choice, Engine::add_request_group) shared with its group's first.
  int cached_tokens = 0;
  std::vector<float> first_logits;   // with EngineOptions::record_first_logits
  std::vector<float> logprobs;       // [tokens] when sampling.logprobs >= 0: each token's, under the raw logits
  std::vector<std::vector<TopLogprob>> top_logprobs;  // [tokens] when sampling.logprobs > 0
};

}  // namespace asynct
