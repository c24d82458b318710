#include "text/tool_prompt.h"

#include <cctype>

#include "text/jinja/value.h"

namespace asynct::text {
namespace {

using json = nlohmann::ordered_json;

bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string dumps(const json& value) { return jinja::py_json_dumps(value, jinja::DumpOptions{}); }

// What the system message gains: the tools, one JSON object a line, and the form of a call.
std::string tools_section(const json& tools) {
  std::string s =
      "# Tools\n\nYou can call the functions below to help with the user's request. Their signatures, "
      "one JSON object a line, are inside <tools></tools>:\n<tools>";
  for (const json& tool : tools) s += "\n" + dumps(tool);
  s += "\n</tools>\n\nTo call a function, answer with one JSON object holding its name and arguments inside ";
  s += std::string(kToolCallOpen) + std::string(kToolCallClose) + " tags, one pair a call:\n";
  s += std::string(kToolCallOpen) + "\n{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n" +
       std::string(kToolCallClose);
  return s;
}

std::string content_text(const json& message) {
  const auto it = message.find("content");
  return it != message.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

bool template_reads_tools(const std::string& source) {
  for (std::size_t at = source.find("tools"); at != std::string::npos; at = source.find("tools", at + 1)) {
    const bool starts = at == 0 || !identifier_char(source[at - 1]);
    const bool ends = at + 5 == source.size() || !identifier_char(source[at + 5]);
    if (starts && ends) return true;
  }
  return false;
}

std::string tool_call_json(const std::string& name, const json& arguments) {
  return dumps(json{{"name", name}, {"arguments", arguments}});
}

json messages_with_tools(const json& messages, const json& tools) {
  json out = json::array();
  const bool has_tools = tools.is_array() && !tools.empty();
  if (has_tools && (messages.empty() || messages[0].value("role", "") != "system"))
    out.push_back({{"role", "system"}, {"content", tools_section(tools)}});
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string role = m.value("role", "");
    if (i == 0 && role == "system" && has_tools) {
      json system = m;
      const std::string text = content_text(m);
      system["content"] = text + (text.empty() ? "" : "\n\n") + tools_section(tools);
      out.push_back(system);
    } else if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      json assistant = m;
      std::string text = content_text(m);
      for (const json& call : m["tool_calls"]) {
        const json& function = call.contains("function") ? call["function"] : call;
        if (!text.empty()) text += "\n";
        text += std::string(kToolCallOpen) + "\n" +
                tool_call_json(function.value("name", ""), function.value("arguments", json::object())) + "\n" +
                std::string(kToolCallClose);
      }
      assistant.erase("tool_calls");
      assistant["content"] = text;
      out.push_back(assistant);
    } else if (role == "tool") {
      std::string results;
      for (; i < messages.size() && messages[i].value("role", "") == "tool"; ++i)
        results += (results.empty() ? "" : "\n") + std::string("<tool_response>\n") + content_text(messages[i]) +
                   "\n</tool_response>";
      --i;
      out.push_back({{"role", "user"}, {"content", results}});
    } else {
      out.push_back(m);
    }
  }
  return out;
}

}  // namespace asynct::text
