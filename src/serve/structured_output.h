// Structured output (response_format json_object / json_schema, and forced tool calls): a
// request's schema, or any JSON, compiled by xgrammar into a grammar over the model's vocabulary, and each of the
// request's sequences given its own matcher as a TokenConstraint (engine/token_constraint.h):
// the mask before each token, every token taken, complete once the grammar took its stop token
// or matched with nothing but a stop token left to take (so a model without one still ends).
// Built without xgrammar (ASYNCT_HAVE_XGRAMMAR off in CMake), available() is false and compile()
// refuses with a 400 saying so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/token_constraint.h"

namespace asynct::serve {

struct ResponseFormat {
  enum class Kind { Text, JsonObject, JsonSchema };
  Kind kind = Kind::Text;
  std::string schema;  // JsonSchema: the schema's JSON text
};

class StructuredOutput {
 public:
  // tokenizer_json: the model's tokenizer.json (model.vocab and added_tokens name each id's
  // token); vocab_size: the model's (ids past the tokenizer's are never allowed); stop_ids: the
  // tokens that end a complete answer (the model's end-of-sequence tokens). Throws Error when the
  // file cannot be read.
  StructuredOutput(const std::string& tokenizer_json, int vocab_size, std::vector<std::int32_t> stop_ids);
  ~StructuredOutput();
  static bool available();
  // A factory of constraints for one request's sequences. Throws ApiError 400 naming
  // response_format for a schema xgrammar does not take, or when built without xgrammar.
  TokenConstraintFactory compile(const ResponseFormat& format) const;
  // A factory of constraints that make the answer one tool call (text/tool_prompt.h's form:
  // <tool_call>, a newline, the call's JSON following `call_schema`, a newline, </tool_call>, then
  // a stop token). Throws ApiError 400 naming tools as compile() does.
  TokenConstraintFactory compile_tool_call(const std::string& call_schema) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace asynct::serve
