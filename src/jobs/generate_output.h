// How `asynct generate` writes a finished request: the token-id line, the text with its label,
// the logprobs as a readable table, or everything as one JSON line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace asynct {

// A token's bytes by id (empty for an unknown id); null when there is no tokenizer.
using TokenBytes = std::function<std::string(std::int32_t)>;

struct FinishedRequest {
  std::size_t index = 0;          // in --prompt / --prompt-ids order
  std::size_t prompt_tokens = 0;
  const RequestOutput* output = nullptr;
  bool has_text = false;          // a text prompt: `text` is its output text
  std::string text;
  std::string stop_string;        // the stop string that ended the text, if one did
  // Seconds from the start of the run to its first token and to its end (the JSON line's timing:
  // bench/bench_speculative.py reads each request's generation rate from them); < 0: not timed.
  double first_token_s = -1, end_s = -1;
};

// A token's bytes in double quotes, readable on a terminal: valid UTF-8 as it is; newline, tab,
// carriage return, quote and backslash escaped as in C; other control bytes and bytes that are
// not valid UTF-8 as \xNN.
std::string quoted_token(std::string_view bytes);

// "request 0: prompt 3 tokens -> 1,2,3  (length)" (the form tests and scripts parse).
std::string token_line(const FinishedRequest& r);

// "--- request 1: 12 prompt tokens -> 16 tokens (stop at "\n\n") ---" for a labelled text.
std::string text_label(const FinishedRequest& r);
// "request 0: 12 prompt tokens -> 16 tokens (length)": a streamed request's summary line.
std::string summary_line(const FinishedRequest& r);

// One line per generated token: its position, id (and text), logprob, then the top-n.
std::string logprob_table(const FinishedRequest& r, const TokenBytes& token_bytes);

// {"request", "prompt_tokens", "token_ids", "finish_reason", ["text", "stop"], ["first_token_s",
// "end_s"], ["logprobs"]}:
// logprobs (when asked) as [{"id", ["token"], "logprob", "top_logprobs": [{"id", ["token"],
// "logprob"}]}], token texts as UTF-8 with U+FFFD for a partial character.
nlohmann::json request_json(const FinishedRequest& r, const TokenBytes& token_bytes);

// dump() that replaces invalid UTF-8 (a token's partial character) instead of throwing.
std::string json_line(const nlohmann::json& j);

}  // namespace asynct
