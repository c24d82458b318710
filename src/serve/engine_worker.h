// The engine on its own thread, for a server: HTTP threads submit requests and read each one's
// stream of text pieces; the engine thread adds them between steps and steps while any is
// unfinished. A stream the client abandons is cancelled: its request ends at its next token, or
// during its prompt after the chunk being computed (finish reason "abort"), and its blocks are
// freed.
//
// At most max_in_flight requests are in flight at once, from submit() until their reader lets go
// of the stream (running or waiting in the engine, or their text still being sent): submit()
// refuses more (the server's 429), so memory is bounded by the options.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "text/model_text.h"
#include "serve/metrics.h"

namespace asynct::serve {

// What a request's reader gets, in order: text pieces, then one final event.
struct StreamEvent {
  std::string text;            // the next piece of output text (may be empty)
  // With logprobs asked (sampling.logprobs >= 0): the token this event is for, with its
  // logprobs; there is then one event a token, whether or not it completes any text.
  std::vector<GeneratedToken> tokens;
  bool done = false;
  std::string finish_reason;   // on the final event: the engine's ("eos", "stop", "length") or "abort"
  std::string error;           // on the final event, when the engine refused the request
  bool engine_failed = false;  // ... or failed (no request is taken after that)
  std::int64_t completion_tokens = 0;  // on the final event
  std::int64_t cached_tokens = 0;      // on the final event: prompt tokens not computed (RequestOutput)
};

// One request's stream: written by the engine thread, read by one HTTP thread.
class RequestStream {
 public:
  explicit RequestStream(std::function<void()> on_release) : on_release_(std::move(on_release)) {}
  ~RequestStream() { on_release_(); }
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  // The next event, waiting at most `timeout`; false when none came in time.
  bool next(StreamEvent& event, std::chrono::milliseconds timeout);
  // Waits until the engine has taken the request (true), or has refused it: false, with its
  // final event (the error) in `refused`.
  bool wait_taken(StreamEvent& refused);
  // The reader has gone: the request ends at its next token or its prompt's next chunk.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // The engine thread's side: the event, and the reader woken now or (wake false) by wake().
  void push(StreamEvent event, bool wake = true);
  void wake() { ready_.notify_one(); }
  void taken();  // the engine has the request

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  bool taken_ = false;
  std::atomic<bool> cancelled_{false};
  std::function<void()> on_release_;
};

// Wakes the readers of streams on a thread of its own, so that the engine thread pays one
// wake-up a step instead of one a token: a wake-up is a system call, and 64 of them a step
// would sit between a decode step's end and the next one whenever the next is not queued yet.
class StreamWaker {
 public:
  StreamWaker();
  ~StreamWaker();
  StreamWaker(const StreamWaker&) = delete;
  StreamWaker& operator=(const StreamWaker&) = delete;
  // Wakes these streams' readers soon (their events already pushed, without waking).
  void wake(std::vector<std::shared_ptr<RequestStream>>& streams);

 private:
  std::mutex mutex_;
  std::condition_variable work_;
  std::vector<std::shared_ptr<RequestStream>> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

class EngineWorker {
 public:
  // `metrics` (outliving the worker) gets each request's latencies and end, and the engine's
  // state after every step.
  EngineWorker(std::unique_ptr<Engine> engine, int max_in_flight, ServerMetrics& metrics);
  ~EngineWorker();  // cancels what is left and joins the thread

  // Queues a request (its prompt, limits and sampling set; on_token is the worker's) whose
  // output text `text` makes; nullptr when max_in_flight requests are unfinished.
  std::shared_ptr<RequestStream> submit(Request request, std::unique_ptr<OutputText> text);
  // Queues a group of requests with one prompt (a request's n choices), all or none (empty when
  // there are not places for all): the others fork from the first once its prompt is computed
  // (Engine::add_request_group).
  std::vector<std::shared_ptr<RequestStream>> submit_group(std::vector<Request> requests,
                                                           std::vector<std::unique_ptr<OutputText>> texts);

  // Requests submitted whose streams are still held, and the most there may be.
  int in_flight() const { return in_flight_; }
  int max_in_flight() const { return max_in_flight_; }
  // Whether submit() refuses every request now (draining or stopped): the server's 503.
  bool draining() const { return draining_; }
  // The error the engine failed with (its step threw: every request then ended with it and
  // none is taken after); empty while it runs. The server's 503 and /health say it.
  std::string failure() const;
  // Refuses new requests and cancels every one in flight: each ends at its next token or prompt
  // chunk with finish reason "abort" (its reader gets the final event). The thread keeps stepping.
  void drain();
  // drain(), then stops the thread once every request has ended.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    Clock::time_point submitted;
    Request request;
    std::unique_ptr<OutputText> text;
    std::shared_ptr<RequestStream> stream;
    std::vector<Pending> followers;  // the rest of its group (a request's n choices)
  };
  struct Active {
    std::unique_ptr<OutputText> text;
    std::shared_ptr<RequestStream> stream;
    Clock::time_point submitted, last_token;
    std::int64_t prompt_tokens = 0, tokens = 0;
    bool logprobs = false;  // the request asks for them: an event for every token
    bool aborted = false;  // ended because its reader left
  };
  // Adds a pending request and its followers to the engine, as one group (the engine thread).
  void add(Pending& p);
  // Ends every request with the engine's error and stops taking new ones (the engine thread).
  void fail_all(const std::string& error);
  void run();
  // Sends the request's final event and forgets it.
  void finish(const std::shared_ptr<RequestStream>& stream, StreamEvent last);

  std::unique_ptr<Engine> engine_;
  const int max_in_flight_;
  ServerMetrics& metrics_;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::string failure_;  // under mutex_
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Pending> inbox_;
  bool stopping_ = false;
  std::vector<std::shared_ptr<RequestStream>> all_;  // every unfinished stream (stop() cancels them)
  std::map<std::int64_t, std::shared_ptr<Active>> active_;  // the engine thread's: engine id -> its request
  // The engine thread's: streams that got a token's events in this step, to wake after it.
  std::vector<std::shared_ptr<RequestStream>> to_wake_;
  StreamWaker waker_;  // before the engine thread, which uses it; after in_flight_, which its streams' release needs
  std::thread thread_;
};

}  // namespace asynct::serve
