#include "engine/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace asynct {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      holders_(std::size_t(std::max(num_blocks, 0)), 0),
      hash_of_(std::size_t(std::max(num_blocks, 0)), 0),
      filed_(std::size_t(std::max(num_blocks, 0)), 0),
      evictable_at_(std::size_t(std::max(num_blocks, 0))) {
  check(num_blocks >= 1, "BlockManager: need at least one block");
  check(block_size >= 1, "BlockManager: block_size must be >= 1");
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

bool BlockManager::can_grow(const std::vector<int>& table, int tokens) const {
  return blocks_for(tokens) - std::int64_t(table.size()) <= std::int64_t(num_free_blocks());
}

void BlockManager::grow(std::vector<int>& table, int tokens) {
  check(can_grow(table, tokens), "BlockManager: out of KV blocks (", num_free_blocks(), " free)");
  while (std::int64_t(table.size()) < blocks_for(tokens)) {
    int block;
    if (!free_.empty()) {
      block = free_.back();
      free_.pop_back();
    } else {  // the filed block released longest ago is forgotten
      block = evictable_.front();
      evictable_.pop_front();
      filed_by_hash_.erase(hash_of_[std::size_t(block)]);
      filed_[std::size_t(block)] = 0;
    }
    holders_[std::size_t(block)] = 1;
    table.push_back(block);
  }
}

void BlockManager::release(std::vector<int>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const std::size_t b = std::size_t(*it);
    check(holders_[b] > 0, "BlockManager: block ", *it, " released but not held");
    if (--holders_[b] > 0) continue;
    if (filed_[b]) evictable_at_[b] = evictable_.insert(evictable_.end(), *it);
    else free_.push_back(*it);
  }
  table.clear();
}

void BlockManager::shrink(std::vector<int>& table, int tokens) {
  const std::size_t keep = std::size_t(blocks_for(tokens));
  if (table.size() <= keep) return;
  std::vector<int> tail(table.begin() + std::ptrdiff_t(keep), table.end());
  table.resize(keep);
  release(tail);
}

void BlockManager::share(const std::vector<int>& from, int count, std::vector<int>& table) {
  check(count >= 0 && std::size_t(count) <= from.size(), "BlockManager: sharing ", count, " of ", from.size(), " blocks");
  for (int i = 0; i < count; ++i) {
    check(holders_[std::size_t(from[std::size_t(i)])] > 0, "BlockManager: block ", from[std::size_t(i)], " shared but not held");
    hold(from[std::size_t(i)]);
    table.push_back(from[std::size_t(i)]);
  }
}

void BlockManager::hold(int block) {
  const std::size_t b = std::size_t(block);
  if (holders_[b]++ == 0) evictable_.erase(evictable_at_[b]);  // a filed block no one held
}

std::uint64_t BlockManager::chain_hash(std::uint64_t parent, const std::int32_t* tokens, int count) {
  // FNV-1a over the parent's hash and the tokens' bytes, then a splitmix64 finish.
  std::uint64_t h = 14695981039346656037ull;
  const auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  mix(parent);
  for (int i = 0; i < count; ++i) mix(std::uint64_t(std::uint32_t(tokens[i])));
  h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 27, h *= 0x94d049bb133111ebull, h ^= h >> 31;
  return h;
}

int BlockManager::match_prefix(const std::vector<std::int32_t>& tokens, int max_blocks, std::vector<int>& table,
                               std::uint64_t* last_hash) {
  check(table.empty(), "BlockManager: match_prefix into a table that holds blocks");
  std::uint64_t parent = 0;
  const int full = std::min<int>(max_blocks, int(tokens.size()) / block_size_);
  for (int i = 0; i < full; ++i) {
    const std::int32_t* block_tokens = tokens.data() + std::size_t(i) * std::size_t(block_size_);
    const std::uint64_t h = chain_hash(parent, block_tokens, block_size_);
    const auto it = filed_by_hash_.find(h);
    if (it == filed_by_hash_.end() || it->second.parent != parent ||
        !std::equal(it->second.tokens.begin(), it->second.tokens.end(), block_tokens))
      break;
    hold(it->second.block);
    table.push_back(it->second.block);
    parent = h;
  }
  *last_hash = parent;
  return int(table.size());
}

std::uint64_t BlockManager::cache_block(int block, std::uint64_t parent, const std::int32_t* tokens) {
  const std::uint64_t h = chain_hash(parent, tokens, block_size_);
  const std::size_t b = std::size_t(block);
  check(holders_[b] > 0, "BlockManager: filing block ", block, ", which no sequence holds");
  if (!filed_[b] && filed_by_hash_.find(h) == filed_by_hash_.end()) {
    filed_by_hash_.emplace(h, Filed{block, parent, std::vector<std::int32_t>(tokens, tokens + block_size_)});
    filed_[b] = 1;
    hash_of_[b] = h;
  }
  return h;
}

}  // namespace asynct
