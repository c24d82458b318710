// A request's sequence as the engine and its scheduler hold it: its tokens, how many of them are
// in the KV cache and where (its block table), and what its sampling and drafting remember; and
// a sequence scheduled into a step with its number of new tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/logit_summary.h"
#include "engine/penalty_history.h"
#include "engine/request.h"
#include "engine/suffix_index.h"
#include "engine/token_constraint.h"

namespace asynct {

struct Sequence {
  std::int64_t id;
  Request request;
  std::vector<std::int32_t> tokens;  // prompt + generated so far
  int num_generated = 0;
  int num_computed = 0;              // tokens whose K/V are in the cache
  std::vector<int> block_table;
  int preemptions = 0;
  int cached_tokens = -1;          // RequestOutput::cached_tokens, once it first runs
  int num_filed_blocks = 0;        // leading blocks filed in the prefix cache (prefix caching)
  std::uint64_t last_filed_hash = 0;  // the last of them's chained hash
  std::vector<float> first_logits;
  std::optional<PenaltyHistory> penalties;  // only when the request has penalties
  std::unique_ptr<TokenConstraint> constraint;  // only when the request has one
  std::vector<float> logprobs;
  std::vector<std::vector<TopLogprob>> top_logprobs;
  std::vector<std::unique_ptr<Sequence>> forks;  // its group's other choices, until they fork
  std::vector<std::int32_t> drafts;  // this step's drafted tokens after its newest (speculative decoding)
  std::unique_ptr<SuffixIndex> suffix;  // its newest prompt and output tokens (--speculative suffix, when it drafts)
  // Decode steps it still drafts in none, and the next pause's length (SpeculativeOptions::max_pause).
  int draft_pause = 0, next_draft_pause = 1;
  // --speculative draft (engine/draft_model.h): the draft model's proposal for this step, the
  // tokens its cache was fed, in order, and that cache's blocks.
  std::vector<std::int32_t> proposed_drafts;
  std::vector<std::int32_t> draft_fed;
  std::vector<int> draft_block_table;
};

struct Scheduled {
  Sequence* seq;   // null once the sequence finished in the step before (pipelining)
  int num_tokens;  // new tokens this step
};

}  // namespace asynct
