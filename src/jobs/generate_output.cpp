#include "jobs/generate_output.h"

#include <cstdio>

namespace asynct {

namespace {

// The length of the valid UTF-8 character at s[i], or 0 when none starts there (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF).
std::size_t utf8_char_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned lead = byte(0);
  const auto continuation = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return byte(k) >= lo && byte(k) <= hi;
  };
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned lo = lead == 0xE0 ? 0xA0 : 0x80, hi = lead == 0xED ? 0x9F : 0xBF;
    return continuation(1, lo, hi) && continuation(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned lo = lead == 0xF0 ? 0x90 : 0x80, hi = lead == 0xF4 ? 0x8F : 0xBF;
    return continuation(1, lo, hi) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

std::string logprob_text(float logprob) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", double(logprob));
  return text;
}

std::string counts(const FinishedRequest& r) {
  const RequestOutput& o = *r.output;
  std::string s = std::to_string(r.prompt_tokens) + " prompt tokens -> " + std::to_string(o.tokens.size()) + " tokens (" +
                  o.finish_reason;
  if (!r.stop_string.empty()) s += " at " + quoted_token(r.stop_string);
  return s + ")";
}

}  // namespace

std::string quoted_token(std::string_view bytes) {
  std::string out = "\"";
  for (std::size_t i = 0; i < bytes.size();) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    const std::size_t n = utf8_char_length(bytes, i);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (n == 0 || c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", unsigned(c));
      out += hex;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
  return out + "\"";
}

std::string token_line(const FinishedRequest& r) {
  std::string s = "request " + std::to_string(r.index) + ": prompt " + std::to_string(r.prompt_tokens) + " tokens -> ";
  const std::vector<std::int32_t>& tokens = r.output->tokens;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (t) s += ',';
    s += std::to_string(tokens[t]);
  }
  return s + "  (" + r.output->finish_reason + ")";
}

std::string text_label(const FinishedRequest& r) {
  return "--- request " + std::to_string(r.index) + ": " + counts(r) + " ---";
}

std::string summary_line(const FinishedRequest& r) { return "request " + std::to_string(r.index) + ": " + counts(r); }

std::string logprob_table(const FinishedRequest& r, const TokenBytes& token_bytes) {
  const RequestOutput& o = *r.output;
  const auto name = [&](std::int32_t id) {
    std::string s = std::to_string(id);
    if (token_bytes) {
      s += ' ';
      s += quoted_token(token_bytes(id));
    }
    return s;
  };
  std::string table = "logprobs of request " + std::to_string(r.index) + " (position: token logprob | most likely)\n";
  for (std::size_t t = 0; t < o.tokens.size() && t < o.logprobs.size(); ++t) {
    char position[32];
    std::snprintf(position, sizeof position, "%5zu: ", t);
    std::string line = position + name(o.tokens[t]) + " " + logprob_text(o.logprobs[t]);
    if (t < o.top_logprobs.size() && !o.top_logprobs[t].empty()) {
      line += " |";
      for (std::size_t k = 0; k < o.top_logprobs[t].size(); ++k)
        line += (k ? ", " : " ") + name(o.top_logprobs[t][k].id) + " " + logprob_text(o.top_logprobs[t][k].logprob);
    }
    table += line + "\n";
  }
  return table;
}

nlohmann::json request_json(const FinishedRequest& r, const TokenBytes& token_bytes) {
  const RequestOutput& o = *r.output;
  nlohmann::json j = {{"request", r.index},
                      {"prompt_tokens", r.prompt_tokens},
                      {"token_ids", o.tokens},
                      {"finish_reason", o.finish_reason}};
  if (r.has_text) {
    j["text"] = r.text;
    if (!r.stop_string.empty()) j["stop"] = r.stop_string;
  }
  if (r.first_token_s >= 0) j["first_token_s"] = r.first_token_s;
  if (r.end_s >= 0) j["end_s"] = r.end_s;
  if (!o.logprobs.empty()) {
    const auto entry = [&](std::int32_t id, float logprob) {
      nlohmann::json e = {{"id", id}};
      if (token_bytes) e["token"] = token_bytes(id);
      e["logprob"] = logprob;
      return e;
    };
    nlohmann::json list = nlohmann::json::array();
    for (std::size_t t = 0; t < o.tokens.size() && t < o.logprobs.size(); ++t) {
      nlohmann::json e = entry(o.tokens[t], o.logprobs[t]);
      nlohmann::json top = nlohmann::json::array();
      if (t < o.top_logprobs.size())
        for (const TopLogprob& alt : o.top_logprobs[t]) top.push_back(entry(alt.id, alt.logprob));
      e["top_logprobs"] = top;
      list.push_back(e);
    }
    j["logprobs"] = list;
  }
  return j;
}

std::string json_line(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace asynct
