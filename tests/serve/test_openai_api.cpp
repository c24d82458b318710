// The OpenAI request checks and response bodies (serve/openai_api.h), without a server.
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;

CompletionRequest parse(Endpoint e, const json& body) { return parse_completion_request(e, body.dump(), "m"); }

// The status and the field an ApiError names for a body.
std::pair<int, std::string> refusal(Endpoint e, const std::string& body) {
  try {
    parse_completion_request(e, body, "m");
  } catch (const ApiError& error) {
    return {error.status, error.param};
  }
  return {0, "accepted"};
}

TEST(OpenAiApi, DefaultsAreOpenAis) {
  const CompletionRequest c = parse(Endpoint::Completions, {{"model", "m"}, {"prompt", "hi"}});
  ASSERT_EQ(c.prompts.size(), 1u);
  EXPECT_EQ(c.prompts[0].text, "hi");
  EXPECT_EQ(c.max_tokens, 16);
  EXPECT_EQ(c.sampling.temperature, 1.0f);
  EXPECT_EQ(c.sampling.top_p, 1.0f);
  EXPECT_FALSE(c.stream);
  const CompletionRequest chat = parse(Endpoint::ChatCompletions, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(chat.max_tokens, 0);  // the rest of the context
  EXPECT_EQ(chat.messages[0]["content"], "hi");
}

TEST(OpenAiApi, ReadsEveryField) {
  const CompletionRequest r = parse(
      Endpoint::ChatCompletions,
      {{"model", "m"},
       {"messages", {{{"role", "developer"}, {"content", "be brief"}}, {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"max_completion_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 40}, {"min_p", 0.05},
       {"presence_penalty", 0.3}, {"frequency_penalty", -0.2}, {"repetition_penalty", 1.1}, {"seed", 12},
       {"stop", {"x", "yz"}}, {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"n", 1},
       {"unknown_field", {1, 2}}});
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.seed, 12u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(parse(Endpoint::Completions, {{"model", "m"}, {"prompt", {"one"}}, {"top_k", -1}}).sampling.top_k, 0);
  const CompletionRequest ids = parse(Endpoint::Completions, {{"model", "m"}, {"prompt", {5, 0, 7}}, {"ignore_eos", true}});
  EXPECT_EQ(ids.prompts.at(0).ids, (std::vector<std::int32_t>{5, 0, 7}));
  EXPECT_TRUE(ids.prompts[0].text.empty() && ids.ignore_eos);
  EXPECT_EQ(parse(Endpoint::Completions, {{"model", "m"}, {"prompt", {{3, 4}}}}).prompts.at(0).ids, (std::vector<std::int32_t>{3, 4}));
  // Several prompts: a list of strings, or of token-id lists.
  const CompletionRequest texts = parse(Endpoint::Completions, {{"model", "m"}, {"prompt", {"a", "b", "c"}}, {"n", 2}});
  ASSERT_EQ(texts.prompts.size(), 3u);
  EXPECT_EQ(texts.prompts[2].text, "c");
  EXPECT_EQ(texts.n, 2);
  const CompletionRequest lists = parse(Endpoint::Completions, {{"model", "m"}, {"prompt", {{1, 2}, {3}}}});
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(lists.prompts[1].ids, (std::vector<std::int32_t>{3}));
}

TEST(OpenAiApi, SeedlessRequestsDrawFreshSeeds) {
  const json body = {{"model", "m"}, {"prompt", "hi"}};
  const std::uint64_t a = parse(Endpoint::Completions, body).sampling.seed;
  const std::uint64_t b = parse(Endpoint::Completions, body).sampling.seed;
  const std::uint64_t c = parse(Endpoint::Completions, body).sampling.seed;
  EXPECT_FALSE(a == b && b == c);  // 64 random bits each: equal by chance once in 2^64
  json seeded = body;
  seeded["seed"] = 99;
  EXPECT_EQ(parse(Endpoint::Completions, seeded).sampling.seed, 99u);
  EXPECT_EQ(parse(Endpoint::Completions, seeded).sampling.seed, 99u);
}

TEST(OpenAiApi, RefusesBadBodiesNamingTheField) {
  const auto completions = [](const std::string& body) { return refusal(Endpoint::Completions, body); };
  const auto chat = [](const std::string& body) { return refusal(Endpoint::ChatCompletions, body); };
  EXPECT_EQ(completions("{not json"), (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(completions("[1, 2]"), (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(completions(R"({"prompt": "hi"})"), (std::pair<int, std::string>{400, "model"}));
  EXPECT_EQ(completions(R"({"model": "other", "prompt": "hi"})"), (std::pair<int, std::string>{404, "model"}));
  EXPECT_EQ(completions(R"({"model": "m"})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": 5})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": ["a", [1]]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": [[1], "a"]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": [[1], []]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": [[1], [-1]]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": [1, -2]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": [1, 2.5]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": []})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": [99999999999]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "ignore_eos": 1})"), (std::pair<int, std::string>{400, "ignore_eos"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "max_tokens": -1})"), (std::pair<int, std::string>{400, "max_tokens"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "max_tokens": 0})"), (std::pair<int, std::string>{400, "max_tokens"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "max_tokens": 1e3})"), (std::pair<int, std::string>{400, "max_tokens"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "max_tokens": 99999999999})"), (std::pair<int, std::string>{400, "max_tokens"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "temperature": "hot"})"), (std::pair<int, std::string>{400, "temperature"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "temperature": 2.5})"), (std::pair<int, std::string>{400, "temperature"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "top_p": 0})"), (std::pair<int, std::string>{400, "top_p"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]})"), (std::pair<int, std::string>{400, "stop"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "stop": [""]})"), (std::pair<int, std::string>{400, "stop"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "n": 0})"), (std::pair<int, std::string>{400, "n"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "n": 129})"), (std::pair<int, std::string>{400, "n"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "logprobs": 21})"), (std::pair<int, std::string>{400, "logprobs"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "logprobs": true})"), (std::pair<int, std::string>{400, "logprobs"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "stream": "yes"})"), (std::pair<int, std::string>{400, "stream"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}})"),
            (std::pair<int, std::string>{400, "stream_options"}));
  EXPECT_EQ(completions(R"({"model": "m", "prompt": "x", "seed": 1.5})"), (std::pair<int, std::string>{400, "seed"}));
  EXPECT_EQ(completions(std::string("{\"model\": \"m\", \"prompt\": \"\xff\"}")), (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": []})"), (std::pair<int, std::string>{400, "messages"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": "hi"})"), (std::pair<int, std::string>{400, "messages"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]})"),
            (std::pair<int, std::string>{400, "messages[0].role"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "user"}]})"), (std::pair<int, std::string>{400, "messages[0].content"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            (std::pair<int, std::string>{400, "messages[0].content[0]"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"),
            (std::pair<int, std::string>{400, "top_logprobs"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})"),
            (std::pair<int, std::string>{400, "top_logprobs"}));
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 1})"),
            (std::pair<int, std::string>{400, "logprobs"}));
  // Neutral values of what asynct does not implement are fine.
  EXPECT_EQ(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": false, "n": 1, "tools": []})"),
            (std::pair<int, std::string>{0, "accepted"}));
}

// Fields OpenAI honours and asynct does not implement yet: a 400 naming the field unless neutral.
TEST(OpenAiApi, RefusesUnimplementedFieldsUnlessNeutral) {
  const std::string chat_head = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], )";
  const auto chat = [&](const std::string& rest) { return refusal(Endpoint::ChatCompletions, chat_head + rest + "}"); };
  const auto completions = [](const std::string& rest) {
    return refusal(Endpoint::Completions, R"({"model": "m", "prompt": "x", )" + rest + "}");
  };
  using R = std::pair<int, std::string>;
  EXPECT_EQ(chat(R"("functions": [{"name": "f"}])"), (R{400, "functions"}));
  EXPECT_EQ(chat(R"("function_call": "auto")"), (R{400, "function_call"}));
  EXPECT_EQ(chat(R"("function_call": {"name": "f"})"), (R{400, "function_call"}));
  EXPECT_EQ(chat(R"("tool_choice": "auto")"), (R{400, "tool_choice"}));
  EXPECT_EQ(chat(R"("tool_choice": "required")"), (R{400, "tool_choice"}));
  EXPECT_EQ(chat(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"), (R{400, "tool_choice"}));
  // Their neutral values (and null) are accepted.
  EXPECT_EQ(chat(R"("response_format": {"type": "text"}, "logit_bias": {}, "functions": [], "function_call": "none",
                  "tool_choice": "none")"),
            (R{0, "accepted"}));
  EXPECT_EQ(chat(R"("response_format": null, "logit_bias": null, "functions": null, "function_call": null, "tool_choice": null)"),
            (R{0, "accepted"}));
  EXPECT_EQ(completions(R"("logit_bias": {})"), (R{0, "accepted"}));
}

// logit_bias: {"token id": bias in [-100, 100]}, at most 300 ids (the route checks them against
// the vocabulary); anything else a 400 naming the field.
TEST(OpenAiApi, ReadsLogitBias) {
  const std::string chat_head = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], )";
  const CompletionRequest r =
      parse_completion_request(Endpoint::ChatCompletions, chat_head + R"("logit_bias": {"50256": -100, "7": 2.5}})", "m");
  ASSERT_EQ(r.logit_bias.size(), 2u);
  std::map<std::int32_t, float> got;
  for (const LogitBias& b : r.logit_bias) got[b.id] = b.bias;
  EXPECT_EQ(got, (std::map<std::int32_t, float>{{7, 2.5f}, {50256, -100.0f}}));
  EXPECT_TRUE(parse_completion_request(Endpoint::Completions, R"({"model": "m", "prompt": "x", "logit_bias": null})", "m")
                  .logit_bias.empty());
  const auto completions = [](const std::string& rest) {
    return refusal(Endpoint::Completions, R"({"model": "m", "prompt": "x", )" + rest + "}");
  };
  using R = std::pair<int, std::string>;
  EXPECT_EQ(completions(R"("logit_bias": {"50256": -100})"), (R{0, "accepted"}));
  for (const char* bad : {R"([])", R"({"x": 1})", R"({"-3": 1})", R"({"1.5": 1})", R"({"99999999999": 1})",
                          R"({"5": 100.5})", R"({"5": -101})", R"({"5": "1"})", R"({"": 1})"})
    EXPECT_EQ(completions(std::string(R"("logit_bias": )") + bad), (R{400, "logit_bias"})) << bad;
  std::string many = "{";
  for (int i = 0; i < 301; ++i) many += (i ? ", \"" : "\"") + std::to_string(i) + "\": 1";
  EXPECT_EQ(completions(R"("logit_bias": )" + many + "}"), (R{400, "logit_bias"}));
}

// response_format: text, json_object, or json_schema with a name and a schema object; anything
// else a 400 naming the field.
TEST(OpenAiApi, ReadsResponseFormat) {
  const std::string head = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": )";
  const auto read = [&](const std::string& format) {
    return parse_completion_request(Endpoint::ChatCompletions, head + format + "}", "m").response_format;
  };
  EXPECT_EQ(read("null").kind, ResponseFormat::Kind::Text);
  EXPECT_EQ(read(R"({"type": "text"})").kind, ResponseFormat::Kind::Text);
  EXPECT_EQ(read(R"({"type": "json_object"})").kind, ResponseFormat::Kind::JsonObject);
  const ResponseFormat f =
      read(R"({"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "integer"}}})");
  EXPECT_EQ(f.kind, ResponseFormat::Kind::JsonSchema);
  EXPECT_EQ(nlohmann::json::parse(f.schema), nlohmann::json::parse(R"({"type": "integer"})"));
  using R = std::pair<int, std::string>;
  for (const char* bad : {R"("text")", R"({})", R"({"type": "xml"})", R"({"type": "json_schema"})",
                          R"({"type": "json_schema", "json_schema": {}})",
                          R"({"type": "json_schema", "json_schema": {"name": "n"}})",
                          R"({"type": "json_schema", "json_schema": {"name": "n", "schema": []}})",
                          R"({"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strict": "yes"}})"})
    EXPECT_EQ(refusal(Endpoint::ChatCompletions, head + bad + "}"), (R{400, "response_format"})) << bad;
}

// POST /tokenize and /detokenize bodies, in vLLM's shapes.
TEST(OpenAiApi, TokenizeAndDetokenizeBodies) {
  const TokenizeRequest prompt = parse_tokenize_request(R"({"model": "m", "prompt": "hi", "add_special_tokens": false})", "m");
  EXPECT_FALSE(prompt.chat);
  EXPECT_EQ(prompt.prompt, "hi");
  EXPECT_FALSE(prompt.add_special_tokens);
  const TokenizeRequest chat = parse_tokenize_request(R"({"messages": [{"role": "user", "content": "hi"}]})", "m");
  EXPECT_TRUE(chat.chat && chat.add_generation_prompt);
  EXPECT_EQ(chat.messages[0]["content"], "hi");
  const auto tokenize_refusal = [](const std::string& body) -> std::pair<int, std::string> {
    try {
      parse_tokenize_request(body, "m");
    } catch (const ApiError& e) {
      return {e.status, e.param};
    }
    return {0, "accepted"};
  };
  using R = std::pair<int, std::string>;
  EXPECT_EQ(tokenize_refusal(R"({})"), (R{400, "prompt"}));
  EXPECT_EQ(tokenize_refusal(R"({"prompt": "a", "messages": []})"), (R{400, "prompt"}));
  EXPECT_EQ(tokenize_refusal(R"({"prompt": 5})"), (R{400, "prompt"}));
  EXPECT_EQ(tokenize_refusal(R"({"prompt": "a", "model": "other"})"), (R{404, "model"}));
  EXPECT_EQ(tokenize_refusal(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"})"),
            (R{400, "add_generation_prompt"}));
  EXPECT_EQ(tokenize_refusal("[1]"), (R{400, ""}));
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [0, 5, 9]})", "m", 10), (std::vector<std::int32_t>{0, 5, 9}));
  EXPECT_TRUE(parse_detokenize_request(R"({"tokens": []})", "m", 10).empty());
  for (const char* body : {R"({"tokens": [10]})", R"({"tokens": [-1]})", R"({"tokens": [1.5]})", R"({"tokens": "1"})", R"({})"}) {
    try {
      parse_detokenize_request(body, "m", 10);
      ADD_FAILURE() << body << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(std::make_pair(e.status, e.param), (R{400, "tokens"})) << body;
    }
  }
}

// A token-id prompt read apart from the rest of the body gives what nlohmann-json gives for the
// whole body: the same JSON but for the prompt, whose ids are the array's. Bodies of every form
// nearby, the ones it must leave to nlohmann-json (other prompt forms, a second "prompt",
// escapes, nesting, signs, fractions, leading zeros, overflow, malformed bodies), and random
// bodies with strings full of quotes, backslashes, brackets and the word itself.
TEST(OpenAiApi, TokenIdPromptsReadApartParseAsTheWholeBody) {
  const auto same_as_whole = [](const std::string& body) -> ::testing::AssertionResult {
    const std::optional<PromptIdsApart> apart = prompt_ids_apart(body);
    if (!apart) return ::testing::AssertionSuccess() << "left whole";
    json whole, rest;
    try {
      whole = json::parse(body);
    } catch (const json::exception&) {
      // Read apart, the rest must be invalid as well.
      try {
        rest = json::parse(apart->body);
      } catch (const json::exception&) {
        return ::testing::AssertionSuccess() << "invalid either way";
      }
      return ::testing::AssertionFailure() << "the rest of an invalid body parsed: " << body;
    }
    rest = json::parse(apart->body);
    // (A later "prompt" spelled with escapes replaces the [] left for the ids, as it replaces them.)
    if (rest.contains("prompt") && rest["prompt"] == json::array()) rest["prompt"] = apart->ids;
    if (rest != whole) return ::testing::AssertionFailure() << "differs: " << body << " -> " << rest.dump();
    return ::testing::AssertionSuccess() << "read apart";
  };
  const auto read_apart = [](const std::string& body) { return prompt_ids_apart(body).has_value(); };
  const std::vector<std::string> taken = {
      R"({"model": "m", "prompt": [5, 0, 7]})",
      R"({"prompt":[2147483647],"model":"m"})",
      "{\"model\": \"m\",\n\t\"prompt\" :\r\n [ 1 ,2\n,3 ] , \"max_tokens\": 3}",
      R"({"model": "a \"prompt\": [9]", "prompt": [1, 2], "stop": ["]", "[", "\\"]})",
      R"({"x": {"prompt": "inner"}, "prompt": [4], "y": [{"prompt": [8]}]})",
      R"({"prompt": [1], "pr\u006fmpt": "later, spelled with an escape"})",
      R"({"pr\u006fmpt": "earlier", "prompt": [3, 4]})",
  };
  for (const std::string& body : taken) {
    EXPECT_TRUE(read_apart(body)) << body;
    EXPECT_TRUE(same_as_whole(body));
  }
  const std::vector<std::string> left = {
      R"({"model": "m", "prompt": "text"})",   R"({"model": "m", "prompt": []})",
      R"({"model": "m", "prompt": [[1, 2]]})", R"({"model": "m", "prompt": [1, -2]})",
      R"({"model": "m", "prompt": [1, 2.5]})", R"({"model": "m", "prompt": [1e3]})",
      R"({"model": "m", "prompt": [007]})",    R"({"model": "m", "prompt": [2147483648]})",
      R"({"model": "m", "prompt": [99999999999999999999999]})",
      R"({"model": "m", "prompt": [1, "2"]})", R"({"model": "m", "prompt": [1,]})",
      R"({"model": "m", "prompt": [1 2]})",    R"({"model": "m", "prompt": [1], "prompt": [2]})",
      R"({"model": "m", "prompt": [1)",         R"({"model": "m", "prompt)",
      R"({"model": "m", "prompt": null})",     R"({"model": "m", "prompt": {"ids": [1]}})",
      R"([{"prompt": [1]}])",                    R"({"model": "m"})",
  };
  for (const std::string& body : left) {
    EXPECT_FALSE(read_apart(body)) << body;
    EXPECT_TRUE(same_as_whole(body));
  }
  // Through the request parser: the ids read apart, or the later escaped "prompt" that replaced them.
  const auto request = [](const std::string& body) { return parse_completion_request(Endpoint::Completions, body, "m"); };
  EXPECT_EQ(request(R"({"model": "m", "prompt": [1, 2, 3]})").prompts.at(0).ids, (std::vector<std::int32_t>{1, 2, 3}));
  const CompletionRequest later = request(R"({"model": "m", "prompt": [1], "pr\u006fmpt": "later"})");
  EXPECT_EQ(later.prompts.at(0).text, "later");
  EXPECT_TRUE(later.prompts[0].ids.empty());
  EXPECT_EQ(request(R"({"model": "m", "pr\u006fmpt": "earlier", "prompt": [3, 4]})").prompts.at(0).ids, (std::vector<std::int32_t>{3, 4}));
  // Malformed elsewhere: read apart, and invalid either way (the error then names the body as sent).
  EXPECT_TRUE(same_as_whole(R"({"model": "m", "prompt": [1, 2], "temperature": })"));
  EXPECT_EQ(refusal(Endpoint::Completions, R"({"model": "m", "prompt": [1, 2], "temperature": })"), (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(refusal(Endpoint::Completions, R"({"model": "m", "prompt": [1, 2], "model": "other"})"), (std::pair<int, std::string>{404, "model"}));

  // Random bodies.
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"prompt", "\"", "\\", "[", "]", "{", "}", ",", ":", " ", "p", "\xc3\xa9", "\n"};
  const auto random_string = [&] {
    std::string out;
    for (int k = int(rng() % 6); k > 0; --k) out += pieces[rng() % pieces.size()];
    return out;
  };
  int apart_count = 0;
  for (int trial = 0; trial < 400; ++trial) {
    json body = json::object();
    const int fields = 1 + int(rng() % 4), prompt_at = int(rng() % (fields + 1));
    for (int f = 0; f <= fields; ++f) {
      if (f == prompt_at) {
        json ids = json::array();
        for (int k = 1 + int(rng() % 50); k > 0; --k) ids.push_back(rng() % 3 == 0 ? std::uint32_t(rng() % 2147483648u) : rng() % 10);
        body["prompt"] = ids;
        continue;
      }
      const std::string key = random_string() + std::to_string(f);
      switch (rng() % 4) {
        case 0: body[key] = random_string(); break;
        case 1: body[key] = json::array({random_string(), int(rng() % 100) - 50, {{"prompt", random_string()}}}); break;
        case 2: body[key] = {{"prompt", json::array({1, 2})}, {random_string(), nullptr}}; break;
        default: body[key] = double(rng() % 1000) / 8.0; break;
      }
    }
    const std::string text = body.dump(rng() % 2 ? -1 : int(rng() % 4));
    EXPECT_TRUE(read_apart(text)) << text;
    EXPECT_TRUE(same_as_whole(text));
    ++apart_count;
  }
  EXPECT_EQ(apart_count, 400);
}

TEST(OpenAiApi, ErrorObjectIsOpenAis) {
  const json body = error_body(ApiError(400, "max_tokens must be >= 1", "max_tokens"));
  EXPECT_EQ(body["error"]["message"], "max_tokens must be >= 1");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(error_body(ApiError(429, "busy"))["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(error_body(ApiError(500, "x"))["error"]["param"].is_null());
}

TEST(OpenAiApi, ResponsesAndChunksHaveOpenAisShape) {
  CompletionRequest chat = parse(Endpoint::ChatCompletions, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                             {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  const json whole = completion_response(chat, "id1", 5, "Hello", "stop", Usage{3, 2});
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["usage"]["total_tokens"], 5);
  const json first = completion_chunk(chat, "id1", 5, "He", "", true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first["usage"].is_null());
  const json last = completion_chunk(chat, "id1", 5, "", "length", false);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json usage = usage_chunk(chat, "id1", 5, Usage{3, 2});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(usage_chunk(chat, "id1", 5, Usage{40, 2, 32})["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  const CompletionRequest text = parse(Endpoint::Completions, {{"model", "m"}, {"prompt", "hi"}});
  EXPECT_EQ(completion_response(text, "c", 1, "x", "length", Usage{})["choices"][0]["text"], "x");
  EXPECT_EQ(completion_chunk(text, "c", 1, "y", "", true)["object"], "text_completion");
  EXPECT_EQ(completion_chunk(text, "c", 1, "y", "", true, {}, 0, 3)["choices"][0]["index"], 3);
  const json two = completion_response(text, "c", 1, {{"a", "stop", {}, {}}, {"b", "length", {}, {}}}, Usage{2, 5});
  EXPECT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(two["choices"][1]["index"], 1);
  EXPECT_EQ(two["choices"][1]["text"], "b");
  EXPECT_EQ(two["usage"]["total_tokens"], 7);
  EXPECT_EQ(parse(Endpoint::Completions, {{"model", "m"}, {"prompt", "hi"}, {"n", 3}}).n, 3);
  // The server's fingerprint in every body and chunk (null until it sets one).
  EXPECT_TRUE(two["system_fingerprint"].is_null());
  CompletionRequest printed = text;
  printed.system_fingerprint = "fp_x";
  EXPECT_EQ(completion_response(printed, "c", 1, "x", "length", Usage{})["system_fingerprint"], "fp_x");
  EXPECT_EQ(completion_chunk(printed, "c", 1, "y", "", true)["system_fingerprint"], "fp_x");
  EXPECT_EQ(usage_chunk(printed, "c", 1, Usage{})["system_fingerprint"], "fp_x");
  // Logprobs: completions' legacy layout, chat's content list; null when not asked.
  const std::vector<TokenLogprob> lp = {{"He", -0.5f, {{"He", -0.5f}, {"A", -1.5f}}}, {"llo", -0.25f, {{"llo", -0.25f}, {"y", -2.0f}}}};
  const CompletionRequest with = parse(Endpoint::Completions, {{"model", "m"}, {"prompt", "hi"}, {"logprobs", 2}});
  EXPECT_EQ(with.sampling.logprobs, 2);
  const json legacy = completion_response(with, "c", 1, "Hello", "length", Usage{}, lp)["choices"][0]["logprobs"];
  EXPECT_EQ(legacy["tokens"], json({"He", "llo"}));
  EXPECT_EQ(legacy["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(legacy["top_logprobs"][1]["y"], -2.0);
  EXPECT_EQ(legacy["text_offset"], json({0, 2}));
  EXPECT_EQ(completion_chunk(with, "c", 1, "llo", "", false, {lp[1]}, 2)["choices"][0]["logprobs"]["text_offset"], json({2}));
  const CompletionRequest chat_lp = parse(Endpoint::ChatCompletions, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                                      {"logprobs", true}, {"top_logprobs", 2}});
  EXPECT_EQ(chat_lp.sampling.logprobs, 2);
  const json content = completion_response(chat_lp, "c", 1, "Hello", "stop", Usage{}, lp)["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content[0]["token"], "He");
  EXPECT_EQ(content[0]["bytes"], json({72, 101}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["token"], "y");
  EXPECT_EQ(parse(Endpoint::ChatCompletions, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logprobs", true}})
                .sampling.logprobs, 0);
  EXPECT_TRUE(completion_response(text, "c", 1, "x", "length", Usage{})["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(openai_finish_reason("eos"), "stop");
  EXPECT_EQ(openai_finish_reason("length"), "length");
  EXPECT_EQ(openai_finish_reason("abort"), "abort");
}

TEST(ServerMetrics, PrometheusTextWithCumulativeBuckets) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(7.0);
  const std::string text = h.text("x_seconds", "X.");
  EXPECT_NE(text.find("# TYPE x_seconds histogram\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x_seconds_bucket{le=\"0.1\"} 1\nx_seconds_bucket{le=\"1\"} 3\nx_seconds_bucket{le=\"+Inf\"} 4\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("x_seconds_sum 8.05\nx_seconds_count 4\n"), std::string::npos) << text;

  ServerMetrics m;
  m.request_finished("length", 5, 16, 0.2);
  m.request_finished("abort", 3, 2, 0.1);
  m.http_error(429);
  m.engine_state(2, 1, 7, 64);
  m.engine_step(0.0021, 10, 6);
  m.engine_step(0.0019, 11, 7);
  m.engine_gap(0.00003);
  const std::string all = m.prometheus_text();
  for (const char* line : {"asynct_requests_total{finish_reason=\"length\"} 1\n", "asynct_requests_total{finish_reason=\"abort\"} 1\n",
                           "asynct_requests_total{finish_reason=\"stop\"} 0\n", "asynct_http_errors_total{status=\"429\"} 1\n",
                           "asynct_prompt_tokens_total 8\n", "asynct_generation_tokens_total 18\n", "asynct_requests_running 2\n",
                           "asynct_requests_waiting 1\n", "asynct_kv_blocks_used 7\n", "asynct_kv_blocks 64\n",
                           "asynct_e2e_request_latency_seconds_count 2\n", "asynct_engine_steps_total 11\n",
                           "asynct_engine_pipelined_steps_total 7\n", "asynct_engine_step_seconds_bucket{le=\"0.002\"} 1\n",
                           "asynct_engine_step_seconds_count 2\n", "asynct_engine_gap_seconds_bucket{le=\"5e-05\"} 1\n"})
    EXPECT_NE(all.find(line), std::string::npos) << line << "\nin\n" << all;
}

}  // namespace
}  // namespace asynct::serve
