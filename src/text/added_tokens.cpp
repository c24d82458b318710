#include "text/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "text/regex.h"

namespace asynct::text {

namespace {

// The reference's word and space classes (Unicode \w and \s), through PCRE2 with UCP.
bool word_char_before(std::string_view text, std::size_t at) {
  if (at == 0) return false;
  std::size_t b = at - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  static const Regex word(R"(^\w)");
  std::vector<Span> m;
  word.find_all(text.substr(b, at - b), m);
  return !m.empty();
}

bool word_char_after(std::string_view text, std::size_t at) {
  if (at >= text.size()) return false;
  static const Regex word(R"(^\w)");
  std::vector<Span> m;
  std::size_t e = at + 1;
  while (e < text.size() && (static_cast<unsigned char>(text[e]) & 0xC0) == 0x80) ++e;
  word.find_all(text.substr(at, e - at), m);
  return !m.empty();
}

// Where the whitespace run ending at `at` starts.
std::size_t spaces_before(std::string_view text, std::size_t at) {
  static const Regex spaces(R"(\s+$)");
  std::vector<Span> m;
  spaces.find_all(text.substr(0, at), m);
  return m.empty() ? at : m.back().begin;
}

// Where the whitespace run starting at `at` ends.
std::size_t spaces_after(std::string_view text, std::size_t at) {
  static const Regex spaces(R"(^\s+)");
  std::vector<Span> m;
  spaces.find_all(text.substr(at), m);
  return m.empty() ? at : at + m.front().end;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  by_first_byte_.resize(256);
  for (std::uint32_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    const auto b = static_cast<unsigned char>(tokens_[i].content[0]);
    first_byte_[b] = true;
    by_first_byte_[b].push_back(i);
  }
  for (auto& list : by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](std::uint32_t x, std::uint32_t y) {
      return tokens_[x].content.size() > tokens_[y].content.size();
    });
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  std::size_t done = 0;  // text before this is in `out`
  std::size_t at = 0;
  const std::size_t n = text.size();
  while (at < n) {
    if (!first_byte_[static_cast<unsigned char>(text[at])]) {
      ++at;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (const std::uint32_t i : by_first_byte_[static_cast<unsigned char>(text[at])]) {
      const std::string& c = tokens_[i].content;
      if (c.size() <= n - at && std::memcmp(text.data() + at, c.data(), c.size()) == 0) {
        hit = &tokens_[i];
        break;  // longest first
      }
    }
    if (!hit) {
      ++at;
      continue;
    }
    std::size_t start = at, stop = at + hit->content.size();
    if (hit->single_word && (word_char_before(text, start) || word_char_after(text, stop))) {
      at = stop;  // the reference skips this match and searches on after it
      continue;
    }
    if (hit->lstrip) start = std::max(spaces_before(text, start), done);
    if (hit->rstrip) stop = spaces_after(text, stop);
    if (start > done) out.push_back({done, start, -1});
    out.push_back({start, stop, hit->id});
    done = at = stop;
  }
  if (done < n) out.push_back({done, n, -1});
}

}  // namespace asynct::text
