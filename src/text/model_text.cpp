#include "text/model_text.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#ifdef ASYNCT_WITH_TEXT
#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/completion_text.h"
#include "text/tokenizer.h"
#include "text/tool_prompt.h"
#include "text/utf8.h"
#endif

namespace asynct {

std::string no_text_support_message(const std::string& feature) {
  return feature +
         " needs text support, which this build of asynct does not have (it was configured without PCRE2 and ICU: "
         "scripts/setup.sh installs them, libpcre2-dev and libicu-dev; then configure again with -DASYNCT_TEXT=ON); "
         "--prompt-ids takes token ids";
}

std::string read_text_file(const std::string& path, const std::string& option, const std::string& use) {
  std::error_code ec;
  check(std::filesystem::exists(path, ec), option, " ", path, ": no such file");
  check(!std::filesystem::is_directory(path, ec), option, " ", path, " is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  check(bool(in), option, " ", path, ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  check(!in.bad(), option, " ", path, ": cannot be read");
  check(!text.str().empty(), option, " ", path, " is empty: there is nothing to ", use);
  return text.str();
}

#ifndef ASYNCT_WITH_TEXT

bool have_text_support() { return false; }

std::unique_ptr<ModelText> ModelText::open(const std::string&, const ChatFormat&) {
  throw Error(no_text_support_message("a text prompt (--prompt)"));
}

#else

bool have_text_support() { return true; }

namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), "cannot read '", path, "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A special token as tokenizer_config.json writes it: a string, {"content": ...} or null.
std::optional<std::string> config_token(const nlohmann::ordered_json& config, const char* name, const std::string& path) {
  const auto it = config.find(name);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  throw Error(path + ": " + name + " must be a string, null or {\"content\": ...}");
}

bool config_flag(const nlohmann::ordered_json& config, const char* name, const std::string& path) {
  const auto it = config.find(name);
  if (it == config.end() || it->is_null()) return false;
  check(it->is_boolean(), path, ": ", name, " must be true or false");
  return it->get<bool>();
}

class CompletionOutput final : public OutputText {
 public:
  CompletionOutput(const text::Tokenizer& tokenizer, std::vector<std::string> stops)
      : text_(tokenizer, std::move(stops)) {}
  std::string push(std::int32_t id) override { return text_.push(id); }
  std::string finish() override { return text_.finish(); }
  bool stopped() const override { return text_.stopped(); }
  const std::string& stop_string() const override { return text_.stop_string(); }

 private:
  text::CompletionText text_;
};

class TokenizerFiles final : public ModelText {
 public:
  TokenizerFiles(const std::string& dir, const ChatFormat& chat)
      : tokenizer_(load_tokenizer(dir)), chat_(chat) {
    const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
    if (fs::exists(config_path)) {
      try {
        config_ = nlohmann::ordered_json::parse(read_file(config_path));
      } catch (const nlohmann::json::exception& e) {
        throw Error(config_path + " is not valid JSON: " + e.what());
      }
      check(config_.is_object(), config_path, ": not a JSON object");
    }
    // The special tokens a plain prompt gets (the rule at the top of model_text.h).
    const auto special_id = [&](const char* flag, const char* name) -> std::optional<std::int32_t> {
      if (!config_flag(config_, flag, config_path)) return std::nullopt;
      const std::optional<std::string> token = config_token(config_, name, config_path);
      check(token.has_value(), config_path, ": ", flag, " is true but ", name, " is not set");
      const std::optional<std::int32_t> id = tokenizer_.token_to_id(*token);
      check(id.has_value(), config_path, ": ", name, " '", *token, "' is not a token of ", dir, "/tokenizer.json");
      return id;
    };
    bos_ = special_id("add_bos_token", "bos_token");
    eos_ = special_id("add_eos_token", "eos_token");

    if (!chat.enabled && !chat.load_if_present) return;
    // transformers reads chat_template.jinja before tokenizer_config.json's chat_template.
    const std::string jinja_path = (fs::path(dir) / "chat_template.jinja").string();
    std::string source;
    if (!chat.enabled && !fs::exists(jinja_path) &&
        (config_.is_null() || !config_.contains("chat_template") || config_["chat_template"].is_null()))
      return;  // no template, and none asked for
    if (fs::exists(jinja_path)) {
      template_path_ = jinja_path;
      source = read_file(jinja_path);
    } else {
      template_path_ = config_path;
      check(!config_.is_null(), "--chat: ", dir, " has no chat template (no tokenizer_config.json or chat_template.jinja)");
      check(config_.contains("chat_template") && !config_["chat_template"].is_null(), "--chat: ", config_path,
            " has no chat_template (and there is no chat_template.jinja): this model has no chat format");
      try {
        source = chat_template_source(config_);
      } catch (const Error& e) {
        throw Error(config_path + ": " + e.what());
      }
    }
    try {
      template_.emplace(source);
    } catch (const Error& e) {
      throw Error("the chat template in " + template_path_ + ": " + e.what());
    }
    reads_tools_ = text::template_reads_tools(source);
    check(chat.thinking || source.find("enable_thinking") != std::string::npos, "--no-thinking: the chat template in ",
          template_path_, " does not read enable_thinking (a Qwen3-style switch), so it cannot be turned off");
    const auto bad = text::find_invalid_utf8(chat.system);
    check(!bad, "--system is not valid UTF-8 (byte ", bad.value_or(0), ")");
    if (config_.is_null()) config_ = nlohmann::ordered_json::object();
  }

  std::vector<std::int32_t> prompt_ids(const std::string& prompt, const std::string& what, bool add_special) const override {
    const auto bad = text::find_invalid_utf8(prompt);
    check(!bad, what, " is not valid UTF-8 (byte ", bad.value_or(0), ")");
    if (template_ && chat_.enabled) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!chat_.system.empty()) messages.push_back({{"role", "system"}, {"content", chat_.system}});
      messages.push_back({{"role", "user"}, {"content", prompt}});
      nlohmann::ordered_json extra = nlohmann::ordered_json::object();
      if (!chat_.thinking) extra["enable_thinking"] = false;
      return render_chat(messages, extra, what + ": ", true);
    }
    std::vector<std::int32_t> ids;
    if (bos_ && add_special) ids.push_back(*bos_);
    tokenizer_.encode(prompt, ids);
    if (eos_ && add_special) ids.push_back(*eos_);
    return ids;
  }

  bool has_chat_template() const override { return template_.has_value(); }

  std::vector<std::int32_t> chat_ids(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                     bool add_generation_prompt) const override {
    check(template_.has_value(), "this model has no chat template (tokenizer_config.json's chat_template or chat_template.jinja)");
    for (const auto& m : messages) {
      const auto content = m.find("content");
      if (content == m.end() || !content->is_string()) continue;
      const auto bad = text::find_invalid_utf8(content->get<std::string>());
      check(!bad, "a message's content is not valid UTF-8 (byte ", bad.value_or(0), ")");
    }
    if (reads_tools_) return render_chat(messages, nlohmann::ordered_json::object(), "", add_generation_prompt, tools);
    return render_chat(text::messages_with_tools(messages, tools), nlohmann::ordered_json::object(), "", add_generation_prompt);
  }

  std::unique_ptr<OutputText> output(const std::vector<std::string>& stop_strings) const override {
    return std::make_unique<CompletionOutput>(tokenizer_, stop_strings);
  }

  std::string token_bytes(std::int32_t id) const override {
    return tokenizer_.has_token(id) ? std::string(tokenizer_.token_bytes(id)) : std::string();
  }

  std::int32_t vocab_size() const override { return tokenizer_.vocab_size(); }

  std::string summary() const override {
    std::string s = "tokenizer of " + std::to_string(tokenizer_.vocab_size()) + " tokens";
    if (template_ && chat_.enabled) return s + ", chat template " + fs::path(template_path_).filename().string() +
                          (chat_.thinking ? "" : " (enable_thinking false)");
    return s + (bos_ ? ", BOS " + std::to_string(*bos_) : ", no BOS") + (eos_ ? ", EOS appended" : "");
  }

 private:
  // The chat through the template, tokenized with nothing added; the template's errors are
  // prefixed with `where` and the template's file.
  std::vector<std::int32_t> render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& extra,
                                        const std::string& where, bool add_generation_prompt,
                                        const nlohmann::ordered_json& tools = nullptr) const {
    std::string rendered;
    try {
      rendered = template_->render(chat_template_variables(config_, messages, tools, add_generation_prompt, extra));
    } catch (const Error& e) {
      throw Error(where + "the chat template in " + template_path_ + ": " + e.what());
    }
    return tokenizer_.encode(rendered);
  }

  static text::Tokenizer load_tokenizer(const std::string& dir) {
    const std::string path = (fs::path(dir) / "tokenizer.json").string();
    check(fs::exists(path), "a text prompt needs the model's tokenizer: ", dir,
          " has no tokenizer.json (--prompt-ids takes token ids)");
    return text::Tokenizer::from_file(path);  // its errors name the file
  }

  text::Tokenizer tokenizer_;
  ChatFormat chat_;
  nlohmann::ordered_json config_;  // null when the directory has no tokenizer_config.json
  std::optional<std::int32_t> bos_, eos_;
  std::optional<ChatTemplate> template_;
  bool reads_tools_ = false;  // the template renders tools itself
  std::string template_path_;
};

}  // namespace

std::unique_ptr<ModelText> ModelText::open(const std::string& model_dir, const ChatFormat& chat) {
  return std::make_unique<TokenizerFiles>(model_dir, chat);
}

#endif  // ASYNCT_WITH_TEXT

}  // namespace asynct
