// A checkpoint's text, for the jobs (`asynct generate`, perplexity) and the server: its tokenizer
// files turn prompts and chats into token ids and generated ids back into text.
//
// Files: DIR/tokenizer.json (the tokenizer; text/tokenizer.h), DIR/tokenizer_config.json
// (special tokens, add_bos_token, the chat template) and DIR/chat_template.jinja (a chat
// template saved apart, which transformers prefers to tokenizer_config.json's).
//
// Special tokens around a plain prompt, as HuggingFace's tokenizer(text) adds them: the
// tokenizer.json post-processors asynct reads (none, ByteLevel) add nothing, and the
// tokenizer_config.json flags add_bos_token / add_eos_token (absent: false) put bos_token
// first / eos_token last, as LlamaTokenizer(Fast) does. Qwen3 (add_bos_token false, bos_token
// null, a ByteLevel post-processor) gets none; SmolLM2 (GPT2Tokenizer, no add_bos_token) gets
// none; a Llama 2 style config with add_bos_token true gets its <s>. (Llama 3's tokenizer.json
// adds <|begin_of_text|> through a TemplateProcessing post-processor, which the tokenizer
// refuses by name.) A chat prompt is the template's text tokenized with nothing added, as
// apply_chat_template(tokenize=True) does: the template writes its own special tokens.
//
// A chat is one user message (the prompt), after an optional system message, rendered with
// add_generation_prompt = true; with thinking off the template gets enable_thinking = false
// (Qwen3's templates read it: an empty <think></think> block that skips the reasoning).
//
// Everything is checked when the files are opened, before the model is loaded. In a build
// without text support (no PCRE2 or ICU when it was configured) open() throws an Error that
// says so and how to get it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace asynct {

struct ChatFormat {
  bool enabled = false;  // render prompts through the chat template
  // Load the chat template when the directory has one, for chat_ids(), without rendering
  // prompt_ids() through it (a server's completions and chats); no template is no error.
  bool load_if_present = false;
  std::string system;    // the system message; empty: none
  bool thinking = true;  // false: enable_thinking = false (the template must read it)
};

// One request's output text (text::CompletionText): ids in, the text safe to show out.
class OutputText {
 public:
  virtual ~OutputText() = default;
  virtual std::string push(std::int32_t id) = 0;
  virtual std::string finish() = 0;
  virtual bool stopped() const = 0;
  virtual const std::string& stop_string() const = 0;
};

class ModelText {
 public:
  // Throws Error naming the file: no tokenizer.json, a tokenizer feature asynct does not
  // implement, a bad tokenizer_config.json, add_bos_token without a bos_token the tokenizer
  // knows; with chat: no chat template, a template asynct's interpreter refuses, a system
  // message that is not UTF-8, thinking off for a template that does not read enable_thinking.
  static std::unique_ptr<ModelText> open(const std::string& model_dir, const ChatFormat& chat);
  virtual ~ModelText() = default;

  // The prompt's token ids (see the top of this file); `what` names the prompt in errors
  // ("--prompt 2"): text that is not valid UTF-8, a chat template that raises an error.
  // add_special false: the tokenizer's ids alone, no BOS or EOS (HuggingFace's
  // add_special_tokens=False; a chat-formatted prompt is rendered either way).
  virtual std::vector<std::int32_t> prompt_ids(const std::string& prompt, const std::string& what,
                                               bool add_special = true) const = 0;
  // Whether chat_ids() can render (the template loaded: ChatFormat enabled or load_if_present).
  virtual bool has_chat_template() const = 0;
  // A whole chat's ids: `messages` ([{"role", "content"}], contents UTF-8; an assistant's may
  // carry tool_calls, role "tool" a tool's result) and `tools` (OpenAI's function list, or null)
  // through the chat template with add_generation_prompt (as given), tokenized as prompt_ids()
  // tokenizes a chat. A template without a section for tools gets them written into the messages
  // (text/tool_prompt.h). Throws Error without a template, for content that is not valid UTF-8
  // or a template that raises.
  virtual std::vector<std::int32_t> chat_ids(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools = nullptr,
                                             bool add_generation_prompt = true) const = 0;
  // A new request's output text, ending before the first of the stop strings (each non-empty
  // UTF-8, else Error). Special tokens and ids the tokenizer lacks add no text.
  virtual std::unique_ptr<OutputText> output(const std::vector<std::string>& stop_strings) const = 0;
  // A token's bytes (a token can hold part of a UTF-8 character); empty for an id the
  // tokenizer does not have.
  virtual std::string token_bytes(std::int32_t id) const = 0;
  // One more than the largest id the tokenizer has.
  virtual std::int32_t vocab_size() const = 0;
  // For the run's header: "tokenizer 151669 tokens, no BOS, chat template".
  virtual std::string summary() const = 0;
};

// The whole of a text file given by an option (`option` names it in errors, e.g. "--file"); a
// missing, unreadable or empty file, or a directory, is an Error saying there is nothing to
// `use` (e.g. "score").
std::string read_text_file(const std::string& path, const std::string& option, const std::string& use);

// Whether this build reads text (ASYNCT_WITH_TEXT).
bool have_text_support();

// The message for a text feature used in a build without text support.
std::string no_text_support_message(const std::string& feature);

}  // namespace asynct
