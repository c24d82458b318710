#include "text/bpe.h"

#include <algorithm>
#include <bit>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/utf8.h"

namespace asynct::text {

namespace {

constexpr std::int32_t kNoRank = -1;

// The raw bytes a byte-level token string stands for; false when a character is outside the
// byte-level alphabet.
bool byte_level_to_bytes(const std::string& token, std::string& out) {
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  std::size_t i = 0;
  while (i < token.size()) {
    char32_t cp;
    if (p[i] < 0x80) {
      cp = p[i];
      i += 1;
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = char32_t(((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F));
      i += 2;
    } else {
      return false;  // three-byte and longer characters are never in the alphabet
    }
    const int b = char_to_byte(cp);
    if (b < 0) return false;
    out.push_back(char(b));
  }
  return true;
}

bool is_unset_string(const nlohmann::json& spec, const char* name) {
  if (!spec.contains(name)) return true;
  const auto& v = spec[name];
  return v.is_null() || (v.is_string() && v.get<std::string>().empty());
}

}  // namespace

BpeModel::BpeModel(BpeModel&& o) noexcept
    : vocab_(std::move(o.vocab_)),
      max_id_(o.max_id_),
      merge_table_(std::move(o.merge_table_)),
      merge_shift_(o.merge_shift_),
      unk_id_(o.unk_id_),
      fuse_unk_(o.fuse_unk_),
      ignore_merges_(o.ignore_merges_),
      raw_vocab_(std::move(o.raw_vocab_)) {
  std::copy(std::begin(o.byte_ids_), std::end(o.byte_ids_), std::begin(byte_ids_));
}

BpeModel BpeModel::from_json(const nlohmann::json& spec) {
  check(spec.is_object(), "tokenizer.json: \"model\" must be an object");
  const std::string type = spec.value("type", std::string("BPE"));
  check(type == "BPE", "tokenizer.json: the model type '", type, "' is not supported (asynct implements BPE)");
  if (spec.contains("dropout") && !spec["dropout"].is_null()) {
    check(spec["dropout"].is_number() && spec["dropout"].get<double>() == 0.0,
          "tokenizer.json: BPE dropout is not supported (it must be null)");
  }
  check(!spec.value("byte_fallback", false), "tokenizer.json: BPE byte_fallback is not supported");
  check(is_unset_string(spec, "continuing_subword_prefix"),
        "tokenizer.json: BPE continuing_subword_prefix is not supported (it must be empty)");
  check(is_unset_string(spec, "end_of_word_suffix"),
        "tokenizer.json: BPE end_of_word_suffix is not supported (it must be empty)");

  BpeModel m;
  check(spec.contains("vocab") && spec["vocab"].is_object(), "tokenizer.json: the BPE model has no \"vocab\" object");
  for (const auto& [token, id] : spec["vocab"].items()) {
    check(id.is_number_integer() && id.get<long long>() >= 0 && id.get<long long>() < (1ll << 31),
          "tokenizer.json: the vocabulary id of '", token, "' is not a non-negative integer");
    m.vocab_.emplace(token, id.get<std::int32_t>());
    m.max_id_ = std::max(m.max_id_, id.get<std::int32_t>());
  }
  const auto& alphabet = byte_to_char();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, alphabet[std::size_t(b)]);
    const auto it = m.vocab_.find(ch);
    m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
  }

  m.ignore_merges_ = spec.value("ignore_merges", false);
  m.fuse_unk_ = spec.value("fuse_unk", false);
  if (!is_unset_string(spec, "unk_token")) {
    const std::string unk = spec["unk_token"];
    const auto it = m.vocab_.find(unk);
    check(it != m.vocab_.end(), "tokenizer.json: the BPE unk_token '", unk, "' is not in the vocabulary");
    m.unk_id_ = it->second;
  }
  if (m.ignore_merges_) {
    std::string raw;
    for (const auto& [token, id] : m.vocab_)
      if (byte_level_to_bytes(token, raw)) m.raw_vocab_.emplace(raw, id);
  }

  check(spec.contains("merges") && spec["merges"].is_array(), "tokenizer.json: the BPE model has no \"merges\" list");
  const auto& merges = spec["merges"];
  std::size_t capacity = 16;
  while (capacity < 2 * merges.size()) capacity *= 2;
  m.merge_table_.assign(capacity, Slot{});
  m.merge_shift_ = 64 - std::countr_zero(capacity);
  std::int32_t rank = 0;
  for (const auto& merge : merges) {
    std::string left, right;
    if (merge.is_string()) {  // the older form: "left right"
      const std::string s = merge;
      const auto space = s.find(' ', 1);
      check(space != std::string::npos, "tokenizer.json: the merge '", s, "' is not two tokens separated by a space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      check(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
            "tokenizer.json: merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
      left = merge[0];
      right = merge[1];
    }
    const auto a = m.vocab_.find(left), b = m.vocab_.find(right), ab = m.vocab_.find(left + right);
    check(a != m.vocab_.end() && b != m.vocab_.end(), "tokenizer.json: merge ", rank, " ('", left, "', '", right,
          "') names a token that is not in the vocabulary");
    check(ab != m.vocab_.end(), "tokenizer.json: merge ", rank, " ('", left, "', '", right, "') makes '", left + right,
          "', which is not in the vocabulary");
    // A pair listed twice keeps its first (lowest) rank.
    if (m.find_merge(a->second, b->second).rank == kNoRank) m.add_merge(a->second, b->second, {rank, ab->second});
    ++rank;
  }
  return m;
}

void BpeModel::add_merge(std::int32_t a, std::int32_t b, Merge merge) {
  const std::uint64_t k = key(a, b);
  const std::size_t mask = merge_table_.size() - 1;
  std::size_t i = std::size_t((k * 0x9E3779B97F4A7C15ull) >> merge_shift_);
  while (merge_table_[i].key != ~std::uint64_t(0)) i = (i + 1) & mask;
  merge_table_[i] = {k, merge};
}

BpeModel::Merge BpeModel::find_merge(std::int32_t a, std::int32_t b) const {
  const std::uint64_t k = key(a, b);
  const std::size_t mask = merge_table_.size() - 1;
  std::size_t i = std::size_t((k * 0x9E3779B97F4A7C15ull) >> merge_shift_);
  for (;;) {
    const Slot& s = merge_table_[i];
    if (s.key == k) return s.merge;
    if (s.key == ~std::uint64_t(0)) return {kNoRank, -1};
    i = (i + 1) & mask;
  }
}

// Scans for the lowest-rank pair after every merge; ranks[i] belongs to (symbols[i], symbols[i+1]).
void BpeModel::merge_small(std::vector<std::int32_t>& symbols) const {
  std::int32_t ranks[64], merged[64];
  std::size_t n = symbols.size();
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const Merge m = find_merge(symbols[i], symbols[i + 1]);
    ranks[i] = m.rank;
    merged[i] = m.id;
  }
  while (n > 1) {
    std::size_t best = n;
    std::int32_t best_rank = kNoRank;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      if (ranks[i] != kNoRank && (best_rank == kNoRank || ranks[i] < best_rank)) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best == n) break;
    symbols[best] = merged[best];
    // Drop symbol best+1 and pair best+1.
    for (std::size_t i = best + 1; i + 1 < n; ++i) {
      symbols[i] = symbols[i + 1];
      if (i + 1 < n - 1) {
        ranks[i] = ranks[i + 1];
        merged[i] = merged[i + 1];
      }
    }
    --n;
    if (best > 0) {
      const Merge m = find_merge(symbols[best - 1], symbols[best]);
      ranks[best - 1] = m.rank;
      merged[best - 1] = m.id;
    }
    if (best + 1 < n) {
      const Merge m = find_merge(symbols[best], symbols[best + 1]);
      ranks[best] = m.rank;
      merged[best] = m.id;
    }
  }
  symbols.resize(n);
}

// A min-heap of candidate merges (rank, then position) over a doubly linked list; an entry
// whose pair has changed since it was pushed is skipped when popped.
void BpeModel::merge_large(std::vector<std::int32_t>& symbols) const {
  const std::size_t n = symbols.size();
  std::vector<std::int32_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = std::int32_t(i) - 1;
    next[i] = i + 1 < n ? std::int32_t(i + 1) : -1;
  }
  struct Candidate {
    std::int32_t rank, pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const Merge m = find_merge(symbols[i], symbols[i + 1]);
    if (m.rank != kNoRank) heap.push({m.rank, std::int32_t(i)});
  }
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[std::size_t(c.pos)] || next[std::size_t(c.pos)] < 0) continue;
    const std::int32_t right = next[std::size_t(c.pos)];
    const Merge m = find_merge(symbols[std::size_t(c.pos)], symbols[std::size_t(right)]);
    if (m.rank != c.rank) continue;  // stale
    symbols[std::size_t(c.pos)] = m.id;
    alive[std::size_t(right)] = 0;
    next[std::size_t(c.pos)] = next[std::size_t(right)];
    if (next[std::size_t(right)] >= 0) prev[std::size_t(next[std::size_t(right)])] = c.pos;
    if (prev[std::size_t(c.pos)] >= 0) {
      const std::int32_t p = prev[std::size_t(c.pos)];
      const Merge pm = find_merge(symbols[std::size_t(p)], symbols[std::size_t(c.pos)]);
      if (pm.rank != kNoRank) heap.push({pm.rank, p});
    }
    if (next[std::size_t(c.pos)] >= 0) {
      const Merge nm = find_merge(symbols[std::size_t(c.pos)], symbols[std::size_t(next[std::size_t(c.pos)])]);
      if (nm.rank != kNoRank) heap.push({nm.rank, c.pos});
    }
  }
  std::size_t w = 0;
  for (std::int32_t i = 0; i >= 0 && std::size_t(i) < n; i = next[std::size_t(i)]) symbols[w++] = symbols[std::size_t(i)];
  symbols.resize(w);
}

void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    const auto it = raw_vocab_.find(std::string(word));
    if (it != raw_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWord;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<std::int32_t> symbols;
  symbols.clear();
  bool last_unk = false;
  for (const char ch : word) {
    const std::int32_t id = byte_ids_[static_cast<unsigned char>(ch)];
    if (id >= 0) {
      symbols.push_back(id);
      last_unk = false;
    } else if (unk_id_ >= 0) {  // a byte with no token: the unknown token (fused when asked)
      if (!(fuse_unk_ && last_unk)) symbols.push_back(unk_id_);
      last_unk = true;
    }  // with no unk_token the byte is dropped, as the reference does
  }
  if (symbols.size() <= 64) {
    merge_small(symbols);
  } else {
    merge_large(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), symbols);
  }
}

}  // namespace asynct::text
