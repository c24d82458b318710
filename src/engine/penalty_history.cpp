#include "engine/penalty_history.h"

namespace asynct {

PenaltyHistory::PenaltyHistory(const std::vector<std::int32_t>& tokens, std::size_t prompt_length) {
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) add(tokens[i], i >= prompt_length);
}

void PenaltyHistory::add(std::int32_t token, bool generated) {
  auto [it, inserted] = index_.try_emplace(token, int(tokens_.size()));
  if (inserted) tokens_.push_back({token, 0, 0});
  PenaltyToken& t = tokens_[std::size_t(it->second)];
  if (generated)
    ++t.output_count;
  else
    t.in_prompt = 1;
}

int PenaltyHistory::find(std::int32_t token) const {
  const auto it = index_.find(token);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace asynct
