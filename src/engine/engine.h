// The serving engine: requests in, tokens out. Each step the scheduler picks running decodes
// first, then prefill chunks (chunked prefill) up to a token budget; when KV blocks run out a
// running request is preempted (its blocks freed) and later recomputed — never a crash.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/logit_summary.h"
#include "core/sampling_params.h"
#include "engine/block_manager.h"
#include "engine/drafter.h"
#include "engine/model_runner.h"
#include "engine/penalty_history.h"
#include "engine/suffix_index.h"
#include "engine/token_constraint.h"

namespace asynct {

struct EngineOptions {
  int max_num_seqs = 64;             // sequences in one step
  int max_num_batched_tokens = 2048;  // new tokens in one step (the chunked-prefill budget)
  int max_model_len = 4096;          // prompt + output tokens of one request
  bool record_first_logits = false;  // keep the logits each request's first token came from
  // When every running sequence decodes, the runner draws each one's token where the step runs
  // (ModelRunner::samples_on_device) and none can end by length in this step, queue the next
  // step before reading this one's tokens (the runner takes them where it sampled them), so
  // that the GPU never waits for the host between decode steps. Same tokens either way.
  bool pipeline_steps = true;
  // Keep the full blocks of computed K/V for later requests that start with the same tokens
  // (BlockManager's prefix cache): a new or preempted request takes the blocks of its longest
  // cached prefix (all but its last token at most) and computes only the rest. Same tokens
  // either way where the arithmetic does not depend on the batch (the CPU); `asynct serve`
  // turns it on, generate and bench leave it off.
  bool prefix_caching = false;
  // Speculative decoding (engine/drafter.h): a decoding sequence's newest token and up to
  // speculative.num_tokens drafted ones go into one step, and it keeps the drafts the model
  // chooses, plus the model's next token. Requests with penalties decode a token a step (each
  // draft position would need its own penalty history). Steps with drafts are never queued
  // ahead (pipeline_steps): the next step's drafts depend on this step's tokens.
  SpeculativeOptions speculative;
};

// What a request's stream sees, one per generated token.
struct GeneratedToken {
  std::int64_t request_id = 0;
  std::int32_t token = 0;
  float logprob = 0.0f;                    // when the request asks for logprobs (>= 0); else 0
  std::vector<TopLogprob> top_logprobs;    // when it asks for logprobs > 0; else empty
};

struct Request {
  std::vector<std::int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  // Added to these tokens' logits before anything else at every draw (SamplingParams' step 0);
  // checked with validate_logit_bias. Logprobs stay the model's own.
  std::vector<LogitBias> logit_bias;
  // Structured output: makes the sequence's constraint (one per sequence, each choice of a group
  // its own). Its mask applies at every token, after the bias and penalties; a constrained
  // request decodes a token a step, never chained ahead or drafted (each mask needs the token
  // before), and ends with "stop" once the constraint is complete. Empty: unconstrained.
  TokenConstraintFactory constraint;
  // The request ends when it generates any of these (each in the vocabulary); empty: it runs
  // to max_tokens.
  std::vector<std::int32_t> eos_token_ids;
  // The request ends with finish_reason "stop" when it generates any of these (each in the
  // vocabulary); the token is kept in the output, as an end-of-sequence token is.
  std::vector<std::int32_t> stop_token_ids;
  // Called for every generated token, in order, from inside Engine::step(). Returning false
  // ends the request now with finish_reason "stop" (a stop string matched; a client left).
  // An exception from it ends the request the same way, and is rethrown from step() once the
  // step is fully applied; the requests that finished in that step come from the next step().
  std::function<bool(const GeneratedToken&)> on_token;
  // Asked after each chunk of the prompt (chunked prefill) that yields no token yet: true ends
  // the request there with finish_reason "abort", with its choices not yet forked (a client
  // that left, a server shutting down), instead of at its first token, after the whole prompt.
  std::function<bool()> cancelled;
};

struct RequestOutput {
  std::int64_t id = 0;
  std::vector<std::int32_t> tokens;  // generated tokens
  // "eos" (an end-of-sequence token; before the others), "stop" (a stop token, or on_token
  // ended it), "length" (max_tokens), "abort" (Engine::abort_waiting, Request::cancelled).
  std::string finish_reason;
  int preemptions = 0;
  // Prompt tokens it did not compute when it first ran: found in the prefix cache, or (a forked
  // choice, Engine::add_request_group) shared with its group's first.
  int cached_tokens = 0;
  std::vector<float> first_logits;   // with EngineOptions::record_first_logits
  std::vector<float> logprobs;       // [tokens] when sampling.logprobs >= 0: each token's, under the raw logits
  std::vector<std::vector<TopLogprob>> top_logprobs;  // [tokens] when sampling.logprobs > 0
};

struct EngineStats {
  std::int64_t steps = 0, preemptions = 0;
  // Tokens the model computed: a decode token is a generated token fed to the model for the
  // first time (the newest token of a sequence past its prompt, or a draft it kept); drafts it
  // did not keep are neither (drafted_tokens - accepted_tokens); prefill tokens are the rest,
  // the prompts and the output a preempted sequence recomputes. Whatever the chunking, a
  // request that runs without preemption adds its prompt length to prefill_tokens (a forked
  // choice, add_request_group, none: its first choice computed the prompt) and (generated - 1)
  // to decode_tokens.
  std::int64_t prefill_tokens = 0, decode_tokens = 0;
  std::int64_t pipelined_steps = 0;  // steps queued before the step they continue was read
  // Speculative decoding: sequence-steps that verified drafts, the tokens drafted in them, and
  // those the model kept (each kept draft is a token the step gave beyond the one it gives anyway).
  std::int64_t draft_rounds = 0, drafted_tokens = 0, accepted_tokens = 0;
  // Sequence-steps that would have drafted but for SpeculativeOptions' switch-off rule: the
  // batch over max_batch, or the sequence's pause after a round that kept nothing.
  std::int64_t drafts_skipped_batch = 0, drafts_skipped_paused = 0;
  // Prefix caching: the tokens of the requests that started running (again, after a
  // preemption), and those of them found in cached blocks (not computed).
  std::int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;
  // Host wall-clock time of the parts of step(), in milliseconds: scheduling and building the
  // batches; the runner's submit() and collect() (the wait for the GPU, and the runner's
  // sampling); reading the tokens into the sequences after it (sample_ms).
  double schedule_ms = 0, forward_ms = 0, sample_ms = 0;
  // Host wall-clock time, in ms, of the step step() collected last: building and submitting
  // it, waiting for it in collect() and reading its output. A step queued ahead (pipelining)
  // was built and submitted during the step() before; its time counts here, with its own
  // step, not in the interval between the two step() calls. (On the CPU backend submit() runs
  // the whole forward pass, so that interval would hold the next step's work; on the GPU, in
  // a steady decode loop, this time and the interval agree.)
  double last_step_ms = 0;
};

class Engine {
 public:
  Engine(std::unique_ptr<ModelRunner> runner, int vocab_size, EngineOptions options = {});

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
    return !waiting_.empty() || !running_.empty() || next_queued_ || !unreported_.empty();
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
  int num_running() const { return int(running_.size()); }
  int num_waiting() const;
  int kv_blocks_used() const { return blocks_.num_blocks() - blocks_.num_free_blocks(); }
  int kv_blocks() const { return blocks_.num_blocks(); }
  // Zeroes the statistics and the runner's phase times (e.g. after a warm-up).
  void reset_stats();
  const ModelRunner& runner() const { return *runner_; }

 private:
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
    // Drafting paused for this many more steps, and the next pause's length (SpeculativeOptions::max_pause).
    int draft_pause = 0, next_draft_pause = 1;
  };
  struct Scheduled {
    Sequence* seq;   // null once the sequence finished in the step before (pipelining)
    int num_tokens;  // new tokens this step
  };
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
    // The constrained rows' masks to fill once the batch is built (fill_token_masks), each with
    // its first word in batch.token_masks.
    std::vector<std::pair<TokenConstraint*, int>> masks_to_fill;
    bool chained = false;         // its tokens come from the step before (pipelining)
    double submit_ms = 0;         // host time building and submitting it (EngineStats::last_step_ms)
  };

  void schedule(StepState& s);     // fills s.scheduled
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
  // The drafts `seq` takes into a step that has `budget` tokens left, or none (also while the
  // batch is over SpeculativeOptions::max_batch or its drafting is paused). Suffix decoding
  // drafts from the sequence's own index and from suffix_cache_, taking the draft whose match is
  // longer (a tie: its own).
  std::vector<std::int32_t> drafts_for(const Sequence& seq, int budget) const;
  // Appends the sampling of `seq`'s next row to a batch: of the token after its newest, or,
  // in a chained batch, of the token after the one the step before draws for it; `ahead`
  // drafted tokens further on (speculative decoding).
  void add_row_sampling(StepState& s, const Sequence& seq, bool chained, int ahead = 0) const;
  // The allowed-token masks of a built batch's constrained rows, each request's on its own thread
  // (xgrammar's matchers are independent): a step's host time grows by one mask, not by one a row.
  void fill_token_masks(StepState& s) const;
  // Whether the step after `s` is known before s's tokens are (see EngineOptions::pipeline_steps),
  // and that step, every sequence one token further, its tokens taken from s's rows.
  bool can_chain(const StepState& s) const;
  void build_chained_batch(const StepState& s, StepState& next);
  // Reads a step's output into its sequences; returns the requests that finished.
  std::vector<RequestOutput> apply(const StepState& s, const StepOutput& out);
  void preempt(Sequence* seq);
  // Files the sequence's blocks that its computed tokens fill, in order (prefix caching).
  void file_full_blocks(Sequence& seq);
  // Lets go of the sequence's blocks: nothing of it is computed any more.
  void release_blocks(Sequence& seq);
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
  std::int64_t next_id_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::deque<std::unique_ptr<Sequence>> running_;
  EngineStats stats_;
  StepState current_;         // the step step() submits (or finds queued) and collects
  StepState next_;            // the step queued behind it, when next_queued_
  bool next_queued_ = false;
  // A step whose on_token threw: the error step() rethrows, and the requests that finished in
  // that step, which the next step() returns.
  std::exception_ptr callback_error_;
  std::vector<RequestOutput> unreported_;
};

}  // namespace asynct
