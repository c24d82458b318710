// Drafts from a smaller model with the target's vocabulary (--speculative draft --draft-model
// DIR). The draft model runs in its own runner and paged KV cache: in a step's drafting round each
// drafting sequence first feeds the draft model the tokens it has not seen (its prompt the first
// time, then the tokens the target took since), then the draft model takes `most` greedy steps,
// every drafting sequence batched in each. A greedy draft is a guess like a prompt lookup's, so
// the engine's verification keeps the target's tokens, greedy or sampled (drafter.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/sequence.h"

namespace asynct {

class DraftModel {
 public:
  // `max_positions`: the draft model's (a sequence longer than that is not drafted for).
  DraftModel(std::unique_ptr<ModelRunner> runner, int vocab_size, int max_positions);

  // Sets each sequence's proposed drafts (Sequence::proposed_drafts): up to most[i] tokens (fewer,
  // or none, when the draft cache has no room), all the sequences' draft steps batched.
  void propose(const std::vector<Sequence*>& seqs, const std::vector<int>& most);
  // Lets go of the sequence's draft cache (it ended, or was preempted).
  void release(Sequence& seq);

 private:
  std::unique_ptr<ModelRunner> runner_;
  BlockManager blocks_;
  int vocab_size_, max_positions_;
  StepBatch batch_;  // reused from step to step
};

}  // namespace asynct
