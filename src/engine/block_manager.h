// The paged KV cache's bookkeeping: which physical blocks are free, and each sequence's
// block table. It holds no K/V itself (the model runner does).
//
// With prefix caching, a full block whose K/V are computed can be kept for later requests:
// cache_block() files it under a hash chained over its tokens and the block before it, and
// match_prefix() gives a new sequence the leading blocks of its tokens that are filed, shared
// (each block counts its holders). A filed block that no sequence holds is not freed but kept,
// least recently released first in line to be taken when no free block is left.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace asynct {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  // Blocks a sequence can take now: the free ones and the filed ones no sequence holds.
  int num_free_blocks() const { return int(free_.size() + evictable_.size()); }
  // Blocks some sequence holds.
  int num_used_blocks() const { return num_blocks_ - num_free_blocks(); }
  int num_blocks() const { return num_blocks_; }
  // Blocks that hold `tokens` tokens (in 64 bits: a count near INT_MAX does not wrap).
  std::int64_t blocks_for(std::int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Whether `table` can grow to hold `tokens` tokens.
  bool can_grow(const std::vector<int>& table, int tokens) const;
  // Grows `table` to hold `tokens` tokens (free blocks first, then the least recently released
  // filed ones, forgotten); throws if there are not enough.
  void grow(std::vector<int>& table, int tokens);
  // Lets go of every block of `table` and empties it: a block no sequence holds any more is
  // freed, or kept when it is filed.
  void release(std::vector<int>& table);
  // Lets go of the blocks of `table` past those that hold `tokens` tokens (a speculative step's
  // blocks for drafts the model did not keep).
  void shrink(std::vector<int>& table, int tokens);
  // Appends the first `count` blocks of `from` to `table`, now held by its sequence too (a fork
  // sharing its parent's full blocks).
  void share(const std::vector<int>& from, int count, std::vector<int>& table);

  // The chained hash of a full block: its tokens after the hash of the block before it (0 for
  // the first).
  static std::uint64_t chain_hash(std::uint64_t parent, const std::int32_t* tokens, int count);
  // Into the empty `table`: the filed blocks holding the first blocks of `tokens`, at most
  // max_blocks, each now held by the caller; returns how many, and the last one's hash.
  int match_prefix(const std::vector<std::int32_t>& tokens, int max_blocks, std::vector<int>& table,
                   std::uint64_t* last_hash);
  // Files `block`, full with `tokens` (block_size of them) after the block of hash `parent`;
  // returns its hash. A block already filed under it (another sequence computed the same
  // prefix) stays the one found.
  std::uint64_t cache_block(int block, std::uint64_t parent, const std::int32_t* tokens);

 private:
  struct Filed {
    int block;
    std::uint64_t parent;
    std::vector<std::int32_t> tokens;  // compared on a match: a hash collision is no match
  };
  void hold(int block);

  int num_blocks_, block_size_;
  std::vector<int> free_;                   // a stack: the most recently freed block is reused first
  std::vector<int> holders_;                // per block: the sequences holding it
  std::vector<std::uint64_t> hash_of_;      // per block: its hash when filed
  std::vector<char> filed_;                 // per block: whether it is filed
  std::list<int> evictable_;                // filed, held by none: least recently released first
  std::vector<std::list<int>::iterator> evictable_at_;
  std::unordered_map<std::uint64_t, Filed> filed_by_hash_;
};

}  // namespace asynct
