// `asynct serve`'s /metrics: counters, gauges and latency histograms in Prometheus' text format
// (version 0.0.4). Written by the engine thread and the HTTP threads, read by /metrics; every
// method is thread-safe.
//
//   asynct_requests_total{finish_reason}       requests that ended: stop, length, abort, error
//   asynct_http_errors_total{status}           requests answered with an error status (400, 401, 404, 405, 413, 429, 503, 500)
//   asynct_prompt_tokens_total, asynct_generation_tokens_total
//   asynct_requests_running, asynct_requests_waiting     sequences in the engine after its last step
//   asynct_kv_blocks_used, asynct_kv_blocks              KV cache blocks held by requests, and in all
//   asynct_prefix_cache_queries_total, asynct_prefix_cache_hits_total
//                                                        prompt tokens looked up, and found cached
//   asynct_time_to_first_token_seconds, asynct_inter_token_latency_seconds,
//   asynct_e2e_request_latency_seconds                   histograms (from submission)
//   asynct_engine_steps_total, asynct_engine_pipelined_steps_total
//                                                        engine steps, and those queued behind the one before
//   asynct_spec_draft_rounds_total, asynct_spec_drafted_tokens_total, asynct_spec_accepted_tokens_total
//                                                        speculative decoding: sequence-steps with drafts, tokens
//                                                        drafted, and drafts kept (mean kept a round: kept / rounds)
//   asynct_spec_skipped_rounds_total{reason}             sequence-steps the switch-off rule kept from drafting:
//                                                        "batch" (over --speculative-max-batch), "paused" (after
//                                                        rounds that kept none)
//   asynct_engine_step_seconds                           histogram: a step's host time (EngineStats::last_step_ms)
//   asynct_engine_gap_seconds                            histogram: the engine thread's time between two steps
//                                                        while requests are unfinished (the server's own share)
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace asynct::serve {

// Cumulative buckets over fixed upper bounds (seconds), as Prometheus reads them.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  // "# HELP", "# TYPE" and the _bucket, _sum and _count lines.
  std::string text(const std::string& name, const std::string& help) const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<std::uint64_t> counts_;  // per bound, then +Inf; not cumulative
  double sum_ = 0.0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  void request_finished(const std::string& finish_reason, std::int64_t prompt_tokens, std::int64_t generated_tokens,
                        double seconds);
  void first_token(double seconds_since_submission) { ttft_.observe(seconds_since_submission); }
  void inter_token(double seconds) { itl_.observe(seconds); }
  void http_error(int status);
  void engine_state(int running, int waiting, int blocks_used, int blocks);
  void prefix_cache(std::int64_t queries, std::int64_t hits) { cache_queries_ = queries, cache_hits_ = hits; }
  void speculative(std::int64_t rounds, std::int64_t drafted, std::int64_t accepted, std::int64_t skipped_batch,
                   std::int64_t skipped_paused) {
    draft_rounds_ = rounds, drafted_ = drafted, accepted_ = accepted;
    skipped_batch_ = skipped_batch, skipped_paused_ = skipped_paused;
  }
  // After each engine step: its host time, the engine's step counts, and (when the step before
  // it ended with requests still unfinished) the time since that step ended.
  void engine_step(double step_seconds, std::int64_t steps, std::int64_t pipelined_steps);
  void engine_gap(double seconds) { gap_.observe(seconds); }

  std::string prometheus_text() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::uint64_t> finished_;  // by finish reason
  std::map<int, std::uint64_t> http_errors_;       // by status
  std::uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::atomic<int> running_{0}, waiting_{0}, blocks_used_{0}, blocks_{0};
  std::atomic<std::int64_t> cache_queries_{0}, cache_hits_{0};
  std::atomic<std::int64_t> steps_{0}, pipelined_steps_{0};
  std::atomic<std::int64_t> draft_rounds_{0}, drafted_{0}, accepted_{0}, skipped_batch_{0}, skipped_paused_{0};
  Histogram ttft_, itl_, e2e_, step_, gap_;
};

}  // namespace asynct::serve
