// ModelText (text/model_text.h) on the Qwen3 tokenizer files: the special tokens a plain prompt
// gets (none for Qwen3; bos_token with add_bos_token), chats through the Qwen3 and SmolLM2
// templates (system message, enable_thinking), chat_template.jinja before tokenizer_config.json,
// the output text, and every error named with its file.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "text/model_text.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"
#include <nlohmann/json.hpp>
#include "text_model_dir.h"

namespace {

namespace fs = std::filesystem;
using asynct::ChatFormat;
using asynct::ModelText;
using asynct::testing::read_json;
using asynct::testing::write_json;

class ModelTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(asynct::testing::copy_qwen3_tokenizer(dir_.dir(), &why)) << why;
  }
  const asynct::text::Tokenizer& tokenizer() {
    static const asynct::text::Tokenizer t =
        asynct::text::Tokenizer::from_file(asynct::testing::qwen3_tokenizer_file("tokenizer.json"));
    return t;
  }
  std::vector<std::int32_t> ids(const std::string& prompt, const ChatFormat& chat = {}) {
    return ModelText::open(dir_.dir(), chat)->prompt_ids(prompt, "--prompt 0");
  }
  std::string error(const ChatFormat& chat, const std::string& prompt = "hi") {
    try {
      ModelText::open(dir_.dir(), chat)->prompt_ids(prompt, "--prompt 0");
    } catch (const asynct::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::string config_path() const { return dir_.file("tokenizer_config.json"); }

  asynct::testing::TempDir dir_{"asynct_model_text"};
};

ChatFormat chat(const std::string& system = "", bool thinking = true) {
  ChatFormat c;
  c.enabled = true;
  c.system = system;
  c.thinking = thinking;
  return c;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(ModelTextTest, Qwen3PlainPromptsGetNoSpecialTokens) {
  EXPECT_EQ(ids("Hello, world"), tokenizer().encode("Hello, world"));
  EXPECT_EQ(ids("Hello, world").front(), 9707);  // "Hello", as HuggingFace's tokenizer gives it
  EXPECT_TRUE(contains(ModelText::open(dir_.dir(), {})->summary(), "no BOS"));
}

TEST_F(ModelTextTest, AddBosTokenPutsTheBosTokenFirst) {
  auto config = read_json(config_path());
  config["add_bos_token"] = true;
  config["bos_token"] = "<|endoftext|>";
  write_json(config_path(), config);
  const std::vector<std::int32_t> got = ids("Hello");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], 151643);
  EXPECT_EQ(got[1], 9707);
  // As an AddedToken object too; add_eos_token appends.
  config["bos_token"] = {{"content", "<|endoftext|>"}, {"special", true}};
  config["add_eos_token"] = true;
  config["eos_token"] = "<|im_end|>";
  write_json(config_path(), config);
  EXPECT_EQ(ids("Hello"), (std::vector<std::int32_t>{151643, 9707, 151645}));
  // A chat gets nothing added: the template writes its own special tokens.
  EXPECT_EQ(ids("Hello", chat()), tokenizer().encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"));

  config["bos_token"] = nullptr;
  write_json(config_path(), config);
  EXPECT_TRUE(contains(error({}), "add_bos_token is true but bos_token is not set")) << error({});
  config["bos_token"] = "<no such token>";
  write_json(config_path(), config);
  EXPECT_TRUE(contains(error({}), "bos_token '<no such token>' is not a token of")) << error({});
  config["bos_token"] = "<|endoftext|>";
  config["add_bos_token"] = "yes";
  write_json(config_path(), config);
  EXPECT_TRUE(contains(error({}), "tokenizer_config.json: add_bos_token must be true or false")) << error({});
}

TEST_F(ModelTextTest, Qwen3ChatTemplate) {
  EXPECT_EQ(ids("Hi", chat()), tokenizer().encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(ids("Hi", chat("Be brief.", /*thinking=*/false)),
            tokenizer().encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(contains(ModelText::open(dir_.dir(), chat("", false))->summary(), "enable_thinking false"));
}

TEST_F(ModelTextTest, SmolLM2ChatTemplateAndThinkingItDoesNotHave) {
  auto config = read_json(config_path());
  const auto smollm2 = read_json(std::string(ASYNCT_TEXT_SOURCE_DIR) + "/data/smollm2_tokenizer_config.json");
  config["chat_template"] = smollm2["chat_template"];
  write_json(config_path(), config);
  EXPECT_EQ(ids("Hi", chat()),
            tokenizer().encode("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                               "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(ids("Hi", chat("Short answers.")),
            tokenizer().encode("<|im_start|>system\nShort answers.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\n"));
  const std::string e = error(chat("", /*thinking=*/false));
  EXPECT_TRUE(contains(e, "--no-thinking")) << e;
  EXPECT_TRUE(contains(e, "does not read enable_thinking")) << e;
  EXPECT_TRUE(contains(e, config_path())) << e;
}

// Tools: a template that renders them (Qwen3's) gets them as the `tools` variable; one without a
// section for them (SmolLM2's) gets them written into the messages (text/tool_prompt.h): the tools
// at the end of the system message, earlier calls in the assistant's content, results as a user
// turn of <tool_response> blocks.
TEST_F(ModelTextTest, ToolsThroughTheTemplateOrWrittenIntoTheMessages) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": "Weather in Bern?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "sunny"}])");
  ChatFormat server;
  server.load_if_present = true;
  const auto rendered = [&](const nlohmann::ordered_json& t) {
    const std::vector<std::int32_t> ids = ModelText::open(dir_.dir(), server)->chat_ids(messages, t);
    return tokenizer().decode(ids);
  };
  const std::string qwen3 = rendered(tools);
  EXPECT_TRUE(contains(qwen3, "# Tools")) << qwen3;
  EXPECT_TRUE(contains(qwen3, R"({"type": "function", "function": {"name": "get_weather")")) << qwen3;
  EXPECT_TRUE(contains(qwen3, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}\n</tool_call>"))
      << qwen3;
  EXPECT_TRUE(contains(qwen3, "<tool_response>\n21 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>")) << qwen3;

  auto config = read_json(config_path());
  config["chat_template"] = read_json(std::string(ASYNCT_TEXT_SOURCE_DIR) + "/data/smollm2_tokenizer_config.json")["chat_template"];
  write_json(config_path(), config);
  const std::string smollm2 = rendered(tools);
  EXPECT_EQ(smollm2.rfind("<|im_start|>system\n# Tools\n", 0), 0u) << smollm2;
  EXPECT_TRUE(contains(smollm2, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                                "{\"type\": \"object\"}}}\n</tools>")) << smollm2;
  EXPECT_TRUE(contains(smollm2, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                                "\"Bern\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n21 C\n</tool_response>\n"
                                "<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n")) << smollm2;
  // Without tools, the earlier calls are still written out, and no tools section is added.
  const std::string no_tools = rendered(nullptr);
  EXPECT_FALSE(contains(no_tools, "# Tools")) << no_tools;
  EXPECT_TRUE(contains(no_tools, "You are a helpful AI assistant named SmolLM")) << no_tools;
  EXPECT_TRUE(contains(no_tools, "<tool_call>")) << no_tools;
}

TEST_F(ModelTextTest, ChatTemplateJinjaComesFirst) {
  std::ofstream(dir_.file("chat_template.jinja")) << "[{{ messages[0]['content'] }}]";
  EXPECT_EQ(ids("Hi", chat()), tokenizer().encode("[Hi]"));
  EXPECT_TRUE(contains(ModelText::open(dir_.dir(), chat())->summary(), "chat_template.jinja"));
}

TEST_F(ModelTextTest, ChatErrorsNameTheFile) {
  auto config = read_json(config_path());
  config.erase("chat_template");
  write_json(config_path(), config);
  std::string e = error(chat());
  EXPECT_TRUE(contains(e, "has no chat_template")) << e;
  EXPECT_TRUE(contains(e, config_path())) << e;
  EXPECT_EQ(ids("Hi"), tokenizer().encode("Hi"));  // plain prompts do not need one

  config["chat_template"] = "{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}";
  write_json(config_path(), config);
  e = error(chat());
  EXPECT_TRUE(contains(e, "nosuchfilter")) << e;
  EXPECT_TRUE(contains(e, "--prompt 0") || contains(e, config_path())) << e;

  config["chat_template"] = "{{ raise_exception('only system messages') }}";
  write_json(config_path(), config);
  e = error(chat());
  EXPECT_TRUE(contains(e, "--prompt 0: the chat template in " + config_path())) << e;
  EXPECT_TRUE(contains(e, "only system messages")) << e;

  fs::remove(config_path());
  e = error(chat());
  EXPECT_TRUE(contains(e, "has no chat template")) << e;
  EXPECT_EQ(ids("Hi"), tokenizer().encode("Hi"));  // no tokenizer_config.json: nothing added
}

TEST_F(ModelTextTest, TokenizerErrorsNameTheFile) {
  auto spec = read_json(dir_.file("tokenizer.json"));
  spec["normalizer"] = {{"type", "NFKC"}};
  write_json(dir_.file("tokenizer.json"), spec);
  std::string e = error({});
  EXPECT_TRUE(contains(e, dir_.file("tokenizer.json"))) << e;
  EXPECT_TRUE(contains(e, "NFKC")) << e;
  fs::remove(dir_.file("tokenizer.json"));
  e = error({});
  EXPECT_TRUE(contains(e, "has no tokenizer.json")) << e;
  EXPECT_TRUE(contains(e, "--prompt-ids")) << e;
}

TEST_F(ModelTextTest, PromptsAndSystemMessagesMustBeUtf8) {
  EXPECT_TRUE(contains(error({}, "ok\xC3("), "--prompt 0 is not valid UTF-8 (byte 2)")) << error({}, "ok\xC3(");
  EXPECT_TRUE(contains(error(chat("\xFF")), "--system is not valid UTF-8")) << error(chat("\xFF"));
}

TEST_F(ModelTextTest, OutputTextAndTokenBytes) {
  const auto text = ModelText::open(dir_.dir(), {});
  const std::vector<std::int32_t> hello = tokenizer().encode("Hello, world");
  auto out = text->output({", w"});
  std::string shown;
  for (const std::int32_t id : hello) shown += out->push(id);
  shown += out->finish();
  EXPECT_EQ(shown, "Hello");
  EXPECT_TRUE(out->stopped());
  EXPECT_EQ(out->stop_string(), ", w");
  EXPECT_EQ(text->token_bytes(9707), "Hello");
  EXPECT_EQ(text->token_bytes(151700), "");  // past the tokenizer, inside Qwen3's 151936
  EXPECT_EQ(text->vocab_size(), 151669);
  EXPECT_THROW(text->output({""}), asynct::Error);
}

}  // namespace
