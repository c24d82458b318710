// The paged KV cache's bookkeeping: which physical blocks are free, and each sequence's
// block table. It holds no K/V itself (the model runner does).
#pragma once

#include <cstdint>
#include <vector>

namespace asynct {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_free_blocks() const { return int(free_.size()); }
  int num_blocks() const { return num_blocks_; }
  // Blocks that hold `tokens` tokens (in 64 bits: a count near INT_MAX does not wrap).
  std::int64_t blocks_for(std::int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Whether `table` can grow to hold `tokens` tokens.
  bool can_grow(const std::vector<int>& table, int tokens) const;
  // Grows `table` to hold `tokens` tokens; throws if there are not enough free blocks.
  void grow(std::vector<int>& table, int tokens);
  // Returns every block of `table` to the free list and empties it.
  void release(std::vector<int>& table);

 private:
  int num_blocks_, block_size_;
  std::vector<int> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace asynct
