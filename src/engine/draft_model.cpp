#include "engine/draft_model.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace asynct {

DraftModel::DraftModel(std::unique_ptr<ModelRunner> runner, int vocab_size, int max_positions)
    : runner_(std::move(runner)), blocks_(runner_->num_blocks(), runner_->block_size()), vocab_size_(vocab_size),
      max_positions_(max_positions) {}

void DraftModel::release(Sequence& seq) {
  blocks_.release(seq.draft_block_table);
  seq.draft_fed.clear();
}

void DraftModel::propose(const std::vector<Sequence*>& seqs, const std::vector<int>& most) {
  check(seqs.size() == most.size(), "draft model: ", seqs.size(), " sequences with ", most.size(), " draft limits");
  struct Drafting {
    Sequence* seq;
    int left;      // drafts still to take
    int feeding;   // tokens it feeds this draft step
  };
  std::vector<Drafting> drafting;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = *seqs[i];
    s.proposed_drafts.clear();
    // The draft cache keeps the longest prefix of what it was fed that the sequence's tokens
    // still have (drafts the target did not keep are gone); the newest token is always fed
    // again, since its logits give the first draft.
    std::size_t kept = 0;
    while (kept < s.draft_fed.size() && kept + 1 < s.tokens.size() && s.draft_fed[kept] == s.tokens[kept]) ++kept;
    s.draft_fed.resize(kept);
    blocks_.shrink(s.draft_block_table, int(kept));
    if (most[i] > 0 && std::int64_t(s.tokens.size()) + most[i] <= max_positions_)
      drafting.push_back({&s, most[i], int(s.tokens.size() - kept)});
  }
  const int bs = blocks_.block_size();
  while (!drafting.empty()) {
    // Room in the draft cache, taken in order; a sequence without room drafts no further.
    std::erase_if(drafting, [&](const Drafting& d) {
      const int end = int(d.seq->draft_fed.size()) + d.feeding;
      if (!blocks_.can_grow(d.seq->draft_block_table, end)) return true;
      blocks_.grow(d.seq->draft_block_table, end);
      return false;
    });
    if (drafting.empty()) break;
    // One-token sequences first: a backend hands that leading run to its decode kernel.
    std::stable_partition(drafting.begin(), drafting.end(), [](const Drafting& d) { return d.feeding == 1; });
    batch_.reset(drafting.size());
    for (std::size_t j = 0; j < drafting.size(); ++j) {
      Sequence& s = *drafting[j].seq;
      const int begin = int(s.draft_fed.size()), end = begin + drafting[j].feeding;
      for (int pos = begin; pos < end; ++pos) {
        const std::int32_t token = pos < int(s.tokens.size()) ? s.tokens[std::size_t(pos)] : s.proposed_drafts.back();
        s.draft_fed.push_back(token);
        batch_.tokens.push_back(token);
        batch_.positions.push_back(pos);
        batch_.slot_mapping.push_back(std::int64_t(s.draft_block_table[std::size_t(pos / bs)]) * bs + pos % bs);
      }
      batch_.cu_seqlens_q.push_back(batch_.num_tokens());
      batch_.kv_lens.push_back(end);
      batch_.block_tables[j].assign(s.draft_block_table.begin(), s.draft_block_table.end());
      batch_.logit_rows.push_back(batch_.num_tokens() - 1);
      batch_.sampling.push_back(RowSampling{});  // greedy
      batch_.full_logits.push_back(0);
    }
    const StepOutput& out = runner_->forward(batch_);
    for (std::size_t j = 0; j < drafting.size(); ++j) {
      const LogitSummary& summary = out.summaries[j];
      Drafting& d = drafting[j];
      // A draft is only a guess: a non-finite row ends the sequence's drafts, not the step.
      if (summary.nonfinite >= 0 || summary.token < 0 || summary.token >= vocab_size_) {
        d.left = 0;
        continue;
      }
      d.seq->proposed_drafts.push_back(summary.token);
      --d.left;
      d.feeding = 1;
    }
    std::erase_if(drafting, [](const Drafting& d) { return d.left == 0; });
  }
}

}  // namespace asynct
