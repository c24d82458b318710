// Tool calls in the form Qwen3's and the Hermes templates teach:
//
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Bern"}}
//   </tool_call>
//
// A chat template with a section for tools (one that reads the variable `tools`, as Qwen3's does)
// renders the tools, an assistant's earlier calls and the tools' results itself. For a template
// without one (SmolLM2's, Llama 2's), messages_with_tools() writes them into plain messages that
// any template renders: the tools and the call format described at the end of the system message
// (one is added first when the chat has none), each earlier call written into its assistant
// message's content in the form above, and each run of tool results made one user message of
// <tool_response> blocks. The server parses the model's answer in the same form either way
// (serve/tool_calls.h).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace asynct::text {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

// Whether a chat template's source reads the variable `tools` (then it renders tools itself).
bool template_reads_tools(const std::string& template_source);

// One call as the form above writes it between its tags: {"name": ..., "arguments": ...} as
// Python's json.dumps writes it (", " and ": ", non-ASCII kept). arguments: a JSON value (an
// object for a well-formed call).
std::string tool_call_json(const std::string& name, const nlohmann::ordered_json& arguments);

// The chat for a template without a tools section (see the top). messages: checked chat messages
// ({role, content}, an assistant's with tool_calls [{id?, type?, function: {name, arguments}}],
// role "tool" for results); tools: OpenAI's list of {"type": "function", "function": {...}}, or
// null. Messages without tool parts pass unchanged.
nlohmann::ordered_json messages_with_tools(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools);

}  // namespace asynct::text
