#include "text/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "text/jinja/value.h"

namespace asynct::jinja {

std::string describe(Pos pos) { return detail::concat("line ", pos.line, ":", pos.column); }

namespace {

// jinja2's \s (Python's Unicode whitespace), on UTF-8 text.
std::size_t whitespace_at(const std::string& s, std::size_t i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return py_isspace(b) ? 1 : 0;
  std::size_t len = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + len > s.size()) return 0;
  std::u32string c = utf8_decode(s.substr(i, len));
  return c.size() == 1 && py_isspace(c[0]) ? len : 0;
}

std::size_t skip_whitespace(const std::string& s, std::size_t i) {
  while (i < s.size()) {
    std::size_t n = whitespace_at(s, i);
    if (n == 0) break;
    i += n;
  }
  return i;
}

std::string rstrip_whitespace(const std::string& text) {
  std::u32string t = utf8_decode(text);
  while (!t.empty() && py_isspace(t.back())) t.pop_back();
  return utf8_encode(t);
}

bool all_whitespace(const std::string& s, std::size_t from) {
  if (from >= s.size()) return false;  // jinja2 matches \s+: nothing to strip
  return skip_whitespace(s, from) == s.size();
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      std::size_t start = find_tag(pos);
      std::string text = src_.substr(pos, start - pos);
      Pos text_pos = at(pos);
      if (start == src_.size()) {
        emit_text(std::move(text), text_pos);
        break;
      }
      char kind = src_[start + 1];
      char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      if (sign == '-') {
        text = rstrip_whitespace(text);
      } else if (sign != '+' && kind != '{') {
        std::size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && all_whitespace(text, l_pos)) text.resize(l_pos);
      }
      emit_text(std::move(text), text_pos);
      std::size_t p = start + 2 + (sign ? 1 : 0);
      std::size_t end = kind == '#' ? comment(start, p) : tag(kind, start, p);
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos = end;
    }
    tokens_.push_back({Token::Type::End, "", at(src_.size())});
    return std::move(tokens_);
  }

 private:
  Pos at(std::size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    std::size_t line = std::size_t(it - line_starts_.begin());
    return {int(line), int(offset - line_starts_[line - 1] + 1)};
  }

  std::size_t find_tag(std::size_t pos) const {
    for (std::size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  void emit_text(std::string text, Pos pos) {
    if (!text.empty()) tokens_.push_back({Token::Type::Text, std::move(text), pos});
  }

  // After a tag's closing delimiter: `-` strips all whitespace, trim_blocks one newline.
  std::size_t after_end(std::size_t end, char sign, bool trim) const {
    if (sign == '-') return skip_whitespace(src_, end);
    if (sign == 0 && trim && end < src_.size() && src_[end] == '\n') return end + 1;
    return end;
  }

  std::size_t comment(std::size_t start, std::size_t p) {
    for (std::size_t i = p; i + 1 < src_.size(); ++i) {
      for (char sign : {'-', '+'}) {
        if (src_.compare(i, 3, std::string(1, sign) + "#}") == 0) return after_end(i + 3, sign, true);
      }
      if (src_.compare(i, 2, "#}") == 0) return after_end(i + 2, 0, true);
    }
    throw Error(detail::concat("chat template ", describe(at(start)), ": unclosed comment '{#'"));
  }

  std::size_t tag(char kind, std::size_t start, std::size_t p) {
    bool block = kind == '%';
    tokens_.push_back({block ? Token::Type::BlockBegin : Token::Type::VariableBegin, block ? "{%" : "{{", at(start)});
    const char* close = block ? "%}" : "}}";
    int depth = 0;  // open brackets: a `}}` inside a dict literal does not end the tag
    while (true) {
      p = skip_whitespace(src_, p);
      if (p >= src_.size())
        throw Error(detail::concat("chat template ", describe(at(start)), ": unclosed tag '", block ? "{%" : "{{", "'"));
      if (depth == 0) {
        char sign = 0;
        std::size_t q = p;
        if ((src_[q] == '-' || (block && src_[q] == '+')) && src_.compare(q + 1, 2, close) == 0) sign = src_[q++];
        if (src_.compare(q, 2, close) == 0) {
          tokens_.push_back({block ? Token::Type::BlockEnd : Token::Type::VariableEnd, close, at(p)});
          return after_end(q + 2, sign, block);
        }
      }
      p = token(p, depth);
    }
  }

  std::size_t token(std::size_t p, int& depth) {
    Pos pos = at(p);
    char c = src_[p];
    if (c == '\'' || c == '"') return string_literal(p);
    if (std::isdigit(static_cast<unsigned char>(c))) return number(p);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t q = p;
      while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
      tokens_.push_back({Token::Type::Name, src_.substr(p, q - p), pos});
      return q;
    }
    for (const char* op : {"//", "**", "==", "!=", "<=", ">="}) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back({Token::Type::Operator, op, pos});
        return p + 2;
      }
    }
    if (std::strchr("+-/*%~[](){}<>=.:|,", c) != nullptr) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) throw Error(detail::concat("chat template ", describe(pos), ": unexpected '", c, "'"));
        --depth;
      }
      tokens_.push_back({Token::Type::Operator, std::string(1, c), pos});
      return p + 1;
    }
    throw Error(detail::concat("chat template ", describe(pos), ": unexpected character '", c, "'"));
  }

  std::size_t number(std::size_t p) {
    Pos pos = at(p);
    auto digits = [&](std::size_t q) {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q + 1])))))
        ++q;
      return q;
    };
    std::size_t q = digits(p);
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      q = digits(q + 1);
      is_float = true;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      std::size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        q = digits(r);
        is_float = true;
      }
    }
    std::string text = src_.substr(p, q - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({is_float ? Token::Type::Float : Token::Type::Integer, text, pos});
    return q;
  }

  // A string literal, with Python's escapes (jinja2 decodes them with "unicode-escape").
  std::size_t string_literal(std::size_t p) {
    Pos pos = at(p);
    char quote = src_[p];
    std::string out;
    std::size_t q = p + 1;
    auto hex = [&](std::size_t from, int n) {
      if (from + std::size_t(n) > src_.size()) return -1L;
      long v = 0;
      for (int k = 0; k < n; ++k) {
        char h = src_[from + std::size_t(k)];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return -1L;
        v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    while (true) {
      if (q >= src_.size()) throw Error(detail::concat("chat template ", describe(pos), ": unclosed string literal"));
      char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) throw Error(detail::concat("chat template ", describe(pos), ": unclosed string literal"));
      char e = src_[q + 1];
      q += 2;
      switch (e) {
        case '\n': break;  // a backslash-newline continues the line
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          long v = hex(q, n);
          if (v < 0 || v > 0x10ffff)
            throw Error(detail::concat("chat template ", describe(pos), ": bad \\", e, " escape in a string literal"));
          utf8_append(out, char32_t(v));
          q += std::size_t(n);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            long v = e - '0';
            for (int k = 0; k < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++k) v = v * 8 + (src_[q++] - '0');
            utf8_append(out, char32_t(v));
          } else if (e == 'N') {
            throw Error(detail::concat("chat template ", describe(pos), ": \\N{...} escapes are not supported"));
          } else {
            out += '\\';  // Python keeps unknown escapes as they are
            out += e;
          }
      }
    }
    tokens_.push_back({Token::Type::String, std::move(out), pos});
    return q + 1;
  }

  std::string src_;
  std::vector<std::size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  std::string normalized;
  normalized.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).run();
}

}  // namespace asynct::jinja
