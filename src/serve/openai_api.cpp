// Over 500 lines: one job, a request body to a checked CompletionRequest and the response bodies
// back (openai_api.h); the field checks, the prompt forms and the bodies share its small readers.
#include "serve/openai_api.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxStopStrings = 4;  // OpenAI's limit

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

// 64 bits of fresh entropy (std::random_device gives 32 a call).
std::uint64_t fresh_seed() {
  thread_local std::random_device device;
  return (std::uint64_t(device()) << 32) ^ std::uint64_t(device());
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

// The field's value when present and not null.
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const json& body, const char* name, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad(name, std::string(name) + " must be a number, not " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad(name, std::string(name) + " must be in [" + std::to_string(lo).substr(0, 6) + ", " +
                        std::to_string(hi).substr(0, 6) + "], got " + v->dump());
  return x;
}

std::optional<std::int64_t> integer(const json& body, const char* name, std::int64_t lo, std::int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw bad(name, std::string(name) + " must be an integer, not " + type_name(*v));
  // Non-negative integers parse as unsigned: compared as such, none wraps.
  const bool in_range = v->is_number_unsigned() ? v->get<std::uint64_t>() <= std::uint64_t(hi) &&
                                                      (lo <= 0 || v->get<std::uint64_t>() >= std::uint64_t(lo))
                                                : v->get<std::int64_t>() >= lo && v->get<std::int64_t>() <= hi;
  if (!in_range)
    throw bad(name, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
  return v->is_number_unsigned() ? std::int64_t(v->get<std::uint64_t>()) : v->get<std::int64_t>();
}

std::optional<bool> boolean(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad(name, std::string(name) + " must be a boolean, not " + type_name(*v));
  return v->get<bool>();
}

std::string string_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return "";
  if (!v->is_string()) throw bad(name, std::string(name) + " must be a string, not " + type_name(*v));
  return v->get<std::string>();
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts (joined).
std::string message_content(const json& message, std::size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) throw bad(param, param + " is missing");
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw bad(param, param + " must be a string or a list of text parts, not " + type_name(*it));
  std::string text;
  for (std::size_t p = 0; p < it->size(); ++p) {
    const json& part = (*it)[p];
    const std::string part_param = param + "[" + std::to_string(p) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text")
      throw bad(part_param, part_param + " must be a text part ({\"type\": \"text\", \"text\": ...}); asynct reads text only");
    if (!part.contains("text") || !part["text"].is_string()) throw bad(part_param, part_param + ".text must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments":
// JSON text of an object}}], the arguments handed to the template as the object (as
// transformers' templates expect; Qwen3's writes either).
json assistant_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array()) throw bad(param, param + " must be a list of tool calls");
  json out = json::array();
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const json& call = calls[c];
    const std::string at = param + "[" + std::to_string(c) + "]";
    const json* function = call.is_object() ? field(call, "function") : nullptr;
    if (!function || !function->is_object()) throw bad(param, at + ".function must be an object {\"name\", \"arguments\"}");
    const json* name = field(*function, "name");
    if (!name || !name->is_string()) throw bad(param, at + ".function.name must be a string");
    const json* arguments = field(*function, "arguments");
    json parsed = json::object();
    if (arguments && arguments->is_string()) {
      parsed = json::parse(arguments->get<std::string>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        throw bad(param, at + ".function.arguments must be the JSON text of an object");
    } else if (arguments && arguments->is_object()) {
      parsed = *arguments;
    } else if (arguments) {
      throw bad(param, at + ".function.arguments must be a string (JSON text of an object)");
    }
    const json* id = field(call, "id");
    if (id && !id->is_string()) throw bad(param, at + ".id must be a string");
    out.push_back({{"id", id ? *id : json("")}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", parsed}}}});
  }
  return out;
}

json chat_messages(const json& body) {
  const json* v = field(body, "messages");
  if (!v) throw bad("messages", "messages is missing");
  if (!v->is_array()) throw bad("messages", std::string("messages must be an array, not ") + type_name(*v));
  if (v->empty()) throw bad("messages", "messages is empty");
  json out = json::array();
  for (std::size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad(param, param + " must be an object, not " + type_name(m));
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad(param + ".role", param + ".role must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool")
      throw bad(param + ".role", param + ".role '" + r + "' is not one of system, developer, user, assistant, tool");
    if (r == "assistant" && field(m, "tool_calls") && !field(m, "tool_calls")->empty()) {
      // An earlier answer that called tools: its text may be absent (then "", which every template
      // takes: Qwen3's looks inside it).
      json message = {{"role", "assistant"}, {"content", field(m, "content") ? message_content(m, i) : std::string()}};
      message["tool_calls"] = assistant_tool_calls(m["tool_calls"], param + ".tool_calls");
      out.push_back(std::move(message));
    } else if (r == "tool") {
      const json* id = field(m, "tool_call_id");
      if (!id || !id->is_string()) throw bad(param + ".tool_call_id", param + ".tool_call_id must be a string (the call's id)");
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", message_content(m, i)}});
    } else {
      // A developer message is OpenAI's newer name for a system message.
      out.push_back({{"role", r == "developer" ? "system" : r}, {"content", message_content(m, i)}});
    }
  }
  return out;
}

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) throw bad("stop", std::string("stop must be a string or an array of strings, not ") + type_name(*v));
  if (v->size() > kMaxStopStrings) throw bad("stop", "stop has " + std::to_string(v->size()) + " strings; at most 4");
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) throw bad("stop", std::string("stop must hold strings, not ") + type_name(s));
    out.push_back(s.get<std::string>());
  }
  for (const std::string& s : out)
    if (s.empty()) throw bad("stop", "stop strings must not be empty");
  return out;
}

// A prompt's token ids: a non-empty list of integers in [0, 2^31).
std::vector<std::int32_t> token_ids(const json& list, const std::string& param) {
  if (list.empty()) throw bad("prompt", param + " is empty");
  std::vector<std::int32_t> ids;
  ids.reserve(list.size());
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
      throw bad("prompt", param + " must be a string or a list of token ids (integers >= 0), and holds " + id.dump().substr(0, 32));
    ids.push_back(std::int32_t(id.get<std::int64_t>()));
  }
  return ids;
}

// OpenAI's logit_bias: {"token id": bias}, ids as decimal strings, biases in [-100, 100], at
// most kMaxLogitBiasTokens. The ids are checked against the vocabulary by the route.
std::vector<LogitBias> logit_bias_field(const json& body) {
  const json* v = field(body, "logit_bias");
  if (!v) return {};
  if (!v->is_object()) throw bad("logit_bias", std::string("logit_bias must be an object of token ids to biases, not ") + type_name(*v));
  if (v->size() > std::size_t(kMaxLogitBiasTokens))
    throw bad("logit_bias", "logit_bias holds " + std::to_string(v->size()) + " tokens; at most " +
                                std::to_string(kMaxLogitBiasTokens));
  std::vector<LogitBias> out;
  for (const auto& [key, value] : v->items()) {
    const std::string shown = "'" + key.substr(0, 32) + "'";
    const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoll(key) > std::numeric_limits<std::int32_t>::max())
      throw bad("logit_bias", "logit_bias keys must be token ids (non-negative integers as strings), got " + shown);
    if (!value.is_number())
      throw bad("logit_bias", "logit_bias[" + shown + "] must be a number, not " + type_name(value));
    const double bias = value.get<double>();
    if (!std::isfinite(bias) || bias < -kMaxLogitBias || bias > kMaxLogitBias)
      throw bad("logit_bias", "logit_bias[" + shown + "] must be in [-100, 100], got " + value.dump());
    out.push_back({std::int32_t(std::stoll(key)), float(bias)});
  }
  return out;
}

// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"name": ..., "schema": {...}, "strict": ...}}.
ResponseFormat response_format_field(const json& body) {
  ResponseFormat f;
  const json* v = field(body, "response_format");
  if (!v) return f;
  const auto refuse = [](const std::string& why) { return bad("response_format", "response_format " + why); };
  if (!v->is_object()) throw refuse(std::string("must be an object, not ") + type_name(*v));
  const json* type = field(*v, "type");
  if (!type || !type->is_string()) throw refuse("needs a type: text, json_object or json_schema");
  const std::string kind = type->get<std::string>();
  if (kind == "text") return f;
  if (kind == "json_object") {
    f.kind = ResponseFormat::Kind::JsonObject;
    return f;
  }
  if (kind != "json_schema") throw refuse("type '" + kind.substr(0, 32) + "' is not text, json_object or json_schema");
  const json* spec = field(*v, "json_schema");
  if (!spec || !spec->is_object()) throw refuse("json_schema needs a json_schema object");
  const json* name = field(*spec, "name");
  if (!name || !name->is_string() || name->get<std::string>().empty()) throw refuse("json_schema needs a name");
  const json* schema = field(*spec, "schema");
  if (!schema || !schema->is_object()) throw refuse("json_schema needs a schema object");
  if (const json* strict = field(*spec, "strict"); strict && !strict->is_boolean()) throw refuse("json_schema.strict must be a boolean");
  f.kind = ResponseFormat::Kind::JsonSchema;
  f.schema = schema->dump();
  return f;
}

// A field asynct reads but does not implement yet: an error unless it has its neutral value.
void refuse_unless_neutral(const json& body, const char* name, const json& neutral, const std::string& why) {
  const json* v = field(body, name);
  if (v && *v != neutral) throw bad(name, std::string(name) + " " + why);
}

json base_object(const CompletionRequest& r, const std::string& id, std::int64_t created, bool chunk) {
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  return json{{"id", id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", created},
              {"model", r.model},
              {"system_fingerprint", r.system_fingerprint.empty() ? json(nullptr) : json(r.system_fingerprint)}};
}

// A message's tool_calls (whole: in a response) or a delta's (each with its index in the choice's calls).
json tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool whole) {
  json out = json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    json call = whole ? json::object() : json{{"index", first_index + int(i)}};
    call["id"] = calls[i].id;
    call["type"] = "function";
    call["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(call));
  }
  return out;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens}, {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json finish_value(const std::string& finish_reason) { return finish_reason.empty() ? json(nullptr) : json(finish_reason); }

json byte_list(const std::string& s) {
  json out = json::array();
  for (const unsigned char c : s) out.push_back(int(c));
  return out;
}

// The choice's "logprobs": null unless the request asked; completions' legacy layout (tokens,
// token_logprobs, top_logprobs as {token: logprob}, text_offset) or chat's (content: a list of
// {token, logprob, bytes, top_logprobs}).
json logprobs_value(const CompletionRequest& r, const std::vector<TokenLogprob>& tokens, std::int64_t offset) {
  if (r.sampling.logprobs < 0) return nullptr;
  if (r.endpoint == Endpoint::ChatCompletions) {
    json content = json::array();
    for (const TokenLogprob& t : tokens) {
      json top = json::array();
      for (const auto& [token, logprob] : t.top) top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", byte_list(token)}});
      content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", byte_list(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json strings = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : tokens) {
    strings.push_back(t.token);
    logprobs.push_back(t.logprob);
    json top = json::object();
    for (const auto& [token, logprob] : t.top) top[token] = logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += std::int64_t(t.token.size());
  }
  return {{"tokens", strings}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

ApiError::ApiError(int status_, std::string message, std::string param_, std::string type_)
    : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)) {
  if (type.empty())
    type = status == 404 ? "not_found_error" : status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
}

json error_body(const ApiError& e) {
  return {{"error", {{"message", e.what()}, {"type", e.type}, {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                     {"code", nullptr}}}};
}

json parse_messages(const json& body) { return chat_messages(body); }

namespace {

// A tokenize / detokenize body: a JSON object whose model, when named, is the one served.
json tool_body(const std::string& text, const std::string& served_model) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw ApiError(400, std::string("the body must be a JSON object, not ") + type_name(body));
  const std::string model = string_field(body, "model");
  if (!model.empty() && model != served_model)
    throw ApiError(404, "The model '" + model + "' does not exist; this server serves '" + served_model + "'", "model");
  return body;
}

}  // namespace

TokenizeRequest parse_tokenize_request(const std::string& text, const std::string& served_model) {
  const json body = tool_body(text, served_model);
  TokenizeRequest r;
  r.chat = field(body, "messages") != nullptr;
  if (r.chat == (field(body, "prompt") != nullptr)) throw bad("prompt", "give either prompt (a string) or messages");
  if (r.chat) {
    r.messages = chat_messages(body);
    r.tools = parse_tools(body).tools;
    r.add_generation_prompt = boolean(body, "add_generation_prompt").value_or(true);
  } else {
    const json* p = field(body, "prompt");
    if (!p->is_string()) throw bad("prompt", std::string("prompt must be a string, not ") + type_name(*p));
    r.prompt = p->get<std::string>();
    r.add_special_tokens = boolean(body, "add_special_tokens").value_or(true);
  }
  return r;
}

std::vector<std::int32_t> parse_detokenize_request(const std::string& text, const std::string& served_model,
                                                   std::int32_t vocab_size) {
  const json body = tool_body(text, served_model);
  const json* tokens = field(body, "tokens");
  if (!tokens) throw bad("tokens", "tokens is missing");
  if (!tokens->is_array()) throw bad("tokens", std::string("tokens must be a list of token ids, not ") + type_name(*tokens));
  std::vector<std::int32_t> ids;
  for (const json& id : *tokens) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= vocab_size)
      throw bad("tokens", "tokens must hold token ids in [0, " + std::to_string(vocab_size) + "), and holds " + id.dump().substr(0, 32));
    ids.push_back(std::int32_t(id.get<std::int64_t>()));
  }
  return ids;
}

std::optional<PromptIdsApart> prompt_ids_apart(const std::string& body) {
  const std::size_t n = body.size();
  std::size_t i = 0;
  const auto skip_space = [&] {
    while (i < n && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) ++i;
  };
  const auto digit = [&](std::size_t at) { return at < n && body[at] >= '0' && body[at] <= '9'; };
  int depth = 0;
  std::size_t begin = 0, end = 0;  // the prompt's array, when found
  std::vector<std::int32_t> ids;
  while (i < n) {
    const char c = body[i];
    if (c != '"') {
      depth += c == '{' || c == '[' ? 1 : c == '}' || c == ']' ? -1 : 0;
      ++i;
      continue;
    }
    const std::size_t start = ++i;  // a string: to its closing quote
    while (i < n && body[i] != '"') i += body[i] == '\\' ? 2 : 1;
    if (i >= n) return std::nullopt;
    const std::size_t length = i++ - start;
    if (depth != 1 || length != 6 || body.compare(start, 6, "prompt") != 0) continue;
    skip_space();
    if (i >= n || body[i] != ':') continue;  // a value "prompt", not the key
    if (end != 0) return std::nullopt;        // a second "prompt"
    ++i;
    skip_space();
    if (i >= n || body[i] != '[') return std::nullopt;
    begin = i++;
    for (;;) {  // plain integers: no sign, fraction, exponent or leading zero
      skip_space();
      if (!digit(i) || (body[i] == '0' && digit(i + 1))) return std::nullopt;
      std::int64_t id = 0;
      while (digit(i) && id <= std::numeric_limits<std::int32_t>::max()) id = 10 * id + (body[i++] - '0');
      if (id > std::numeric_limits<std::int32_t>::max() || digit(i)) return std::nullopt;
      if (i < n && (body[i] == '.' || body[i] == 'e' || body[i] == 'E')) return std::nullopt;
      ids.push_back(std::int32_t(id));
      skip_space();
      if (i < n && body[i] == ',') {
        ++i;
        continue;
      }
      if (i < n && body[i] == ']') break;
      return std::nullopt;
    }
    end = ++i;
  }
  if (end == 0) return std::nullopt;
  PromptIdsApart apart;
  apart.body.reserve(n - (end - begin) + 2);
  apart.body.append(body, 0, begin).append("[]").append(body, end, std::string::npos);
  apart.ids = std::move(ids);
  return apart;
}

CompletionRequest parse_completion_request(Endpoint endpoint, const std::string& body_text, const std::string& served_model) {
  json body;
  std::optional<PromptIdsApart> apart = endpoint == Endpoint::Completions ? prompt_ids_apart(body_text) : std::nullopt;
  try {
    body = json::parse(apart ? apart->body : body_text);
  } catch (const json::exception& e) {
    std::string message = e.what();
    if (apart) {
      try {  // the error as the body was sent (its positions)
        [[maybe_unused]] const json sent = json::parse(body_text);
      } catch (const json::exception& sent) {
        message = sent.what();
      }
    }
    throw ApiError(400, std::string("the body is not valid JSON: ") + message);
  }
  if (!body.is_object()) throw ApiError(400, std::string("the body must be a JSON object, not ") + type_name(body));
  CompletionRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::ChatCompletions;

  r.model = string_field(body, "model");
  if (r.model.empty()) throw bad("model", "model is missing (this server serves '" + served_model + "')");
  if (r.model != served_model)
    throw ApiError(404, "The model '" + r.model + "' does not exist; this server serves '" + served_model + "'", "model");

  if (chat) {
    r.messages = chat_messages(body);
  } else {
    const json* p = field(body, "prompt");
    if (!p) throw bad("prompt", "prompt is missing");
    if (apart && p->is_array() && p->empty()) {
      // The ids read apart (unless a later "prompt" spelled with escapes replaced the [] left for them).
      r.prompts.push_back({"", std::move(apart->ids)});
    } else if (p->is_string()) {
      r.prompts.push_back({p->get<std::string>(), {}});
    } else if (!p->is_array()) {
      throw bad("prompt", std::string("prompt must be a string, token ids or a list of either, not ") + type_name(*p));
    } else if (p->empty()) {
      throw bad("prompt", "prompt is empty");
    } else if (p->front().is_string() || p->front().is_array()) {  // several prompts
      for (std::size_t i = 0; i < p->size(); ++i) {
        const json& one = (*p)[i];
        const std::string param = "prompt[" + std::to_string(i) + "]";
        if (one.is_string() && p->front().is_string())
          r.prompts.push_back({one.get<std::string>(), {}});
        else if (one.is_array() && p->front().is_array())
          r.prompts.push_back({"", token_ids(one, param)});
        else
          throw bad("prompt", "prompt must be a list of strings or a list of token-id lists, and " + param + " is " + type_name(one));
      }
    } else {
      r.prompts.push_back({"", token_ids(*p, "prompt")});
    }
  }

  const std::int64_t kMaxInt = std::numeric_limits<int>::max();
  std::optional<std::int64_t> max_tokens = integer(body, "max_tokens", 1, kMaxInt);
  if (chat && !max_tokens) max_tokens = integer(body, "max_completion_tokens", 1, kMaxInt);
  r.max_tokens = int(max_tokens.value_or(chat ? 0 : 16));

  SamplingParams& s = r.sampling;
  s.temperature = float(number(body, "temperature", 0.0, 2.0).value_or(1.0));
  s.top_p = float(number(body, "top_p", 0.0, 1.0).value_or(1.0));
  if (s.top_p <= 0.0f) throw bad("top_p", "top_p must be in (0, 1], got 0");
  const std::int64_t top_k = integer(body, "top_k", -1, kMaxInt).value_or(0);
  s.top_k = top_k < 0 ? 0 : int(top_k);  // -1: off, as vLLM reads it
  s.min_p = float(number(body, "min_p", 0.0, 1.0).value_or(0.0));
  s.presence_penalty = float(number(body, "presence_penalty", -2.0, 2.0).value_or(0.0));
  s.frequency_penalty = float(number(body, "frequency_penalty", -2.0, 2.0).value_or(0.0));
  s.repetition_penalty = float(number(body, "repetition_penalty", 0.0, 1e6).value_or(1.0));
  if (!(s.repetition_penalty > 0.0f)) throw bad("repetition_penalty", "repetition_penalty must be > 0");
  const json* seed = field(body, "seed");
  if (seed) {
    if (!seed->is_number_integer()) throw bad("seed", std::string("seed must be an integer, not ") + type_name(*seed));
    s.seed = seed->is_number_unsigned() ? seed->get<std::uint64_t>() : std::uint64_t(seed->get<std::int64_t>());
  } else {
    s.seed = fresh_seed();  // without a seed every request draws anew
  }
  r.stop = stop_strings(body);
  r.stream = boolean(body, "stream").value_or(false);
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) throw bad("stream_options", std::string("stream_options must be an object, not ") + type_name(*options));
    if (!r.stream) throw bad("stream_options", "stream_options needs stream: true");
    r.include_usage = boolean(*options, "include_usage").value_or(false);
  }
  r.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  r.n = int(integer(body, "n", 1, 128).value_or(1));
  if (chat) {
    const bool logprobs = boolean(body, "logprobs").value_or(false);
    const std::optional<std::int64_t> top = integer(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top && !logprobs) throw bad("top_logprobs", "top_logprobs needs logprobs: true");
    s.logprobs = logprobs ? int(top.value_or(0)) : -1;
  } else {
    s.logprobs = int(integer(body, "logprobs", 0, kMaxTopLogprobs).value_or(-1));
  }
  refuse_unless_neutral(body, "echo", json(false), "is not supported");
  refuse_unless_neutral(body, "best_of", json(1), "is not supported (one choice a request)");
  refuse_unless_neutral(body, "suffix", json(nullptr), "is not supported");
  // The legacy function fields: refused unless neutral, never ignored.
  if (const json* v = field(body, "functions"); v && !(v->is_array() && v->empty()))
    throw bad("functions", "functions (deprecated by OpenAI) are not supported: use tools");
  if (const json* v = field(body, "function_call"); v && *v != json("none"))
    throw bad("function_call", "function_call (deprecated by OpenAI) is not supported: use tool_choice");
  if (chat) {
    r.tools = parse_tools(body);
  } else {
    for (const char* name : {"tools", "tool_choice"})
      if (field(body, name)) throw bad(name, std::string(name) + " is for /v1/chat/completions");
  }
  r.logit_bias = logit_bias_field(body);
  r.response_format = response_format_field(body);
  if (r.tools.read_calls() && r.response_format.kind != ResponseFormat::Kind::Text)
    throw bad("response_format", "response_format and tools together are not supported: the answer is either "
                                 "constrained JSON or may call a tool (send tool_choice \"none\" for the first)");
  validate_sampling(s);  // the engine's own ranges (a backstop: the checks above are stricter)
  return r;
}

json completion_response(const CompletionRequest& r, const std::string& id, std::int64_t created,
                         const std::vector<Choice>& choices, const Usage& usage) {
  json out = base_object(r, id, created, false);
  out["choices"] = json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    json choice = {{"index", i}};
    if (r.endpoint == Endpoint::ChatCompletions) {
      const bool text = !r.tools.read_calls() || !choices[i].text.empty();
      choice["message"] = {{"role", "assistant"}, {"content", text ? json(choices[i].text) : json(nullptr)}};
      if (!choices[i].tool_calls.empty()) choice["message"]["tool_calls"] = tool_calls_json(choices[i].tool_calls, 0, true);
    } else
      choice["text"] = choices[i].text;
    choice["logprobs"] = logprobs_value(r, choices[i].logprobs, 0);
    choice["finish_reason"] = finish_value(choices[i].finish_reason);
    out["choices"].push_back(choice);
  }
  out["usage"] = usage_json(usage);
  return out;
}

json completion_response(const CompletionRequest& r, const std::string& id, std::int64_t created, const std::string& text,
                         const std::string& finish_reason, const Usage& usage, const std::vector<TokenLogprob>& logprobs) {
  return completion_response(r, id, created, std::vector<Choice>{{text, finish_reason, logprobs, {}}}, usage);
}

json completion_chunk(const CompletionRequest& r, const std::string& id, std::int64_t created, const std::string& text,
                      const std::string& finish_reason, bool first, const std::vector<TokenLogprob>& logprobs,
                      std::int64_t offset, int index, const std::vector<ToolCall>& calls, int calls_before) {
  json out = base_object(r, id, created, true);
  json choice = {{"index", index}};
  if (r.endpoint == Endpoint::ChatCompletions) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    // The first chunk opens the text ("", or null where tools are read: an answer of calls has none).
    if (!text.empty())
      delta["content"] = text;
    else if (first && finish_reason.empty() && calls.empty())
      delta["content"] = r.tools.read_calls() ? json(nullptr) : json("");
    if (!calls.empty()) delta["tool_calls"] = tool_calls_json(calls, calls_before, false);
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs_value(r, logprobs, offset);
  choice["finish_reason"] = finish_value(finish_reason);
  out["choices"] = json::array({choice});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json usage_chunk(const CompletionRequest& r, const std::string& id, std::int64_t created, const Usage& usage) {
  json out = base_object(r, id, created, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string openai_finish_reason(const std::string& engine_reason, bool called_tools) {
  return engine_reason == "length" ? "length" : engine_reason == "abort" ? "abort" : called_tools ? "tool_calls" : "stop";
}

}  // namespace asynct::serve
