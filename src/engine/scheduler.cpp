#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace asynct {

Scheduler::Scheduler(const EngineOptions& options, BlockManager& blocks, EngineStats& stats, const SuffixIndex* suffix_cache,
                     DraftModel* draft_model)
    : options_(options), blocks_(blocks), stats_(stats), suffix_cache_(suffix_cache), draft_model_(draft_model) {}

void Scheduler::schedule(std::vector<Scheduled>& out) {
  out.clear();
  int budget = options_.max_num_batched_tokens;
  if (draft_model_) propose_model_drafts(budget);
  // Running sequences first (decodes and unfinished prefill chunks), oldest first; the newest
  // running sequences give up their blocks when the older ones need more.
  for (std::size_t i = 0; i < running_.size() && budget > 0 && int(out.size()) < options_.max_num_seqs; ++i) {
    Sequence* seq = running_[i].get();
    int n = std::min(int(seq->tokens.size()) - seq->num_computed, budget);
    seq->drafts = drafts_for(*seq, budget);
    n += int(seq->drafts.size());
    bool preempted_self = false;
    while (!blocks_.can_grow(seq->block_table, seq->num_computed + n)) {
      Sequence* victim = running_.back().get();
      preempt(victim);
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    blocks_.grow(seq->block_table, seq->num_computed + n);
    out.push_back({seq, n});
    budget -= n;
  }
  // Then waiting sequences, first come first served, while the budget and the blocks last.
  while (!waiting_.empty() && budget > 0 && int(out.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front().get();
    int cached = 0;
    if (options_.prefix_caching) {  // its cached prefix, never its last token (whose logits it needs)
      const int bs = blocks_.block_size();
      cached = blocks_.match_prefix(seq->tokens, (int(seq->tokens.size()) - 1) / bs, seq->block_table,
                                    &seq->last_filed_hash) * bs;
      seq->num_filed_blocks = cached / bs;
      seq->num_computed = cached;
    }
    const int n = std::min(int(seq->tokens.size()) - seq->num_computed, budget);
    if (!blocks_.can_grow(seq->block_table, seq->num_computed + n)) {
      release_blocks(*seq);  // waiting sequences hold no blocks
      break;
    }
    blocks_.grow(seq->block_table, seq->num_computed + n);
    stats_.prefix_cache_queries += std::int64_t(seq->tokens.size());
    stats_.prefix_cache_hits += cached;
    if (seq->cached_tokens < 0) seq->cached_tokens = cached;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    out.push_back({seq, n});
    budget -= n;
  }
  // One-token sequences first: a backend can hand that leading run to its decode kernel.
  std::stable_partition(out.begin(), out.end(), [](const Scheduled& s) { return s.num_tokens == 1; });
}

int Scheduler::draft_limit(const Sequence& seq, int budget) const {
  const SpeculativeOptions& o = options_.speculative;
  // Decoding (one new token, past the prompt), without penalties.
  if (!o.enabled() || seq.num_generated == 0 || int(seq.tokens.size()) - seq.num_computed != 1 ||
      seq.request.sampling.has_penalties() || seq.constraint)
    return 0;
  // A step gives up to drafts + 1 tokens: within max_tokens and the step's budget.
  return std::max(0, std::min({o.num_tokens, seq.request.max_tokens - seq.num_generated - 1, budget - 1}));
}

void Scheduler::propose_model_drafts(int budget) {
  std::vector<Sequence*> seqs;
  std::vector<int> most;
  if (!drafting_off_for_batch())
    for (std::size_t i = 0; i < running_.size() && int(i) < options_.max_num_seqs; ++i) {
      Sequence& seq = *running_[i];
      const int limit = draft_limit(seq, budget);
      if (limit > 0 && seq.draft_pause == 0) {
        seqs.push_back(&seq);
        most.push_back(limit);
      }
    }
  draft_model_->propose(seqs, most);
}

std::vector<std::int32_t> Scheduler::drafts_for(Sequence& seq, int budget) {
  const SpeculativeOptions& o = options_.speculative;
  const int most = draft_limit(seq, budget);
  if (most <= 0) return {};
  // The switch-off rule, before any draft is looked for.
  if (drafting_off_for_batch()) {
    ++stats_.drafts_skipped_batch;
    return {};
  }
  if (seq.draft_pause > 0) {
    --seq.draft_pause;
    ++stats_.drafts_skipped_paused;
    return {};
  }
  std::vector<std::int32_t> drafts;
  if (o.method == "draft") {  // (proposed before the step's loop: propose_model_drafts)
    drafts = std::move(seq.proposed_drafts);
    seq.proposed_drafts.clear();
    if (int(drafts.size()) > most) drafts.resize(std::size_t(most));
  } else if (o.forced()) {  // (timing: kept whatever the model draws)
    drafts.assign(std::size_t(most), seq.tokens.back());
  } else if (o.method == "ngram") {
    drafts = ngram_draft(seq.tokens, o.ngram_min, o.ngram_max, most);
  } else {
    SuffixIndex::Draft own = seq.suffix->draft(seq.tokens, most, o.suffix_min_probability);
    if (suffix_cache_) {
      SuffixIndex::Draft shared = suffix_cache_->draft(seq.tokens, most, o.suffix_min_probability);
      if (shared.match_length > own.match_length) own = std::move(shared);
    }
    drafts = std::move(own.tokens);
  }
  // Only into blocks that are free: drafts never preempt a sequence.
  if (!drafts.empty() && !blocks_.can_grow(seq.block_table, seq.num_computed + 1 + int(drafts.size()))) drafts.clear();
  return drafts;
}

void Scheduler::drafts_kept(Sequence& seq, int kept) const {
  const int max_pause = options_.speculative.max_pause;
  if (kept == 0 && max_pause > 0) {
    seq.draft_pause = std::min(seq.next_draft_pause, max_pause);
    seq.next_draft_pause = std::min(2 * seq.next_draft_pause, max_pause);
  } else {
    seq.next_draft_pause = 1;
  }
}

void Scheduler::preempt(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  check(it != running_.end(), "engine: preempting a sequence that is not running");
  release_blocks(*seq);
  seq->drafts.clear();
  ++seq->preemptions;
  ++stats_.preemptions;
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

void Scheduler::release_blocks(Sequence& seq) {
  blocks_.release(seq.block_table);
  if (draft_model_) draft_model_->release(seq);
  seq.num_computed = 0;  // computed again (or taken from the prefix cache) when it runs again
  seq.num_filed_blocks = 0;
  seq.last_filed_hash = 0;
}

}  // namespace asynct
