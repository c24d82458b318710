// Chat templates: the Jinja program in a HuggingFace tokenizer_config.json ("chat_template")
// that turns a conversation into the model's prompt text. asynct carries its own interpreter of
// the Jinja subset these templates use (src/text/jinja/), rendering as Python's jinja2 does in
// HuggingFace transformers' environment (trim_blocks, lstrip_blocks, loop controls, a `tojson`
// that keeps non-ASCII, `raise_exception`, `strftime_now`). A construct outside that subset is
// an asynct::Error naming it and its line:column, never output that might differ.
//
//   ChatTemplate t(chat_template_source(config));
//   std::string prompt = t.render(chat_template_variables(config, messages, tools, true));
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace asynct {

namespace jinja {
struct Node;
}

class ChatTemplate {
 public:
  // Parses the template; a syntax error or unsupported statement throws asynct::Error.
  explicit ChatTemplate(const std::string& source);

  // variables: a JSON object, one member per template variable. Use ordered_json: key order
  // shows in the output (tojson of a tool definition keeps its keys in the given order).
  std::string render(const nlohmann::ordered_json& variables) const;
  // nlohmann::json keeps object keys sorted, so dicts print sorted.
  std::string render(const nlohmann::json& variables) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body_;
};

// The template in a tokenizer_config.json: "chat_template" as a string, or the entry `name` of
// a list of {"name", "template"}. Throws asynct::Error when there is none.
std::string chat_template_source(const nlohmann::ordered_json& tokenizer_config, const std::string& name = "default");

// The variables transformers' apply_chat_template passes: messages, tools (null when none),
// documents (null), add_generation_prompt, the tokenizer's special tokens that are set
// (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token as strings,
// whether the config writes them as strings or {"content": ...} objects;
// additional_special_tokens as a list of strings), then every member of `extra`
// (e.g. {"enable_thinking": false}), which wins over a special token of the same name.
nlohmann::ordered_json chat_template_variables(const nlohmann::ordered_json& tokenizer_config,
                                               const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                               const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

}  // namespace asynct
