// The engine's options (batch limits, pipelining, prefix caching, speculative decoding) and the
// statistics it keeps, shared by the Engine (engine.h) and its Scheduler (scheduler.h).
#pragma once

#include <cstdint>

#include "engine/drafter.h"

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
  // Sequence-steps that could have drafted (decoding, room for a draft) but for
  // SpeculativeOptions' switch-off rule: the batch over max_batch, or the sequence's pause after
  // a round that kept nothing.
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

}  // namespace asynct
