#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace asynct {

Engine::Engine(std::unique_ptr<ModelRunner> runner, int vocab_size, EngineOptions options)
    : runner_(std::move(runner)), vocab_size_(vocab_size), options_(options),
      blocks_(runner_->num_blocks(), runner_->block_size()) {
  check(options.max_num_seqs >= 1, "engine: max_num_seqs must be >= 1");
  check(options.max_num_batched_tokens >= 1, "engine: max_num_batched_tokens must be >= 1");
  check(options.max_model_len >= 2, "engine: max_model_len must be >= 2");
}

std::int64_t Engine::add_request(const Request& r) {
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
  validate_sampling(r.sampling);
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->request = r;
  seq->tokens = r.prompt;
  waiting_.push_back(std::move(seq));
  return waiting_.back()->id;
}

void Engine::preempt(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == seq; });
  check(it != running_.end(), "engine: preempting a sequence that is not running");
  blocks_.release(seq->block_table);
  seq->num_computed = 0;  // recomputed from scratch when it runs again
  ++seq->preemptions;
  ++stats_.preemptions;
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

void Engine::reset_stats() {
  stats_ = {};
  runner_->reset_phase_times();
}

void Engine::schedule(StepState& s) {
  std::vector<Scheduled>& out = s.scheduled;
  out.clear();
  int budget = options_.max_num_batched_tokens;
  // Running sequences first (decodes and unfinished prefill chunks), oldest first; the newest
  // running sequences give up their blocks when the older ones need more.
  for (std::size_t i = 0; i < running_.size() && budget > 0 && int(out.size()) < options_.max_num_seqs; ++i) {
    Sequence* seq = running_[i].get();
    const int n = std::min(int(seq->tokens.size()) - seq->num_computed, budget);
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
    const int n = std::min(int(seq->tokens.size()) - seq->num_computed, budget);
    if (!blocks_.can_grow(seq->block_table, seq->num_computed + n)) break;
    blocks_.grow(seq->block_table, seq->num_computed + n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    out.push_back({seq, n});
    budget -= n;
  }
  // One-token sequences first: a backend can hand that leading run to its decode kernel.
  std::stable_partition(out.begin(), out.end(), [](const Scheduled& s) { return s.num_tokens == 1; });
}

bool Engine::finished(const Sequence& seq, std::string* reason) const {
  const std::int32_t last = seq.tokens.back();
  const std::vector<std::int32_t>& eos = seq.request.eos_token_ids;
  if (std::find(eos.begin(), eos.end(), last) != eos.end()) {
    *reason = "eos";
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
  const std::vector<Scheduled>& scheduled = s.scheduled;
  std::vector<int>& sample_row = s.sample_row;
  StepBatch& b = s.batch;
  b.reset(scheduled.size());
  sample_row.assign(scheduled.size(), -1);
  const int bs = blocks_.block_size();
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& seq = *scheduled[i].seq;
    const int begin = seq.num_computed, end = begin + scheduled[i].num_tokens;
    // Only the newest token past the prompt is a decode token (EngineStats).
    const int newest = int(seq.tokens.size()) - 1;
    const bool decodes = end - 1 == newest && newest >= int(seq.request.prompt.size());
    stats_.decode_tokens += decodes ? 1 : 0;
    stats_.prefill_tokens += scheduled[i].num_tokens - (decodes ? 1 : 0);
    for (int pos = begin; pos < end; ++pos) {
      b.tokens.push_back(seq.tokens[std::size_t(pos)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(std::int64_t(seq.block_table[std::size_t(pos / bs)]) * bs + pos % bs);
    }
    b.cu_seqlens_q.push_back(b.num_tokens());
    b.kv_lens.push_back(end);
    b.block_tables[i].assign(seq.block_table.begin(), seq.block_table.end());
    if (end == int(seq.tokens.size())) {  // the whole sequence is in the cache: sample
      sample_row[i] = int(b.logit_rows.size());
      b.logit_rows.push_back(b.num_tokens() - 1);
      // Greedy rows need only their argmax, which the runner gives for every row.
      const bool record = options_.record_first_logits && seq.num_generated == 0;
      b.full_logits.push_back(seq.request.sampling.temperature > 0.0f || record ? 1 : 0);
    }
  }
}

bool Engine::can_chain(const StepState& s) const {
  // Every running sequence is in the step, and nothing waits: scheduling again would pick them all.
  if (!waiting_.empty() || s.scheduled.size() != running_.size()) return false;
  std::int64_t new_blocks = 0;
  for (std::size_t i = 0; i < s.scheduled.size(); ++i) {
    const Sequence* seq = s.scheduled[i].seq;
    if (seq == nullptr || s.scheduled[i].num_tokens != 1 || s.sample_row[i] < 0) return false;
    // Greedy, and not ended by length by this step's token (an end of sequence still may: the
    // next step's row for it is then dropped).
    if (s.batch.full_logits[std::size_t(s.sample_row[i])]) return false;
    if (seq->num_generated + 1 >= seq->request.max_tokens) return false;
    new_blocks += std::max<std::int64_t>(0, blocks_.blocks_for(seq->num_computed + 2) - std::int64_t(seq->block_table.size()));
  }
  return new_blocks <= blocks_.num_free_blocks();  // no preemption
}

// The step after `s` (not yet collected): each sequence's next position, one past the one `s`
// computes, its token the greedy token of the sequence's row in `s`.
void Engine::build_chained_batch(const StepState& s, StepState& next) {
  next.chained = true;
  next.scheduled = s.scheduled;
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
  }
}

std::vector<RequestOutput> Engine::step() {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  auto t = Clock::now();
  if (next_queued_) {  // the step queued behind the last one is this one
    std::swap(current_, next_);
    next_queued_ = false;
  } else {
    const auto start = t;
    schedule(current_);
    check(!current_.scheduled.empty() || !has_unfinished(), "engine: no request could be scheduled");
    if (current_.scheduled.empty()) return {};
    build_batch(current_);
    stats_.schedule_ms += ms_since(t);
    t = Clock::now();
    runner_->submit(current_.batch);
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
  const StepOutput& out = runner_->collect();
  stats_.forward_ms += ms_since(t);
  ++stats_.steps;
  try {
    std::vector<RequestOutput> done = apply(current_, out);
    stats_.last_step_ms = current_.submit_ms + ms_since(t);  // + collect() and apply()
    return done;
  } catch (...) {
    // The step's output is bad (e.g. a non-finite logit): the sequences are as they were, and
    // the step queued behind it, built on its tokens, is dropped.
    if (next_queued_) {
      next_queued_ = false;
      runner_->collect();
    }
    throw;
  }
}

std::vector<RequestOutput> Engine::apply(const StepState& s, const StepOutput& out) {
  using Clock = std::chrono::steady_clock;
  const auto t = Clock::now();
  const std::vector<Scheduled>& scheduled = s.scheduled;
  check(out.summaries.size() == s.batch.logit_rows.size() && out.logits.size() == s.batch.logit_rows.size(),
        "engine: the runner returned ", out.summaries.size(), " rows for ", s.batch.logit_rows.size(), " logit rows");
  // Before any sequence changes: every sampled row must be finite (greedy or not, a NaN or an
  // infinity is an error) and present when its full logits were asked for.
  std::vector<std::size_t> tempered;  // indices into scheduled of rows drawn with a temperature
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    const int row = s.sample_row[i];
    if (row < 0 || scheduled[i].seq == nullptr) continue;
    check_finite(out.summaries[std::size_t(row)]);
    check(!s.batch.full_logits[std::size_t(row)] || out.logits[std::size_t(row)],
          "engine: the runner did not return logit row ", row);
    if (scheduled[i].seq->request.sampling.temperature > 0.0f) tempered.push_back(i);
  }
  // A row drawn with a temperature takes 0.3-3 ms on the host at a 152K vocabulary (greedy rows
  // take their token from the summary): the rows are independent and each draw depends only
  // on its own (seed, step), so they run in parallel with the same result as in sequence.
  std::vector<int> drawn(scheduled.size(), -1);
  parallel_for(tempered.size(), [&](std::size_t k) {
    const std::size_t i = tempered[k];
    const Sequence& seq = *scheduled[i].seq;
    drawn[i] = sample_token(out.logits[std::size_t(s.sample_row[i])], std::size_t(vocab_size_), seq.request.sampling,
                            std::uint64_t(seq.num_generated));
  });
  std::vector<RequestOutput> done;
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    if (scheduled[i].seq == nullptr) continue;  // finished in the step before
    Sequence& seq = *scheduled[i].seq;
    seq.num_computed += scheduled[i].num_tokens;
    if (s.chained) stats_.decode_tokens += scheduled[i].num_tokens;
    const int row = s.sample_row[i];
    if (row < 0) continue;
    const float* logits = out.logits[std::size_t(row)];
    if (options_.record_first_logits && seq.num_generated == 0) seq.first_logits.assign(logits, logits + vocab_size_);
    seq.tokens.push_back(drawn[i] >= 0 ? drawn[i] : out.summaries[std::size_t(row)].greedy);
    ++seq.num_generated;
    std::string reason;
    if (finished(seq, &reason)) {
      RequestOutput o;
      o.id = seq.id;
      o.tokens.assign(seq.tokens.begin() + std::ptrdiff_t(seq.request.prompt.size()), seq.tokens.end());
      o.finish_reason = reason;
      o.preemptions = seq.preemptions;
      o.first_logits = std::move(seq.first_logits);
      done.push_back(std::move(o));
      // A step queued behind this one computed a token for it too: that row is dropped.
      if (next_queued_)
        for (Scheduled& e : next_.scheduled)
          if (e.seq == &seq) e.seq = nullptr;
      blocks_.release(seq.block_table);
      auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == &seq; });
      running_.erase(it);
    }
  }
  stats_.sample_ms += std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  return done;
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
