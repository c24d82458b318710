// tokenizer.json's "model" of type BPE over a byte-level alphabet: the vocabulary and the merges
// by rank. It works on raw bytes: each byte starts as the id of its byte-level character, and
// merges are looked up by the pair of ids (a hash of id pairs -> rank and merged id), so no
// string is built while encoding.
//
// A word is merged by repeatedly taking the adjacent pair of lowest rank (leftmost among
// equals): short words by scanning a small array, long ones with a priority queue over a linked
// list of symbols. Words seen before come from a cache.
//
// Options: dropout (null or 0), byte_fallback (false), continuing_subword_prefix and
// end_of_word_suffix (empty or null) are checked; anything else set is an Error naming it.
// unk_token, fuse_unk and ignore_merges are implemented.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace asynct::text {

class BpeModel {
 public:
  // Reads tokenizer.json's "model"; throws Error on an unsupported type or option, a merge
  // whose parts or result are not in the vocabulary, or a byte with no token.
  static BpeModel from_json(const nlohmann::json& spec);

  BpeModel(BpeModel&& other) noexcept;

  // Appends the ids of one pre-tokenized word (raw bytes) to `out`.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  // The vocabulary: token string (byte-level spelling) -> id, and id -> string.
  const std::unordered_map<std::string, std::int32_t>& vocab() const { return vocab_; }
  std::int32_t max_id() const { return max_id_; }

 private:
  BpeModel() = default;
  struct Merge {
    std::int32_t rank, id;
  };
  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b);
  }
  // The merge of (a, b), or rank -1 when there is none. Merges live in an open-addressing
  // table (linear probing, power-of-two size, at most half full): the hot lookup of encoding.
  Merge find_merge(std::int32_t a, std::int32_t b) const;
  void add_merge(std::int32_t a, std::int32_t b, Merge m);
  void merge_small(std::vector<std::int32_t>& symbols) const;
  void merge_large(std::vector<std::int32_t>& symbols) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::int32_t max_id_ = -1;
  std::int32_t byte_ids_[256] = {};  // -1: the byte has no token
  struct Slot {
    std::uint64_t key = ~std::uint64_t(0);  // empty
    Merge merge{-1, -1};
  };
  std::vector<Slot> merge_table_;
  int merge_shift_ = 64;
  std::int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, std::int32_t> raw_vocab_;  // raw bytes -> id (ignore_merges)

  // Words up to kCacheMaxWord bytes -> their ids; cleared when it holds kCacheEntries.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr std::size_t kCacheMaxWord = 256, kCacheEntries = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace asynct::text
