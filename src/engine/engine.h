// The serving engine: requests in, tokens out. Each step its scheduler (scheduler.h) picks running
// decodes first, then prefill chunks (chunked prefill) up to a token budget; when KV blocks run
// out a running request is preempted (its blocks freed) and later recomputed — never a crash.
// The engine keeps the requests, builds and runs each step, and takes its tokens back.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/block_manager.h"
#include "engine/draft_model.h"
#include "engine/engine_options.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/suffix_index.h"

namespace asynct {

class Engine {
 public:
  // `draft_model`: --speculative draft's, and only then (with the target's vocabulary).
  Engine(std::unique_ptr<ModelRunner> runner, int vocab_size, EngineOptions options = {},
         std::unique_ptr<DraftModel> draft_model = nullptr);

  // Queues a request; throws Error for an empty prompt, out-of-vocabulary ids (prompt, end and
  // stop tokens), sampling parameters out of range (validate_sampling), or a request that could
  // never fit (prompt + max_tokens over max_model_len or over the whole cache).
  std::int64_t add_request(const Request& request);
  // Queues a request's choices (OpenAI's n): requests with one prompt, checked as add_request
  // checks each. The first runs; the others are forked from it in the step that computes the
  // last of its prompt: each shares the prompt's full KV blocks, gets its own copy of the
  // partial last block (ModelRunner::copy_blocks), and draws its first token from the same
  // logits with its own sampling. Where the blocks for the copies are not free then, the rest
  // wait as requests of their own. Returns their ids, in order.
  std::vector<std::int64_t> add_request_group(const std::vector<Request>& choices);
  bool has_unfinished() const {
    return !scheduler_.waiting().empty() || !scheduler_.running().empty() || next_queued_ || !unreported_.empty();
  }
  // Runs one step; returns the requests that finished in it.
  std::vector<RequestOutput> step();
  // Ends a request that waits for a place (new, or preempted: it holds no blocks and no queued
  // step has a row for it; or a choice not yet forked) with finish_reason "abort"; its output
  // comes from the next step().
  // Returns false when it is running (its on_token can end it at its next token) or unknown.
  bool abort_waiting(std::int64_t id);
  // Runs until every queued request finishes; outputs in the order the requests were added.
  std::vector<RequestOutput> run_to_completion(const std::function<void(const EngineStats&)>& progress = {});
  const EngineStats& stats() const { return stats_; }
  // What a server's metrics show, read between steps: sequences running and waiting (new,
  // preempted, and a group's choices not yet forked from the one that leads), KV blocks in use
  // and in all.
  int num_running() const { return int(scheduler_.running().size()); }
  int num_waiting() const;
  int kv_blocks_used() const { return blocks_.num_blocks() - blocks_.num_free_blocks(); }
  int kv_blocks() const { return blocks_.num_blocks(); }
  // Zeroes the statistics and the runner's phase times (e.g. after a warm-up).
  void reset_stats();
  const ModelRunner& runner() const { return *runner_; }

 private:
  // One step: what was scheduled, its batch, and where each sequence's sampling row is. Kept
  // from step to step so that a step reuses its allocations.
  struct StepState {
    std::vector<Scheduled> scheduled;
    StepBatch batch;
    std::vector<int> sample_row;  // [scheduled] row of batch.logit_rows, or -1
    // Choices forked off in this step (add_request_group), each with its row of batch.logit_rows,
    // and the blocks copied for them once the step has run.
    std::vector<std::pair<Sequence*, int>> forks;
    std::vector<BlockCopy> block_copies;
    // The constrained rows' masks, filled once the step is submitted (supply_masks): each row's
    // sequence, its constraint (null once the sequence ended: any token, the row is dropped)
    // and its first word in batch.token_masks.
    struct MaskToFill {
      const Sequence* seq = nullptr;
      TokenConstraint* constraint = nullptr;
      int offset = 0;
    };
    std::vector<MaskToFill> masks_to_fill;
    bool chained = false;         // its tokens come from the step before (pipelining)
    double submit_ms = 0;         // host time building and submitting it (EngineStats::last_step_ms)
  };

  void build_batch(StepState& s);  // fills s.batch and s.sample_row from s.scheduled
  // Forks `leader`'s waiting choices in the step being built, whose row `row` draws its first
  // token (build_batch).
  void fork(Sequence& leader, int row, StepState& s);
  std::unique_ptr<Sequence> make_sequence(const Request& request);  // checked as add_request says
  // Checks a sampled row's output (apply), and reads its token into `seq`, adding its output to
  // `done` when it ends.
  void check_row(const Sequence& seq, int row, const StepState& s, const StepOutput& out) const;
  // Returns true when the sequence ended (it is gone then).
  bool take_token(Sequence& seq, int row, const StepOutput& out, std::vector<RequestOutput>& done);
  // Ends a running sequence: its output (and its choices' not yet forked, as "abort") to
  // `done`, its row in a step queued behind dropped, its blocks released.
  void end_running(Sequence& seq, const std::string& reason, std::vector<RequestOutput>& done);
  // Takes a speculative step's tokens for `seq`, from row `row` on: each draft the model chose,
  // then the model's own token; lets go of the blocks of the drafts it did not keep.
  void take_drafted_tokens(Sequence& seq, int row, const StepOutput& out, std::vector<RequestOutput>& done);
  // Appends the sampling of `seq`'s next row to a batch: of the token after its newest, or,
  // in a chained batch, of the token after the one the step before draws for it; `ahead`
  // drafted tokens further on (speculative decoding).
  void add_row_sampling(StepState& s, const Sequence& seq, bool chained, int ahead = 0) const;
  // The allowed-token masks of a submitted step's constrained rows, each request's on its own
  // thread (xgrammar's matchers are independent: a step's host time grows by one mask, not by
  // one a row), handed to the runner. The step computes meanwhile: a step's masks after
  // submit(), a chained step's after the tokens of the step before are applied.
  void supply_masks(StepState& s);
  // Whether the step after `s` is known before s's tokens are (see EngineOptions::pipeline_steps),
  // and that step, every sequence one token further, its tokens taken from s's rows.
  bool can_chain(const StepState& s) const;
  void build_chained_batch(const StepState& s, StepState& next);
  // Reads a step's output into its sequences; returns the requests that finished.
  std::vector<RequestOutput> apply(const StepState& s, const StepOutput& out);
  // Files the sequence's blocks that its computed tokens fill, in order (prefix caching).
  void file_full_blocks(Sequence& seq);
  // A finished sequence's output (its logits and logprobs moved out).
  static RequestOutput output_of(Sequence& seq, const std::string& reason);
  static void append_token(Sequence& seq, std::int32_t token);
  // Whether `seq` ends with the token it just generated (`go_on`: what on_token said), and why.
  bool finished(const Sequence& seq, bool go_on, std::string* reason) const;

  std::unique_ptr<ModelRunner> runner_;
  int vocab_size_;
  EngineOptions options_;
  BlockManager blocks_;
  // Finished requests' prompts and outputs, the oldest evicted past suffix_cache_tokens
  // (--speculative suffix with a cache; else null).
  std::unique_ptr<SuffixIndex> suffix_cache_;
  std::unique_ptr<DraftModel> draft_model_;  // --speculative draft's (else null)
  std::int64_t next_id_ = 0;
  EngineStats stats_;
  Scheduler scheduler_;  // the waiting and running sequences
  std::unique_ptr<ThreadPool> mask_pool_;  // supply_masks' threads, from the first step with two constrained rows
  StepState current_;         // the step step() submits (or finds queued) and collects
  StepState next_;            // the step queued behind it, when next_queued_
  bool next_queued_ = false;
  // A step whose on_token threw: the error step() rethrows, and the requests that finished in
  // that step, which the next step() returns.
  std::exception_ptr callback_error_;
  std::vector<RequestOutput> unreported_;
};

}  // namespace asynct
