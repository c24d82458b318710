#include "text/chat_template.h"

#include "core/error.h"
#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"

namespace asynct {

ChatTemplate::ChatTemplate(const std::string& source)
    : body_(std::make_shared<const jinja::Body>(jinja::parse(source))) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  return jinja::render(*body_, variables);
}

std::string ChatTemplate::render(const nlohmann::json& variables) const {
  return jinja::render(*body_, nlohmann::ordered_json::parse(variables.dump()));
}

std::string chat_template_source(const nlohmann::ordered_json& config, const std::string& name) {
  check(config.is_object(), "tokenizer_config.json must be a JSON object");
  auto it = config.find("chat_template");
  check(it != config.end() && !it->is_null(), "tokenizer_config.json has no chat_template");
  if (it->is_string()) return it->get<std::string>();
  check(it->is_array(), "tokenizer_config.json's chat_template must be a string or a list of {name, template}");
  for (const auto& entry : *it) {
    if (entry.is_object() && entry.value("name", "") == name && entry.contains("template") && entry["template"].is_string())
      return entry["template"].get<std::string>();
  }
  throw Error("tokenizer_config.json has no chat template named '" + name + "'");
}

namespace {
// A special token as tokenizer_config.json writes it: a string or an AddedToken object.
std::optional<std::string> token_text(const nlohmann::ordered_json& t, const std::string& what) {
  if (t.is_null()) return std::nullopt;
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  throw Error("tokenizer_config.json's " + what + " must be a string, null or {\"content\": ...}");
}
}  // namespace

nlohmann::ordered_json chat_template_variables(const nlohmann::ordered_json& config,
                                               const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                               const nlohmann::ordered_json& extra) {
  check(config.is_object(), "tokenizer_config.json must be a JSON object");
  check(messages.is_array(), "chat messages must be a JSON list, got ", messages.type_name());
  check(tools.is_null() || tools.is_array(), "chat tools must be a JSON list or null, got ", tools.type_name());
  check(extra.is_object(), "extra chat template variables must be a JSON object, got ", extra.type_name());
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  v["messages"] = messages;
  v["tools"] = tools;
  v["documents"] = nullptr;
  v["add_generation_prompt"] = add_generation_prompt;
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto it = config.find(name);
    if (it == config.end()) continue;
    if (auto text = token_text(*it, name); text && !text->empty()) v[name] = *text;
  }
  if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array() && !it->empty()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : *it)
      if (auto text = token_text(t, "additional_special_tokens")) list.push_back(*text);
    v["additional_special_tokens"] = list;
  }
  for (const auto& [key, value] : extra.items()) v[key] = value;
  return v;
}

}  // namespace asynct
