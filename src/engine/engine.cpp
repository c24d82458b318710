// Over 500 lines: the engine's one class, whose parts (building a step's batch, forking a
// group's choices, chaining pipelined steps, taking the tokens back, the prefix cache's filing)
// all read and write the same sequences and blocks; scheduling is scheduler.cpp's.
#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

namespace asynct {

namespace {

// Checks the options, and makes the index of finished requests suffix decoding drafts from
// (--speculative suffix with a cache; else null).
std::unique_ptr<SuffixIndex> checked_suffix_cache(const EngineOptions& options) {
  check(options.max_num_seqs >= 1, "engine: max_num_seqs must be >= 1");
  check(options.max_num_batched_tokens >= 1, "engine: max_num_batched_tokens must be >= 1");
  check(options.max_model_len >= 2, "engine: max_model_len must be >= 2");
  validate_speculative(options.speculative, /*allow_forced=*/true);
  const SpeculativeOptions& o = options.speculative;
  if (o.method == "suffix" && o.suffix_cache_tokens > 0) return std::make_unique<SuffixIndex>(o.suffix_depth, o.suffix_cache_tokens);
  return nullptr;
}

}  // namespace

Engine::Engine(std::unique_ptr<ModelRunner> runner, int vocab_size, EngineOptions options,
               std::unique_ptr<DraftModel> draft_model)
    : runner_(std::move(runner)), vocab_size_(vocab_size), options_(options),
      blocks_(runner_->num_blocks(), runner_->block_size()), suffix_cache_(checked_suffix_cache(options_)),
      draft_model_(std::move(draft_model)), scheduler_(options_, blocks_, stats_, suffix_cache_.get(), draft_model_.get()) {
  check((options_.speculative.method == "draft") == (draft_model_ != nullptr),
        draft_model_ ? "engine: a draft model is given but --speculative is not draft"
                     : "engine: --speculative draft needs a draft model (--draft-model)");
}

std::int64_t Engine::add_request(const Request& r) {
  scheduler_.waiting().push_back(make_sequence(r));
  return scheduler_.waiting().back()->id;
}

std::vector<std::int64_t> Engine::add_request_group(const std::vector<Request>& choices) {
  check(!choices.empty(), "request group: no choices");
  std::vector<std::unique_ptr<Sequence>> made;
  for (const Request& r : choices) {
    check(r.prompt == choices[0].prompt, "request group: every choice has the same prompt");
    made.push_back(make_sequence(r));  // all checked before any is queued
  }
  std::vector<std::int64_t> ids;
  for (const auto& seq : made) ids.push_back(seq->id);
  std::unique_ptr<Sequence> leader = std::move(made[0]);
  leader->forks.assign(std::make_move_iterator(made.begin() + 1), std::make_move_iterator(made.end()));
  scheduler_.waiting().push_back(std::move(leader));
  return ids;
}

std::unique_ptr<Sequence> Engine::make_sequence(const Request& r) {
  check(!r.prompt.empty(), "request: the prompt is empty");
  for (std::size_t i = 0; i < r.prompt.size(); ++i)
    check(r.prompt[i] >= 0 && r.prompt[i] < vocab_size_, "request: token id ", r.prompt[i],
          " at prompt position ", i, " is outside the vocabulary [0, ", vocab_size_, ")");
  check(r.max_tokens >= 1, "request: max_tokens must be >= 1, got ", r.max_tokens);
  const std::int64_t total = std::int64_t(r.prompt.size()) + r.max_tokens;
  check(total <= options_.max_model_len, "request: prompt (", r.prompt.size(), ") + max_tokens (",
        r.max_tokens, ") = ", total, " tokens is over max_model_len ", options_.max_model_len);
  check(blocks_.blocks_for(total) <= blocks_.num_blocks(), "request: ", total,
        " tokens need ", blocks_.blocks_for(total), " KV blocks but the cache has ",
        blocks_.num_blocks());
  for (const std::int32_t eos : r.eos_token_ids)
    check(eos >= 0 && eos < vocab_size_, "request: end-of-sequence token ", eos, " is outside the vocabulary [0, ",
          vocab_size_, ")");
  for (const std::int32_t stop : r.stop_token_ids)
    check(stop >= 0 && stop < vocab_size_, "request: stop token ", stop, " is outside the vocabulary [0, ", vocab_size_,
          ")");
  validate_sampling(r.sampling);
  validate_logit_bias(r.logit_bias.data(), r.logit_bias.size(), vocab_size_);
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->request = r;
  seq->tokens = r.prompt;
  if (r.sampling.has_penalties()) seq->penalties.emplace(seq->tokens, r.prompt.size());
  if (r.constraint) {
    seq->constraint = r.constraint();
    check(seq->constraint != nullptr, "request: its constraint factory made no constraint");
  }
  if (options_.speculative.method == "suffix" && !seq->penalties && !seq->constraint) {  // (the others are never drafted)
    seq->suffix = std::make_unique<SuffixIndex>(options_.speculative.suffix_depth, options_.speculative.suffix_request_tokens);
    seq->suffix->add(seq->tokens);
  }
  return seq;
}

void Engine::reset_stats() {
  stats_ = {};
  runner_->reset_phase_times();
}

int Engine::num_waiting() const {
  std::size_t n = scheduler_.waiting().size();
  for (const auto& seq : scheduler_.waiting()) n += seq->forks.size();
  for (const auto& seq : scheduler_.running()) n += seq->forks.size();
  return int(n);
}

void Engine::append_token(Sequence& seq, std::int32_t token) {
  if (seq.penalties) seq.penalties->add(seq.tokens.back(), seq.num_generated > 0);
  seq.tokens.push_back(token);
  if (seq.suffix) seq.suffix->extend(token);
  ++seq.num_generated;
}

bool Engine::finished(const Sequence& seq, bool go_on, std::string* reason) const {
  const std::int32_t last = seq.tokens.back();
  const auto holds = [&](const std::vector<std::int32_t>& ids) { return std::find(ids.begin(), ids.end(), last) != ids.end(); };
  if (holds(seq.request.eos_token_ids)) {
    *reason = "eos";
    return true;
  }
  if (holds(seq.request.stop_token_ids) || !go_on || (seq.constraint && seq.constraint->complete())) {
    *reason = "stop";
    return true;
  }
  if (seq.num_generated >= seq.request.max_tokens) {
    *reason = "length";
    return true;
  }
  return false;
}

// The batch of the scheduled sequences' new tokens. Its vectors keep their capacity from step
// to step, so a steady decode loop allocates nothing here.
void Engine::build_batch(StepState& s) {
  s.chained = false;
  s.forks.clear();
  s.masks_to_fill.clear();
  s.block_copies.clear();
  const std::vector<Scheduled>& scheduled = s.scheduled;
  std::vector<int>& sample_row = s.sample_row;
  StepBatch& b = s.batch;
  b.reset(scheduled.size());
  sample_row.assign(scheduled.size(), -1);
  const int bs = blocks_.block_size();
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& seq = *scheduled[i].seq;
    const int drafted = int(seq.drafts.size());
    const int begin = seq.num_computed, end = begin + scheduled[i].num_tokens;
    // Only the newest token past the prompt is a decode token (EngineStats).
    const int newest = int(seq.tokens.size()) - 1;
    const bool decodes = end - 1 - drafted == newest && newest >= int(seq.request.prompt.size());
    stats_.decode_tokens += decodes ? 1 : 0;
    stats_.prefill_tokens += scheduled[i].num_tokens - drafted - (decodes ? 1 : 0);
    if (drafted > 0) ++stats_.draft_rounds, stats_.drafted_tokens += drafted;
    for (int pos = begin; pos < end; ++pos) {
      b.tokens.push_back(pos <= newest ? seq.tokens[std::size_t(pos)] : seq.drafts[std::size_t(pos - newest - 1)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(std::int64_t(seq.block_table[std::size_t(pos / bs)]) * bs + pos % bs);
    }
    b.cu_seqlens_q.push_back(b.num_tokens());
    b.kv_lens.push_back(end);
    b.block_tables[i].assign(seq.block_table.begin(), seq.block_table.end());
    if (end - drafted == int(seq.tokens.size())) {  // the whole sequence is in the cache: sample
      sample_row[i] = int(b.logit_rows.size());
      // A row for its newest token and one for each draft (consecutive rows).
      for (int ahead = 0; ahead <= drafted; ++ahead) {
        b.logit_rows.push_back(b.num_tokens() - 1 - drafted + ahead);
        // The runner samples every row; only recorded logits need to come back whole.
        const bool record = options_.record_first_logits && seq.num_generated == 0;
        b.full_logits.push_back(record ? 1 : 0);
        add_row_sampling(s, seq, /*chained=*/false, ahead);
      }
      if (!seq.forks.empty()) fork(*scheduled[i].seq, sample_row[i], s);
    }
  }
  b.masks_later = !s.masks_to_fill.empty();
}

void Engine::fork(Sequence& leader, int row, StepState& s) {
  check(leader.num_generated == 0, "engine: forking request ", leader.id, " after its first token");
  StepBatch& b = s.batch;
  const int prompt = int(leader.tokens.size()), bs = blocks_.block_size();
  const int full = prompt / bs;
  const bool partial = prompt % bs != 0;
  const int leader_token = b.logit_rows[std::size_t(row)];  // the prompt's last token, in the batch
  std::vector<std::unique_ptr<Sequence>> forks = std::move(leader.forks);
  leader.forks.clear();
  for (std::size_t i = 0; i < forks.size(); ++i) {
    Sequence& f = *forks[i];
    if (partial && blocks_.num_free_blocks() < 1) {
      // No block for its copy: it and the rest compute their prompts as requests of their own,
      // first in line.
      for (std::size_t j = forks.size(); j-- > i;) scheduler_.waiting().push_front(std::move(forks[j]));
      return;
    }
    blocks_.share(leader.block_table, full, f.block_table);
    if (partial) {
      blocks_.grow(f.block_table, prompt);
      s.block_copies.push_back({leader.block_table[std::size_t(full)], f.block_table.back()});
    }
    f.num_computed = prompt;  // once this step and the copies after it have run
    f.cached_tokens = prompt;
    const int fork_row = int(b.logit_rows.size());
    b.logit_rows.push_back(leader_token);
    b.full_logits.push_back(options_.record_first_logits ? 1 : 0);
    add_row_sampling(s, f, /*chained=*/false);
    s.forks.emplace_back(&f, fork_row);
    scheduler_.running().push_back(std::move(forks[i]));
  }
}

void Engine::add_row_sampling(StepState& s, const Sequence& seq, bool chained, int ahead) const {
  StepBatch& b = s.batch;
  RowSampling row;
  row.params = seq.request.sampling;
  row.step = std::uint64_t(seq.num_generated) + (chained ? 1 : 0) + std::uint64_t(ahead);
  row.newest_is_output = chained || ahead > 0 || seq.num_generated > 0 ? 1 : 0;
  row.penalty_begin = row.penalty_end = int(b.penalty_tokens.size());
  if (seq.penalties) {
    const std::vector<PenaltyToken>& history = seq.penalties->tokens();
    b.penalty_tokens.insert(b.penalty_tokens.end(), history.begin(), history.end());
    if (chained) {  // the sequence's newest token is not the row's newest: it joins the history
      const std::int32_t newest = seq.tokens.back();
      const int at = seq.penalties->find(newest);
      if (at < 0) b.penalty_tokens.push_back({newest, 0, 0});
      PenaltyToken& t = at < 0 ? b.penalty_tokens.back() : b.penalty_tokens[std::size_t(row.penalty_begin + at)];
      if (seq.num_generated > 0)
        ++t.output_count;
      else
        t.in_prompt = 1;
    }
    row.penalty_end = int(b.penalty_tokens.size());
  }
  row.bias_begin = int(b.logit_bias.size());
  b.logit_bias.insert(b.logit_bias.end(), seq.request.logit_bias.begin(), seq.request.logit_bias.end());
  row.bias_end = int(b.logit_bias.size());
  if (seq.constraint) {
    check(ahead == 0, "engine: a constrained sequence's row must not follow drafts");
    row.mask_offset = int(b.token_masks.size());
    b.token_masks.resize(b.token_masks.size() + std::size_t(token_mask_words(vocab_size_)), 0u);
    s.masks_to_fill.push_back({&seq, seq.constraint.get(), row.mask_offset});
  }
  b.sampling.push_back(row);
}

void Engine::supply_masks(StepState& s) {
  const auto fill = [&](std::size_t i) {  // (into the zeros add_row_sampling made room with)
    const StepState::MaskToFill& m = s.masks_to_fill[i];
    std::uint32_t* mask = s.batch.token_masks.data() + m.offset;
    if (m.constraint) return m.constraint->fill_allowed(mask, vocab_size_);
    for (int t = 0; t < vocab_size_; ++t) mask[t / 32] |= 1u << (t % 32);
  };
  if (s.masks_to_fill.size() < 2) {
    if (!s.masks_to_fill.empty()) fill(0);
  } else {
    if (!mask_pool_) mask_pool_ = std::make_unique<ThreadPool>();
    mask_pool_->run(s.masks_to_fill.size(), fill);
  }
  runner_->supply_masks(s.batch);
}

bool Engine::can_chain(const StepState& s) const {
  // Every running sequence is in the step, and nothing waits: scheduling again would pick them all.
  if (!scheduler_.waiting().empty() || s.scheduled.size() != scheduler_.running().size()) return false;
  // The next step's drafts would come from this step's tokens: only a batch over the switch-off
  // rule's size, where no sequence drafts, is queued ahead.
  if (options_.speculative.enabled() && !scheduler_.drafting_off_for_batch()) return false;
  std::int64_t new_blocks = 0;
  for (std::size_t i = 0; i < s.scheduled.size(); ++i) {
    const Sequence* seq = s.scheduled[i].seq;
    if (seq == nullptr || s.scheduled[i].num_tokens != 1 || s.sample_row[i] < 0) return false;
    // Its token drawn where the step runs, and not ended by length by it (an end of sequence,
    // a stop token or on_token still may: the next step's row for it is then dropped).
    if (!runner_->samples_on_device(s.batch.sampling[std::size_t(s.sample_row[i])])) return false;
    if (seq->num_generated + 1 >= seq->request.max_tokens) return false;
    new_blocks += std::max<std::int64_t>(0, blocks_.blocks_for(seq->num_computed + 2) - std::int64_t(seq->block_table.size()));
  }
  return new_blocks <= blocks_.num_free_blocks();  // no preemption
}

// The step after `s` (not yet collected): each sequence's next position, one past the one `s`
// computes, its token the one the runner draws for the sequence's row in `s`.
void Engine::build_chained_batch(const StepState& s, StepState& next) {
  next.chained = true;
  next.scheduled = s.scheduled;
  next.masks_to_fill.clear();
  StepBatch& b = next.batch;
  const std::size_t n = s.scheduled.size();
  b.reset(n);
  b.full_logits.assign(n, 0);
  next.sample_row.resize(n);
  const int bs = blocks_.block_size();
  for (std::size_t i = 0; i < n; ++i) {
    Sequence& seq = *s.scheduled[i].seq;
    const int pos = seq.num_computed + 1;
    blocks_.grow(seq.block_table, pos + 1);
    b.tokens.push_back(seq.tokens.back());  // a placeholder: the runner takes the token from s
    b.tokens_from_rows.push_back(s.sample_row[i]);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(std::int64_t(seq.block_table[std::size_t(pos / bs)]) * bs + pos % bs);
    b.cu_seqlens_q.push_back(int(i) + 1);
    b.kv_lens.push_back(pos + 1);
    b.block_tables[i].assign(seq.block_table.begin(), seq.block_table.end());
    next.sample_row[i] = int(i);
    b.logit_rows.push_back(int(i));
    add_row_sampling(next, seq, /*chained=*/true);
  }
  if (options_.speculative.enabled()) stats_.drafts_skipped_batch += std::int64_t(n);  // (can_chain)
  b.masks_later = !next.masks_to_fill.empty();  // once s's tokens are applied
}

std::vector<RequestOutput> Engine::step() {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  if (!unreported_.empty()) return std::exchange(unreported_, {});  // an on_token threw in the step before
  auto t = Clock::now();
  if (next_queued_) {  // the step queued behind the last one is this one
    std::swap(current_, next_);
    next_queued_ = false;
  } else {
    const auto start = t;
    scheduler_.schedule(current_.scheduled);
    check(!current_.scheduled.empty() || !has_unfinished(), "engine: no request could be scheduled");
    if (current_.scheduled.empty()) return {};
    build_batch(current_);
    stats_.schedule_ms += ms_since(t);
    t = Clock::now();
    runner_->submit(current_.batch);
    if (!current_.block_copies.empty()) runner_->copy_blocks(current_.block_copies);
    if (current_.batch.masks_later) supply_masks(current_);
    stats_.forward_ms += ms_since(t);
    current_.submit_ms = ms_since(start);
  }
  // The step after this one, queued now when it is already known: the GPU runs it while the
  // host reads this one's tokens.
  t = Clock::now();
  if (options_.pipeline_steps && runner_->pipelines_steps() && can_chain(current_)) {
    const auto start = t;
    build_chained_batch(current_, next_);
    stats_.schedule_ms += ms_since(t);
    t = Clock::now();
    runner_->submit(next_.batch);
    stats_.forward_ms += ms_since(t);
    next_.submit_ms = ms_since(start);
    next_queued_ = true;
    ++stats_.pipelined_steps;
  }

  t = Clock::now();
  const auto collected = t;
  const StepOutput& out = runner_->collect();
  stats_.forward_ms += ms_since(t);
  ++stats_.steps;
  std::vector<RequestOutput> done;
  try {
    done = apply(current_, out);
  } catch (...) {
    // The step's output is bad (e.g. a non-finite logit): the sequences are as they were, and
    // the step queued behind it, built on its tokens, is dropped (its masks allowing any token).
    if (next_queued_) {
      next_queued_ = false;
      if (next_.batch.masks_later) {
        for (StepState::MaskToFill& m : next_.masks_to_fill) m.constraint = nullptr;
        supply_masks(next_);
      }
      runner_->collect();
    }
    throw;
  }
  // The step queued behind samples once its masks follow the tokens just applied.
  if (next_queued_ && next_.batch.masks_later) {
    t = Clock::now();
    supply_masks(next_);
    stats_.schedule_ms += ms_since(t);
  }
  stats_.last_step_ms = current_.submit_ms + ms_since(collected);  // + collect(), apply() and the next step's masks
  if (callback_error_) {  // the step is applied: the error goes to the caller, the outputs to the next step()
    unreported_.insert(unreported_.end(), std::make_move_iterator(done.begin()), std::make_move_iterator(done.end()));
    std::rethrow_exception(std::exchange(callback_error_, nullptr));
  }
  return done;
}

std::vector<RequestOutput> Engine::apply(const StepState& s, const StepOutput& out) {
  using Clock = std::chrono::steady_clock;
  const auto t = Clock::now();
  const std::vector<Scheduled>& scheduled = s.scheduled;
  const std::size_t rows = s.batch.logit_rows.size();
  check(out.summaries.size() == rows && out.logits.size() == rows && out.top_logprobs.size() == rows,
        "engine: the runner returned ", out.summaries.size(), " rows for ", rows, " logit rows");
  // Before any sequence changes: every sampled row must be finite (a NaN or an infinity is an
  // error), its token in the vocabulary, and its full logits and top logprobs there when asked.
  for (std::size_t i = 0; i < scheduled.size(); ++i)
    if (s.sample_row[i] >= 0 && scheduled[i].seq != nullptr)
      for (int ahead = 0; ahead <= int(scheduled[i].seq->drafts.size()); ++ahead)
        check_row(*scheduled[i].seq, s.sample_row[i] + ahead, s, out);
  for (const auto& [fork, row] : s.forks) check_row(*fork, row, s, out);
  std::vector<RequestOutput> done;
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    if (scheduled[i].seq == nullptr) continue;  // finished in the step before
    Sequence& seq = *scheduled[i].seq;
    if (!seq.drafts.empty()) {  // its newest token is computed; the drafts as far as the model keeps them
      ++seq.num_computed;
      take_drafted_tokens(seq, s.sample_row[i], out, done);
      continue;
    }
    seq.num_computed += scheduled[i].num_tokens;
    if (options_.prefix_caching) file_full_blocks(seq);
    if (s.chained) stats_.decode_tokens += scheduled[i].num_tokens;
    if (s.sample_row[i] >= 0) {
      take_token(seq, s.sample_row[i], out, done);
    } else if (seq.request.cancelled) {  // a chunk of its prompt: it may end here
      bool cancelled = false;
      try {
        cancelled = seq.request.cancelled();
      } catch (...) {
        if (!callback_error_) callback_error_ = std::current_exception();
        cancelled = true;
      }
      if (cancelled) end_running(seq, "abort", done);
    }
  }
  for (const auto& [fork, row] : s.forks) take_token(*fork, row, out, done);
  stats_.sample_ms += std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  return done;
}

void Engine::check_row(const Sequence& seq, int row, const StepState& s, const StepOutput& out) const {
  const LogitSummary& summary = out.summaries[std::size_t(row)];
  check_finite(summary);
  check(summary.token >= 0 && summary.token < vocab_size_, "engine: the runner gave token ", summary.token,
        " for logit row ", row, ", outside the vocabulary [0, ", vocab_size_, ")");
  check(!s.batch.full_logits[std::size_t(row)] || out.logits[std::size_t(row)],
        "engine: the runner did not return logit row ", row);
  if (const int offset = s.batch.sampling[std::size_t(row)].mask_offset; offset >= 0) {
    const std::uint32_t* mask = s.batch.token_masks.data() + offset;
    if (!(mask[summary.token / 32] >> (summary.token % 32) & 1u)) {
      std::int64_t allowed = 0;
      for (int w = 0; w < token_mask_words(vocab_size_); ++w) allowed += std::popcount(mask[w]);
      throw Error(detail::concat("engine: the runner gave token ", summary.token, " for logit row ", row,
                                 ", which its allowed-token mask leaves out (the mask allows ", allowed, " tokens)"));
    }
  }
  const int top = seq.request.sampling.logprobs;
  check(top <= 0 || out.top_logprobs[std::size_t(row)].size() == std::size_t(std::min(top, vocab_size_)),
        "engine: the runner returned ", out.top_logprobs[std::size_t(row)].size(), " top logprobs for logit row ",
        row, ", which asked for ", top);
}

void Engine::take_drafted_tokens(Sequence& seq, int row, const StepOutput& out, std::vector<RequestOutput>& done) {
  const std::vector<std::int32_t> drafts = std::move(seq.drafts);
  seq.drafts.clear();
  std::size_t ahead = 0;
  for (;; ++ahead) {
    // The model's token after the drafts kept so far; a draft it equals was computed at the
    // position it now has, so its K/V stay.
    const bool kept = ahead < drafts.size() &&
                      (options_.speculative.forced() || out.summaries[std::size_t(row) + ahead].token == drafts[ahead]);
    if (take_token(seq, row + int(ahead), out, done)) return;  // ended: its blocks are gone
    if (!kept) break;
    ++seq.num_computed;
    ++stats_.accepted_tokens;
    ++stats_.decode_tokens;
  }
  scheduler_.drafts_kept(seq, int(ahead));
  blocks_.shrink(seq.block_table, seq.num_computed + 1);
  if (options_.prefix_caching) file_full_blocks(seq);
}

bool Engine::take_token(Sequence& seq, int row, const StepOutput& out, std::vector<RequestOutput>& done) {
  const LogitSummary& summary = out.summaries[std::size_t(row)];
  const float* logits = out.logits[std::size_t(row)];
  if (options_.record_first_logits && seq.num_generated == 0) seq.first_logits.assign(logits, logits + vocab_size_);
  append_token(seq, summary.token);
  if (seq.constraint)
    check(seq.constraint->accept(summary.token), "engine: request ", seq.id, "'s constraint refused token ", summary.token,
          " (its mask allowed it)");
  const int logprobs = seq.request.sampling.logprobs;
  if (logprobs >= 0) seq.logprobs.push_back(summary.logprob);
  if (logprobs > 0) seq.top_logprobs.push_back(out.top_logprobs[std::size_t(row)]);
  bool go_on = true;
  if (seq.request.on_token) {
    GeneratedToken g;
    g.request_id = seq.id;
    g.token = summary.token;
    if (logprobs >= 0) g.logprob = summary.logprob;
    if (logprobs > 0) g.top_logprobs = out.top_logprobs[std::size_t(row)];
    try {
      go_on = seq.request.on_token(g);
    } catch (...) {
      if (!callback_error_) callback_error_ = std::current_exception();
      go_on = false;
    }
  }
  std::string reason;
  if (!finished(seq, go_on, &reason)) return false;
  end_running(seq, reason, done);
  return true;
}

void Engine::end_running(Sequence& seq, const std::string& reason, std::vector<RequestOutput>& done) {
  if (suffix_cache_) suffix_cache_->add(seq.tokens);  // later requests draft from it
  done.push_back(output_of(seq, reason));
  for (const auto& fork : seq.forks) done.push_back(output_of(*fork, "abort"));  // only a prompt's end forks them
  seq.forks.clear();
  // A step queued behind this one computed a token for it too: that row is dropped.
  if (next_queued_) {
    for (Scheduled& e : next_.scheduled)
      if (e.seq == &seq) e.seq = nullptr;
    for (StepState::MaskToFill& m : next_.masks_to_fill)
      if (m.seq == &seq) m.constraint = nullptr;
  }
  blocks_.release(seq.block_table);
  if (draft_model_) draft_model_->release(seq);
  auto it = std::find_if(scheduler_.running().begin(), scheduler_.running().end(), [&](const auto& r) { return r.get() == &seq; });
  scheduler_.running().erase(it);
}

void Engine::file_full_blocks(Sequence& seq) {
  const int bs = blocks_.block_size();
  for (; seq.num_filed_blocks < seq.num_computed / bs; ++seq.num_filed_blocks) {
    const std::size_t i = std::size_t(seq.num_filed_blocks);
    seq.last_filed_hash = blocks_.cache_block(seq.block_table[i], seq.last_filed_hash, seq.tokens.data() + i * std::size_t(bs));
  }
}

RequestOutput Engine::output_of(Sequence& seq, const std::string& reason) {
  RequestOutput o;
  o.id = seq.id;
  o.tokens.assign(seq.tokens.begin() + std::ptrdiff_t(seq.request.prompt.size()), seq.tokens.end());
  o.finish_reason = reason;
  o.preemptions = seq.preemptions;
  o.cached_tokens = std::max(0, seq.cached_tokens);
  o.first_logits = std::move(seq.first_logits);
  o.logprobs = std::move(seq.logprobs);
  o.top_logprobs = std::move(seq.top_logprobs);
  return o;
}

bool Engine::abort_waiting(std::int64_t id) {
  // A choice not yet forked: it leaves its group.
  for (auto* queue : {&scheduler_.waiting(), &scheduler_.running()})
    for (const auto& leader : *queue) {
      auto& forks = leader->forks;
      const auto f = std::find_if(forks.begin(), forks.end(), [&](const auto& s) { return s->id == id; });
      if (f == forks.end()) continue;
      unreported_.push_back(output_of(**f, "abort"));
      forks.erase(f);
      return true;
    }
  const auto it = std::find_if(scheduler_.waiting().begin(), scheduler_.waiting().end(), [&](const auto& s) { return s->id == id; });
  if (it == scheduler_.waiting().end()) return false;
  Sequence& seq = **it;
  check(seq.block_table.empty(), "engine: waiting request ", id, " holds KV blocks");
  unreported_.push_back(output_of(seq, "abort"));
  // Its group's other choices wait in its place, the first of them leading the rest.
  std::unique_ptr<Sequence> heir;
  if (!seq.forks.empty()) {
    heir = std::move(seq.forks.front());
    heir->forks.assign(std::make_move_iterator(seq.forks.begin() + 1), std::make_move_iterator(seq.forks.end()));
  }
  const auto at = scheduler_.waiting().erase(it);
  if (heir) scheduler_.waiting().insert(at, std::move(heir));
  return true;
}

std::vector<RequestOutput> Engine::run_to_completion(const std::function<void(const EngineStats&)>& progress) {
  std::map<std::int64_t, RequestOutput> by_id;
  while (has_unfinished()) {
    for (RequestOutput& o : step()) by_id[o.id] = std::move(o);
    if (progress) progress(stats_);
  }
  std::vector<RequestOutput> out;
  for (auto& [id, o] : by_id) out.push_back(std::move(o));
  return out;
}

}  // namespace asynct
