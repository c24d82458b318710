// What the penalties of a sequence's next row see (StepBatch::penalty_tokens): the distinct
// tokens of the sequence except its newest, each with the times it was generated and whether
// the prompt holds it. Kept up to date token by token, so a step copies it instead of counting
// the sequence again; at most one entry per token of the sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/sampling_params.h"

namespace asynct {

class PenaltyHistory {
 public:
  // The history of a sequence of `tokens` (the first `prompt_length` of them its prompt).
  PenaltyHistory(const std::vector<std::int32_t>& tokens, std::size_t prompt_length);
  // The newest token stopped being the newest: it joins the history.
  void add(std::int32_t token, bool generated);
  const std::vector<PenaltyToken>& tokens() const { return tokens_; }
  // The index of `token` in tokens(), or -1.
  int find(std::int32_t token) const;

 private:
  std::vector<PenaltyToken> tokens_;
  std::unordered_map<std::int32_t, int> index_;
};

}  // namespace asynct
