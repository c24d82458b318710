#include "text/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace asynct::text {

namespace {

// A byte-level token's bytes; a token with a character outside the alphabet (an added token
// such as "<|im_start|>" maps to itself, but one with other text may not) is its own UTF-8, as
// the reference's ByteLevel decoder does.
std::string token_to_bytes(const std::string& token) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  std::size_t i = 0;
  while (i < token.size()) {
    char32_t cp = 0;
    int len = 1;
    if (p[i] < 0x80) {
      cp = p[i];
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = char32_t(((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F));
      len = 2;
    } else {
      return token;
    }
    const int b = char_to_byte(cp);
    if (b < 0) return token;
    out.push_back(char(b));
    i += std::size_t(len);
  }
  return out;
}

void check_type(const nlohmann::json& spec, const char* field, std::initializer_list<const char*> allowed,
                const char* what) {
  if (!spec.contains(field) || spec[field].is_null()) {
    for (const char* a : allowed)
      if (std::string(a) == "null") return;
    throw Error(std::string("tokenizer.json: no \"") + field + "\"; asynct needs " + what);
  }
  const auto& v = spec[field];
  check(v.is_object() && v.contains("type") && v["type"].is_string(), "tokenizer.json: \"", field,
        "\" must be an object with a \"type\"");
  const std::string type = v["type"];
  for (const char* a : allowed)
    if (type == a) return;
  throw Error("tokenizer.json: the " + std::string(field) + " type '" + type + "' is not supported (asynct implements " +
              what + ")");
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), "cannot open the tokenizer file '", path, "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error("'" + path + "' is not valid JSON: " + e.what());
  }
  try {
    return from_json(spec);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": a field has the wrong type: " + e.what());
  }
}

Tokenizer Tokenizer::from_json(const nlohmann::json& spec) {
  check(spec.is_object(), "tokenizer.json must hold an object");
  check(!spec.contains("truncation") || spec["truncation"].is_null(), "tokenizer.json: truncation is not supported");
  check(!spec.contains("padding") || spec["padding"].is_null(), "tokenizer.json: padding is not supported");
  check(spec.contains("model"), "tokenizer.json: no \"model\"");
  check_type(spec, "post_processor", {"null", "ByteLevel"}, "ByteLevel or none");
  check_type(spec, "decoder", {"ByteLevel"}, "the ByteLevel decoder");

  Tokenizer t(BpeModel::from_json(spec["model"]));
  t.normalizer_ = Normalizer::from_json(spec.value("normalizer", nlohmann::json()));
  t.pre_tokenizer_ = PreTokenizer::from_json(spec.value("pre_tokenizer", nlohmann::json()));

  std::int32_t max_id = t.model_.max_id();
  if (spec.contains("added_tokens") && !spec["added_tokens"].is_null()) {
    check(spec["added_tokens"].is_array(), "tokenizer.json: \"added_tokens\" must be a list");
    // Ids as the reference assigns them (it reads the file's "id" only to warn when it
    // differs): a token already in the vocabulary, or added before, keeps that id; a new one
    // gets the model's vocabulary size, or one more than the largest added id when that is
    // already at or past it. In a consistent file these are the file's ids.
    const auto model_size = std::int32_t(t.model_.vocab().size());
    std::int32_t max_added = -1;
    for (const auto& a : spec["added_tokens"]) {
      AddedToken tok;
      check(a.is_object() && a.contains("content") && a["content"].is_string(),
            "tokenizer.json: an added token needs a \"content\" string");
      tok.content = a["content"];
      tok.special = a.value("special", false);
      tok.lstrip = a.value("lstrip", false);
      tok.rstrip = a.value("rstrip", false);
      tok.normalized = a.value("normalized", !tok.special);
      tok.single_word = a.value("single_word", false);
      if (tok.content.empty()) continue;  // the reference ignores empty tokens
      auto same = std::find_if(t.added_.begin(), t.added_.end(), [&](const AddedToken& o) { return o.content == tok.content; });
      if (same != t.added_.end()) {
        tok.id = same->id;
      } else if (const auto it = t.model_.vocab().find(tok.content); it != t.model_.vocab().end()) {
        tok.id = it->second;
      } else {
        tok.id = max_added < 0 ? model_size : (max_added >= model_size ? max_added + 1 : model_size);
      }
      max_added = std::max(max_added, tok.id);
      max_id = std::max(max_id, tok.id);
      if (same != t.added_.end()) {
        *same = tok;  // the later entry's flags win, as in the reference
      } else {
        t.added_.push_back(std::move(tok));
      }
    }
  }
  // Special tokens first, then the others, in file order (the reference's order; it only
  // matters for two tokens with the same text).
  std::vector<AddedToken> raw, normalized;
  for (int pass = 0; pass < 2; ++pass) {
    for (const AddedToken& tok : t.added_) {
      if (tok.special != (pass == 0)) continue;
      if (!tok.normalized) {
        raw.push_back(tok);
      } else {
        AddedToken n = tok;
        std::string buf;
        if (t.normalizer_.normalize(tok.content, buf)) n.content = buf;
        normalized.push_back(std::move(n));
      }
    }
  }
  t.raw_added_ = AddedTokenMatcher(std::move(raw));
  t.normalized_added_ = AddedTokenMatcher(std::move(normalized));

  t.id_bytes_.assign(std::size_t(max_id) + 1, std::string());
  t.id_kind_.assign(std::size_t(max_id) + 1, 0);
  for (const auto& [token, id] : t.model_.vocab()) {
    t.id_bytes_[std::size_t(id)] = token_to_bytes(token);
    t.id_kind_[std::size_t(id)] = 1;
  }
  // An added token's text wins over the model's; a normalized one decodes as its normalized
  // text, as the reference does.
  for (const AddedToken& tok : t.added_) {
    std::string text = tok.content;
    if (tok.normalized) t.normalizer_.normalize(tok.content, text);
    t.id_bytes_[std::size_t(tok.id)] = token_to_bytes(text);
    t.id_kind_[std::size_t(tok.id)] = tok.special ? 2 : 1;
  }
  return t;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, out);
  return out;
}

void Tokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  if (const auto bad = find_invalid_utf8(text))
    throw Error("encode: the text is not valid UTF-8 (at byte " + std::to_string(*bad) + ")");
  if (raw_added_.empty()) return encode_plain(text, out);
  std::vector<Segment> segments;
  raw_added_.split(text, segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      encode_plain(text.substr(s.begin, s.end - s.begin), out);
    }
  }
}

void Tokenizer::encode_plain(std::string_view text, std::vector<std::int32_t>& out) const {
  std::string normalized;
  if (normalizer_.normalize(text, normalized)) text = normalized;
  if (normalized_added_.empty()) return encode_words(text, out);
  std::vector<Segment> segments;
  normalized_added_.split(text, segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      encode_words(text.substr(s.begin, s.end - s.begin), out);
    }
  }
}

void Tokenizer::encode_words(std::string_view text, std::vector<std::int32_t>& out) const {
  std::vector<std::string_view> words;
  std::deque<std::string> scratch;
  pre_tokenizer_.split(text, words, scratch);
  for (const std::string_view w : words) model_.encode_word(w, out);
}

std::string_view Tokenizer::token_bytes(std::int32_t id) const {
  check(id >= 0 && std::size_t(id) < id_kind_.size() && id_kind_[std::size_t(id)] != 0, "token id ", id,
        " is not in the vocabulary (ids 0..", std::int64_t(id_kind_.size()) - 1, ")");
  return id_bytes_[std::size_t(id)];
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && std::size_t(id) < id_kind_.size() && id_kind_[std::size_t(id)] == 2;
}

bool Tokenizer::has_token(std::int32_t id) const {
  return id >= 0 && std::size_t(id) < id_kind_.size() && id_kind_[std::size_t(id)] != 0;
}

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& tok : added_)
    if (tok.content == token) return tok.id;
  const auto it = model_.vocab().find(std::string(token));
  if (it == model_.vocab().end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::decode_bytes(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (const std::int32_t id : ids) {
    const std::string_view bytes = token_bytes(id);
    if (!(skip_special && is_special(id))) out += bytes;
  }
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  return lossy_utf8(decode_bytes(ids, skip_special));
}

std::string StreamingDetokenizer::push(std::int32_t id) {
  const std::string_view bytes = tokenizer_->token_bytes(id);
  std::string out;
  if (!(skip_special_ && tokenizer_->is_special(id))) utf8_.feed(bytes, out);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out;
  utf8_.finish(out);
  return out;
}

}  // namespace asynct::text
