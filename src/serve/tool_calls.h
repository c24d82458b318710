// Tool calls on /v1/chat/completions: the request's `tools` and `tool_choice` checked, the JSON
// schema a forced call must follow, and the model's answer split into its text and its calls.
//
// The calls are read in the form text/tool_prompt.h describes (<tool_call>{"name", "arguments"}
// </tool_call>, Qwen3's and Hermes'): a block whose JSON is an object with a string name and an
// object of arguments is a call; any other block stays in the text as it was written. With tools
// in play, whitespace around the calls and at the end of the answer is not part of the text, and
// an answer that is only calls has no text (content null).
//
// tool_choice: "none" (the default without tools): tools are not shown to the model and its
// answer is text; "auto" (the default with tools): the model chooses, its calls are read from its
// answer; "required" / {"type": "function", "function": {"name"}}: the grammar makes the answer
// exactly one call, to any of the tools / to that one, whose arguments follow its parameters'
// schema (serve/structured_output.h). parallel_tool_calls is read (a boolean); "auto" reads every
// call the model writes, a forced choice makes one.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace asynct::serve {

struct ToolChoice {
  enum class Mode { None, Auto, Required, Named };
  Mode mode = Mode::None;
  std::string name;  // Named: the function's
};

struct ChatTools {
  nlohmann::ordered_json tools;  // OpenAI's list as sent (checked), or null: what the template renders
  ToolChoice choice;
  bool forced() const { return choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Named; }
  bool read_calls() const { return choice.mode != ToolChoice::Mode::None; }
};

// A chat body's tools, tool_choice and parallel_tool_calls. Each tool {"type": "function",
// "function": {"name" (1-64 of a-z A-Z 0-9 _ -, unique), "description"? (a string),
// "parameters"? (a JSON schema object), "strict"? (a boolean)}}, at most 128. Throws ApiError 400
// naming the field. With tool_choice "none", `tools` comes back null.
ChatTools parse_tools(const nlohmann::ordered_json& body);

// The JSON schema of a forced call's object {"name": ..., "arguments": ...}: the named function's,
// or any tool's (anyOf). Arguments follow the function's parameters (any object without them).
std::string forced_call_schema(const ChatTools& tools);

struct ToolCall {
  std::string id;         // "call_" and 24 random letters and digits, given as the call is read
  std::string name;
  std::string arguments;  // the arguments object as JSON text
};

// An answer read so far: its text safe to send now, the calls completed since.
struct AnswerPart {
  std::string content;
  std::vector<ToolCall> calls;
  void add(AnswerPart&& later);  // the part that follows this one
};

// Reads an answer as it streams: text that might still begin a <tool_call> block, or be the
// whitespace before one, is held back until the next text decides.
class ToolCallReader {
 public:
  AnswerPart push(const std::string& text);
  AnswerPart finish();  // the rest: held text, an unfinished block as text
  AnswerPart push(const std::string& text, bool last);  // push, and with `last` the finish too

 private:
  void emit_text(std::string text, AnswerPart& out);
  void emit_block(const std::string& body, AnswerPart& out);
  std::string pending_;       // text not yet given out
  bool in_block_ = false;     // pending_ is inside a <tool_call> block
  bool after_call_ = false;   // a call came and no text since: leading whitespace is dropped
  std::string whitespace_;    // whitespace held until text follows it
};

// A whole answer read at once (the same as one push() and finish()).
AnswerPart read_tool_calls(const std::string& answer);

// A new call id (OpenAI's form: "call_" and 24 random letters and digits).
std::string new_tool_call_id();

}  // namespace asynct::serve
