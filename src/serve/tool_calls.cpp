#include "serve/tool_calls.h"

#include <cctype>
#include <optional>
#include <random>
#include <set>

#include "serve/openai_api.h"
#include "text/tool_prompt.h"

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;

constexpr std::size_t kMaxTools = 128;   // OpenAI's limit
constexpr std::size_t kMaxNameLength = 64;
constexpr const char* kWhitespace = " \t\n\r";

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (const char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

// One tool, checked: its function's name.
std::string check_tool(const json& tool, std::size_t i) {
  const std::string param = "tools[" + std::to_string(i) + "]";
  if (!tool.is_object()) throw bad("tools", param + " must be an object {\"type\": \"function\", \"function\": {...}}");
  if (tool.value("type", json()) != json("function")) throw bad("tools", param + ".type must be \"function\"");
  const auto function = tool.find("function");
  if (function == tool.end() || !function->is_object()) throw bad("tools", param + ".function must be an object");
  const auto name = function->find("name");
  if (name == function->end() || !name->is_string() || !valid_name(name->get<std::string>()))
    throw bad("tools", param + ".function.name must be 1-64 letters, digits, _ or -");
  if (const auto d = function->find("description"); d != function->end() && !d->is_null() && !d->is_string())
    throw bad("tools", param + ".function.description must be a string");
  if (const auto p = function->find("parameters"); p != function->end() && !p->is_null() && !p->is_object())
    throw bad("tools", param + ".function.parameters must be a JSON schema object");
  if (const auto s = function->find("strict"); s != function->end() && !s->is_null() && !s->is_boolean())
    throw bad("tools", param + ".function.strict must be a boolean");
  return name->get<std::string>();
}

json call_schema(const json& function) {
  const auto p = function.find("parameters");
  const json parameters = p != function.end() && p->is_object() ? *p : json{{"type", "object"}};
  return {{"type", "object"},
          {"properties", {{"name", {{"const", function["name"]}}}, {"arguments", parameters}}},
          {"required", {"name", "arguments"}}};
}

// A block's JSON as a call, when it is one: {"name": a string, "arguments": an object (or a
// string holding one), absent: {}}.
std::optional<ToolCall> block_call(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  json arguments = json::object();
  if (const auto a = j.find("arguments"); a != j.end()) {
    arguments = a->is_string() ? json::parse(a->get<std::string>(), nullptr, false) : *a;
    if (arguments.is_discarded() || !arguments.is_object()) return std::nullopt;
  }
  return ToolCall{new_tool_call_id(), name->get<std::string>(), arguments.dump()};
}

}  // namespace

ChatTools parse_tools(const json& body) {
  ChatTools out;
  const auto tools_it = body.find("tools");
  const bool has_list = tools_it != body.end() && !tools_it->is_null();
  std::set<std::string> names;
  if (has_list) {
    if (!tools_it->is_array()) throw bad("tools", "tools must be a list of functions");
    if (tools_it->size() > kMaxTools)
      throw bad("tools", "tools holds " + std::to_string(tools_it->size()) + " functions; at most " + std::to_string(kMaxTools));
    for (std::size_t i = 0; i < tools_it->size(); ++i)
      if (!names.insert(check_tool((*tools_it)[i], i)).second)
        throw bad("tools", "tools[" + std::to_string(i) + "]: a second function named '" + (*tools_it)[i]["function"]["name"].get<std::string>() + "'");
  }
  const bool any = !names.empty();
  if (const auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null() && !p->is_boolean())
    throw bad("parallel_tool_calls", "parallel_tool_calls must be a boolean");

  const auto choice = body.find("tool_choice");
  out.choice.mode = any ? ToolChoice::Mode::Auto : ToolChoice::Mode::None;
  if (choice != body.end() && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string mode = choice->get<std::string>();
      if (mode == "none")
        out.choice.mode = ToolChoice::Mode::None;
      else if (mode == "auto" || mode == "required")
        out.choice.mode = mode == "auto" ? ToolChoice::Mode::Auto : ToolChoice::Mode::Required;
      else
        throw bad("tool_choice", "tool_choice '" + mode.substr(0, 32) + "' is not none, auto, required or {\"type\": \"function\", ...}");
    } else if (choice->is_object()) {
      const auto function = choice->find("function");
      if (choice->value("type", json()) != json("function") || function == choice->end() || !function->is_object() ||
          !function->contains("name") || !(*function)["name"].is_string())
        throw bad("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
      out.choice.mode = ToolChoice::Mode::Named;
      out.choice.name = (*function)["name"].get<std::string>();
      if (!names.count(out.choice.name))
        throw bad("tool_choice", "tool_choice names '" + out.choice.name.substr(0, 64) + "', which is not one of the tools");
    } else {
      throw bad("tool_choice", "tool_choice must be a string or an object");
    }
    if (out.choice.mode != ToolChoice::Mode::None && !any)
      throw bad("tool_choice", "tool_choice asks for a tool call, but the request has no tools");
  }
  if (out.choice.mode != ToolChoice::Mode::None) out.tools = *tools_it;
  return out;
}

std::string forced_call_schema(const ChatTools& tools) {
  json options = json::array();
  for (const json& tool : tools.tools) {
    const json& function = tool["function"];
    if (tools.choice.mode == ToolChoice::Mode::Named && function["name"] != tools.choice.name) continue;
    options.push_back(call_schema(function));
  }
  return options.size() == 1 ? options[0].dump() : json{{"anyOf", options}}.dump();
}

AnswerPart ToolCallReader::push(const std::string& text) {
  const std::string_view open = text::kToolCallOpen, close = text::kToolCallClose;
  AnswerPart out;
  pending_ += text;
  for (;;) {
    if (in_block_) {
      const std::size_t end = pending_.find(close);
      if (end == std::string::npos) return out;
      emit_block(pending_.substr(0, end), out);
      pending_.erase(0, end + close.size());
      in_block_ = false;
      continue;
    }
    const std::size_t start = pending_.find(open);
    if (start != std::string::npos) {
      emit_text(pending_.substr(0, start), out);
      pending_.erase(0, start + open.size());
      in_block_ = true;
      continue;
    }
    // Held: the longest end of the text that begins the tag.
    std::size_t keep = std::min(pending_.size(), open.size() - 1);
    while (keep > 0 && open.compare(0, keep, pending_, pending_.size() - keep, keep) != 0) --keep;
    emit_text(pending_.substr(0, pending_.size() - keep), out);
    pending_.erase(0, pending_.size() - keep);
    return out;
  }
}

AnswerPart ToolCallReader::finish() {
  AnswerPart out;
  if (in_block_) {
    // A block the answer did not close: a call when its JSON is one, else text.
    if (std::optional<ToolCall> call = block_call(pending_)) {
      whitespace_.clear();
      out.calls.push_back(std::move(*call));
    } else {
      emit_text(std::string(text::kToolCallOpen) + pending_, out);
    }
  } else {
    emit_text(pending_, out);
  }
  pending_.clear();
  in_block_ = false;
  whitespace_.clear();  // whitespace at the end is not part of the text
  return out;
}

void ToolCallReader::emit_text(std::string text, AnswerPart& out) {
  if (after_call_) {
    const std::size_t first = text.find_first_not_of(kWhitespace);
    if (first == std::string::npos) return;
    text.erase(0, first);
    after_call_ = false;
  }
  const std::size_t last = text.find_last_not_of(kWhitespace);
  if (last == std::string::npos) {
    whitespace_ += text;
    return;
  }
  out.content += whitespace_;
  out.content.append(text, 0, last + 1);
  whitespace_ = text.substr(last + 1);
}

void ToolCallReader::emit_block(const std::string& body, AnswerPart& out) {
  if (std::optional<ToolCall> call = block_call(body)) {
    whitespace_.clear();  // whitespace before a call is not part of the text
    after_call_ = true;
    out.calls.push_back(std::move(*call));
    return;
  }
  emit_text(std::string(text::kToolCallOpen) + body + std::string(text::kToolCallClose), out);
}

void AnswerPart::add(AnswerPart&& later) {
  content += later.content;
  for (ToolCall& call : later.calls) calls.push_back(std::move(call));
}

AnswerPart ToolCallReader::push(const std::string& text, bool last) {
  AnswerPart part = push(text);
  if (last) part.add(finish());
  return part;
}

AnswerPart read_tool_calls(const std::string& answer) { return ToolCallReader().push(answer, true); }

std::string new_tool_call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, int(sizeof(kAlphabet)) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(generator)];
  return id;
}

}  // namespace asynct::serve
