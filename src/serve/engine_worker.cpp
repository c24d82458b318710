#include "serve/engine_worker.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>

namespace asynct::serve {

bool RequestStream::next(StreamEvent& event, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  // No timed wait for a zero timeout: the HTTP threads ask for every event until none is left,
  // and an expired wait_for cost ~90 us on the development machine (46 us a call, half of them
  // empty), as much as 64 streams' tokens leave the host time for.
  if (events_.empty() && (timeout.count() <= 0 || !ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })))
    return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestStream::wait_taken(StreamEvent& refused) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return taken_ || !events_.empty(); });
  if (taken_) return true;
  refused = std::move(events_.front());
  events_.pop_front();
  return false;
}

void RequestStream::taken() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    taken_ = true;
  }
  ready_.notify_one();
}

void RequestStream::push(StreamEvent event, bool wake) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  if (wake) ready_.notify_one();
}

StreamWaker::StreamWaker()
    : thread_([this] {
        std::vector<std::shared_ptr<RequestStream>> streams;
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
          work_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
          if (pending_.empty()) return;  // stopping, nothing left
          streams.swap(pending_);
          lock.unlock();
          for (const auto& stream : streams) stream->wake();
          streams.clear();
          lock.lock();
        }
      }) {}

StreamWaker::~StreamWaker() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_one();
  thread_.join();
}

void StreamWaker::wake(std::vector<std::shared_ptr<RequestStream>>& streams) {
  if (streams.empty()) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.empty()) pending_.swap(streams);
    else pending_.insert(pending_.end(), streams.begin(), streams.end());
  }
  streams.clear();
  work_.notify_one();
}

EngineWorker::EngineWorker(std::unique_ptr<Engine> engine, int max_in_flight, ServerMetrics& metrics)
    : engine_(std::move(engine)), max_in_flight_(max_in_flight), metrics_(metrics), thread_([this] { run(); }) {
  metrics_.engine_state(0, 0, engine_->kv_blocks_used(), engine_->kv_blocks());
}

EngineWorker::~EngineWorker() { stop(); }

std::shared_ptr<RequestStream> EngineWorker::submit(Request request, std::unique_ptr<OutputText> text) {
  std::vector<Request> requests;
  requests.push_back(std::move(request));
  std::vector<std::unique_ptr<OutputText>> texts;
  texts.push_back(std::move(text));
  std::vector<std::shared_ptr<RequestStream>> streams = submit_group(std::move(requests), std::move(texts));
  return streams.empty() ? nullptr : streams[0];
}

std::vector<std::shared_ptr<RequestStream>> EngineWorker::submit_group(std::vector<Request> requests,
                                                                       std::vector<std::unique_ptr<OutputText>> texts) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const int n = int(requests.size());
    if (draining_ || stopping_ || n < 1 || in_flight_ + n > max_in_flight_) return {};
    in_flight_ += n;
    std::vector<Pending> group;
    for (int i = 0; i < n; ++i) {
      streams.push_back(std::make_shared<RequestStream>([this] { --in_flight_; }));
      all_.push_back(streams.back());
      group.push_back({Clock::now(), std::move(requests[std::size_t(i)]), std::move(texts[std::size_t(i)]), streams.back(), {}});
    }
    Pending leader = std::move(group[0]);
    leader.followers.assign(std::make_move_iterator(group.begin() + 1), std::make_move_iterator(group.end()));
    inbox_.push_back(std::move(leader));
  }
  wake_.notify_one();
  return streams;
}

std::string EngineWorker::failure() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void EngineWorker::drain() {
  const std::lock_guard<std::mutex> lock(mutex_);
  draining_ = true;
  for (const auto& stream : all_) stream->cancel();
}

void EngineWorker::stop() {
  drain();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::finish(const std::shared_ptr<RequestStream>& stream, StreamEvent last) {
  last.done = true;
  stream->push(std::move(last));
  const std::lock_guard<std::mutex> lock(mutex_);
  all_.erase(std::remove(all_.begin(), all_.end(), stream), all_.end());
}

void EngineWorker::run() {
  std::optional<Clock::time_point> last_step_end;  // while requests stay unfinished between steps
  for (;;) {
    std::vector<Pending> incoming;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || engine_->has_unfinished(); });
      if (stopping_ && inbox_.empty() && !engine_->has_unfinished()) return;
      incoming.swap(inbox_);
    }
    for (Pending& p : incoming) add(p);
    // A request whose reader left while it waits for a place ends now, without its prefill;
    // a running one after its prompt's next chunk (Request::cancelled) or at its next token
    // (on_token).
    for (const auto& [id, active] : active_)
      if (active->stream->cancelled() && engine_->abort_waiting(id)) active->aborted = true;
    if (!engine_->has_unfinished()) {
      metrics_.engine_state(0, 0, engine_->kv_blocks_used(), engine_->kv_blocks());
      last_step_end.reset();
      continue;
    }
    if (last_step_end) metrics_.engine_gap(std::chrono::duration<double>(Clock::now() - *last_step_end).count());
    std::vector<RequestOutput> outputs;
    try {
      outputs = engine_->step();
    } catch (const std::exception& e) {
      waker_.wake(to_wake_);
      fail_all(e.what());
      return;
    }
    // A gap is the engine thread's time between steps with work waiting; after a step that ends
    // the last request the thread sleeps until the next one comes, and that is no gap.
    if (engine_->has_unfinished())
      last_step_end = Clock::now();
    else
      last_step_end.reset();
    waker_.wake(to_wake_);
    const EngineStats& stats = engine_->stats();
    metrics_.engine_step(stats.last_step_ms / 1e3, stats.steps, stats.pipelined_steps);
    // Before any reader hears of its request's end, so that /metrics agrees with what it saw.
    metrics_.engine_state(engine_->num_running(), engine_->num_waiting(), engine_->kv_blocks_used(), engine_->kv_blocks());
    metrics_.prefix_cache(stats.prefix_cache_queries, stats.prefix_cache_hits);
    metrics_.speculative(stats.draft_rounds, stats.drafted_tokens, stats.accepted_tokens, stats.drafts_skipped_batch,
                         stats.drafts_skipped_paused);
    for (const RequestOutput& out : outputs) {
      const auto it = active_.find(out.id);
      if (it == active_.end()) continue;
      const std::shared_ptr<Active> active = it->second;
      active_.erase(it);
      StreamEvent last;
      last.text = active->text->finish();
      last.finish_reason = active->aborted ? "abort" : active->text->stopped() ? "stop" : out.finish_reason;
      last.completion_tokens = std::int64_t(out.tokens.size());
      last.cached_tokens = out.cached_tokens;
      metrics_.request_finished(last.finish_reason == "length" || last.finish_reason == "abort" ? last.finish_reason : "stop",
                                active->prompt_tokens, last.completion_tokens,
                                std::chrono::duration<double>(Clock::now() - active->submitted).count());
      finish(active->stream, std::move(last));
    }
  }
}

void EngineWorker::add(Pending& p) {
  std::vector<Pending*> group{&p};
  for (Pending& f : p.followers) group.push_back(&f);
  std::vector<std::shared_ptr<Active>> actives;
  std::vector<Request> requests;
  for (Pending* q : group) {
    auto active = std::make_shared<Active>();
    active->text = std::move(q->text);
    active->stream = q->stream;
    active->submitted = q->submitted;
    active->prompt_tokens = std::int64_t(q->request.prompt.size());
    active->logprobs = q->request.sampling.logprobs >= 0;
    // The engine thread calls it for each token: the text piece it makes safe to show goes to
    // the reader; a reader that left, or a stop string, ends the request.
    q->request.on_token = [this, a = active.get(), &metrics = metrics_](const GeneratedToken& g) {
      const Clock::time_point now = Clock::now();
      if (a->tokens++ == 0) metrics.first_token(std::chrono::duration<double>(now - a->submitted).count());
      else metrics.inter_token(std::chrono::duration<double>(now - a->last_token).count());
      a->last_token = now;
      if (a->stream->cancelled()) {
        a->aborted = true;
        return false;
      }
      std::string piece = a->text->push(g.token);
      if (!piece.empty() || a->logprobs) {
        StreamEvent event;
        event.text = std::move(piece);
        if (a->logprobs) event.tokens.push_back(g);
        a->stream->push(std::move(event), /*wake=*/false);
        to_wake_.push_back(a->stream);
      }
      return !a->text->stopped();
    };
    // ... and one whose reader left during its prompt ends at the next chunk.
    q->request.cancelled = [a = active.get()] {
      if (a->stream->cancelled()) a->aborted = true;
      return a->aborted;
    };
    actives.push_back(std::move(active));
    requests.push_back(std::move(q->request));
  }
  try {
    // A request's n choices fork after its prompt (Engine::add_request_group).
    const std::vector<std::int64_t> ids =
        requests.size() == 1 ? std::vector<std::int64_t>{engine_->add_request(requests[0])} : engine_->add_request_group(requests);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      active_[ids[i]] = actives[i];
      actives[i]->stream->taken();
    }
  } catch (const std::exception& e) {
    for (Pending* q : group) {
      StreamEvent refused;
      refused.error = e.what();
      metrics_.request_finished("error", 0, 0, std::chrono::duration<double>(Clock::now() - q->submitted).count());
      finish(q->stream, std::move(refused));
    }
  }
}

void EngineWorker::fail_all(const std::string& error) {
  // The engine cannot go on: every request ends with the error, and no new one is taken.
  std::fprintf(stderr, "asynct serve: the engine failed: %s\n", error.c_str());
  std::vector<Pending> left;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    failure_ = error.empty() ? "unknown error" : error;
    left.swap(inbox_);
  }
  const auto fail = [&](const std::shared_ptr<RequestStream>& stream) {
    StreamEvent failed;
    failed.error = "the engine failed: " + error;
    failed.engine_failed = true;
    finish(stream, std::move(failed));
  };
  for (auto& [id, active] : active_) {
    metrics_.request_finished("error", active->prompt_tokens, active->tokens,
                              std::chrono::duration<double>(Clock::now() - active->submitted).count());
    fail(active->stream);
  }
  active_.clear();
  for (Pending& p : left) {
    fail(p.stream);
    for (Pending& f : p.followers) fail(f.stream);
  }
}

}  // namespace asynct::serve
