// The engine's scheduler: which sequences run in the next step and how many new tokens each.
// Running sequences first (decodes, unfinished prefill chunks), oldest first; then waiting ones,
// first come first served (after their cached prefix, with prefix caching), while the step's
// token budget and the KV blocks last; when blocks run out the newest running sequence is
// preempted (its blocks freed; it is recomputed later). A decoding sequence may take drafts
// (speculative decoding, engine/drafter.h), which the step verifies: k + 1 new tokens, unless
// SpeculativeOptions' switch-off rule holds them back. It owns the waiting and running queues;
// the Engine (engine.h) keeps the requests, builds and runs each step, and takes its tokens back.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "engine/draft_model.h"
#include "engine/engine_options.h"
#include "engine/sequence.h"
#include "engine/suffix_index.h"

namespace asynct {

class Scheduler {
 public:
  // `blocks` and `stats` are the engine's (outliving the scheduler); `suffix_cache`, finished
  // requests' index that suffix decoding also drafts from, or null.
  // `draft_model`: --speculative draft's (else null).
  Scheduler(const EngineOptions& options, BlockManager& blocks, EngineStats& stats, const SuffixIndex* suffix_cache,
            DraftModel* draft_model = nullptr);

  // The next step's sequences, one-token ones first (a backend can hand that leading run to its
  // decode kernel), each sequence's drafts set (Sequence::drafts, its new tokens counting them).
  void schedule(std::vector<Scheduled>& out);
  // The switch-off rule's other half: a round of drafts that kept none pauses the sequence's
  // drafting (SpeculativeOptions::max_pause), each time twice as long; one that kept a draft
  // ends the pauses.
  void drafts_kept(Sequence& seq, int kept) const;
  // The switch-off rule's batch half: more running sequences than SpeculativeOptions::max_batch,
  // so no sequence drafts (and a step may be queued behind the one before: Engine::can_chain).
  bool drafting_off_for_batch() const {
    const int most = options_.speculative.max_batch;
    return most > 0 && int(running_.size()) > most;
  }
  // Moves a running sequence to the front of the waiting queue, its blocks freed.
  void preempt(Sequence* seq);

  std::deque<std::unique_ptr<Sequence>>& waiting() { return waiting_; }
  std::deque<std::unique_ptr<Sequence>>& running() { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  const std::deque<std::unique_ptr<Sequence>>& running() const { return running_; }

 private:
  // The drafts `seq` takes into a step that has `budget` tokens left, or none (also while the
  // switch-off rule holds: over max_batch running sequences, or the sequence's pause, which it
  // counts down). Suffix decoding drafts from the sequence's own index and from the cache,
  // taking the draft whose match is longer (a tie: its own).
  std::vector<std::int32_t> drafts_for(Sequence& seq, int budget);
  // The most drafts `seq` may take into a step with `budget` tokens left; 0 when it does not draft
  // (not decoding, penalties, a constraint, the switch-off rule). Changes nothing.
  int draft_limit(const Sequence& seq, int budget) const;
  // --speculative draft: the draft model's proposals for the running sequences that will draft
  // (as drafts_for then takes them), every one's draft steps batched.
  void propose_model_drafts(int budget);
  // Lets go of the sequence's blocks: nothing of it is computed any more.
  void release_blocks(Sequence& seq);

  const EngineOptions& options_;
  BlockManager& blocks_;
  EngineStats& stats_;
  const SuffixIndex* suffix_cache_;
  DraftModel* draft_model_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::deque<std::unique_ptr<Sequence>> running_;
};

}  // namespace asynct
