#include "engine/block_manager.h"

#include "core/error.h"

namespace asynct {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  check(num_blocks >= 1, "BlockManager: need at least one block");
  check(block_size >= 1, "BlockManager: block_size must be >= 1");
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

bool BlockManager::can_grow(const std::vector<int>& table, int tokens) const {
  return blocks_for(tokens) - std::int64_t(table.size()) <= std::int64_t(free_.size());
}

void BlockManager::grow(std::vector<int>& table, int tokens) {
  check(can_grow(table, tokens), "BlockManager: out of KV blocks (", free_.size(), " free)");
  while (std::int64_t(table.size()) < blocks_for(tokens)) {
    table.push_back(free_.back());
    free_.pop_back();
  }
}

void BlockManager::release(std::vector<int>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

}  // namespace asynct
