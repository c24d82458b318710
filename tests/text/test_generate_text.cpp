// `asynct generate` with text, run as a child process on a small random Qwen3 with the Qwen3
// tokenizer (text_model_dir.h): a text prompt streams its text, several are labelled, stop
// strings end the text before them (spanning tokens, at the very start, several, one that
// never completes) and end the request, stop token ids, logprobs readable and as JSON, chats,
// --prompt-ids on the same model, and each error with its exit code and message. The model's
// greedy output is deterministic: the stop strings are taken from a first run's text.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_asynct.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"
#include "text_model_dir.h"

namespace {

namespace fs = std::filesystem;
using asynct::testing::Outcome;
using asynct::testing::run_asynct;
using nlohmann::json;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// One model directory for the whole test program (~0.5 s to write).
class GenerateText : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<asynct::testing::TempDir>("asynct_generate_text");
    ready_ = asynct::testing::write_text_model(model(), &why_);
  }
  static void TearDownTestSuite() { dir_.reset(); }
  void SetUp() override { ASSERT_TRUE(ready_) << why_; }

  static std::string model() { return dir_->file("model"); }
  static std::string cwd() { return dir_->dir(); }
  static const asynct::text::Tokenizer& tokenizer() {
    static const asynct::text::Tokenizer t = asynct::text::Tokenizer::from_file(model() + "/tokenizer.json");
    return t;
  }
  // A directory with the model's config.json (no weights: enough for errors found before
  // they load) and tokenizer files changed by `edit`.
  static std::string variant(const std::string& name, const std::function<void(const std::string&)>& edit) {
    const std::string d = dir_->file(name);
    fs::create_directories(d);
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(model() + "/" + f, d + "/" + f, fs::copy_options::overwrite_existing);
    edit(d);
    return d;
  }

  static Outcome generate(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"generate", "--model", model()};
    all.insert(all.end(), args.begin(), args.end());
    return run_asynct(all, cwd(), 120);
  }
  // The JSON lines of a --json run, by request index.
  static std::vector<json> requests(const Outcome& o) {
    std::vector<json> out;
    std::istringstream lines(o.out);
    std::string line;
    while (std::getline(lines, line)) {
      const json j = json::parse(line);
      const std::size_t i = j.at("request").get<std::size_t>();
      if (out.size() <= i) out.resize(i + 1);
      out[i] = j;
    }
    return out;
  }
  // The text the tokenizer makes of ids, as the output shows it (special tokens and ids past
  // the tokenizer left out).
  static std::string decoded(const std::vector<std::int32_t>& ids) {
    std::vector<std::int32_t> known;
    for (const std::int32_t id : ids)
      if (tokenizer().has_token(id) && !tokenizer().is_special(id)) known.push_back(id);
    return tokenizer().decode(known);
  }

  static inline std::unique_ptr<asynct::testing::TempDir> dir_;
  static inline bool ready_ = false;
  static inline std::string why_;
};

const std::string kPrompt = "Hello, world";  // 3 tokens: "Hello" "," " world"

TEST_F(GenerateText, OneTextPromptStreamsItsText) {
  const Outcome json_run = generate({"--prompt", kPrompt, "--max-tokens", "12", "--json"});
  ASSERT_EQ(json_run.code, 0) << json_run.describe();
  const std::vector<json> r = requests(json_run);
  ASSERT_EQ(r.size(), 1u) << json_run.describe();
  EXPECT_EQ(r[0]["prompt_tokens"], 3);
  EXPECT_EQ(r[0]["finish_reason"], "length");
  const auto ids = r[0]["token_ids"].get<std::vector<std::int32_t>>();
  ASSERT_EQ(ids.size(), 12u);
  const std::string text = r[0]["text"];
  EXPECT_EQ(text, decoded(ids));
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(contains(json_run.err, "tokenizer of 151669 tokens, no BOS")) << json_run.describe();

  const Outcome streamed = generate({"--prompt", kPrompt, "--max-tokens", "12"});
  ASSERT_EQ(streamed.code, 0) << streamed.describe();
  EXPECT_EQ(streamed.out, text + "\n");  // only the text on stdout
  EXPECT_TRUE(contains(streamed.err, "request 0: 3 prompt tokens -> 12 tokens (length)")) << streamed.describe();
  EXPECT_TRUE(contains(streamed.err, "asynct generate: Qwen3ForCausalLM")) << streamed.describe();
}

TEST_F(GenerateText, SeveralPromptsPrintEachTextLabelled) {
  const Outcome one = generate({"--prompt", "Bonjour", "--max-tokens", "6", "--json"});
  ASSERT_EQ(one.code, 0) << one.describe();
  const std::string bonjour = requests(one).at(0)["text"];
  const Outcome both = generate({"--prompt", kPrompt, "--prompt", "Bonjour", "--max-tokens", "6"});
  ASSERT_EQ(both.code, 0) << both.describe();
  EXPECT_TRUE(contains(both.out, "--- request 1: 1 prompt tokens -> 6 tokens (length) ---\n" + bonjour + "\n"))
      << both.describe();
  EXPECT_TRUE(contains(both.out, "--- request 0: 3 prompt tokens -> 6 tokens (length) ---\n")) << both.describe();
}

// Stop strings built from a first run's text: one across the boundary between two tokens, one
// at the very start, several, and one that begins like the text but never completes.
TEST_F(GenerateText, StopStringsEndTheTextBeforeThemAndTheRequest) {
  const Outcome first = generate({"--prompt", kPrompt, "--max-tokens", "16", "--json"});
  ASSERT_EQ(first.code, 0) << first.describe();
  const auto ids = requests(first).at(0)["token_ids"].get<std::vector<std::int32_t>>();
  const std::string text = requests(first).at(0)["text"];
  ASSERT_EQ(ids.size(), 16u);

  // The last character of tokens [0, k) and the first of token k, where both are whole
  // characters and the pair is not in the text before.
  const auto char_length = [](const std::string& s, std::size_t at) {
    std::size_t n = 1;
    while (at + n < s.size() && (static_cast<unsigned char>(s[at + n]) & 0xC0) == 0x80) ++n;
    return n;
  };
  std::string across, before;
  std::size_t tokens_needed = 0;
  for (std::size_t k = 2; k + 1 < ids.size() && across.empty(); ++k) {
    const std::string head = decoded({ids.begin(), ids.begin() + std::ptrdiff_t(k)});
    const std::string upto = decoded({ids.begin(), ids.begin() + std::ptrdiff_t(k + 1)});
    if (head.empty() || upto.size() <= head.size() || upto.compare(0, head.size(), head) != 0 ||
        contains(head, "\xEF\xBF\xBD") || contains(upto, "\xEF\xBF\xBD"))
      continue;
    std::size_t last = head.size() - 1;
    while (last > 0 && (static_cast<unsigned char>(head[last]) & 0xC0) == 0x80) --last;
    const std::string stop = head.substr(last) + upto.substr(head.size(), char_length(upto, head.size()));
    if (text.find(stop) != last) continue;
    across = stop, before = head.substr(0, last), tokens_needed = k + 1;
  }
  ASSERT_FALSE(across.empty()) << "no stop string across two tokens in '" << text << "'";

  const Outcome stopped = generate({"--prompt", kPrompt, "--max-tokens", "16", "--json", "--stop", across});
  ASSERT_EQ(stopped.code, 0) << stopped.describe();
  const json s = requests(stopped).at(0);
  EXPECT_EQ(s["text"], before) << "stop '" << across << "' in '" << text << "'";
  EXPECT_EQ(s["finish_reason"], "stop");
  EXPECT_EQ(s["stop"], across);
  EXPECT_EQ(s["token_ids"].get<std::vector<std::int32_t>>(),
            std::vector<std::int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(tokens_needed)));
  const Outcome streamed = generate({"--prompt", kPrompt, "--max-tokens", "16", "--stop", across});
  ASSERT_EQ(streamed.code, 0) << streamed.describe();
  EXPECT_EQ(streamed.out, before + "\n");
  EXPECT_TRUE(contains(streamed.err, "tokens (stop at ")) << streamed.describe();

  const std::string first_char = text.substr(0, char_length(text, 0));
  const Outcome at_start = generate({"--prompt", kPrompt, "--max-tokens", "16", "--json", "--stop", first_char});
  ASSERT_EQ(at_start.code, 0) << at_start.describe();
  EXPECT_EQ(requests(at_start).at(0)["text"], "");
  EXPECT_EQ(requests(at_start).at(0)["finish_reason"], "stop");
  EXPECT_LT(requests(at_start).at(0)["token_ids"].size(), 16u);

  // The later stop string listed first: the text ends at the one that comes first.
  std::size_t last_char = text.size() - 1;
  while (last_char > 0 && (static_cast<unsigned char>(text[last_char]) & 0xC0) == 0x80) --last_char;
  const std::string later = text.substr(last_char);
  const Outcome several = generate({"--prompt", kPrompt, "--max-tokens", "16", "--json", "--stop", later, "--stop", across});
  ASSERT_EQ(several.code, 0) << several.describe();
  if (text.find(later) > text.find(across)) {
    EXPECT_EQ(requests(several).at(0)["text"], before);
  }

  const Outcome never = generate({"--prompt", kPrompt, "--max-tokens", "16", "--json", "--stop", across + "\x01"});
  ASSERT_EQ(never.code, 0) << never.describe();
  EXPECT_EQ(requests(never).at(0)["text"], text);
  EXPECT_EQ(requests(never).at(0)["finish_reason"], "length");
  EXPECT_FALSE(requests(never).at(0).contains("stop"));
}

TEST_F(GenerateText, StopTokenIdsEndTheRequestKeepingTheToken) {
  const Outcome first = generate({"--prompt", kPrompt, "--max-tokens", "10", "--json"});
  ASSERT_EQ(first.code, 0) << first.describe();
  const auto ids = requests(first).at(0)["token_ids"].get<std::vector<std::int32_t>>();
  ASSERT_EQ(ids.size(), 10u);
  const std::size_t end = std::size_t(std::find(ids.begin(), ids.end(), ids[4]) - ids.begin()) + 1;
  const Outcome o = generate({"--prompt", kPrompt, "--max-tokens", "10", "--json", "--stop-token-id", std::to_string(ids[4])});
  ASSERT_EQ(o.code, 0) << o.describe();
  const json r = requests(o).at(0);
  EXPECT_EQ(r["finish_reason"], "stop");
  EXPECT_EQ(r["token_ids"].get<std::vector<std::int32_t>>(), std::vector<std::int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(end)));
  EXPECT_EQ(r["text"], decoded(r["token_ids"].get<std::vector<std::int32_t>>()));
}

TEST_F(GenerateText, LogprobsReadableAndAsJson) {
  const Outcome o = generate({"--prompt", kPrompt, "--max-tokens", "5", "--logprobs", "3", "--json"});
  ASSERT_EQ(o.code, 0) << o.describe();
  const json r = requests(o).at(0);
  ASSERT_EQ(r["logprobs"].size(), 5u) << o.out;
  for (std::size_t t = 0; t < 5; ++t) {
    const json& e = r["logprobs"][t];
    EXPECT_EQ(e["id"], r["token_ids"][t]);
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(e["top_logprobs"][0]["id"], e["id"]);  // greedy: the most likely token
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_EQ(e["token"], decoded({e["id"].get<std::int32_t>()})) << e.dump();
  }
  const Outcome readable = generate({"--prompt", kPrompt, "--max-tokens", "5", "--logprobs", "2"});
  ASSERT_EQ(readable.code, 0) << readable.describe();
  const std::regex line("\n +[0-4]: [0-9]+ \"[^\n]*\" -?[0-9]+\\.[0-9]{4} \\| [0-9]+ \"[^\n]*\" -?[0-9.]+, [0-9]+ \"[^\n]*\" -?[0-9.]+");
  EXPECT_EQ(std::distance(std::sregex_iterator(readable.out.begin(), readable.out.end(), line), std::sregex_iterator()), 5)
      << readable.describe();
}

TEST_F(GenerateText, ChatPromptsGoThroughTheTemplate) {
  const Outcome o = generate({"--chat", "--system", "Be brief.", "--no-thinking", "--prompt", "Hi", "--max-tokens", "3", "--json"});
  ASSERT_EQ(o.code, 0) << o.describe();
  const std::string rendered =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(requests(o).at(0)["prompt_tokens"], tokenizer().encode(rendered).size());
  EXPECT_TRUE(contains(o.err, "chat template tokenizer_config.json (enable_thinking false)")) << o.describe();
}

TEST_F(GenerateText, PromptIdsStillGiveTokenIds) {
  const Outcome text_run = generate({"--prompt", kPrompt, "--max-tokens", "6", "--json"});
  ASSERT_EQ(text_run.code, 0) << text_run.describe();
  std::string prompt_ids;
  for (const std::int32_t id : tokenizer().encode(kPrompt)) {
    if (!prompt_ids.empty()) prompt_ids += ',';
    prompt_ids += std::to_string(id);
  }
  const Outcome ids_run = generate({"--prompt-ids", prompt_ids, "--max-tokens", "6"});
  ASSERT_EQ(ids_run.code, 0) << ids_run.describe();
  std::string expected = "request 0: prompt 3 tokens -> ";
  const auto ids = requests(text_run).at(0)["token_ids"].get<std::vector<std::int32_t>>();
  for (std::size_t t = 0; t < ids.size(); ++t) {
    if (t) expected += ',';
    expected += std::to_string(ids[t]);
  }
  EXPECT_TRUE(contains(ids_run.out, expected + "  (length)\n")) << ids_run.describe();
  EXPECT_TRUE(contains(ids_run.out, "asynct generate: ")) << "the header stays on stdout with token ids\n"
                                                          << ids_run.describe();
}

// Each error: its exit code (1 a bad command line, 2 an error) and a message that names it.
TEST_F(GenerateText, ErrorsSayWhatIsWrong) {
  const auto expect_error = [&](const std::vector<std::string>& args, int code, const std::vector<std::string>& parts) {
    const Outcome o = run_asynct(args, cwd(), 120);
    std::string shown;
    for (const std::string& a : args) shown += " '" + a + "'";
    EXPECT_EQ(o.code, code) << shown << "\n" << o.describe();
    for (const std::string& part : parts) EXPECT_TRUE(contains(o.err, part)) << shown << "\n" << o.describe();
    EXPECT_FALSE(contains(o.err, "internal error")) << o.describe();
    EXPECT_EQ(o.out, "") << shown << "\n" << o.describe();
  };
  const std::vector<std::string> gen = {"generate", "--model", model()};
  const auto with = [&](std::vector<std::string> base, const std::vector<std::string>& more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  expect_error(with(gen, {"--prompt", "caf\xC3"}), 2, {"--prompt 0 is not valid UTF-8 (byte 3)"});
  expect_error(with(gen, {"--prompt", kPrompt, "--max-tokens", "4094"}), 2,
               {"prompt (3 tokens) + --max-tokens (4094) = 4097 tokens is over the model's context of 4096 tokens"});
  expect_error(with(gen, {"--prompt", kPrompt, "--prompt-ids", "1,2"}), 1, {"--prompt", "--prompt-ids"});
  expect_error(with(gen, {"--prompt-ids", "1,2", "--stop", "x"}), 1, {"--stop", "--prompt"});
  expect_error(with(gen, {"--chat"}), 1, {"--chat", "--prompt"});
  expect_error(with(gen, {"--prompt", "x", "--system", "s"}), 1, {"--system", "--chat"});
  expect_error(with(gen, {"--prompt", "x", "--stop", ""}), 2, {"stop string 0 is empty"});
  expect_error({"generate", "--prompt", "hello"}, 2, {"needs --model DIR", "built-in asynct model has no tokenizer", "--prompt-ids"});

  const std::string no_template = variant("no_template", [](const std::string& d) {
    auto config = asynct::testing::read_json(d + "/tokenizer_config.json");
    config.erase("chat_template");
    asynct::testing::write_json(d + "/tokenizer_config.json", config);
  });
  expect_error({"generate", "--model", no_template, "--chat", "--prompt", "Hi"}, 2,
               {"--chat: " + no_template + "/tokenizer_config.json has no chat_template"});
  const std::string nfkc = variant("nfkc", [](const std::string& d) {
    auto spec = asynct::testing::read_json(d + "/tokenizer.json");
    spec["normalizer"] = {{"type", "NFKC"}};
    asynct::testing::write_json(d + "/tokenizer.json", spec);
  });
  expect_error({"generate", "--model", nfkc, "--prompt", "Hi"}, 2, {nfkc + "/tokenizer.json", "NFKC", "not supported"});
  const std::string no_tokenizer = variant("no_tokenizer", [](const std::string& d) { fs::remove(d + "/tokenizer.json"); });
  expect_error({"generate", "--model", no_tokenizer, "--prompt", "Hi"}, 2, {no_tokenizer + " has no tokenizer.json"});
  // A tokenizer that is not the model's: ids past its vocabulary.
  const std::string small_vocab = variant("small_vocab", [](const std::string& d) {
    auto config = asynct::testing::read_json(d + "/config.json");
    config["vocab_size"] = 256;
    asynct::testing::write_json(d + "/config.json", config);
  });
  expect_error({"generate", "--model", small_vocab, "--prompt", "Hello"}, 2,
               {"--prompt 0: the tokenizer gave token id 9707, outside the model's vocabulary [0, 256)"});
}

}  // namespace
