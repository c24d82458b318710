// Suffix decoding's index (engine/drafter.h, --speculative suffix): a trie of every window of up
// to `depth` consecutive tokens of the sequences added to it, each node counting how often its
// path occurred. Drafts continue a context by its longest suffix the index has seen followed by
// something, taking the most frequent continuation while it is likely enough, so a draft is long
// where the match is confident and short or empty where it is not.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace asynct {

class SuffixIndex {
 public:
  struct Draft {
    std::vector<std::int32_t> tokens;
    int match_length = 0;  // tokens of the context's suffix the first draft token continued (0: no draft)
  };

  // `max_tokens`: the tokens kept; over it, the oldest sequences are evicted, and then the
  // newest sequence's oldest tokens (a window sliding over one long sequence).
  explicit SuffixIndex(int depth, std::int64_t max_tokens = INT64_MAX);

  // Starts a new sequence with `tokens` (its last max_tokens at most).
  void add(std::span<const std::int32_t> tokens);
  // Appends a token to the newest sequence (a new one if there is none): the windows ending at it.
  void extend(std::int32_t token);

  // Up to max_tokens tokens after `context`. Each continues the longest suffix (at most depth-1
  // tokens) of context + the draft so far that occurred followed by a token, with its most
  // frequent follower (ties: the lowest id); the draft stops before a follower whose count is
  // under min_probability of its path's count.
  Draft draft(std::span<const std::int32_t> context, int max_tokens, double min_probability) const;

  int depth() const { return depth_; }
  std::int64_t num_tokens() const { return num_tokens_; }  // tokens of the retained sequences
  std::size_t num_sequences() const { return sequences_.size(); }
  std::size_t num_nodes() const { return num_nodes_; }     // the trie's nodes, the root aside

 private:
  struct Node {
    int count = 0;  // occurrences of the path from the root (the root: windows started)
    std::map<std::int32_t, std::unique_ptr<Node>> children;  // ordered: ties go to the lowest id
  };

  // The node of `path` from the root, or null.
  const Node* find(std::span<const std::int32_t> path) const;
  // The deepest node for a suffix of `context` (at most depth-1 tokens) that has a child, and its length.
  const Node* longest_match(std::span<const std::int32_t> context, int* length) const;
  // Takes the oldest sequence's windows out, counts and nodes (count 0) alike.
  void evict_oldest();
  // Takes the windows that start at the only sequence's first token out, and that token.
  void evict_first_token();
  // The windows of `seq` that start at `start` (up to depth tokens) out of the counts.
  void remove_window(const std::deque<std::int32_t>& seq, std::size_t start);

  int depth_;
  std::int64_t max_tokens_;
  Node root_;
  std::deque<std::deque<std::int32_t>> sequences_;  // retained, oldest first, for eviction
  std::int64_t num_tokens_ = 0;
  std::size_t num_nodes_ = 0;
  // The newest sequence's nodes for its windows that end at its last token, 1..depth-1 long
  // (shortest first): extend() adds a child to each and to the root.
  std::vector<Node*> open_;
};

}  // namespace asynct
