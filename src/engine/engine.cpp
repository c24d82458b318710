#include "engine/engine.h"

#include <algorithm>
#include <map>

#include "core/error.h"

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
  check(blocks_.blocks_for(int(total)) <= blocks_.num_blocks(), "request: ", total,
        " tokens need ", blocks_.blocks_for(int(total)), " KV blocks but the cache has ",
        blocks_.num_blocks());
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

std::vector<Engine::Scheduled> Engine::schedule() {
  std::vector<Scheduled> out;
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
  return out;
}

bool Engine::finished(const Sequence& seq, std::string* reason) const {
  const std::int32_t last = seq.tokens.back();
  if (!seq.request.ignore_eos && seq.request.eos_token >= 0 && last == seq.request.eos_token) {
    *reason = "eos";
    return true;
  }
  if (seq.num_generated >= seq.request.max_tokens) {
    *reason = "length";
    return true;
  }
  return false;
}

std::vector<RequestOutput> Engine::step() {
  std::vector<Scheduled> scheduled = schedule();
  check(!scheduled.empty() || !has_unfinished(), "engine: no request could be scheduled");
  std::vector<RequestOutput> done;
  if (scheduled.empty()) return done;

  StepBatch batch;
  batch.cu_seqlens_q.push_back(0);
  std::vector<int> sample_row(scheduled.size(), -1);
  const int bs = blocks_.block_size();
  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& seq = *scheduled[i].seq;
    const int begin = seq.num_computed, end = begin + scheduled[i].num_tokens;
    for (int pos = begin; pos < end; ++pos) {
      batch.tokens.push_back(seq.tokens[std::size_t(pos)]);
      batch.positions.push_back(pos);
      batch.slot_mapping.push_back(std::int64_t(seq.block_table[std::size_t(pos / bs)]) * bs + pos % bs);
    }
    batch.cu_seqlens_q.push_back(batch.num_tokens());
    batch.kv_lens.push_back(end);
    batch.block_tables.push_back(seq.block_table);
    if (end == int(seq.tokens.size())) {  // the whole sequence is in the cache: sample
      sample_row[i] = int(batch.logit_rows.size());
      batch.logit_rows.push_back(batch.num_tokens() - 1);
    }
    (scheduled[i].num_tokens == 1 && begin > 0 ? stats_.decode_tokens : stats_.prefill_tokens) +=
        scheduled[i].num_tokens;
  }
  Tensor logits = runner_->forward(batch);
  ++stats_.steps;

  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& seq = *scheduled[i].seq;
    seq.num_computed += scheduled[i].num_tokens;
    if (sample_row[i] < 0) continue;
    const float* row = logits.data_as<float>() + std::int64_t(sample_row[i]) * vocab_size_;
    const std::vector<float> values(row, row + vocab_size_);
    if (options_.record_first_logits && seq.num_generated == 0) seq.first_logits = values;
    seq.tokens.push_back(sample_token(values, seq.request.sampling, std::uint64_t(seq.num_generated)));
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
      blocks_.release(seq.block_table);
      auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == &seq; });
      running_.erase(it);
    }
  }
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
