#include "engine/suffix_index.h"

#include <algorithm>

#include "core/error.h"

namespace asynct {
namespace {

// Nodes in a subtree, its root included.
std::size_t subtree_size(const auto& node) {
  std::size_t n = 1;
  for (const auto& [token, child] : node.children) n += subtree_size(*child);
  return n;
}

}  // namespace

SuffixIndex::SuffixIndex(int depth, std::int64_t max_tokens) : depth_(depth), max_tokens_(max_tokens) {
  check(depth >= 2, "suffix index: depth must be >= 2, got ", depth);
  check(max_tokens >= 1, "suffix index: max_tokens must be >= 1, got ", max_tokens);
}

void SuffixIndex::add(std::span<const std::int32_t> tokens) {
  if (std::int64_t(tokens.size()) > max_tokens_) tokens = tokens.last(std::size_t(max_tokens_));
  sequences_.emplace_back();
  open_.clear();
  for (const std::int32_t t : tokens) extend(t);
}

void SuffixIndex::extend(std::int32_t token) {
  if (sequences_.empty()) {
    sequences_.emplace_back();
    open_.clear();
  }
  sequences_.back().push_back(token);
  ++num_tokens_;
  ++root_.count;
  // Every window ending at the previous token grows by this one, and a window starts here.
  std::vector<Node*> open;
  open.reserve(std::size_t(depth_));
  auto grow = [&](Node* node, int length) {
    std::unique_ptr<Node>& child = node->children[token];
    if (!child) {
      child = std::make_unique<Node>();
      ++num_nodes_;
    }
    ++child->count;
    if (length + 1 < depth_) open.push_back(child.get());
  };
  grow(&root_, 0);
  for (std::size_t i = 0; i < open_.size(); ++i) grow(open_[i], int(i) + 1);
  open_ = std::move(open);
  while (num_tokens_ > max_tokens_) {
    if (sequences_.size() > 1)
      evict_oldest();
    else
      evict_first_token();
  }
}

void SuffixIndex::evict_oldest() {
  const std::deque<std::int32_t> seq = std::move(sequences_.front());
  sequences_.pop_front();
  num_tokens_ -= std::int64_t(seq.size());
  for (std::size_t start = 0; start < seq.size(); ++start) remove_window(seq, start);
}

void SuffixIndex::evict_first_token() {
  std::deque<std::int32_t>& seq = sequences_.front();
  remove_window(seq, 0);
  seq.pop_front();
  --num_tokens_;
  // The window that started there, if it reached the last token, is open no more.
  if (open_.size() > seq.size()) open_.resize(seq.size());
}

void SuffixIndex::remove_window(const std::deque<std::int32_t>& seq, std::size_t start) {
  // The window extend() counted from this start: a node whose count reaches 0 occurred only in
  // this window, and so did everything under it (no open window passes through it).
  --root_.count;
  Node* node = &root_;
  const std::size_t end = std::min(seq.size(), start + std::size_t(depth_));
  for (std::size_t k = start; k < end; ++k) {
    auto it = node->children.find(seq[k]);
    check(it != node->children.end(), "suffix index: an evicted window is missing");
    if (--it->second->count == 0) {
      num_nodes_ -= subtree_size(*it->second);
      node->children.erase(it);
      return;
    }
    node = it->second.get();
  }
}

const SuffixIndex::Node* SuffixIndex::find(std::span<const std::int32_t> path) const {
  const Node* node = &root_;
  for (const std::int32_t t : path) {
    auto it = node->children.find(t);
    if (it == node->children.end()) return nullptr;
    node = it->second.get();
  }
  return node;
}

const SuffixIndex::Node* SuffixIndex::longest_match(std::span<const std::int32_t> context, int* length) const {
  for (int n = int(std::min<std::size_t>(context.size(), std::size_t(depth_ - 1))); n >= 1; --n) {
    const Node* node = find(context.last(std::size_t(n)));
    if (node && !node->children.empty()) {
      *length = n;
      return node;
    }
  }
  *length = 0;
  return nullptr;
}

SuffixIndex::Draft SuffixIndex::draft(std::span<const std::int32_t> context, int max_tokens, double min_probability) const {
  Draft d;
  if (max_tokens <= 0) return d;
  // The context's tail that a match can use, then the draft appended to it.
  std::vector<std::int32_t> tail(context.end() - std::ptrdiff_t(std::min<std::size_t>(context.size(), std::size_t(depth_ - 1))),
                                 context.end());
  int length = 0;
  const Node* node = longest_match(tail, &length);
  d.match_length = length;
  while (node && int(d.tokens.size()) < max_tokens) {
    std::int32_t best = 0;
    const Node* next = nullptr;
    for (const auto& [token, child] : node->children)  // ascending ids: a tie keeps the lowest
      if (!next || child->count > next->count) best = token, next = child.get();
    if (double(next->count) < min_probability * double(node->count)) break;
    d.tokens.push_back(best);
    tail.push_back(best);
    // Going down stays the longest suffix with a follower while there is room and a follower;
    // otherwise match again from the root.
    node = next;
    if (++length >= depth_ || node->children.empty()) node = longest_match(tail, &length);
  }
  if (d.tokens.empty()) d.match_length = 0;
  return d;
}

}  // namespace asynct
