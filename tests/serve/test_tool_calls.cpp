// Tool calls (serve/tool_calls.h) without a server: the request's tools and tool_choice, the
// messages that carry earlier calls and their results, the forced call's schema, the answer read
// into text and calls (whole, and streamed in pieces of every size), and the response bodies.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve/openai_api.h"
#include "serve/tool_calls.h"

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;
using R = std::pair<int, std::string>;

const json kWeather = json::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
const json kTime = json::parse(R"({"type": "function", "function": {"name": "get-time"}})");

json chat_body(const json& extra) {
  json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  for (const auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

CompletionRequest chat(const json& extra) {
  return parse_completion_request(Endpoint::ChatCompletions, chat_body(extra).dump(), "m");
}

R refusal(const json& extra, Endpoint endpoint = Endpoint::ChatCompletions) {
  json body = chat_body(extra);
  if (endpoint == Endpoint::Completions) {
    body.erase("messages");
    body["prompt"] = "x";
  }
  try {
    parse_completion_request(endpoint, body.dump(), "m");
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  return {0, "accepted"};
}

TEST(ToolCalls, ChoiceDefaultsToAutoWithToolsAndNoneWithout) {
  const CompletionRequest with = chat({{"tools", {kWeather, kTime}}});
  EXPECT_EQ(with.tools.choice.mode, ToolChoice::Mode::Auto);
  EXPECT_EQ(with.tools.tools, json({kWeather, kTime}));  // as sent, for the template
  EXPECT_TRUE(with.tools.read_calls());
  EXPECT_FALSE(with.tools.forced());
  const CompletionRequest without = chat(json::object());
  EXPECT_EQ(without.tools.choice.mode, ToolChoice::Mode::None);
  EXPECT_TRUE(without.tools.tools.is_null());
  // "none": the tools are not shown and the answer is text.
  const CompletionRequest none = chat({{"tools", {kWeather}}, {"tool_choice", "none"}});
  EXPECT_TRUE(none.tools.tools.is_null());
  EXPECT_FALSE(none.tools.read_calls());
  const CompletionRequest required = chat({{"tools", {kWeather}}, {"tool_choice", "required"}, {"parallel_tool_calls", false}});
  EXPECT_TRUE(required.tools.forced());
  const CompletionRequest named =
      chat({{"tools", {kWeather, kTime}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get-time"}}}}}});
  EXPECT_EQ(named.tools.choice.mode, ToolChoice::Mode::Named);
  EXPECT_EQ(named.tools.choice.name, "get-time");
}

TEST(ToolCalls, BadToolsAndChoicesAreRefusedByName) {
  const auto tool = [](const json& function) { return json{{"type", "function"}, {"function", function}}; };
  EXPECT_EQ(refusal({{"tools", "get_weather"}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {{{"type", "code"}, {"function", {{"name", "f"}}}}}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {tool({{"name", "has space"}})}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {tool({{"name", std::string(65, 'a')}})}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {tool({{"name", ""}})}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {tool({{"name", "f"}, {"parameters", "object"}})}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {tool({{"name", "f"}, {"description", 3}})}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {tool({{"name", "f"}, {"strict", "yes"}})}}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {kWeather, kWeather}}}), (R{400, "tools"}));
  json many = json::array();
  for (int i = 0; i < 129; ++i) many.push_back(tool({{"name", "f" + std::to_string(i)}}));
  EXPECT_EQ(refusal({{"tools", many}}), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}, {"tool_choice", "always"}}), (R{400, "tool_choice"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}, {"tool_choice", 1}}), (R{400, "tool_choice"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}}),
            (R{400, "tool_choice"}));
  EXPECT_EQ(refusal({{"tool_choice", "required"}}), (R{400, "tool_choice"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}, {"parallel_tool_calls", "no"}}), (R{400, "parallel_tool_calls"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}, {"response_format", {{"type", "json_object"}}}}), (R{400, "response_format"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}, {"tool_choice", "none"}, {"response_format", {{"type", "json_object"}}}}),
            (R{0, "accepted"}));
  EXPECT_EQ(refusal({{"tools", {kWeather}}}, Endpoint::Completions), (R{400, "tools"}));
  EXPECT_EQ(refusal({{"tools", json::array()}, {"tool_choice", "none"}}), (R{0, "accepted"}));
}

TEST(ToolCalls, MessagesCarryEarlierCallsAndTheirResults) {
  const json messages = json::parse(R"([
    {"role": "user", "content": "Weather in Bern?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Bern\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}])");
  const CompletionRequest r =
      parse_completion_request(Endpoint::ChatCompletions, json{{"model", "m"}, {"messages", messages}}.dump(), "m");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"], "");  // absent text: "" (Qwen3's template looks inside it)
  // The arguments go to the template as an object, as transformers' templates expect.
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Bern"}}));
  EXPECT_EQ(r.messages[2], json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 C"}}));

  const auto refused = [](const json& message) {
    try {
      parse_completion_request(Endpoint::ChatCompletions, json{{"model", "m"}, {"messages", {message}}}.dump(), "m");
    } catch (const ApiError& e) {
      return R{e.status, e.param};
    }
    return R{0, "accepted"};
  };
  EXPECT_EQ(refused({{"role", "tool"}, {"content", "r"}}), (R{400, "messages[0].tool_call_id"}));
  EXPECT_EQ(refused({{"role", "tool"}, {"tool_call_id", "c"}}), (R{400, "messages[0].content"}));
  const auto call = [](const json& function) {
    return json{{"role", "assistant"}, {"tool_calls", {{{"id", "c"}, {"type", "function"}, {"function", function}}}}};
  };
  EXPECT_EQ(refused(call({{"name", "f"}, {"arguments", "{not json"}})), (R{400, "messages[0].tool_calls"}));
  EXPECT_EQ(refused(call({{"name", "f"}, {"arguments", "[1, 2]"}})), (R{400, "messages[0].tool_calls"}));
  EXPECT_EQ(refused(call({{"arguments", "{}"}})), (R{400, "messages[0].tool_calls"}));
  EXPECT_EQ(refused(call({{"name", "f"}, {"arguments", "{}"}})), (R{0, "accepted"}));
  EXPECT_EQ(refused({{"role", "assistant"}, {"tool_calls", "f()"}}), (R{400, "messages[0].tool_calls"}));
}

TEST(ToolCalls, ForcedCallSchemaNamesTheFunction) {
  const CompletionRequest named = chat({{"tools", {kWeather, kTime}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  const json one = json::parse(forced_call_schema(named.tools));
  EXPECT_EQ(one["properties"]["name"]["const"], "get_weather");
  EXPECT_EQ(one["properties"]["arguments"], kWeather["function"]["parameters"]);
  EXPECT_EQ(one["required"], json({"name", "arguments"}));
  const CompletionRequest required = chat({{"tools", {kWeather, kTime}}, {"tool_choice", "required"}});
  const json any = json::parse(forced_call_schema(required.tools));
  ASSERT_EQ(any["anyOf"].size(), 2u);
  EXPECT_EQ(any["anyOf"][1]["properties"]["name"]["const"], "get-time");
  EXPECT_EQ(any["anyOf"][1]["properties"]["arguments"], json({{"type", "object"}}));  // no parameters: any object
}

struct Read {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Read&) const = default;
};
Read summarize(const AnswerPart& part) {
  Read r{part.content, {}};
  for (const ToolCall& c : part.calls) r.calls.emplace_back(c.name, c.arguments);
  return r;
}
std::ostream& operator<<(std::ostream& os, const Read& r) {
  os << "content " << json(r.content).dump() << ", calls";
  for (const auto& [name, args] : r.calls) os << " " << name << args;
  return os;
}

const std::vector<std::pair<std::string, Read>>& answers() {
  static const std::vector<std::pair<std::string, Read>> cases = {
      {"Plain text, no call.", {"Plain text, no call.", {}}},
      {"Plain text with a trailing newline.\n\n", {"Plain text with a trailing newline.", {}}},
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}\n</tool_call>",
       {"", {{"get_weather", R"({"city":"Bern"})"}}}},
      {"Let me check.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", "
       "\"arguments\": {\"a\": [1, 2]}}\n</tool_call>\n",
       {"Let me check.", {{"f", "{}"}, {"g", R"({"a":[1,2]})"}}}},
      {"<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call> and then some text",
       {"and then some text", {{"f", R"({"x":1})"}}}},
      {"<tool_call>{\"name\": \"f\"}</tool_call>", {"", {{"f", "{}"}}}},
      // Blocks that are not calls stay in the text as written.
      {"a <tool_call>not json</tool_call> b", {"a <tool_call>not json</tool_call> b", {}}},
      {"<tool_call>{\"arguments\": {}}</tool_call>", {"<tool_call>{\"arguments\": {}}</tool_call>", {}}},
      {"<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", {"<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", {}}},
      // An unclosed block: a call when its JSON is complete, else text.
      {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n", {"", {{"f", R"({"q":1})"}}}},
      {"x <tool_call>\n{\"name\": \"f\", \"argu", {"x <tool_call>\n{\"name\": \"f\", \"argu", {}}},
      {"less < than <tool and <tool_cal", {"less < than <tool and <tool_cal", {}}},
      {"  \n ", {"", {}}},
      {"", {"", {}}},
  };
  return cases;
}

TEST(ToolCalls, AnswersReadIntoTextAndCalls) {
  for (const auto& [answer, want] : answers()) {
    const AnswerPart read = read_tool_calls(answer);
    EXPECT_EQ(summarize(read), want) << json(answer).dump();
    for (const ToolCall& call : read.calls) EXPECT_EQ(call.id.rfind("call_", 0), 0u) << "each call gets its id as it is read";
  }
}

// Streamed in pieces, an answer reads as it does whole: every split into two pieces, byte by
// byte, and random pieces.
TEST(ToolCalls, StreamedAnswersReadAsWholeOnes) {
  std::mt19937 random(7);
  for (const auto& [answer, want] : answers()) {
    std::vector<std::vector<std::size_t>> splits;
    for (std::size_t at = 0; at <= answer.size(); ++at) splits.push_back({at});
    std::vector<std::size_t> bytes;
    for (std::size_t at = 1; at < answer.size(); ++at) bytes.push_back(at);
    splits.push_back(bytes);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::size_t> cuts;
      for (std::size_t at = 1; at < answer.size(); ++at)
        if (random() % 4 == 0) cuts.push_back(at);
      splits.push_back(cuts);
    }
    for (const std::vector<std::size_t>& cuts : splits) {
      ToolCallReader reader;
      AnswerPart all;
      std::size_t from = 0;
      const auto take = [&](const AnswerPart& part) {
        all.content += part.content;
        all.calls.insert(all.calls.end(), part.calls.begin(), part.calls.end());
      };
      for (const std::size_t at : cuts) {
        take(reader.push(answer.substr(from, at - from)));
        from = at;
      }
      take(reader.push(answer.substr(from)));
      take(reader.finish());
      ASSERT_EQ(summarize(all), want) << json(answer).dump() << " cut " << cuts.size() << " times";
    }
  }
}

TEST(ToolCalls, CallIdsAreOpenAis) {
  const std::string a = new_tool_call_id(), b = new_tool_call_id();
  EXPECT_EQ(a.size(), 29u);
  EXPECT_EQ(a.rfind("call_", 0), 0u);
  EXPECT_NE(a, b);
}

TEST(ToolCalls, ResponsesCarryTheCalls) {
  const CompletionRequest r = chat({{"tools", {kWeather}}});
  Choice choice{"", "tool_calls", {}, {{"call_x", "get_weather", R"({"city":"Bern"})"}}};
  const json whole = completion_response(r, "id", 1, std::vector<Choice>{choice}, Usage{3, 9});
  const json& message = whole["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());  // only calls: no text
  EXPECT_EQ(message["tool_calls"], json::parse(R"([{"id": "call_x", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Bern\"}"}}])"));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  // Without tools an empty answer is "" as before.
  const json plain = completion_response(chat(json::object()), "id", 1, std::vector<Choice>{{"", "stop", {}, {}}}, Usage{});
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "");
  // A chunk's calls carry their index among the choice's calls.
  const json chunk = completion_chunk(r, "id", 1, "", "", false, {}, 0, 0, {{"call_y", "f", "{}"}}, 2);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"],
            json::parse(R"([{"index": 2, "id": "call_y", "type": "function", "function": {"name": "f", "arguments": "{}"}}])"));
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("content"));
  // The first chunk opens the text: null where tools are read (an answer of calls has none), "" otherwise.
  EXPECT_TRUE(completion_chunk(r, "id", 1, "", "", true)["choices"][0]["delta"]["content"].is_null());
  EXPECT_EQ(completion_chunk(chat(json::object()), "id", 1, "", "", true)["choices"][0]["delta"]["content"], "");
  EXPECT_EQ(openai_finish_reason("eos", true), "tool_calls");
  EXPECT_EQ(openai_finish_reason("length", true), "length");
  EXPECT_EQ(openai_finish_reason("stop", false), "stop");
}

}  // namespace
}  // namespace asynct::serve
