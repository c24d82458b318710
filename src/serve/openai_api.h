// The OpenAI API's completions and chat completions as asynct serves them (and vLLM's tokenize
// and detokenize bodies): a request body in, checked field by field; the response bodies and
// stream chunks out. No I/O: the HTTP server
// (serve/http_server.h) moves the bytes, the engine worker (serve/engine_worker.h) the tokens.
//
// Fields read (others are ignored, as OpenAI ignores unknown ones): model, prompt (a string,
// token ids, or a list of either: several prompts, whose choices are indexed prompt * n + j and
// whose usage adds up) or messages (role system / developer / user / assistant / tool, content a
// string or a list of text parts; an assistant's may hold tool_calls instead, a tool's names its
// tool_call_id), tools, tool_choice and parallel_tool_calls (serve/tool_calls.h), max_tokens (chat also max_completion_tokens), temperature,
// top_p, top_k, min_p, presence / frequency / repetition penalty, seed, stop (a string or up to
// 4), stream, stream_options.include_usage, n, logprobs (completions: how many top ones, 0-20;
// chat: true, with top_logprobs 0-20), logit_bias ({"token id": bias in [-100, 100]}, at most
// 300, added to the raw logits before everything else; logprobs stay the model's own), and
// response_format (text; json_object: any JSON object; json_schema: {"name", "schema", "strict"?}:
// output constrained token by token by the schema, serve/structured_output.h), and vLLM's
// ignore_eos (for benchmarks). A wrong type or a
// value out of range is an ApiError 400 naming the field, with OpenAI's error object; so is a
// field asynct does not implement (echo, best_of, suffix, and unless neutral the deprecated
// functions and function_call; response_format beside tools), rather than a silent
// approximation. n > 1 asks for n choices (seeds seed, seed + 1, ...). Without a seed, a request
// draws its seed from std::random_device (64 bits): sampled answers differ from one to the next.
//
// Defaults as OpenAI's: temperature 1, top_p 1; max_tokens 16 for completions, for chat the
// rest of the model's context.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/logit_summary.h"
#include "core/sampling_params.h"
#include "serve/structured_output.h"
#include "serve/tool_calls.h"

namespace asynct::serve {

// An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string type = "");
  int status;
  std::string type;   // invalid_request_error, not_found_error, rate_limit_error, server_error
  std::string param;  // the field at fault; empty: none
};
nlohmann::ordered_json error_body(const ApiError& error);

enum class Endpoint { Completions, ChatCompletions };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;
  // Completions: one or more prompts, each text or token ids (then its text is empty).
  struct Prompt {
    std::string text;
    std::vector<std::int32_t> ids;
  };
  std::vector<Prompt> prompts;
  nlohmann::ordered_json messages;           // chat: [{role, content (a string)}, tool_calls, tool_call_id]
  ChatTools tools;                           // chat: the tools the template shows and how calls are read
  int max_tokens = 0;                        // 0: not given (the endpoint's default)
  SamplingParams sampling;
  std::vector<LogitBias> logit_bias;         // ids not yet checked against the vocabulary (the route does)
  ResponseFormat response_format;            // text (none), json_object or json_schema
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;                   // generate max_tokens whatever the model says
  int n = 1;                                 // choices a prompt: choice j of prompt i is index i * n + j
  std::string system_fingerprint;            // the server's (set by it), in every body and chunk
};

// Parses and checks a request body (served_model: the name /v1/models lists; a request for
// another model is a 404). Throws ApiError.
CompletionRequest parse_completion_request(Endpoint endpoint, const std::string& body, const std::string& served_model);

// A chat body's "messages", checked as the chat route checks them: [{role, content (a string)}].
// Throws ApiError.
nlohmann::ordered_json parse_messages(const nlohmann::ordered_json& body);

// POST /tokenize (vLLM's): {"model"?, "prompt": text, "add_special_tokens"? (true)} or
// {"model"?, "messages": [...], "add_generation_prompt"? (true)}. Throws ApiError.
struct TokenizeRequest {
  bool chat = false;  // messages, not a prompt
  std::string prompt;
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // with messages: tools (as the chat route renders them), or null
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};
TokenizeRequest parse_tokenize_request(const std::string& body, const std::string& served_model);
// POST /detokenize (vLLM's): {"model"?, "tokens": [ids]}, each id in [0, vocab_size). Throws ApiError.
std::vector<std::int32_t> parse_detokenize_request(const std::string& body, const std::string& served_model,
                                                   std::int32_t vocab_size);

// A completions body whose token-id prompt was read apart: `body` with that array replaced by
// [], and its ids. nlohmann-json takes ~0.1 us an id (a 4160-id body ~0.45 ms on the
// development machine, most of a long cached prompt's parsing); this reads them ~10x faster.
struct PromptIdsApart {
  std::string body;
  std::vector<std::int32_t> ids;
};
// Only for a body with exactly one top-level "prompt" key (as sent, without escapes) whose value
// is a non-empty flat array of plain integers in [0, 2^31); otherwise (another form, a second
// "prompt", anything unusual) nullopt, and the whole body goes to nlohmann-json, whose errors
// and last-key-wins rule then apply. Parsing `body` gives the original's JSON but for the
// prompt.
std::optional<PromptIdsApart> prompt_ids_apart(const std::string& body);

// A generated token's log-probability and the most likely tokens' (when the request asks), with
// the token's bytes (a token can hold part of a UTF-8 character).
struct TokenLogprob {
  std::string token;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

// What a finished or streaming request reports.
struct Usage {
  std::int64_t prompt_tokens = 0, completion_tokens = 0;
  std::int64_t cached_tokens = 0;  // of the prompt's, found in the prefix cache (prompt_tokens_details)
};

// One choice of a whole response.
struct Choice {
  std::string text;  // with tools read (ChatTools::read_calls), the answer's text apart from its calls: empty is null
  std::string finish_reason;
  std::vector<TokenLogprob> logprobs;
  std::vector<ToolCall> tool_calls;
};

// The non-streaming response: each choice with its whole text (and its tokens' logprobs when
// asked; text_offset counts bytes of the text, as the tokens' bytes add up).
nlohmann::ordered_json completion_response(const CompletionRequest& request, const std::string& id, std::int64_t created,
                                           const std::vector<Choice>& choices, const Usage& usage);
// ... of one choice.
nlohmann::ordered_json completion_response(const CompletionRequest& request, const std::string& id, std::int64_t created,
                                           const std::string& text, const std::string& finish_reason, const Usage& usage,
                                           const std::vector<TokenLogprob>& logprobs = {});

// One stream chunk: `text` (may be empty), the logprobs of the tokens since the last chunk when
// asked, and, on the last one, the finish reason. The chat stream's first chunk carries the
// assistant role (first = true). `offset`: the text's bytes sent before this chunk; `index`: the
// choice's; `calls`: tool calls completed since the last chunk, each whole in its delta, indexed
// from `calls_before` (the choice's calls sent before).
nlohmann::ordered_json completion_chunk(const CompletionRequest& request, const std::string& id, std::int64_t created,
                                        const std::string& text, const std::string& finish_reason, bool first,
                                        const std::vector<TokenLogprob>& logprobs = {}, std::int64_t offset = 0,
                                        int index = 0, const std::vector<ToolCall>& calls = {}, int calls_before = 0);
// The chunk with the usage and no choices (stream_options.include_usage), before [DONE].
nlohmann::ordered_json usage_chunk(const CompletionRequest& request, const std::string& id, std::int64_t created,
                                   const Usage& usage);

// OpenAI's finish_reason for the engine's ("eos" and "stop" are both "stop"; an answer that
// stopped after calling tools: "tool_calls").
std::string openai_finish_reason(const std::string& engine_reason, bool called_tools = false);

}  // namespace asynct::serve
